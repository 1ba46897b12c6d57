"""Fail fast, not hang, when workers disagree.

Horovod matches collectives by name and waits, forever, for ops that never come: a worker with
another model (a parameter more, another shape) or other settings (another codec, pipelining on)
would hang the job. So before its first reduction, and again whenever the worker count changes,
the optimizer compares a description of what it will reduce across workers: one allgather of a
64-bit digest, and only when the digests differ, of the descriptions themselves, to name the
first difference.
"""
from __future__ import annotations

import hashlib
import json

import torch

from . import communicator


def check_workers_agree(description: dict, process_set, what: str = "hx.DistributedOptimizer") -> None:
    """Collective: raise ``ValueError`` on every worker, naming the first difference, unless every
    worker passes the same ``description`` (JSON-serialisable)."""
    if process_set.size() == 1:
        return
    digest = int.from_bytes(hashlib.sha256(json.dumps(description).encode()).digest()[:7], "big")
    digests = communicator.allgather(torch.tensor([digest], dtype=torch.int64), "hx.check.digest", process_set)
    if bool((digests == digests[0]).all()):
        return
    everyone = communicator.allgather_object(description, "hx.check.describe", process_set)
    raise ValueError(f"{what}: the workers disagree; every worker must build the same model and optimizer "
                     f"settings. {first_difference(everyone)}")


def first_difference(descriptions: list[dict]) -> str:
    ref = descriptions[0]
    for rank, d in enumerate(descriptions[1:], start=1):
        for key in ref:
            if d.get(key) == ref[key]:
                continue
            if key == "parameters":
                a = {n: (s, t) for n, s, t in ref[key]}
                b = {n: (s, t) for n, s, t in d[key]}
                only0, only_r = sorted(set(a) - set(b)), sorted(set(b) - set(a))
                if only0 or only_r:
                    return f"Parameter names differ: only on rank 0: {only0[:5]}, only on rank {rank}: {only_r[:5]}"
                diff = [n for n in a if a[n] != b[n]]
                n = diff[0]
                return (f"Parameter {n!r} has shape/dtype {a[n][0]} {a[n][1]} on rank 0 but {b[n][0]} {b[n][1]} "
                        f"on rank {rank} ({len(diff)} parameter(s) differ)")
            return f"Setting {key!r} is {ref[key]!r} on rank 0 but {d.get(key)!r} on rank {rank}"
    return "The workers' descriptions differ"
