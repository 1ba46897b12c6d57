"""``hx.DistributedOptimizer``: ``hvd.DistributedOptimizer`` with compressed and pipelined allreduce.

Like Horovod's optimizer it wraps the user's optimizer class (a dynamic subclass) and starts each
gradient's reduction from a hook as soon as backward has accumulated it. Unlike it:

* a reduction may take several collectives (a codec is a generator of Horovod handles, see
  :mod:`horovod_ext.compression.base`), advanced by a background driver thread as they finish, so
  compress, communicate and decompress of early gradients proceed while backward computes the rest;
* codecs keep state per parameter name (error-feedback residuals), which survives ``zero_grad``;
* ``pipeline=True`` is Pipe-SGD with pipeline width 2: the reduction of step t's gradients runs
  while step t+1 computes, and step t+1 applies them (one step stale). Step 0 is synchronous, so
  step 1 has nothing left to apply and leaves the parameters as they are; from step 2 on, step t
  applies the gradients of step t-1. ``flush()`` applies what is in flight (call it at epoch end,
  before checkpoints and evaluation), so every gradient is applied exactly once;
* ``warmup_steps=K``: the first K steps reduce plain fp32 and synchronously (no codec, no pipeline),
  as PowerSGD's ``start_powerSGD_iter`` and DGC's warm-up do: the first steps of training change the
  parameters fastest, and there compression noise and staleness cost the most;
* ``comm_stats()`` reports what was handed to Horovod and how long the training thread waited.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
import horovod.torch as hvd

from .adaptive import Adaptive
from .communicator import Communicator
from .compression import Compression, Compressor, NonFiniteGradientError, ReduceContext
from .reduction import Driver, Reduction, complete
from .stats import CommStats


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression: Compressor, backward_passes_per_step: int = 1,
                 op=hvd.Average, process_set=hvd.global_process_set, pipeline: bool = False,
                 overlap: bool = True, adaptive=True, warmup_steps: int = 0):
        super(self.__class__, self).__init__(params)
        if not isinstance(compression, Compressor):
            raise TypeError(f"compression must be an hx.Compression codec (e.g. hx.Compression.fp16), "
                            f"got {compression!r}")
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self._compression = compression
        if isinstance(adaptive, Adaptive):
            self.adaptive = adaptive
        else:
            self.adaptive = Adaptive(enabled=bool(adaptive) and compression is not Compression.none)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.process_set = process_set
        self.pipeline = bool(pipeline)
        self.warmup_steps = int(warmup_steps)
        self._names = self._check_names(named_parameters)
        compression.validate(process_set.size(), op)

        self._step_stats = CommStats()
        self._total_stats = CommStats()
        self._last_stats = CommStats()
        self._codec_stats = CommStats()    # steps after the warm-up: what the adaptive cost rule measures
        self._comm = Communicator(process_set, self._step_stats)
        self._driver = Driver() if (overlap or pipeline) else None
        self._codec_state: dict[str, dict] = {name: {} for name in self._names.values()}
        self._group_of = {p: g for g in self.param_groups for p in g["params"]}
        self._pending: dict[torch.Tensor, Reduction] = {}     # started during the current backward
        self._inflight: dict[torch.Tensor, Reduction] = {}    # pipeline: last step's, applied next step
        self._steps_taken = 0
        self._ready_count = 0          # reductions written into p.grad by the last synchronize()
        self._ready_nonfinite: list[str] = []
        self._delay = {p: backward_passes_per_step for p in self._names}
        self._requires_update = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._synchronized = False
        self._should_synchronize = True
        self._hooks = []
        if process_set.included():
            for p in self._requires_update:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    # ------------------------------------------------------------------ set-up
    def _check_names(self, named_parameters) -> dict:
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                             "usually model.named_parameters()")
        seen, dups = set(), set()
        for name, _ in named_parameters:
            (dups if name in seen else seen).add(name)
        if dups:
            raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {sorted(dups)}")
        all_ids = {id(v) for g in self.param_groups for v in g["params"]}
        missing = all_ids - {id(v) for _, v in named_parameters}
        if missing:
            raise ValueError(f"named_parameters was given but {len(missing)} optimizer parameter(s) are not "
                             f"named in it; pass model.named_parameters() of the model being optimized")
        return {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0]) if id(v) in all_ids}

    def _make_hook(self, p):
        def hook(param):
            if p in self._pending:
                raise AssertionError("gradients were computed more than backward_passes_per_step times before "
                                     "step(); increase backward_passes_per_step to accumulate gradients locally")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._start(p)
        return hook

    # ------------------------------------------------------------------ reduction
    @property
    def warming_up(self) -> bool:
        """True during the first ``warmup_steps`` steps (plain synchronous fp32 reductions)."""
        return self._steps_taken < self.warmup_steps

    @property
    def _pipelining(self) -> bool:
        return self.pipeline and not self.warming_up

    def _start(self, p) -> None:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        name = self._names[p]
        slot = self._steps_taken % 2 if self._pipelining else None
        # Pipelined, the user zeroes p.grad and runs the next backward while this reduction is in
        # flight: reduce a snapshot.
        grad = p.grad.detach().clone() if self._pipelining else p.grad
        state = self._codec_state[name]
        codec = self._compression
        if self.warming_up:
            codec = Compression.none
        elif not self.adaptive.uses_codec(grad.numel()):
            codec = Compression.none
            if "residual" in state:      # compression was switched off: send what error feedback held back
                grad = grad + state.pop("residual").view_as(grad).to(grad.dtype)
        else:
            self._step_stats.compressed_elements += grad.numel()
        ctx = ReduceContext(name=name, state=state, comm=self._comm, op=self.op, param=p, slot=slot)
        self._step_stats.gradient_elements += grad.numel()
        red = Reduction(codec, grad, ctx)
        self._pending[p] = red
        self._delay[p] = self.backward_passes_per_step
        if self._driver is not None:
            self._driver.submit(red)

    def _wait(self, reductions: dict) -> None:
        with self._step_stats.timing("wait_s"):
            if self._driver is not None:
                self._driver.wait(reductions.values())
            else:
                complete(reductions.values())

    def _start_missing(self) -> None:
        for p in self._requires_update:
            if p not in self._pending:
                self._start(p)

    def _write_grads(self, reductions: dict) -> list[str]:
        """Copy reduced gradients into ``p.grad``; return the names a codec found non-finite."""
        nonfinite = []
        for p, red in reductions.items():
            if red.ctx.nonfinite:
                nonfinite.append(red.ctx.name)
            out = red.result
            if p.grad is None:
                p.grad = out.clone()
            elif out is not p.grad:
                p.grad.copy_(out)
        return nonfinite

    def synchronize(self) -> None:
        """Wait for the gradient reductions and write the averaged gradients into ``p.grad``.

        Not pipelined: this step's gradients. Pipelined: the previous step's (this step's stay in
        flight); on the first step, this step's."""
        if not self.process_set.included():
            self._synchronized = True
            return
        self._start_missing()
        # The first pipelined step (step 0, or the first after the warm-up) keeps its gradients in
        # flight and applies nothing: every gradient is applied exactly once, one step late.
        if self._pipelining and self._steps_taken > 0:
            ready, self._inflight, self._pending = self._inflight, self._pending, {}
        else:
            ready, self._pending = self._pending, {}
        self._wait(ready)
        self._ready_nonfinite = self._write_grads(ready)
        self._ready_count = len(ready)
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()`` (e.g. to clip gradients) so step() does not wait again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(); the gradients are reduced twice")
            self.synchronize()
        self._synchronized = False
        try:
            if not self.process_set.included():
                return super(self.__class__, self).step(closure)
            if self._ready_count == 0:
                return None          # pipelined step 1: step 0's gradients were applied synchronously
            return self._apply(closure)
        finally:
            self._steps_taken += 1
            self._end_step_stats()
            if (self.adaptive.enabled and not self.adaptive.decided
                    and self._steps_taken >= self.warmup_steps + self.adaptive.measure_steps):
                self._decide_adaptive()

    def _apply(self, closure=None):
        names, self._ready_nonfinite = self._ready_nonfinite, []
        if names:
            self._step_stats.skipped_steps += 1
            for p in self._requires_update:
                if p.grad is not None:
                    p.grad.zero_()
            if getattr(self._compression, "nonfinite", "raise") == "raise":
                raise NonFiniteGradientError(
                    f"non-finite gradient (NaN or Inf) on at least one worker in {len(names)} tensor(s), "
                    f"e.g. {names[:3]}; no worker applied this step. Lower the learning rate, clip "
                    f"gradients, or use Compression.global_qsgd(nonfinite='skip') to skip such steps")
            return None
        for p in self._requires_update:
            self._compression.before_step(p, self._codec_state[self._names[p]], self._group_of[p])
        loss = super(self.__class__, self).step(closure)
        for p in self._requires_update:
            self._compression.after_step(p, self._codec_state[self._names[p]], self._group_of[p])
        return loss

    def _decide_adaptive(self) -> None:
        """Agree on the codec's cost per element (the slowest worker's) and apply the cost rule."""
        st = self._codec_stats
        local = (st.compress_s + st.decompress_s) / max(st.compressed_elements, 1)
        agreed = float(hvd.allreduce(torch.tensor([local], dtype=torch.float64), name="hx.adaptive.cost",
                                     op=hvd.Max, process_set=self.process_set)[0])
        self.adaptive.decide(agreed, st.bits_per_element, self.process_set.size())

    def flush(self):
        """Pipelined: wait for the gradients still in flight and apply them (a no-op otherwise).

        Call at epoch end, before saving a checkpoint or evaluating, so no gradient is lost. The
        gradients of the current backward (if step() was not called yet) are left alone."""
        if not self.pipeline or not self._inflight:
            return None
        ready, self._inflight = self._inflight, {}
        saved = {p: p.grad for p in self._requires_update}
        for p in ready:
            p.grad = torch.zeros_like(p)
        self._wait(ready)
        self._ready_nonfinite = self._write_grads(ready)
        try:
            return self._apply()
        finally:
            for p, g in saved.items():
                p.grad = g
            self._end_step_stats(count_step=False)

    def _end_step_stats(self, count_step: bool = True) -> None:
        self._step_stats.steps = 1 if count_step else 0
        self._last_stats = CommStats(**vars(self._step_stats))
        self._total_stats.add(self._step_stats)
        if self._steps_taken > self.warmup_steps or not count_step:
            self._codec_stats.add(self._step_stats)
        for k, v in vars(CommStats()).items():
            setattr(self._step_stats, k, v)

    def zero_grad(self, set_to_none: bool = True):
        if self._pending and not self._pipelining:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); that would drop gradients "
                                 "whose reduction is in flight")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, *args, **kwargs):
        if self._pending or self._inflight:
            self._wait({**self._pending, **self._inflight})
        self._pending.clear()
        self._inflight.clear()
        self._synchronized = False
        self._should_synchronize = True
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    # ------------------------------------------------------------------ reporting / state
    def comm_stats(self) -> dict:
        """Communication cost: ``last`` step and ``total`` over all steps (see :class:`CommStats`)."""
        return {"compression": self._compression.label, "workers": self.process_set.size(),
                "pipeline": self.pipeline, "adaptive": self.adaptive.as_dict(), "last": self._last_stats.as_dict(),
                "total": self._total_stats.as_dict()}

    def codec_state(self, name: str) -> dict:
        """The codec's persistent state for one parameter name (e.g. its error-feedback residual)."""
        return self._codec_state[name]


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression: Compressor = Compression.none, backward_passes_per_step: int = 1,
                         op=hvd.Average, process_set=hvd.global_process_set, pipeline: bool = False,
                         overlap: bool = True, adaptive=True, warmup_steps: int = 0):
    """Wrap ``optimizer`` so that gradients are averaged across Horovod workers, compressed by
    ``compression``. A superset of ``hvd.DistributedOptimizer``: with ``Compression.none`` (and
    ``pipeline=False``) it issues the same allreduces and produces bit-identical results.

    ``pipeline=True``: Pipe-SGD, updates one step stale (see the module docstring); call
    ``flush()`` before checkpoints and evaluation. ``overlap`` (default on) advances multi-phase
    codecs from a background thread while backward runs. ``adaptive`` (default on; or an
    :class:`horovod_ext.adaptive.Adaptive` with ``min_numel`` / ``link_gbps``) sends a tensor
    uncompressed when compression would not pay. ``warmup_steps``: that many first steps go plain
    fp32 and synchronous before compression and pipelining start.
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               process_set, pipeline, overlap, adaptive, warmup_steps)
