"""PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019): rank-r gradient compression, allreduce only.

The algorithm is that of PyTorch DDP's ``powerSGD_hook`` (``torch.distributed.algorithms.
ddp_comm_hooks.powerSGD_hook``), per tensor instead of per DDP bucket, on Horovod collectives, so it
runs on Gloo, NCCL and MPI. A gradient of shape (n, ...) is viewed as the n x m matrix (m = numel/n;
a conv weight (out, in, kh, kw) is out x (in*kh*kw), as in DDP). Per tensor and step, with
r = min(rank, n, m):

1. M = grad + residual (error feedback; float32 work dtype, float64 for float64 gradients);
2. Q (m x r) is the previous step's Q (warm start), or on the first step a standard-normal draw from
   a CPU ``torch.Generator`` seeded with ``(seed * 1_000_003 + stable_hash(name)) % 2**63`` (the same
   on every worker; see :meth:`PowerSGD.initial_q`), copied to the gradient's device once;
   Q is orthonormalized;
3. P = M Q (n x r); P is allreduced (``hvd.Sum``: its scale does not matter, it is orthonormalized
   next) and orthonormalized;
4. Q = M^T P; Q is allreduced (``hvd.Sum``) and, for ``op=hvd.Average``, divided by the worker count
   (as DDP divides by the world size); for ``op=hvd.Sum`` it stays a sum;
5. the result is P Q^T: the projection of the average (or the sum) of the workers' M onto the span
   of P, identical on every worker; the residual is the local M minus that result (as in DDP's
   hook), and the allreduced Q (the same on every worker) is kept for the next step.

A tensor is sent as a plain allreduce (``op=ctx.op``, of a copy in the work dtype, with Horovod's
pre/post scale factors, like ``none``) when it is 1-D (biases, norms) or 0-D, empty, or not worth
compressing: (n + m) * r * ``min_compression_rate`` >= n * m (DDP's ``_should_compress``; the
default rate 2, as DDP's). Such a tensor has no residual (whatever a residual held, e.g. after a
checkpoint from another codec, is added to it and dropped) and no Q.

Orthogonalization: Householder QR (``torch.linalg.qr``, reduced), as DDP's hook does for rank > 2,
for every rank. It gives columns orthonormal to working precision even when M is rank-deficient (the
gradient of a Linear layer from one sample is rank 1): one-pass Gram-Schmidt, which DDP uses for
rank <= 2, then leaves rounding-noise columns that are not orthogonal to the others, and P P^T M
counts the dominant direction twice. A zero column needs no epsilon (QR completes the basis). QR of
the same input on the same kind of device gives the same output, and every worker orthonormalizes
the same allreduced P and the same (allreduced) Q, so the workers agree. Non-finite values are not
left to LAPACK or cuSOLVER: a non-finite input is replaced by zeros before QR and the output is set
to NaN after it.

Non-finite values: when a worker's M holds NaN/Inf, the first value of its P is replaced by NaN (on
the device, no host sync): the allreduced P then holds a NaN on every worker, P is orthonormalized
to all-NaN, and every worker's result is all-NaN. The optimizer sees the same NaN everywhere and
applies its policy (``nonfinite``: raise or skip). When a result is not finite (identical on every
worker), every worker keeps the residual and the Q from before the call: the skipped step leaves the
codec state as it was. Without a previous Q, the initial draw is kept.

Pipelining (``ctx.slot``: the reductions of two steps in flight). The residual and the new Q depend on
the allreduced P and Q, so PowerSGD cannot store them while compressing, as the sparsifiers do; and
step t+1 starts compressing (during its backward) while step t's reduction may still be on the wire.
Reading "the latest" residual and Q would then depend on timing, and the workers could differ. So
each slot keeps its own residual and Q (slot 0: ``residual`` and ``q``; slot 1: ``residual@1`` and
``q@1``): step t reads what step t-2 stored, which ``synchronize()`` has waited for. These are two
interleaved error-feedback chains, each exact (applied updates + both residuals = sum of gradients),
and warm start uses the Q of two steps before. A reduction takes its slot's residual out of the state
while compressing and stores the new one when it ends (it is put back if the reduction is abandoned
or fails), so ``release()`` can never hand over a residual that a reduction in flight has already
added. Without pipelining (slot None) the slot-1 entries, if a pipelined run left any, are folded
into the slot-0 ones on the next step.

State (``ctx.state``, all tensors on the parameter's device): ``residual`` / ``residual@1`` (flat,
work dtype; per worker, averaged when a checkpoint moves to another worker count) and ``q`` /
``q@1`` (m x r, work dtype; replicated). No RNG is kept.

Devices and host syncs: every tensor is made on the gradient's device; the codec reads no value on
the host (non-finite handling is by masks on the device; the only host-to-device copy is each tensor's
first Q, once). On CUDA, QR runs on torch's linear-algebra backend (cuSOLVER by default); that path
has not been measured for host syncs here. Cost per step and tensor: two matmuls with M, two small
QRs (n x r and m x r), and (n + m) * r elements handed to Horovod instead of n * m.

``hvd.join()`` (Horovod 0.28.1: a joined rank takes part in allreduces with zeros; Average divides
by the full process-set size): PowerSGD is allreduce only, so it keeps reducing while ranks have
joined. The joined ranks' zero P and Q drop out of the sums, and the active ranks get the rank-r
PowerSGD approximation of what ``hvd.allreduce(op=...)`` gives for their M (joined ranks counted as
zeros, Average dividing by the full size). A joined rank does not run the codec, so its Q falls
behind; that cannot make the workers disagree (P is allreduced, so every worker projects onto the
same span whatever Q each used, and the next allreduced Q is the same everywhere again). Its residual
stays as it was. Works on any process set (the size is the process set's).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import horovod.torch as hvd

from ..finite import all_finite, where_
from .base import Compressor, ReduceContext, ReduceGenerator, scale_for_op, stable_hash

#: (residual key, Q key) of each pipeline slot; slot None (not pipelined) uses slot 0's
SLOT_KEYS = {None: ("residual", "q"), 0: ("residual", "q"), 1: ("residual@1", "q@1")}
#: each slot's scratch buffer for M (not saved: keys starting with "_" are scratch)
SPARE_KEYS = {None: "_m", 0: "_m", 1: "_m@1"}


def _work_dtype(grad: torch.Tensor) -> torch.dtype:
    return torch.float64 if grad.dtype == torch.float64 else torch.float32


def _format_rate(rate: float) -> str:
    """A float as plain decimal digits (no exponent, whose '-' would split the label's options)."""
    return np.format_float_positional(rate, trim="-")


def orthonormalize(x: torch.Tensor) -> torch.Tensor:
    """A new k x r matrix (k >= r) whose orthonormal columns span the columns of ``x`` (Householder QR;
    a rank-deficient ``x`` is completed to an orthonormal basis). All-NaN if ``x`` holds NaN/Inf, by
    masks on the device (no value is read on the host here)."""
    ok = all_finite(x)
    q = torch.linalg.qr(torch.where(ok, x, 0.0), mode="reduced").Q
    return q.masked_fill_(~ok, float("nan"))


class PowerSGD(Compressor):
    per_worker_averaged = ("residual", "residual@1")
    per_worker_fresh = ()
    #: both paths copy the gradient before their first collective (read by optimizers that skip the
    #: pipelining snapshot for such codecs)
    reads_input_later = False
    uses_out = True

    def __init__(self, rank: int = 4, min_compression_rate: float = 2.0, seed: int = 0, error_feedback: bool = True):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"powersgd: rank must be an int >= 1, got {rank!r}")
        rate = float(min_compression_rate)
        if not (math.isfinite(rate) and rate >= 0.0):
            raise ValueError(f"powersgd: min_compression_rate must be a finite number >= 0, "
                             f"got {min_compression_rate!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"powersgd: seed must be an int >= 0, got {seed!r}")
        self.rank = rank
        self.min_compression_rate = rate
        self.seed = seed
        self.error_feedback = bool(error_feedback)
        self.label = (f"powersgd{rank}" + (f"-mcr{_format_rate(rate)}" if rate != 2.0 else "")
                      + (f"-s{seed}" if seed else "") + ("" if self.error_feedback else "-noef"))

    # ------------------------------------------------------------------ shapes
    def matrix_shape(self, shape) -> tuple[int, int, int] | None:
        """(n, m, r) of the low-rank factorization of a gradient of ``shape``, or None when it goes as a
        plain allreduce (1-D, 0-D, empty, or (n + m) * r * min_compression_rate >= n * m)."""
        shape = tuple(shape)
        numel = math.prod(shape)
        if len(shape) < 2 or numel == 0:
            return None
        n = shape[0]
        m = numel // n
        r = min(n, m, self.rank)
        if (n + m) * r * self.min_compression_rate >= n * m:
            return None
        return n, m, r

    def initial_q(self, name: str, m: int, r: int) -> torch.Tensor:
        """The first Q (m x r, float32, on the CPU, before orthonormalization) of the tensor ``name``: a
        standard-normal draw, the same on every worker (and for both pipeline slots)."""
        gen = torch.Generator(device="cpu").manual_seed((self.seed * 1_000_003 + stable_hash(name)) % (2**63))
        return torch.randn(m, r, generator=gen, dtype=torch.float32, device="cpu")

    # ------------------------------------------------------------------ error feedback
    def release(self, state: dict):
        """Both slots' residuals, summed and taken out of ``state`` (None when there is none)."""
        held = [state.pop(k) for k in self.per_worker_averaged if k in state]
        if not held:
            return None
        total = held[0]
        for h in held[1:]:
            total = total + h.to(device=total.device, dtype=total.dtype)
        return total

    # ------------------------------------------------------------------ reduction
    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        if not grad.dtype.is_floating_point:
            raise TypeError(f"powersgd: gradient {ctx.name!r} has dtype {grad.dtype}; expected a floating dtype")
        dims = self.matrix_shape(grad.shape)
        if dims is None:
            return (yield from self._plain(grad, ctx))
        n, m, r = dims
        rkey, qkey = SLOT_KEYS[ctx.slot]
        spare_key = SPARE_KEYS[ctx.slot]
        state = ctx.state
        work = _work_dtype(grad)
        taken = {}
        try:
            with ctx.compressing():
                # M = grad + residual, written in one pass into a buffer kept between steps (the
                # previous step's residual, whose values this step has consumed), not a fresh tensor.
                buf = state.pop(spare_key, None)
                if buf is None or buf.numel() != n * m or buf.dtype != work or buf.device != grad.device:
                    buf = torch.empty(n * m, dtype=work, device=grad.device)
                mat = buf.view(n, m)
                g = grad.detach().reshape(n, m)
                # Take this slot's residual out of the state (slot None: both slots'): nothing else can
                # hand it over while this reduction is in flight.
                if self.error_feedback:
                    for key in ((rkey, "residual@1") if ctx.slot is None else (rkey,)):
                        if key in state:
                            taken[key] = state.pop(key)
                held = [v.view(n, m).to(device=mat.device, dtype=work) for v in taken.values()]
                if held:
                    torch.add(g, held[0], out=mat)
                    for h in held[1:]:
                        mat += h
                else:
                    mat.copy_(g)
                if ctx.slot is None:
                    state.pop("q@1", None)
                q_in = state.get(qkey)
                if q_in is None or tuple(q_in.shape) != (m, r):
                    q_in = self.initial_q(ctx.name, m, r)
                q_in = q_in.to(device=mat.device, dtype=mat.dtype)
                p = mat @ orthonormalize(q_in)
                ok = all_finite(mat)
                p.view(-1)[:1].masked_fill_(~ok, float("nan"))
            p = yield ctx.comm.allreduce_(p, name=ctx.op_name("p"), op=hvd.Sum)
            with ctx.compressing():
                p = orthonormalize(p)
                # M^T P as (P^T M)^T: the same product, but BLAS (MKL here) is up to 25x slower on a
                # transposed n x m operand with an r-column output (11.6 ms against 0.47 ms for
                # 2048 x 1024, r = 4, one core; scripts/powersgd_matmul_bench.py)
                q = (p.t() @ mat).t().contiguous()
            q = yield ctx.comm.allreduce_(q, name=ctx.op_name("q"), op=hvd.Sum)
        except BaseException:
            # Abandoned (generator closed) or failed: put back the residual this call took out.
            for key, value in taken.items():
                state.setdefault(key, value)
            raise
        with ctx.decompressing():
            scale_for_op(q, ctx)
            # P Q^T straight into ctx.out (p.grad, or the pipelining buffer) when the dtypes allow.
            dest = ctx.output(work)
            out = torch.mm(p, q.t(), out=None if dest is None else dest.view(n, m))
            finite = all_finite(out)      # the same on every worker
            if not self.error_feedback:
                state[spare_key] = buf
            else:
                new = mat.sub_(out).view(-1)
                old = None
                for value in taken.values():
                    value = value.to(device=new.device, dtype=new.dtype)
                    old = value if old is None else old + value
                # a skipped step (non-finite result, the same on every worker) keeps the old residual
                state[rkey] = where_(finite, new, 0.0 if old is None else old)
                if len(taken) == 1 and old.numel() == n * m and old.dtype == work:
                    state[spare_key] = old.view(-1)   # consumed: the next step's buffer for M
            state[qkey] = torch.where(finite, q, q_in)
            if dest is not None:
                return dest                 # the object itself: the optimizer then copies nothing
            return out.to(grad.dtype).view_as(grad)

    def _plain(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        """A plain allreduce with ``ctx.op`` of a copy of the gradient (plus any residual held)."""
        with ctx.compressing():
            flat = grad.detach().reshape(-1).to(_work_dtype(grad), copy=True)
            held = self.release(ctx.state)
            if held is not None:
                flat += held.reshape(-1).to(device=flat.device, dtype=flat.dtype)
        out = yield ctx.comm.allreduce_(flat, name=ctx.op_name("plain"), op=ctx.op,
                                        prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor)
        return out.to(grad.dtype).view_as(grad)
