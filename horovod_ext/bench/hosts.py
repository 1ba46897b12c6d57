"""hx-bench hosts: emulated hosts on one machine, for running horovodrun jobs "across hosts".

    hx-bench hosts up 2 --bandwidth 1gbit        # two namespace hosts, 198.18.1.2 and 198.18.1.3
    export PATH=/run/hx-hosts/bin:$PATH          # the ssh horovodrun uses to reach them
    recipes/bfa/run.sh --hosts 198.18.1.2:1,198.18.1.3:1 --network-interface hxhost0 ...
    hx-bench hosts status
    hx-bench hosts down

Each host is a Linux network namespace (hxhost0, hxhost1, ...) on a bridge, with a full-duplex link
of the given bandwidth shaped by tc in both directions (and netem latency with --latency-ms), as
hx-bench builds for its own runs. Unlike hx-bench's, these stay up until ``down``, so that any
horovodrun command can be launched across them exactly as on a cluster: horovodrun reaches a
non-local host with ``ssh HOST CMD``, and the ``ssh`` in /run/hx-hosts/bin runs CMD inside that
host's namespace (the file system is shared, as on a cluster with a shared home). Every worker
then talks to the others through its shaped link only. On a real cluster the same command runs
with the cluster's host names and interface (e.g. ``--hosts node1:1,node2:1 --network-interface
eth0``) and the real ssh. Needs root and iproute2 (ip, tc).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .netns import ShapedNetwork, check_privileges, namespaces, write_ssh_shim

PREFIX, IFACE, SUBNET = "hxhost", "hxhost0", "198.18.1"
STATE_DIR = os.environ.get("HX_HOSTS_DIR", "/run/hx-hosts")


def network(count: int, bandwidth: str = "1gbit", latency_ms: float = 0.0) -> ShapedNetwork:
    return ShapedNetwork(count, bandwidth, latency_ms, prefix=PREFIX, iface=IFACE, subnet=SUBNET)


def up(count: int, bandwidth: str = "1gbit", latency_ms: float = 0.0, state_dir: str = STATE_DIR) -> dict:
    """Create ``count`` emulated hosts (replacing any left up) and the ssh stand-in; return their description."""
    if count < 1 or count > 200:
        raise ValueError(f"hx-bench hosts up: COUNT must be between 1 and 200, got {count}")
    net = network(count, bandwidth, latency_ms).up(persist=True)
    bin_dir = write_ssh_shim(net, os.path.join(state_dir, "bin"))
    info = {"count": count, "bandwidth": bandwidth, "latency_ms": latency_ms, "interface": IFACE,
            "addresses": [net.address(i) for i in range(count)],
            "namespaces": [net.namespace(i) for i in range(count)], "ssh_dir": bin_dir,
            "hosts": net.hosts}
    with open(os.path.join(state_dir, "hosts.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def down(state_dir: str = STATE_DIR) -> None:
    """Delete the emulated hosts and the ssh stand-in (safe when none are up)."""
    network(1).down()
    for name in ("bin/ssh", "hosts.json"):
        try:
            os.remove(os.path.join(state_dir, name))
        except FileNotFoundError:
            pass


def status(state_dir: str = STATE_DIR) -> dict | None:
    """The description written by :func:`up`, or None when no hosts are up."""
    path = os.path.join(state_dir, "hosts.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        info = json.load(f)
    listed = namespaces()
    return info if all(ns in listed for ns in info["namespaces"]) else None


def describe(info: dict) -> str:
    return (f"{info['count']} emulated host(s), {info['bandwidth']} each"
            + (f", {info['latency_ms']} ms latency" if info["latency_ms"] else "") + ": "
            + ", ".join(f"{a} ({ns})" for a, ns in zip(info["addresses"], info["namespaces"]))
            + f"\n  export PATH={info['ssh_dir']}:$PATH"
            + f"\n  horovodrun -np {info['count']} -H {info['hosts']} --network-interface {info['interface']} ..."
            + f"\n  recipes/bfa/run.sh --workers {info['count']} --hosts {info['hosts']} "
              f"--network-interface {info['interface']} ...")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hx-bench hosts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    u = sub.add_parser("up", help="create COUNT emulated hosts (replaces any that are up)")
    u.add_argument("count", type=int, help="number of hosts (one worker slot each)")
    u.add_argument("--bandwidth", default="1gbit", help="link rate per host, tc units (default 1gbit)")
    u.add_argument("--latency-ms", type=float, default=0.0, help="added one-way latency per link (netem)")
    sub.add_parser("down", help="delete the emulated hosts")
    sub.add_parser("status", help="print the hosts that are up")
    args = p.parse_args(argv)
    if args.action == "status":
        info = status()
        print(describe(info) if info else "no emulated hosts are up (hx-bench hosts up COUNT)")
        return 0
    try:
        check_privileges()
        if args.action == "up":
            print(describe(up(args.count, args.bandwidth, args.latency_ms)))
        else:
            down()
            print("emulated hosts removed")
    except (PermissionError, RuntimeError, ValueError) as err:
        print(f"hx-bench hosts: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
