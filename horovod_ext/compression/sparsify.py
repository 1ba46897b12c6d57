"""Sparsification with error feedback: top-k (optionally importance-weighted) and random blocks (DEF).

Error feedback keeps, per parameter name, what was not sent (the residual) and adds it to the next
gradient, so nothing is lost: sum of applied updates + residual = sum of raw gradients.

* ``TopK``: each worker sends its own k largest entries of (gradient + residual), ranked by
  magnitude or, with ``importance=True``, by magnitude times (|w| + mean|w|) (importance-weighted
  pruning; the mean term lets zero-valued weights still be chosen). Positions differ between
  workers, so values and indices travel by ``allgather`` (one int32 tensor of 2k entries) and are
  summed locally in rank order: every worker gets the same result.
* ``RandomBlock``: one contiguous block (wrapping around) of each tensor, its start drawn from a
  seed shared by all workers, so the values go through an ordinary allreduce. With
  ``detached=True`` this is DEF (Xu & Huang, ICML 2022): the optimizer updates a synchronized
  copy of the model, x~, with the averaged blocks, and the model used for the next gradient is
  x = x~ - coeff * lr * e (the residual "detached" from the update, as in the authors' code,
  where e is kept in parameter units); ``detached=False`` is classic error feedback.
"""
from __future__ import annotations

import math
import random

import torch

from .base import Compressor, ReduceContext, Reduction, scale_for_op
from .quantize import _stable_hash


def _count(numel: int, ratio: float) -> int:
    return min(numel, max(1, math.ceil(ratio * numel)))


def _check_ratio(kind: str, ratio: float) -> float:
    if not (0.0 < float(ratio) <= 1.0):
        raise ValueError(f"{kind}: ratio must be in (0, 1], got {ratio!r}")
    return float(ratio)


def _with_residual(grad: torch.Tensor, ctx: ReduceContext, error_feedback: bool) -> torch.Tensor:
    acc = grad.detach().reshape(-1).to(torch.float32).clone()
    if error_feedback:
        res = ctx.state.get("residual")
        if res is not None:
            acc += res
    return acc


class TopK(Compressor):
    def __init__(self, ratio: float, importance: bool = False, error_feedback: bool = True):
        self.ratio = _check_ratio("topk", ratio)
        self.importance = importance
        self.error_feedback = error_feedback
        self.label = f"topk{self.ratio:g}" + ("-imp" if importance else "") + ("-ef" if error_feedback else "")

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> Reduction:
        n = ctx.size
        with ctx.compressing():
            acc = _with_residual(grad, ctx, self.error_feedback)
            numel = acc.numel()
            k = _count(numel, self.ratio)
            score = acc.abs()
            if self.importance and ctx.param is not None:
                w = ctx.param.detach().reshape(-1).abs().to(torch.float32)
                score = score * (w + w.mean())
            idx = torch.topk(score, k, sorted=False).indices
            vals = acc[idx]
            if self.error_feedback:
                acc[idx] = 0.0
                ctx.state["residual"] = acc
            payload = torch.cat([idx.to(torch.int32), vals.view(torch.int32)])
        gathered = yield ctx.comm.allgather(payload, name=ctx.op_name("topk"))
        with ctx.decompressing():
            gathered = gathered.view(n, 2 * k)
            all_idx = gathered[:, :k].reshape(-1).to(torch.int64)
            all_vals = gathered[:, k:].contiguous().view(torch.float32).reshape(-1)
            out = torch.zeros(numel, dtype=torch.float32)
            out.index_add_(0, all_idx, all_vals)
            return scale_for_op(out, ctx).to(grad.dtype).view_as(grad)


class RandomBlock(Compressor):
    def __init__(self, ratio: float, detached: bool = True, coeff: float = 0.3, seed: int = 0,
                 error_feedback: bool = True):
        self.ratio = _check_ratio("random_block", ratio)
        self.detached = detached
        self.coeff = float(coeff)
        self.seed = int(seed)
        self.error_feedback = error_feedback or detached
        self.label = f"random_block{self.ratio:g}" + ("-def" if detached else ("-ef" if self.error_feedback else ""))

    def block(self, name: str, step: int, numel: int) -> torch.Tensor:
        """Indices of the block for ``name`` at ``step``: identical on every worker."""
        size = _count(numel, self.ratio)
        start = random.Random(f"{self.seed}:{_stable_hash(name)}:{step}").randrange(numel)
        return (torch.arange(start, start + size) % numel)

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> Reduction:
        with ctx.compressing():
            acc = _with_residual(grad, ctx, self.error_feedback)
            step = ctx.state.get("step", 0)
            ctx.state["step"] = step + 1
            idx = self.block(ctx.name, step, acc.numel())
            msg = acc[idx].clone()
            if self.error_feedback:
                acc[idx] = 0.0
                ctx.state["residual"] = acc
        reduced = yield ctx.comm.allreduce_(msg, name=ctx.op_name("block"), op=ctx.op)
        with ctx.decompressing():
            out = torch.zeros(acc.numel(), dtype=torch.float32)
            out[idx] = reduced
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
