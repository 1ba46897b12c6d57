"""Sparsification with error feedback: top-k (optionally importance-weighted) and random blocks (DEF).

Error feedback keeps, per parameter name, what was not sent (the residual) and adds it to the next
gradient, so nothing is lost: sum of applied updates + residual = sum of raw gradients.

* ``TopK``: each worker sends its own k largest entries of (gradient + residual), ranked by
  magnitude or, with ``importance=True``, by magnitude times (|w| + mean|w|) (importance-weighted
  pruning; the mean term lets zero-valued weights still be chosen). Positions differ between
  workers, so values and indices travel by ``allgather`` (one int32 tensor: the k values' bits, then
  the k indices) and are summed locally in rank order: every worker gets the same result.
* ``RandomBlock``: one contiguous block (wrapping around) of each tensor, its start drawn from a
  seed shared by all workers, so the values go through an ordinary allreduce. With
  ``detached=True`` this is DEF (Xu & Huang, ICML 2022): the optimizer updates a synchronized
  copy of the model, x~, with the averaged blocks, and the model used for the next gradient is
  x = x~ - coeff * lr * e (the residual "detached" from the update, as in the authors' code,
  where e is kept in parameter units); ``detached=False`` is classic error feedback.

Precision and devices: gradient + residual is accumulated, kept and sent in float32, or float64 for
float64 gradients; every tensor is made on the gradient's device, and no value is read by the host.

Non-finite values: when a worker's gradient + residual holds NaN/Inf, the entry it would have sent
may not be among the selected ones, so the first value it sends is replaced by NaN (on the device, no
host sync): every worker's result then holds a NaN. The residual is stored while compressing, not
when the reduction ends, so that with pipelining step t+1 reads step t's residual, in order; a worker
whose own gradient + residual was not finite stores its residual from before the call. When the
reduction ends with a non-finite result (identical on every worker, so the step is skipped
everywhere), every worker puts its residual from before the call back, so the skipped step leaves
the state as it was on every worker: exactly so unless a later reduction of the same tensor has
already read the stored residual (pipelining), in which case only the worker with the non-finite
input kept its old one and the others keep their unsent remainder (the sent part is dropped with the
skipped step). Until the reduction ends, the residual from before the call stays referenced (one more
residual-sized tensor per tensor in flight). The block step counter of random_block still advances
(identically on every worker).

``hvd.join()`` (Horovod 0.28.1: a joined rank adds zeros to allreduces, Average divides by the full
size; allgather is refused):

* ``random_block`` (EF and DEF) is one allreduce: while ranks have joined, the active ranks get exactly
  ``hvd.allreduce(op=...)`` of their blocks. A joined rank does not run the codec, so its block step
  counter (and DEF's synchronized copy, like the model itself) falls behind; after every rank has
  joined, bring the joined ranks' codec state up to date with the model (Horovod's pattern: broadcast
  from the rank ``hvd.join()`` returns), or the workers would pick different blocks.
* ``topk`` needs an allgather: it cannot reduce while a rank has joined. When the scheduler passes
  Horovod's error into the codec, it raises :class:`~horovod_ext.compression.cast.JoinNotSupportedError`
  naming the codec.

Both work on any process set (rank and size are the process set's; allgather is in process-set rank
order).
"""
from __future__ import annotations

import math
import random

import torch
from horovod.common.exceptions import HorovodInternalError

from .base import Compressor, ReduceContext, ReduceGenerator, scale_for_op, stable_hash
from .cast import reraise_collective_error


def _count(numel: int, ratio: float) -> int:
    return min(numel, max(1, math.ceil(ratio * numel)))


def _check_ratio(kind: str, ratio: float) -> float:
    if not (0.0 < float(ratio) <= 1.0):
        raise ValueError(f"{kind}: ratio must be in (0, 1], got {ratio!r}")
    return float(ratio)


def _work_dtype(grad: torch.Tensor) -> torch.dtype:
    return torch.float64 if grad.dtype == torch.float64 else torch.float32


def _with_residual(grad: torch.Tensor, ctx: ReduceContext, error_feedback: bool) -> torch.Tensor:
    """A fresh flat copy of gradient + residual in the working dtype, on the gradient's device."""
    acc = grad.detach().reshape(-1).to(_work_dtype(grad), copy=True)
    if error_feedback:
        res = ctx.state.get("residual")
        if res is not None:
            acc += res.to(device=acc.device, dtype=acc.dtype)
    return acc


def _poison_if_nonfinite(ok: torch.Tensor, sent: torch.Tensor) -> None:
    """Replace ``sent[0]`` by NaN unless ``ok`` (a 0-dim bool: the local input was finite); no host sync."""
    if sent.numel():
        sent[:1].masked_fill_(~ok, float("nan"))


def _commit_residual(ctx: ReduceContext, new: torch.Tensor, ok: torch.Tensor):
    """Store ``new`` as the residual if ``ok`` (this worker's gradient + residual was finite), else keep
    the old one (no host sync). Done while compressing, so a pipelined next step reads it in order.
    Returns the residual from before the call (None if there was none), for :func:`_undo_if_skipped`."""
    old = ctx.state.get("residual")
    if old is None:
        new.masked_fill_(~ok, 0.0)
    else:
        old = old.to(device=new.device, dtype=new.dtype)
        torch.where(ok, new, old, out=new)
    ctx.state["residual"] = new
    return old


def _undo_if_skipped(ctx: ReduceContext, stored: torch.Tensor, old, reduced: torch.Tensor) -> None:
    """After the reduction: a non-finite ``reduced`` (the same on every worker) means the step is skipped
    everywhere, so put the residual from before the call back (no host sync), unless a later
    reduction of this tensor has replaced the stored one already (pipelining)."""
    if ctx.state.get("residual") is not stored:
        return
    ok = torch.isfinite(reduced).all()
    if old is None:
        stored.masked_fill_(~ok, 0.0)
    else:
        torch.where(ok, stored, old, out=stored)


class TopK(Compressor):
    def __init__(self, ratio: float, importance: bool = False, error_feedback: bool = True):
        self.ratio = _check_ratio("topk", ratio)
        self.importance = importance
        self.error_feedback = error_feedback
        self.label = f"topk{self.ratio:g}" + ("-imp" if importance else "") + ("" if error_feedback else "-noef")

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        n = ctx.size
        with ctx.compressing():
            acc = _with_residual(grad, ctx, self.error_feedback)
            numel = acc.numel()
            k = _count(numel, self.ratio)
            score = acc.abs()
            if self.importance and ctx.param is not None:
                w = ctx.param.detach().reshape(-1).abs().to(device=acc.device, dtype=acc.dtype)
                score = score * (w + w.mean())
            idx = torch.topk(score, k, sorted=False).indices
            vals = acc[idx]
            ok = torch.isfinite(acc).all()
            _poison_if_nonfinite(ok, vals)
            if self.error_feedback:
                acc[idx] = 0.0
                old = _commit_residual(ctx, acc, ok)
            wk = vals.view(torch.int32).numel()           # k, or 2k for float64 values
            payload = torch.cat([vals.view(torch.int32), idx.to(torch.int32)])
        try:
            gathered = yield ctx.comm.allgather(payload, name=ctx.op_name("topk"))
        except HorovodInternalError as err:
            reraise_collective_error(self.label, "allgather", err)
        with ctx.decompressing():
            gathered = gathered.view(n, payload.numel())
            # values first: each row's values start at a multiple of the row length, aligned for float64
            all_vals = gathered[:, :wk].reshape(-1).view(acc.dtype)
            all_idx = gathered[:, wk:].reshape(-1).to(torch.int64)
            out = acc.new_zeros(numel)
            out.index_add_(0, all_idx, all_vals)
            if self.error_feedback:
                _undo_if_skipped(ctx, acc, old, all_vals)
            return scale_for_op(out, ctx).to(grad.dtype).view_as(grad)


class RandomBlock(Compressor):
    def __init__(self, ratio: float, detached: bool = True, coeff: float = 0.3, seed: int = 0,
                 error_feedback: bool = True):
        self.ratio = _check_ratio("random_block", ratio)
        self.detached = detached
        self.coeff = float(coeff)
        self.seed = int(seed)
        self.error_feedback = error_feedback or detached
        self.label = (f"random_block{self.ratio:g}" + ("" if detached else "-ef" if self.error_feedback else "-noef")
                      + (f"-c{self.coeff:g}" if self.coeff != 0.3 else "") + (f"-s{self.seed}" if self.seed else ""))

    def span(self, name: str, step: int, numel: int) -> tuple[int, int]:
        """(start, length) of the block for ``name`` at ``step`` (it wraps around): identical on every worker."""
        size = _count(numel, self.ratio)
        start = random.Random(f"{self.seed}:{stable_hash(name)}:{step}").randrange(numel)
        return start, size

    def block(self, name: str, step: int, numel: int, device=None) -> torch.Tensor:
        """Indices of the block for ``name`` at ``step`` (on ``device``, default the CPU)."""
        start, size = self.span(name, step, numel)
        return torch.arange(start, start + size, device=device if device is not None else "cpu") % numel

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        with ctx.compressing():
            acc = _with_residual(grad, ctx, self.error_feedback)
            numel = acc.numel()
            step = ctx.state.get("step", 0)
            ctx.state["step"] = step + 1
            start, size = self.span(ctx.name, step, numel)
            wrap = max(0, start + size - numel)       # the block's part at the tensor's start
            head = acc[start:start + size - wrap]
            msg = torch.cat([head, acc[:wrap]]) if wrap else head.clone()
            ok = torch.isfinite(acc).all()
            _poison_if_nonfinite(ok, msg)
            if self.error_feedback:
                head.zero_()
                acc[:wrap].zero_()
                old = _commit_residual(ctx, acc, ok)
        reduced = yield ctx.comm.allreduce_(msg, name=ctx.op_name("block"), op=ctx.op)
        with ctx.decompressing():
            out = acc.new_zeros(numel)
            out[start:start + size - wrap] = reduced[:size - wrap]
            if wrap:
                out[:wrap] = reduced[size - wrap:]
            if self.error_feedback:
                _undo_if_skipped(ctx, acc, old, reduced)
            return out.to(grad.dtype).view_as(grad)

    # DEF: the wrapped optimizer steps the synchronized model x~; the worker then computes its
    # next gradient at x~ - coeff * lr * e.
    def before_step(self, param: torch.Tensor, state: dict, group: dict) -> None:
        if self.detached and "synced" in state:
            param.data.copy_(state["synced"])

    def after_step(self, param: torch.Tensor, state: dict, group: dict) -> None:
        if not self.detached:
            return
        synced = state.get("synced")
        if synced is None:
            synced = state["synced"] = param.detach().clone()
        else:
            synced.copy_(param.detach())
        res = state.get("residual")
        if res is not None and self.coeff:
            param.data.add_(res.view_as(param).to(param.dtype), alpha=-self.coeff * group["lr"])

    def on_load(self, param: torch.Tensor, state: dict, group: dict) -> None:
        # A checkpoint holds one worker's (perturbed) model; each worker's own x comes from x~ and its e.
        if self.detached and "synced" in state:
            param.data.copy_(state["synced"])
            res = state.get("residual")
            if res is not None and self.coeff:
                param.data.add_(res.view_as(param).to(param.dtype), alpha=-self.coeff * group["lr"])
