"""Codec state in checkpoints: what survives a resume, and how it moves to another worker count.

A codec keeps per-parameter state (``ctx.state``): error-feedback residuals, DEF's synchronized
copy of the model, a dither stream, PowerSGD's Q, step counters (and scratch buffers, keys starting with ``_``, never saved). Part of it is per worker (residuals, dither), so a
checkpoint that resumes exactly must hold every worker's share. Three forms:

* ``local``: one worker's state, what ``optimizer.state_dict()`` carries under ``"horovod_ext"``.
  It needs no collective, so ``hvd.elastic.TorchState`` and rank-0-only saving work unchanged;
* ``all ranks``: every worker's local state, gathered by ``optimizer.gather_state_dict()`` (a
  collective) for a checkpoint that resumes bit-exactly at the same worker count;
* resharding, when a checkpoint written by n workers is loaded by n' != n: every new worker's
  residual is the mean of the n old residuals. The update still owed to the model,
  (1/n) * sum of old residuals, is then exactly what the n' new workers owe together, so nothing is
  lost or counted twice. Replicated entries (DEF's synchronized copy, step counters) come from old
  rank 0; per-worker dither streams start fresh. A warning says so.

Everything here is tensors, numbers and strings, so checkpoints load with ``weights_only=True``.
"""
from __future__ import annotations

import warnings

import torch

FORMAT = 1


def _to_saved(value, where: str):
    if isinstance(value, torch.Generator):
        return {"__generator__": str(value.device), "state": value.get_state()}
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"codec state {where} holds a {type(value).__name__}; codec state must be tensors, "
                    f"numbers, strings or torch.Generator so that checkpoints load with weights_only=True")


def _from_saved(value, device: torch.device):
    if isinstance(value, dict) and "__generator__" in value:
        gen_device = torch.device(value["__generator__"])
        if gen_device.type != "cpu":
            gen_device = device          # a CUDA generator follows its parameter to this worker's device
        gen = torch.Generator(device=gen_device)
        gen.set_state(value["state"].cpu())
        return gen
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def save_codec_states(states: dict[str, dict]) -> dict[str, dict]:
    """Per-name codec state -> a picklable, ``weights_only``-loadable copy. Keys starting with ``_``
    are a codec's scratch buffers (kept between steps only to avoid fresh allocations) and are not
    saved."""
    return {name: {k: _to_saved(v, f"{name!r}[{k!r}]") for k, v in st.items() if not k.startswith("_")}
            for name, st in states.items()}


def load_codec_states(saved: dict[str, dict], devices: dict[str, torch.device]) -> dict[str, dict]:
    """Inverse of :func:`save_codec_states`; tensors go to each parameter's device. Names not in
    ``devices`` (parameters that no longer exist) are an error naming them."""
    unknown = sorted(set(saved) - set(devices))
    if unknown:
        raise ValueError(f"checkpoint holds codec state for parameters this optimizer does not have: {unknown[:5]}"
                         f"{' ...' if len(unknown) > 5 else ''}")
    return {name: {k: _from_saved(v, devices[name]) for k, v in saved.get(name, {}).items()} for name in devices}


def replicated(codec, saved: dict[str, dict]) -> dict[str, dict]:
    """The entries of saved codec state that are the same on every worker (the codec declares the
    per-worker ones: ``per_worker_averaged``, ``per_worker_fresh``)."""
    per_worker = set(codec.per_worker_averaged) | set(codec.per_worker_fresh)
    return {name: {k: v for k, v in st.items() if k not in per_worker} for name, st in saved.items()}


def reshard(codec, per_rank: list[dict[str, dict]], old_size: int, new_size: int) -> dict[str, dict]:
    """One new worker's saved codec state from every old worker's (see the module docstring)."""
    warnings.warn(f"horovod_ext: loading codec state written by {old_size} workers into {new_size}: every worker "
                  f"takes the mean error-feedback residual of the old workers (the update still owed is kept "
                  f"exactly); per-worker dither streams start fresh", stacklevel=3)
    out: dict[str, dict] = {}
    for name in per_rank[0]:
        merged = {}
        for key, value in per_rank[0][name].items():
            if key in codec.per_worker_fresh:
                continue
            if key in codec.per_worker_averaged and isinstance(value, torch.Tensor):
                total = torch.zeros_like(value, dtype=torch.float64)
                for st in per_rank:
                    total += st[name][key].to(torch.float64)
                merged[key] = (total / len(per_rank)).to(value.dtype)
            else:
                merged[key] = value
        out[name] = merged
    return out
