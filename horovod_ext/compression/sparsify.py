"""Sparsification with error feedback: top-k (optionally importance-weighted) and random blocks (DEF).

Error feedback keeps, per parameter name, what was not sent (the residual) and adds it to the next
gradient, so nothing is lost: sum of applied updates + residual = sum of raw gradients.

* ``TopK``: each worker sends its own k largest entries of (gradient + residual), ranked by
  magnitude or, with ``importance=True``, by magnitude times (|w| + mean|w|) (importance-weighted
  pruning; the mean term lets zero-valued weights still be chosen). Positions differ between
  workers, so values and indices travel by ``allgather`` (one int32 tensor: the k values' bits, then
  the k indices) and are summed locally in rank order: every worker gets the same result.
  The k largest are found without a full ``torch.topk`` over every element on the CPU (see
  :func:`topk_indices`): a threshold from a sample, then the exact top k among the candidates.
* ``RandomBlock``: one contiguous block (wrapping around) of each tensor, its start drawn from a
  seed shared by all workers, so the values go through an ordinary allreduce. With
  ``detached=True`` this is DEF (Xu & Huang, ICML 2022): the optimizer updates a synchronized
  copy of the model, x~, with the averaged blocks, and the model used for the next gradient is
  x = x~ - coeff * D(e), the residual "detached" from the update; ``detached=False`` is classic
  error feedback. ``TopK`` uses the same DEF by default (``detached=False``: classic error feedback).

DEF and the wrapped optimizer. D(e) is the displacement the wrapped optimizer makes for a gradient
mass e (read from the parameter's param group in the step hooks), so that coeff keeps one meaning:

* SGD (a group with ``momentum``): D(e) = lr * (1 - dampening) / (1 - momentum) * e, which is
  lr * e without momentum (DEF's original rule, unchanged). A gradient that enters a heavy-ball
  buffer moves the parameters lr / (1 - momentum) times itself in total; with lr alone, momentum 0.9
  made the perturbation 10 times too small.
* Adam family (a group with ``betas``) and RMSprop (``alpha``): D(e) = lr * e / (sqrt(s) + eps)
  (RMSprop: divided by 1 - momentum too), s being this worker's own running mean of squared
  gradients (the codec's estimate of the optimizer's second moment; state ``grad_sq``). Adam moves
  each coordinate by about lr per step whatever the gradient's scale, so in its units a residual of
  e is e / sqrt(s) steps of lr.
* anything else: D(e) = lr * e.

The wrapped optimizer keeps its own momentum and moments; nothing in it is changed (no momentum
correction in the codec, as DGC's, which would need the optimizer's momentum switched off: measured,
it did no better for top-k and worse for random block). Each worker's parameters are its own x (they
differ between workers by coeff * D(e)); x~ is ``state["synced"]``. Classic error feedback is as it
was: under Adam a residual sent after many steps arrives as one burst, which Adam normalizes to about
one step, so rarely sent coordinates move slowly. Final loss against fp32 in the convergence
benchmark (mean of seeds 0-2): SGD momentum 0.9, random block 1% +4.2% with lr units, +0.6% with
these; top-k 1% +0.8% (error feedback), -1.2% (DEF). Adam: random block +11.3% -> +3.2%; top-k +3.5%
(error feedback), -1.2% (DEF).

Precision and devices: gradient + residual is accumulated, kept and sent in float32, or float64 for
float64 gradients; every tensor is made on the gradient's device, and no value is read by the host
(on the CPU, where that costs nothing, top-k's selection counts its candidates).

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

State (per parameter name, all tensors but ``step``): ``residual``, ``grad_sq`` and ``grad_sq_norm``
are per worker (averaged when a checkpoint moves to another worker count); ``synced`` (DEF's x~) and
``step`` (random_block's block counter, a number) are the same on every worker. ``grad_sq`` (the
running mean) and ``grad_sq_norm`` (its 0-dim bias-correction weight) exist only under DEF with an
adaptive optimizer: the first compression starts them, and the first step's hook drops them for any
other optimizer, so SGD pays no memory for them.
"""
from __future__ import annotations

import math
import random

import numpy as np
import torch
from horovod.common.exceptions import HorovodInternalError

from ..finite import all_finite, where_
from .base import Compressor, ReduceContext, ReduceGenerator, scale_for_op, stable_hash
from . import sparse_allreduce
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
    flat, work = grad.detach().reshape(-1), _work_dtype(grad)
    res = ctx.state.get("residual") if error_feedback else None
    if res is None:
        return flat.to(work, copy=True)
    # one pass (the sum in the working dtype, as a copy followed by += would give)
    return torch.add(flat, res.to(device=flat.device, dtype=work))


def _poison_if_nonfinite(ok: torch.Tensor, sent: torch.Tensor) -> None:
    """Replace ``sent[0]`` by NaN unless ``ok`` (a 0-dim bool: the local input was finite); no host sync."""
    if sent.numel():
        sent[:1].masked_fill_(~ok, float("nan"))


def _commit_residual(ctx: ReduceContext, new: torch.Tensor, ok: torch.Tensor):
    """Store ``new`` as the residual if ``ok`` (this worker's gradient + residual was finite), else keep
    the old one (no host sync). Done while compressing, so a pipelined next step reads it in order.
    Returns the residual from before the call (None if there was none), for :func:`_undo_if_skipped`."""
    old = ctx.state.get("residual")
    if old is not None:
        old = old.to(device=new.device, dtype=new.dtype)
    where_(ok, new, 0.0 if old is None else old)
    ctx.state["residual"] = new
    return old


def _undo_if_skipped(ctx: ReduceContext, stored: torch.Tensor, old, reduced: torch.Tensor) -> None:
    """After the reduction: a non-finite ``reduced`` (the same on every worker) means the step is skipped
    everywhere, so put the residual from before the call back (no host sync), unless a later
    reduction of this tensor has replaced the stored one already (pipelining)."""
    if ctx.state.get("residual") is not stored:
        return
    where_(all_finite(reduced), stored, 0.0 if old is None else old)


# ---- top-k selection ---------------------------------------------------------------------------------
#: below this many elements (or when k is above n / _SAMPLE_MAX_FRACTION), a full torch.topk
_SAMPLE_MIN_NUMEL = 1 << 16
_SAMPLE_MAX_FRACTION = 16
#: expected sample elements above the threshold; the threshold is taken _SAMPLE_SIGMAS standard
#: deviations lower, so fewer than k candidates (the full-topk fallback) is a ~3e-5 event
_SAMPLE_HITS = 256
_SAMPLE_SIGMAS = 4.0
_GOLDEN = 0.6180339887498949


def _sample_positions(n: int, m: int, device) -> torch.Tensor:
    """``m`` positions spread over ``range(n)`` by the golden-ratio sequence: no RNG and no state, and
    not aligned with any row length (an integer stride would sample one column of a matrix)."""
    j = torch.arange(m, dtype=torch.float64, device=device)
    return ((j * _GOLDEN) % 1.0 * n).to(torch.int64).clamp_(max=n - 1)


def _at_or_above(score: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Indices (int64) of the entries of the 1-D CPU ``score`` at or above ``threshold``. NumPy's
    compare and ``flatnonzero`` take about 0.8 ms for 2M float32 elements against 3-4 ms for torch's
    ``nonzero(score >= t)`` on one core here (docs/benchmarks.md, codec figures); other dtypes use torch."""
    if score.dtype in (torch.float32, torch.float64) and score.is_contiguous():
        arr = score.detach().numpy()
        return torch.from_numpy(np.flatnonzero(arr >= arr.dtype.type(threshold.item())))
    return torch.nonzero(score >= threshold).squeeze(1)


def topk_indices(score: torch.Tensor, k: int, method: str = "auto") -> torch.Tensor:
    """Indices of the ``k`` largest entries of the 1-D ``score``: the set ``torch.topk`` returns (ties
    may be broken differently), in no particular order, always exactly ``k`` of them.

    ``method="sample"`` (what ``"auto"`` picks on the CPU for tensors of 65,536 elements or more when
    both k and the sample are at most n / 16, that is 4,096 <= k <= n / 16), as in
    DGC: estimate the k-th largest value from a sample of m = n * _SAMPLE_HITS / k elements, lowered
    by 4 standard deviations of the sample count, take every entry at or above it (about 1.25 k
    candidates at k = 1%; one compare and one compaction over the tensor), and ``torch.topk`` among
    those. Every entry left out is below every candidate, so when there are at least k candidates the
    top k of the candidates is the top k of the tensor; with fewer (a sample that misjudged the
    threshold, or NaN: the caller's finiteness check) it falls back to the full ``torch.topk``.
    ``"full"`` is the full ``torch.topk``. On accelerators ``"auto"`` is ``"full"``: counting the
    candidates would read a value on the host, and their ``topk`` is fast there."""
    n = score.numel()
    m = min(n, math.ceil(_SAMPLE_HITS * n / k))
    if method == "auto":
        method = ("sample" if score.device.type == "cpu" and n >= _SAMPLE_MIN_NUMEL
                  and k * _SAMPLE_MAX_FRACTION <= n and m * _SAMPLE_MAX_FRACTION <= n else "full")
    if method == "sample":
        hits = m * k / n
        j = min(m, max(1, math.ceil(hits + _SAMPLE_SIGMAS * math.sqrt(hits)) + 1))
        sample = score.index_select(0, _sample_positions(n, m, score.device))   # (faster than score[...])
        threshold = torch.topk(sample, j, sorted=False).values.min()
        cand = _at_or_above(score, threshold)
        if cand.numel() >= k:
            return cand.index_select(0, torch.topk(score.index_select(0, cand), k, sorted=False).indices)
    elif method != "full":
        raise ValueError(f"topk_indices: method must be 'auto', 'sample' or 'full', got {method!r}")
    return torch.topk(score, k, sorted=False).indices


# ---- DEF -------------------------------------------------------------------------------------------------
_GRAD_SQ_DECAY = 0.999


def _adaptive(group: dict) -> bool:
    """An Adam-family optimizer (Adam, AdamW, NAdam, RAdam, Adamax: ``betas``) or RMSprop (``alpha``):
    each coordinate's step is its gradient divided by the root of a running mean of its squares."""
    return "eps" in group and ("betas" in group or ("alpha" in group and "centered" in group))


def _track_grad_sq(ctx: ReduceContext, grad: torch.Tensor, ok: torch.Tensor):
    """DEF: update this worker's running mean of squared gradients, its estimate of an adaptive
    optimizer's second moment: an exponential mean (decay 0.999) with Adam's bias correction, so that
    it is the weighted mean of the samples so far (``grad_sq``) and ``grad_sq_norm`` = 1 - 0.999^t.
    A residual of t gradients then comes to at most about t steps of lr in Adam's units.

    Tracked from the first compression (the optimizer is known only from the first step's hook,
    which drops both keys unless the optimizer is adaptive). No host sync: a non-finite gradient
    leaves both as they were. Returns what :func:`_undo_grad_sq` needs (None when not tracked)."""
    state = ctx.state
    if "grad_sq" not in state and "residual" in state:
        return None                           # not adaptive (dropped by the step hook)
    g = grad.detach().reshape(-1).to(_work_dtype(grad))
    sq, norm = state.get("grad_sq"), state.get("grad_sq_norm")
    if sq is None or sq.numel() != g.numel():
        sq, norm = torch.zeros_like(g), g.new_zeros(())
    else:
        sq, norm = sq.to(device=g.device, dtype=g.dtype), norm.to(device=g.device, dtype=g.dtype)
    new_norm = norm * _GRAD_SQ_DECAY + (1.0 - _GRAD_SQ_DECAY)
    new = where_(ok, torch.lerp(sq, g * g, (1.0 - _GRAD_SQ_DECAY) / new_norm), sq)
    new_norm = torch.where(ok, new_norm, norm)
    state["grad_sq"], state["grad_sq_norm"] = new, new_norm
    return new, new_norm, sq, norm


def _undo_grad_sq(ctx: ReduceContext, tracked, reduced: torch.Tensor) -> None:
    """As :func:`_undo_if_skipped` for the running mean: a non-finite result (a step skipped on every
    worker) puts the mean from before the call back, unless a later reduction replaced it."""
    if tracked is None:
        return
    new, new_norm, old, old_norm = tracked
    if ctx.state.get("grad_sq") is not new:
        return
    ok = all_finite(reduced)
    where_(ok, new, old)
    torch.where(ok, new_norm, old_norm, out=new_norm)


class _Detached:
    """DEF's step hooks (see the module docstring), shared by RandomBlock and TopK: ``detached`` and
    ``coeff`` attributes. The optimizer steps x~; this worker's model is x = x~ - coeff * D(e)."""

    detached: bool
    coeff: float
    per_worker_averaged = ("residual", "grad_sq", "grad_sq_norm")

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
        if not _adaptive(group):
            state.pop("grad_sq", None)
            state.pop("grad_sq_norm", None)
        self._perturb(param, state, group)

    def on_load(self, param: torch.Tensor, state: dict, group: dict) -> None:
        # A checkpoint holds one worker's (perturbed) model; each worker's own x comes from x~ and its e.
        if self.detached and "synced" in state:
            param.data.copy_(state["synced"])
            self._perturb(param, state, group)

    def _perturb(self, param: torch.Tensor, state: dict, group: dict) -> None:
        """x = x~ - coeff * D(e), D in the wrapped optimizer's units (``param`` holds x~)."""
        res = state.get("residual")
        if res is None or not self.coeff:
            return
        momentum = group.get("momentum") or 0.0
        if _adaptive(group):
            sq, norm = state.get("grad_sq"), state.get("grad_sq_norm")
            if sq is None or sq.numel() != param.numel():
                return                          # no second-moment estimate: x = x~
            # in the residual's (working) dtype: a float16 sqrt(s) + eps would underflow to 0
            den = sq.to(res.device).view_as(param).sqrt().add_(group["eps"])
            den.masked_fill_(norm.to(den.device) <= 0, math.inf)     # no finite sample yet: x = x~
            step = res.view_as(param) / den
            param.data.add_(step.to(param.dtype), alpha=-self.coeff * group["lr"] / (1.0 - momentum))
            return
        scale = group["lr"]
        if momentum:
            scale = scale * (1.0 - (group.get("dampening") or 0.0)) / (1.0 - momentum)
        param.data.add_(res.view_as(param).to(param.dtype), alpha=-self.coeff * scale)


class TopK(_Detached, Compressor):
    reads_input_later = False     # gradient + residual is copied in the first phase
    uses_out = True
    TRANSPORTS = ("allgather", "sparse_allreduce")

    def __init__(self, ratio: float, importance: bool = False, error_feedback: bool = True,
                 detached: bool | None = None, coeff: float = 0.3, transport: str = "allgather"):
        if transport not in self.TRANSPORTS:
            raise ValueError(f"topk transport must be one of {self.TRANSPORTS}, got {transport!r}")
        self.transport = transport
        self.ratio = _check_ratio("topk", ratio)
        self.importance = importance
        self.detached = bool(error_feedback if detached is None else detached)    # DEF unless told otherwise
        self.error_feedback = error_feedback or self.detached
        self.coeff = float(coeff)
        self.label = (f"topk{self.ratio:g}" + ("-imp" if importance else "")
                      + ("" if self.detached else "-ef" if self.error_feedback else "-noef")
                      + (f"-c{self.coeff:g}" if self.detached and self.coeff != 0.3 else "")
                      + ("-sar" if transport == "sparse_allreduce" else ""))
        self._select = "auto"       # topk_indices' method ("full": the plain torch.topk; benchmarks)

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
            ok = all_finite(acc)
            method = self._select
            if method == "auto" and acc.device.type == "cpu" and not bool(ok):
                method = "full"     # NaN: keep torch.topk's choice (NaN ranks highest); on the CPU, no sync
            idx = topk_indices(score, k, method)
            vals = acc.index_select(0, idx)
            tracked = _track_grad_sq(ctx, grad, ok) if self.detached else None
            _poison_if_nonfinite(ok, vals)
            if self.error_feedback:
                acc.index_fill_(0, idx, 0.0)
                old = _commit_residual(ctx, acc, ok)
            sar = self.transport == "sparse_allreduce" and sparse_allreduce.applies(n)
            if not sar:
                wk = vals.view(torch.int32).numel()           # k, or 2k for float64 values
                payload = torch.cat([vals.view(torch.int32), idx.to(torch.int32)])
        if sar:
            try:
                mode, s_idx, s_vals = yield from sparse_allreduce.recursive_doubling(idx, vals, numel, ctx, "topk")
            except HorovodInternalError as err:
                reraise_collective_error(self.label, "alltoall", err)
            received = s_vals
            fill = (lambda out: out.copy_(s_vals)) if mode == sparse_allreduce.DENSE \
                else (lambda out: out.index_put_((s_idx,), s_vals))
        else:
            try:
                gathered = yield ctx.comm.allgather(payload, name=ctx.op_name("topk"))
            except HorovodInternalError as err:
                reraise_collective_error(self.label, "allgather", err)
            with ctx.decompressing():
                gathered = gathered.view(n, payload.numel())
                # values first: each row's values start at a multiple of the row length, aligned for float64
                received = gathered[:, :wk].reshape(-1).view(acc.dtype)
                all_idx = gathered[:, wk:].reshape(-1).to(torch.int64)
            fill = lambda out: out.index_add_(0, all_idx, received)      # noqa: E731
        with ctx.decompressing():
            dest = ctx.output(acc.dtype)
            out = acc.new_zeros(numel) if dest is None else dest.view(-1).zero_()
            fill(out)
            if self.error_feedback:
                _undo_if_skipped(ctx, acc, old, received)
            _undo_grad_sq(ctx, tracked, received)
            scale_for_op(out, ctx)
            return dest if dest is not None else out.to(grad.dtype).view_as(grad)


class RandomBlock(_Detached, Compressor):
    reads_input_later = False     # gradient + residual is copied in the first phase
    uses_out = True

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
            ok = all_finite(acc)
            _poison_if_nonfinite(ok, msg)
            tracked = _track_grad_sq(ctx, grad, ok) if self.detached else None
            if self.error_feedback:
                head.zero_()
                acc[:wrap].zero_()
                old = _commit_residual(ctx, acc, ok)
        reduced = yield ctx.comm.allreduce_(msg, name=ctx.op_name("block"), op=ctx.op)
        with ctx.decompressing():
            dest = ctx.output(acc.dtype)
            out = acc.new_zeros(numel) if dest is None else dest.view(-1)
            if dest is not None:                     # zero all but the block, which is written next
                out[start + size - wrap:].zero_()
                out[wrap:start].zero_()
            out[start:start + size - wrap] = reduced[:size - wrap]
            if wrap:
                out[:wrap] = reduced[size - wrap:]
            if self.error_feedback:
                _undo_if_skipped(ctx, acc, old, reduced)
            _undo_grad_sq(ctx, tracked, reduced)
            return dest if dest is not None else out.to(grad.dtype).view_as(grad)
