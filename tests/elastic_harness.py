"""Launch real Horovod Elastic jobs on one machine from pytest.

Horovod Elastic blacklists the host of a failed worker, and a job whose every host is blacklisted
fails; so a loss-and-recovery test needs one host per worker. Here each worker gets its own host
name, all of which resolve to 127.0.0.1 (``localhost``, ``127.0.0.1``, ``127.1``, ``127.0.1``,
``2130706433``): horovodrun sees local addresses and starts every worker without ssh, while its
elastic driver tracks (and blacklists) each name separately. The host discovery script prints a
hosts file the test (or a worker) rewrites to remove or add a host.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "127.1", "127.0.1", "2130706433")


def write_hosts(path: Path, hosts) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("".join(f"{h}:1\n" for h in hosts))
    os.replace(tmp, path)


def discovery(folder: Path, hosts) -> tuple[Path, Path]:
    """A hosts file listing ``hosts`` (one slot each) and an executable discovery script printing it."""
    folder.mkdir(parents=True, exist_ok=True)
    hosts_file, script = folder / "hosts", folder / "discover_hosts.sh"
    write_hosts(hosts_file, hosts)
    script.write_text(f"#!/bin/sh\ncat '{hosts_file}'\n")
    script.chmod(0o755)
    return script, hosts_file


class JobHung(AssertionError):
    """An elastic job still running at its time limit; the message holds its output and stacks."""


class ElasticJob:
    """``horovodrun -np NP --min-np MIN --max-np MAX --host-discovery-script SCRIPT CMD...`` in the
    background; ``wait()`` returns the CompletedProcess-like (returncode, output)."""

    def __init__(self, cmd, np: int, min_np: int, max_np: int, script: Path, log: Path, env=None,
                 cooldown: tuple[int, int] | None = None):
        full = [str(HOROVODRUN), "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
                "--host-discovery-script", str(script), "--gloo"]
        if cooldown:
            full += ["--blacklist-cooldown-range", str(cooldown[0]), str(cooldown[1])]
        full += [str(c) for c in cmd]
        self.log = log
        self._out = open(log, "w")
        self.started = time.time()
        self.proc = subprocess.Popen(full, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
                                              PYTHONUNBUFFERED="1", **(env or {})))

    def workers(self, host: str, marker: str) -> list[psutil.Process]:
        """The job's worker processes on ``host`` (by HOROVOD_HOSTNAME) whose command line holds ``marker``:
        only the outermost such process of each worker (not its loader subprocesses)."""
        found = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if marker in " ".join(p.cmdline()) and p.environ().get("HOROVOD_HOSTNAME") == host:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        pids = {p.pid for p in found}
        return [p for p in found if p.ppid() not in pids]

    def kill(self, host: str, marker: str) -> int:
        """SIGKILL the worker on ``host``; returns its pid."""
        procs = self.workers(host, marker)
        assert len(procs) == 1, f"expected one worker on {host}, found {[(p.pid, p.cmdline()) for p in procs]}"
        os.kill(procs[0].pid, signal.SIGKILL)
        return procs[0].pid

    def wait(self, timeout: float):
        try:
            rc = self.proc.wait(timeout=max(timeout - (time.time() - self.started), 1))
        except subprocess.TimeoutExpired:
            stacks = self.stacks()
            self.stop()
            raise JobHung(f"elastic job timed out after {timeout} s\n{self.output()[-6000:]}\n{stacks}")
        self._out.close()
        return rc, self.output()

    def stacks(self) -> str:
        """Where each of the job's Python processes is (``py-spy dump``, Python and native frames), for
        the message of a job that hangs; empty where py-spy is not installed."""
        spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if not spy:
            return ""
        out = []
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]     # horovodrun (the elastic driver) and its workers
        except psutil.NoSuchProcess:
            return "(horovodrun has exited: no stacks)"
        for p in procs:
            try:
                cmd, name = " ".join(p.cmdline())[:160], p.name()
                if not name.startswith("python"):
                    continue
                dump = subprocess.run([spy, "dump", "--native", "--pid", str(p.pid)], capture_output=True,
                                      text=True, timeout=60)
                out.append(f"--- pid {p.pid} (parent {p.ppid()}): {cmd}\n{dump.stdout}{dump.stderr}")
            except (psutil.NoSuchProcess, psutil.AccessDenied, subprocess.TimeoutExpired) as err:
                out.append(f"--- pid {p.pid}: no stack ({type(err).__name__})")
        return "\n".join(out)

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Kill what is left of the job (its process group's members we started, by pid)."""
        if self.proc.poll() is None:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc.kill()
            self.proc.wait()
        if not self._out.closed:
            self._out.close()


def read_jsonl(paths) -> list[dict]:
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return rows


def epoch_coverage(rows, epoch: int, expected: set) -> dict:
    """How often each expected id was trained in ``epoch`` (rows: {"epoch", "ids", "workers"/"size"})."""
    counts: dict = {}
    for r in rows:
        if r["epoch"] == epoch:
            for i in r["ids"]:
                counts[i] = counts.get(i, 0) + 1
    missing = sorted(expected - set(counts), key=str)
    return {"missing": missing, "visits": sum(counts.values()), "repeats": sum(counts.values()) - len(counts),
            "unexpected": sorted(set(counts) - expected, key=str), "max": max(counts.values(), default=0)}
