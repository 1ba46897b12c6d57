"""``hx.DistributedOptimizer``: ``hvd.DistributedOptimizer`` with compressed and pipelined allreduce.

It takes every argument of Horovod's optimizer with Horovod's meaning (``sparse_as_dense``,
``gradient_predivide_factor``, ``groups``/``num_groups``, Horovod's compression objects) and with
``compression=none`` issues the same collectives with the same results, so an existing Horovod
script switches by one line. Like Horovod's it wraps the user's optimizer class (a dynamic
subclass) and starts each gradient's reduction from a hook as soon as backward has accumulated it.
On top of it:

* a reduction may take several collectives (a codec is a generator of Horovod handles, see
  :mod:`horovod_ext.compression.base`), advanced by a background driver thread as they finish, so
  compress, communicate and decompress of early gradients proceed while backward computes the rest;
* codecs keep state per parameter name (error-feedback residuals), which survives ``zero_grad``
  and is part of ``state_dict()`` (see :mod:`horovod_ext.state`);
* ``pipeline=True`` is Pipe-SGD with pipeline width 2: the reduction of step t's gradients runs
  while step t+1 computes, and step t+1 applies them (one step stale). Step 0 is synchronous, so
  step 1 has nothing left to apply and leaves the parameters as they are; from step 2 on, step t
  applies the gradients of step t-1. ``flush()`` applies what is in flight (call it at epoch end,
  before evaluation), so every gradient is applied exactly once;
* ``predict_weights=True`` (with ``pipeline``) takes each gradient at the parameters predicted for
  when it is applied instead of one update behind (:mod:`horovod_ext.prediction`);
* ``warmup_steps=K``: the first K steps reduce plain fp32 and synchronously (no codec, no pipeline),
  as PowerSGD's ``start_powerSGD_iter`` and DGC's warm-up do;
* one non-finite policy on every path (``nonfinite``): the reduced gradient is the same on every
  worker, so every worker sees the same NaN/Inf and every worker raises or every worker skips.
  NaN/Inf reach ``p.grad``, so an fp16 ``GradScaler`` sees them and backs off;
* the first reduction checks that every worker has the same parameters (names, shapes, dtypes)
  and settings, and fails with a message naming the difference instead of hanging;
* ``comm_stats()`` reports what was handed to Horovod and how long the training thread waited.

Step bookkeeping (pipeline slots, warm-up, statistics) counts ``synchronize()`` calls, not
``step()`` calls: a step skipped by a ``GradScaler`` still ends a round, so no Horovod op name of a
gradient still in flight is reused.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager, nullcontext

import torch
import horovod.torch as hvd

from . import state as codec_state_io
from .adaptive import Adaptive, backend_sum_cost
from . import communicator
from .communicator import Communicator, allgather_object
from .compression import Compression, Compressor, NonFiniteGradientError, ReduceContext
from .compression.horovod_compat import GroupedAllreduce, SparseAllgather, as_codec
from .consistency import check_workers_agree
from .prediction import WeightPrediction
from .reduction import Done, Driver, Member, Reduction, Rounds
from .stats import Ledger

NONFINITE_POLICIES = ("raise", "skip")


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=hvd.Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=hvd.global_process_set, pipeline=False, overlap=True, adaptive=True, warmup_steps=0,
                 nonfinite=None, predict_weights=False):
        super(self.__class__, self).__init__(params)
        codec = as_codec(compression)
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        nonfinite = nonfinite or codec.nonfinite or "raise"
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if predict_weights and not pipeline:
            raise ValueError("predict_weights=True corrects the staleness of pipelined steps; it needs pipeline=True")
        self._compression = codec
        if isinstance(adaptive, Adaptive):
            self.adaptive = adaptive
        else:
            self.adaptive = Adaptive(enabled=bool(adaptive) and codec is not Compression.none)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self.pipeline = bool(pipeline)
        self.warmup_steps = int(warmup_steps)
        self.nonfinite = nonfinite
        self._names = self._check_names(named_parameters)
        codec.validate(process_set.size(), op)

        self._ledger = Ledger()
        self._comm = Communicator(process_set, self._ledger.step)
        self._rounds = Rounds(Driver() if (overlap or pipeline) else None)
        self._codec_state: dict[str, dict] = {name: {} for name in self._names.values()}
        self._index_groups()
        self._delay = {p: backward_passes_per_step for p in self._names}
        self._requires_update = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._prediction = WeightPrediction(self._requires_update) if predict_weights else None
        self._synchronized = False
        self._should_synchronize = True
        self._checked_world = None        # the worker count the cross-rank check last ran at
        self._notes: set[str] = set()
        self._hooks = []
        self._p_to_group: dict = {}
        self._group_ready: dict = {}
        self._out_buffers: dict = {}      # (param, pipeline slot) -> reduced-gradient buffer (see _output_for)
        if process_set.included():
            if groups is not None:
                self._form_groups(groups)
            for p in self._requires_update:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    # ------------------------------------------------------------------ set-up
    def _index_groups(self) -> None:
        """Each parameter's param-group dict, for the codec hooks (DEF reads its learning rate). torch's
        ``load_state_dict`` replaces the dicts, so this runs again after it."""
        self._group_of = {p: g for g in self.param_groups for p in g["params"]}

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

    def _form_groups(self, groups) -> None:
        """Horovod's grouping: an int splits the parameters (in rank 0's order) into that many groups;
        a list of lists names the groups, and every other parameter forms a group of its own."""
        if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor")
        p_list = list(self._requires_update)
        order = hvd.broadcast_object([self._names[p] for p in p_list], root_rank=0, process_set=self.process_set,
                                     name="hx.groups.order")
        p_list.sort(key=lambda p: order.index(self._names[p]))
        if isinstance(groups, list):
            seen = set()
            for g in groups:
                for p in g:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor")
                    if id(p) in seen:
                        raise ValueError("a parameter can only appear once in groups")
                    seen.add(id(p))
            ids = {id(p) for p in p_list}
            formed = [[p for p in g if id(p) in ids] for g in groups]
            formed += [[p] for p in p_list if id(p) not in seen]
        else:
            k, m = divmod(len(p_list), groups)
            formed = [p_list[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(groups)]
        for g in formed:
            g = tuple(g)
            if not g:
                continue
            for p in g:
                self._p_to_group[p] = g
            self._group_ready[g] = 0

    def _make_hook(self, p):
        def hook(param):
            if p in self._rounds.pending:
                raise AssertionError("gradients were computed more than backward_passes_per_step times before "
                                     "step(); increase backward_passes_per_step to accumulate gradients locally")
            self._delay[p] -= 1
            if self._delay[p] > 0:
                return
            group = self._p_to_group.get(p)
            if group is None:
                self._start([p])
                return
            self._group_ready[group] += 1
            if self._group_ready[group] == len(group):
                self._group_ready[group] = 0
                self._start(list(group))
        return hook

    def set_backward_passes_per_step(self, passes: int) -> None:
        """As Horovod's: change how many backward passes accumulate locally before a reduction."""
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def _note_once(self, key: str, message: str) -> None:
        if key not in self._notes:
            self._notes.add(key)
            if self.process_set.rank() == 0:
                warnings.warn(f"horovod_ext: {message}", stacklevel=3)

    # ------------------------------------------------------------------ cross-rank check
    def _describe(self) -> dict:
        return {"parameters": sorted((self._names[p], list(p.shape), str(p.dtype)) for p in self._requires_update),
                "compression": self._compression.label, "op": str(self.op), "pipeline": self.pipeline,
                "backward_passes_per_step": self.backward_passes_per_step, "warmup_steps": self.warmup_steps,
                "gradient_predivide_factor": self.gradient_predivide_factor, "sparse_as_dense": self.sparse_as_dense,
                "nonfinite": self.nonfinite,
                "groups": sorted(sorted(self._names[p] for p in g) for g in self._group_ready)}

    def _check_ranks(self) -> None:
        """Once per worker count, before the first reduction: every worker must reduce the same
        tensors with the same settings, or Horovod would wait forever for ops that never come."""
        size = self.process_set.size()
        if self._checked_world != size:
            self._checked_world = size
            check_workers_agree(self._describe(), self.process_set)

    # ------------------------------------------------------------------ reduction
    @property
    def _steps_taken(self) -> int:
        """Rounds so far: ``synchronize()`` calls, whether or not their step was applied."""
        return self._rounds.count

    @property
    def warming_up(self) -> bool:
        """True during the first ``warmup_steps`` steps (plain synchronous fp32 reductions)."""
        return self._rounds.count < self.warmup_steps

    @property
    def _pipelining(self) -> bool:
        return self.pipeline and not self.warming_up

    def _context(self, name: str, p, slot) -> ReduceContext:
        pre, post = 1.0, 1.0
        if self.op == hvd.Average and self.gradient_predivide_factor != 1.0:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return ReduceContext(name=name, state=self._codec_state[name], comm=self._comm, op=self.op, param=p,
                             slot=slot, prescale_factor=pre, postscale_factor=post)

    def _gradient(self, p) -> torch.Tensor:
        """The tensor to reduce: ``p.grad`` (zeros when this worker computed none, as Horovod does:
        another worker may have), densified with ``sparse_as_dense``."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad.detach()
        if grad.is_sparse and self.sparse_as_dense:
            grad = grad.to_dense()
        return grad

    def _is_grad(self, p, grad: torch.Tensor) -> bool:
        """Whether ``grad`` is ``p.grad``'s own storage (not a densified or residual-added copy)."""
        return (not grad.is_sparse and p.grad is not None and not p.grad.is_sparse
                and grad.data_ptr() == p.grad.data_ptr() and grad.dtype == p.grad.dtype)

    def _codec_for(self, p, grad: torch.Tensor, state: dict) -> tuple[Compressor, torch.Tensor]:
        if grad.is_sparse:
            if self._compression is not Compression.none:
                self._note_once("sparse", f"sparse gradients (e.g. {self._names[p]!r}) go uncompressed as Horovod "
                                f"sends them (allgather of values and indices); pass sparse_as_dense=True to "
                                f"compress them")
            return SparseAllgather(), grad
        if self.warming_up:
            return Compression.none, grad
        if not self.adaptive.uses_codec(grad.numel()):
            held = self._compression.release(state)     # sent uncompressed: add what error feedback held back
            if held is not None:
                grad = grad + held.view_as(grad).to(grad.dtype)
            return Compression.none, grad
        self._ledger.step.compressed_elements += grad.numel()
        return self._compression, grad

    def _start(self, params: list) -> None:
        self._check_ranks()
        slot = self._rounds.slot(self._pipelining)
        started, plain = {}, []
        for p in params:
            name = self._names[p]
            grad = self._gradient(p)
            codec, grad = self._codec_for(p, grad, self._codec_state[name])
            own = self._is_grad(p, grad)
            if self._pipelining and own and (codec.reads_input_later or len(params) > 1):
                # The user zeroes p.grad and runs the next backward while this reduction is in flight;
                # a codec that has copied what it needs before returning from its first phase needs no
                # snapshot.
                grad = grad.clone()
            self._ledger.step.gradient_elements += grad.numel()
            self._delay[p] = self.backward_passes_per_step
            if len(params) > 1 and codec is Compression.none:
                plain.append((p, grad))
            else:
                ctx = self._context(name, p, slot)
                if codec.uses_out:
                    ctx.out = self._output_for(p, slot, own)
                # Not pipelining, nothing writes p.grad before step(), so the codec's first phase (its
                # compression) can run on the driver thread, beside backward. Pipelining, the next
                # backward may write p.grad meanwhile: the first phase runs here, where its copy is taken.
                offload = self._rounds.driver is not None and not self._pipelining
                started[p] = Reduction(codec, grad, ctx, start=not offload)
        if plain:
            # Horovod's grouped allreduce: one op for the group's plain gradients. Like Horovod's, it
            # leaves gradient_predivide_factor out (the same average, rounded once).
            ps, grads = zip(*plain)
            ctx = self._context(self._names[ps[0]], ps[0], slot)
            ctx.prescale_factor = ctx.postscale_factor = 1.0
            red = Reduction(GroupedAllreduce(), list(grads), ctx)
            started.update({p: Member(red, i) for i, p in enumerate(ps)})
        elif len(params) > 1:
            self._note_once("groups", f"groups= orders the reductions of {self._compression.label!r}, which "
                            f"reduces each tensor itself; only plain allreduces are grouped into one Horovod op")
        self._rounds.start(started)

    def _output_for(self, p, slot, own: bool):
        """Where a codec may write ``p``'s reduced gradient: ``p.grad`` itself when not pipelining
        (nothing writes it before this result is applied); pipelining, a buffer per parameter and
        slot, free again when its round's result has been copied into ``p.grad`` (two rounds later
        the same slot comes back), so no gradient-sized tensor is allocated per step."""
        if not self._pipelining:
            return p.grad if own and p.grad.is_contiguous() else None
        if p.grad is None or p.grad.is_sparse:
            return None
        key = (p, slot)
        buf = self._out_buffers.get(key)
        if buf is None or buf.shape != p.grad.shape or buf.dtype != p.grad.dtype or buf.device != p.grad.device:
            buf = self._out_buffers[key] = torch.empty_like(p.grad, memory_format=torch.contiguous_format)
        return buf

    def _start_missing(self) -> None:
        for p in self._requires_update:
            if p not in self._rounds.pending:
                self._start([p])

    def _write_grads(self, entries: dict) -> None:
        """Copy reduced gradients into ``p.grad`` (sparse ones as Horovod does)."""
        for p, e in entries.items():
            out = e.result
            if p.grad is None:
                p.grad = out.clone()
            elif p.grad.is_sparse:
                p.grad.zero_().add_(out if out.is_sparse else out.to_sparse())
            elif out is not p.grad:
                p.grad.copy_(out.view_as(p.grad))

    def synchronize(self) -> None:
        """Wait for the gradient reductions and write the averaged gradients into ``p.grad``.

        Not pipelined: this step's gradients. Pipelined: the previous step's (this step's stay in
        flight); on the first step, this step's. NaN/Inf in a reduced gradient reach ``p.grad``
        (so a GradScaler sees them); ``step()`` then applies the ``nonfinite`` policy."""
        if not self.process_set.included():
            self._synchronized = True
            return
        self._start_missing()
        for g in self._group_ready:      # a group some of whose members computed no gradient this round
            self._group_ready[g] = 0
        # The first pipelined step (step 0, or the first after the warm-up) keeps its gradients in
        # flight and applies nothing: every gradient is applied exactly once, one step late.
        ready = self._rounds.end(self._pipelining)
        self._rounds.wait(ready, self._ledger.step)
        self._write_grads(ready)
        self._rounds.ready, self._rounds.ready_nonfinite = ready, self._rounds.nonfinite_names(ready)
        self._synchronized = True
        self._end_round()

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
        if not self.process_set.included():
            return super(self.__class__, self).step(closure)
        ready, self._rounds.ready = self._rounds.ready, {}
        if not ready:
            return None          # pipelined step 1: step 0's gradients were applied synchronously
        return self._apply(ready, closure)

    def _apply(self, ready: dict, closure=None):
        pred = self._prediction
        # Predict only where this round's gradients are in flight: they are applied next step, on top
        # of this update. (Not after a synchronous step, whose next step applies nothing, nor at flush.)
        predicting = pred is not None and bool(self._rounds.inflight)
        if pred is not None and (predicting or pred.active):
            pred.restore()               # the update goes to the true weights, not the prediction
        names, self._rounds.ready_nonfinite = self._rounds.ready_nonfinite, []
        if names:
            self._ledger.skipped()
            if self.nonfinite == "raise":
                raise NonFiniteGradientError(
                    f"non-finite gradient (NaN or Inf) on at least one worker in {len(names)} tensor(s), "
                    f"e.g. {names[:3]}; no worker applied this step. Lower the learning rate, clip "
                    f"gradients, or pass nonfinite='skip' to hx.DistributedOptimizer to skip such steps")
            return None
        for p in ready:
            self._compression.before_step(p, self._codec_state[self._names[p]], self._group_of[p])
        loss = super(self.__class__, self).step(closure)
        for p in ready:
            self._compression.after_step(p, self._codec_state[self._names[p]], self._group_of[p])
        if predicting:
            pred.predict()               # the next gradient is taken where it will be applied
        return loss

    def _end_round(self) -> None:
        self._ledger.end_step(count_step=True, measured=self._rounds.count > self.warmup_steps)
        if (self.adaptive.enabled and not self.adaptive.decided
                and self._rounds.count >= self.warmup_steps + self.adaptive.measure_steps):
            self._decide_adaptive()

    def _decide_adaptive(self) -> None:
        """Agree on the codec's cost per element (the lowest over the measured steps of its CPU time:
        interference only ever adds to it; the slowest worker's), measure what the backend's sum of
        the payload costs beyond fp32's where the codec says it may (fp16), and apply the cost rule."""
        st = self._ledger.measured
        local = min(self._ledger.step_costs, default=0.0)
        agreed = float(communicator.allreduce(torch.tensor([local], dtype=torch.float64), "hx.adaptive.cost",
                                              hvd.Max, self.process_set)[0])
        backend = 0.0
        sum_dtype = getattr(self._compression, "backend_sum_dtype", None)
        if (sum_dtype is not None and self.adaptive.link_gbps and self.process_set.size() > 1
                and self._requires_update):
            if self._rounds.inflight:        # pipelined: their traffic would skew the probe (they stay in place)
                self._rounds.wait(self._rounds.inflight, self._ledger.step)
            device = next(iter(self._requires_update)).device
            backend = backend_sum_cost(sum_dtype, device, self.process_set)
        self.adaptive.decide(agreed, st.bits_per_element, self.process_set.size(), backend)

    def flush(self):
        """Pipelined: wait for the gradients still in flight and apply them (a no-op otherwise).

        Call at epoch end, before evaluating, so no gradient is lost. The gradients of the current
        backward (if step() was not called yet) are left alone. With ``predict_weights`` the
        parameters are the true weights afterwards, not a prediction."""
        if self._prediction is not None and self._prediction.active:
            self._prediction.restore()
        if not self.pipeline or not self._rounds.inflight:
            return None
        ready = self._rounds.take_inflight()
        saved = {p: p.grad for p in self._requires_update}
        for p in ready:
            p.grad = torch.zeros_like(p)
        try:
            self._rounds.wait(ready, self._ledger.step)
            self._write_grads(ready)
            self._rounds.ready_nonfinite = self._rounds.nonfinite_names(ready)
            return self._apply(ready)
        finally:
            for p, g in saved.items():
                p.grad = g
            self._ledger.end_step(count_step=False, measured=True)

    def true_parameters(self):
        """A context in which the parameters hold the true weights (``predict_weights``: between
        steps they hold a prediction), e.g. to save them mid-epoch; a no-op otherwise."""
        return self._prediction.true_parameters() if self._prediction is not None else nullcontext()

    def zero_grad(self, set_to_none: bool = True):
        if self._rounds.pending and not self._pipelining:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); that would drop gradients "
                                 "whose reduction is in flight")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    # ------------------------------------------------------------------ state
    def _replicated_state(self) -> dict:
        """What every worker agrees on (see :mod:`horovod_ext.state`): the round counter (pipeline
        slot, warm-up), the adaptive decision, pipelined gradients in flight (waited for and kept as
        reduced results, so a resume applies them next step), the codec's replicated entries."""
        return {"format": codec_state_io.FORMAT, "compression": self._compression.label, "steps": self._rounds.count,
                "adaptive": {"decided": self.adaptive.decided, "compress": self.adaptive.compress},
                "inflight": self._rounds.carried(self._names, self._ledger.step),
                "codec": codec_state_io.replicated(self._compression,
                                                   codec_state_io.save_codec_states(self._codec_state))}

    def _hx_state(self) -> dict:
        """This worker's share of the state: the replicated part and its own codec state."""
        return {**self._replicated_state(), "rank": self.process_set.rank(), "world_size": self.process_set.size(),
                "codec": codec_state_io.save_codec_states(self._codec_state)}

    def state_dict(self):
        """The wrapped optimizer's state plus this worker's codec state under ``"horovod_ext"``
        (no collective: safe on rank 0 alone and inside ``hvd.elastic.TorchState``). For a
        checkpoint that holds every worker's codec state, use :meth:`gather_state_dict`."""
        sd = super(self.__class__, self).state_dict()
        sd["horovod_ext"] = self._hx_state()
        return sd

    def gather_state_dict(self, root_rank: int = 0):
        """Collective: the state dict with every worker's codec state (a list by rank) on
        ``root_rank``; ``None`` elsewhere. Loading it resumes bit-exactly at the same worker count
        and by the documented rule at another (:mod:`horovod_ext.state`)."""
        sd = self.state_dict()
        local = sd.pop("horovod_ext")
        everyone = allgather_object(local, "hx.gather_state", self.process_set)
        if self.process_set.rank() != root_rank:
            return None
        sd["horovod_ext"] = {"format": codec_state_io.FORMAT, "world_size": self.process_set.size(),
                             "ranks": everyone}
        return sd

    def load_state_dict(self, state_dict):
        """Load the wrapped optimizer's state and, if present, the codec state: this worker's own
        share of a gathered state dict, a single worker's state, or resharded from another worker
        count. Reductions in flight are abandoned (they belong to the state being replaced).
        Load the model first: a codec may re-derive this worker's parameters (DEF)."""
        state_dict = dict(state_dict)
        hx_state = state_dict.pop("horovod_ext", None)
        self._reset_rounds()
        super(self.__class__, self).load_state_dict(state_dict)
        self._index_groups()
        if hx_state is not None:
            self._load_hx_state(hx_state)

    def _reset_rounds(self) -> None:
        self._rounds.clear()
        if self._prediction is not None:
            self._prediction.drop()      # the loaded parameters are the truth
        self._synchronized = False
        self._should_synchronize = True
        self._checked_world = None
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        for g in self._group_ready:
            self._group_ready[g] = 0

    def _load_hx_state(self, hx_state: dict) -> None:
        rank, size = self.process_set.rank(), self.process_set.size()
        if hx_state.get("format") != codec_state_io.FORMAT:
            raise ValueError(f"horovod_ext state has format {hx_state.get('format')!r}; this version reads "
                             f"{codec_state_io.FORMAT}")
        per_rank = hx_state["ranks"] if "ranks" in hx_state else [hx_state]
        mine = None
        if hx_state["world_size"] == size:
            mine = per_rank[rank] if "ranks" in hx_state else hx_state
        if mine is not None:
            saved = mine["codec"]
        else:
            saved = codec_state_io.reshard(self._compression, [r["codec"] for r in per_rank],
                                           hx_state["world_size"], size)
        devices = {name: p.device for p, name in self._names.items()}
        self._codec_state = codec_state_io.load_codec_states(saved, devices)
        ref = mine if mine is not None else per_rank[0]
        self._load_replicated(ref, codec=None, inflight=mine is not None)

    def _load_replicated(self, rep: dict, codec: dict | None, inflight: bool = True) -> None:
        """Install the replicated part of a state (``codec``: replicated codec entries to merge into
        this worker's own), then let the codec re-derive per-worker parameters (DEF)."""
        if codec is not None:
            devices = {name: p.device for p, name in self._names.items()}
            for name, entries in codec_state_io.load_codec_states(codec, devices).items():
                self._codec_state[name].update(entries)
        self._rounds.count = int(rep["steps"])
        self.adaptive.decided = bool(rep["adaptive"]["decided"])
        self.adaptive.compress = bool(rep["adaptive"]["compress"])
        self._rounds.inflight.clear()
        if inflight:
            by_name = {name: p for p, name in self._names.items()}
            for name, result in rep.get("inflight", {}).items():
                p = by_name[name]
                self._rounds.inflight[p] = Done(self._context(name, p, None), result.to(p.device))
        with torch.no_grad():
            for p, name in self._names.items():
                self._compression.on_load(p, self._codec_state[name], self._group_of[p])
        self._checked_world = None

    # ------------------------------------------------------------------ reporting
    def comm_stats(self) -> dict:
        """Communication cost: ``last`` step and ``total`` over all steps (see :class:`CommStats`)."""
        return {"compression": self._compression.label, "workers": self.process_set.size(),
                "pipeline": self.pipeline, "predict_weights": self._prediction is not None,
                "nonfinite": self.nonfinite, "adaptive": self.adaptive.as_dict(),
                "last": self._ledger.last.as_dict(), "total": self._ledger.total.as_dict()}

    def codec_state(self, name: str) -> dict:
        """The codec's persistent state for one parameter name (e.g. its error-feedback residual): a new
        dict of the entries a checkpoint keeps (not a codec's scratch buffers, keys starting with ``_``)."""
        return {k: v for k, v in self._codec_state[name].items() if not k.startswith("_")}


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1, op=hvd.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                         sparse_as_dense: bool = False, process_set=hvd.global_process_set, *,
                         pipeline: bool = False, overlap: bool = True, adaptive=True, warmup_steps: int = 0,
                         nonfinite: str | None = None, predict_weights: bool = False):
    """Wrap ``optimizer`` so that gradients are averaged across Horovod workers, compressed by
    ``compression``: ``hvd.DistributedOptimizer`` with the same arguments and results, plus the
    knobs after ``*``.

    Args:
        optimizer: the optimizer to wrap; the result is an instance of its class.
        named_parameters: ``model.named_parameters()``. Names key the Horovod ops and the codec state
            (checkpoints find residuals by name); default: ``allreduce.noname.<group>.<index>``.
        compression: an ``hx.Compression`` codec (default ``none``: Horovod's fp32 allreduce), or a
            Horovod compressor: ``hvd.Compression.none``/``.fp16`` mean ours, any other runs as Horovod
            runs it.
        backward_passes_per_step: backward passes accumulated locally before one reduction (1).
        op: ``hvd.Average`` (default) or ``hvd.Sum``; ``hvd.Adasum`` returns Horovod's own Adasum
            optimizer (it reduces parameter deltas) and is refused with any hx knob below.
        gradient_predivide_factor: op Average only: scale by 1/f before the sum and f/n after it
            (1.0), to keep fp16 sums in range; as in Horovod, not applied inside ``groups``.
        num_groups: deprecated alias of ``groups`` (Horovod's).
        groups: an int (that many groups in rank 0's parameter order) or a list of lists of
            parameters; each group's plain allreduces go to Horovod as one grouped op (None).
        sparse_as_dense: densify sparse gradients before reducing (False: allgather values and
            indices, as Horovod does; such a gradient goes uncompressed, noted once).
        process_set: the workers to average over (the global set).
        pipeline: Pipe-SGD (False). True overlaps the reduction of step t with the compute of step
            t+1, applying updates one step stale; pays when communication is a large part of a step.
            Call ``flush()`` before evaluation.
        predict_weights: with ``pipeline``, run each forward and backward at the parameters
            predicted for when its gradient is applied (the true weights plus the last update;
            SpecTrain / PipeMare), instead of one update behind (False). Between steps the
            parameters then hold that prediction: ``flush()`` leaves the true weights, and
            ``true_parameters()`` shows them for a moment (to save them mid-epoch).
        overlap: advance multi-phase codecs from a background thread while backward runs (True);
            False runs every phase on the training thread, at ``step()``.
        adaptive: send a tensor uncompressed when compressing it would not pay (True): tensors
            under 8,192 elements always; with ``hx.Adaptive(link_gbps=...)``, every tensor once the
            measured codec cost exceeds the wire time it saves. False compresses everything.
        warmup_steps: the first K steps reduce plain fp32 and synchronously (0). The first steps move
            the parameters most; there compression noise and staleness cost most (PowerSGD's
            ``start_powerSGD_iter``, DGC's warm-up).
        nonfinite: ``"raise"`` or ``"skip"`` when an averaged gradient holds NaN/Inf (None: the
            codec's default, else ``"raise"``). Every worker sees the same NaN, so every worker
            raises :class:`NonFiniteGradientError` or every worker skips (``comm_stats()`` counts
            skips). NaN/Inf reach ``p.grad`` first, so a ``GradScaler`` backs off as usual.

    Returns the wrapped optimizer, with ``synchronize()``, ``skip_synchronize()``, ``flush()``,
    ``true_parameters()``, ``comm_stats()``, ``state_dict()`` (this worker's codec state included),
    ``gather_state_dict()`` (every worker's, for checkpoints) and ``set_backward_passes_per_step()``.
    """
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    codec = as_codec(compression)
    if op == hvd.Adasum and hvd.size() > 1:
        if (codec not in (Compression.none, Compression.fp16) or pipeline or warmup_steps or nonfinite
                or predict_weights):
            raise ValueError("op=hvd.Adasum reduces parameter deltas (Horovod's Adasum optimizer), not gradients: "
                             "it cannot be combined with hx codecs, pipeline, predict_weights, warmup_steps or "
                             "nonfinite. Use compression=hx.Compression.none (or fp16) with none of those, or "
                             "op=hvd.Average")
        hvd_compression = hvd.Compression.fp16 if codec is Compression.fp16 else hvd.Compression.none
        return hvd.DistributedOptimizer(optimizer, named_parameters, compression=hvd_compression,
                                        backward_passes_per_step=backward_passes_per_step, op=op,
                                        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
                                        sparse_as_dense=sparse_as_dense, process_set=process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    # hvd.broadcast_optimizer_state recognises Horovod's wrapper by its module and then initialises
    # empty optimizer state with the wrapped optimizer's own step(), not with an allreducing one (which
    # would hang when only some ranks have empty state, as after rank 0 alone loaded a checkpoint).
    # This wrapper must be treated the same way, so it carries that module name.
    cls.__module__ = hvd.DistributedOptimizer.__module__
    return cls(optimizer.param_groups, named_parameters, codec, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set, pipeline, overlap, adaptive,
               warmup_steps, nonfinite, predict_weights)
