"""A shaped network of Linux network namespaces, one per worker, for benchmarks on one machine.

Topology: a bridge ``hxnet0`` in the root namespace (198.18.0.1/24: the range RFC 2544 reserves for
benchmarking) and, per worker, a namespace ``hxbench<i>`` joined to the bridge by a veth pair whose
namespace end is also called ``hxnet0`` (198.18.0.<i+2>). Both ends of every veth are shaped
(netem for latency, tbf for bandwidth), so each worker has a full-duplex link of the requested
bandwidth, as a NIC would. Traffic stays inside namespaces this module created. ``down()`` (also
run by the context manager, at exit and on SIGINT/SIGTERM) deletes everything it made.

Horovodrun reaches each namespace "host" through a tiny ``ssh`` stand-in on PATH that runs the
command with ``ip netns exec`` (see :func:`write_ssh_shim`); horovodrun itself is unchanged.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile

IFACE = "hxnet0"
SUBNET = "198.18.0"
NS_PREFIX = "hxbench"


def parse_rate(text: str) -> float:
    """'1gbit' -> 1e9 (bits per second); accepts kbit, mbit, gbit (tc's units)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(k|m|g)?bit\s*", text.lower())
    if not m:
        raise ValueError(f"bandwidth {text!r}: expected a number followed by kbit, mbit or gbit (e.g. 1gbit)")
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def _run(cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{cmd}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now (``ip netns list``)."""
    return [line.split()[0] for line in _run("ip netns list", check=False).stdout.splitlines() if line.strip()]


def check_privileges() -> None:
    if os.geteuid() != 0:
        raise PermissionError("network namespaces and tc need root (run as root, or use --no-netns)")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise RuntimeError(f"`{tool}` was not found; install iproute2 (Debian: apt-get install iproute2)")


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (needed only for added latency)."""
    probe = f"{NS_PREFIX}probe"
    _run(f"ip netns add {probe}", check=False)
    try:
        return _run(f"ip netns exec {probe} tc qdisc add dev lo root netem delay 1ms", check=False).returncode == 0
    finally:
        _run(f"ip netns del {probe}", check=False)


class ShapedNetwork:
    """``workers`` namespaces on one shaped bridge. ``prefix`` names the namespaces (prefix0, ...),
    ``iface`` both the bridge in the root namespace and each namespace's interface (horovodrun's
    ``--network-interface``: the launcher and the workers must see the same name), ``subnet`` the
    /24 they live in; two networks with different values coexist (hx-bench's and ``hx-bench hosts``')."""

    def __init__(self, workers: int, bandwidth: str = "1gbit", latency_ms: float = 0.0,
                 prefix: str = NS_PREFIX, iface: str = IFACE, subnet: str = SUBNET):
        self.workers = workers
        self.bandwidth = bandwidth
        self.rate_bps = parse_rate(bandwidth)
        self.latency_ms = latency_ms
        self.prefix, self.iface, self.subnet = prefix, iface, subnet
        self._up = False

    def namespace(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 2}"

    @property
    def hosts(self) -> str:
        """horovodrun -H value: one slot per namespace."""
        return ",".join(f"{self.address(i)}:1" for i in range(self.workers))

    def _shape(self, dev: str, netns: str | None) -> None:
        pre = f"ip netns exec {netns} " if netns else ""
        # tbf's bucket must hold at least one GSO burst and a few ms of traffic at high rates.
        burst = max(256 * 1024, int(self.rate_bps / 8 * 0.002))
        tbf = f"tbf rate {int(self.rate_bps)}bit burst {burst} latency 100ms"
        if self.latency_ms > 0:
            _run(f"{pre}tc qdisc replace dev {dev} root handle 1: netem delay {self.latency_ms}ms limit 100000")
            _run(f"{pre}tc qdisc add dev {dev} parent 1: handle 2: {tbf}")
        else:
            _run(f"{pre}tc qdisc replace dev {dev} root handle 1: {tbf}")

    def up(self, persist: bool = False) -> "ShapedNetwork":
        """Build the network. Unless ``persist``, it is deleted again at exit and on SIGINT/SIGTERM."""
        check_privileges()
        if self.latency_ms > 0 and not netem_available():
            raise RuntimeError("added latency needs the netem qdisc (kernel module sch_netem), which this kernel "
                               "does not have; run with --latency-ms 0 (bandwidth shaping uses tbf)")
        self.down()     # leftovers of an earlier run that was killed hard
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        if persist:
            return self
        atexit.register(self.down)
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)

            def handler(signum, frame, previous=previous):
                self.down()
                if callable(previous):
                    previous(signum, frame)
                raise SystemExit(128 + signum)
            signal.signal(sig, handler)
        return self

    def _build(self) -> None:
        host = socket.gethostname()
        iface = self.iface
        _run(f"ip link add {iface} type bridge")
        _run(f"ip addr add {self.subnet}.1/24 dev {iface}")
        _run(f"ip link set {iface} up")
        for i in range(self.workers):
            ns, host_end, ns_end = self.namespace(i), f"{self.prefix[:8]}v{i}", f"{self.prefix[:8]}p{i}"
            _run(f"ip netns add {ns}")
            # Horovod 0.28.1 creates the Gloo device of a process set without HOROVOD_GLOO_IFACE, from
            # the address the host name resolves to; `ip netns exec` shows /etc/netns/NS/hosts as
            # /etc/hosts, so inside the namespace the host name resolves to the namespace's address.
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(f"127.0.0.1 localhost\n{self.address(i)} {host}\n")
            _run(f"ip netns exec {ns} ip link set lo up")
            _run(f"ip link add {host_end} type veth peer name {ns_end}")
            _run(f"ip link set {ns_end} netns {ns}")
            _run(f"ip netns exec {ns} ip link set {ns_end} name {iface}")
            _run(f"ip netns exec {ns} ip addr add {self.address(i)}/24 dev {iface}")
            _run(f"ip netns exec {ns} ip link set {iface} up")
            _run(f"ip link set {host_end} master {iface}")
            _run(f"ip link set {host_end} up")
            self._shape(host_end, None)           # towards the worker
            self._shape(iface, ns)                # from the worker
        self._up = True

    def down(self) -> None:
        """Delete every namespace and link this module creates (safe to call repeatedly)."""
        for name in namespaces():
            if re.fullmatch(rf"{re.escape(self.prefix)}\d+", name):
                _run(f"ip netns del {name}", check=False)
        for name in (os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []):
            if re.fullmatch(rf"{re.escape(self.prefix)}\d+", name):
                shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        if _run(f"ip link show {self.iface}", check=False).returncode == 0:
            _run(f"ip link del {self.iface}", check=False)
        # host ends of veth pairs whose namespace was never made or already gone (a run killed mid-build)
        for line in _run("ip -o link show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            if re.fullmatch(rf"{re.escape(self.prefix[:8])}v\d+", name):
                _run(f"ip link del {name}", check=False)
        self._up = False

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()


def write_ssh_shim(network: ShapedNetwork, folder: str | None = None) -> str:
    """A folder (``folder``, or a new temporary one) holding an ``ssh`` that runs commands in the
    namespace owning the host address.

    horovodrun launches workers on non-local hosts with ``ssh [-o OPT]... HOST [-p P] [-i F] CMD``;
    the shim maps HOST to its namespace and runs CMD there with bash, as sshd would."""
    if folder is None:
        folder = tempfile.mkdtemp(prefix="hx-ssh-")
    os.makedirs(folder, exist_ok=True)
    table = " ".join(f"[{network.address(i)}]={network.namespace(i)}" for i in range(network.workers))
    script = f"""#!/usr/bin/env bash
# ssh stand-in for hx-bench: run the command inside the network namespace of the host address.
declare -A NS=({table})
host=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i) shift 2 ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host=$1; shift; else break; fi ;;
  esac
  [ -n "$host" ] && [ $# -gt 0 ] && case "$1" in -o|-p|-i) ;; *) break ;; esac
done
while [ $# -gt 0 ]; do case "$1" in -o|-p|-i) shift 2 ;; *) break ;; esac; done
ns=${{NS[$host]:-}}
[ -n "$ns" ] || {{ echo "hx ssh shim: unknown host $host" >&2; exit 255; }}
exec ip netns exec "$ns" bash -c "$*"
"""
    path = os.path.join(folder, "ssh")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o755)
    return folder
