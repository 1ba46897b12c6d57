"""``hx.DistributedOptimizer`` under Horovod Elastic (``hvd.elastic.run`` + ``hvd.elastic.TorchState``).

Importing ``horovod_ext`` puts :class:`OptimizerStateHandler` first in Horovod's state-handler
registry, so ``hvd.elastic.TorchState(model=..., optimizer=hx_optimizer, ...)`` handles the
optimizer with it; nothing else changes in an elastic script::

    opt = hx.DistributedOptimizer(base, model.named_parameters(), compression=..., pipeline=True)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state): ...            # state.commit() every few steps

What each event does to the optimizer:

* ``commit`` (save): a deep copy of ``optimizer.state_dict()``: the wrapped optimizer's state and
  this worker's codec state (error-feedback residuals, rounding RNGs, step counters), the pipelined
  gradients still in flight waited for and kept as reduced results. Local, no collective.
* a worker is lost (``HorovodInternalError``; ``restore``): first the reductions still in flight
  are abandoned: their codec generators are closed, so none of them issues another collective
  (after Horovod's re-initialisation such an op would meet the new step's ops under the same name
  and hang or corrupt it), and the driver thread is given a bounded time to see their Horovod
  handles fail. Then the last commit is loaded from a fresh copy of the saved state (so a second
  failure before the next commit restores the same commit again: ``torch.optim`` aliases the
  tensors it is given), this worker's own codec share included.
* after every reset (``sync``; Horovod skips it when workers were only removed, because the
  survivors are then identical): the wrapped optimizer's state comes from rank 0 as in Horovod
  (``broadcast_optimizer_state``; a newcomer's state-initialising step no longer moves its
  parameters), then the replicated part of the codec state comes from rank 0: the step counter
  (pipeline slot, warm-up, adaptive measurement), the adaptive decision, the pipelined gradients in
  flight at the commit (reduced results, the same on every survivor) and the codec's replicated
  entries (DEF's synchronized copy, block counters). Per-worker entries stay: a survivor keeps its
  residual and RNG, a newcomer starts with none (zero residual, fresh RNG). DEF workers then
  re-derive their perturbed models (the codec's ``on_load``). The cross-rank check runs again at
  the next reduction, and the codec is validated for the new worker count.

Global-QSGD's lane capacity (how many workers' integers a lane holds) is computed from the process
set's size at every reduction, so it follows the world size; growing past what a bit width can
hold fails at ``sync`` with the codec's own message instead of overflowing lanes. The residuals of
a lost worker are lost with it (as is its last gradient); survivors keep theirs, so the update the
survivors still owe is carried on exactly.
"""
from __future__ import annotations

import copy
import time
import warnings

import torch
import horovod.torch as hvd
from horovod.torch.elastic import state as _hvd_state

from . import state as codec_state_io

ABANDON_TIMEOUT_S = 60.0
# What this process's handlers did (for logs and tests): commits restored, reductions in flight
# dropped at a restore (and how many of them had not ended yet), syncs.
stats = {"restores": 0, "dropped": 0, "unfinished": 0, "syncs": 0}


class _HxOptimizerType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.optim.Optimizer) and callable(getattr(type(obj), "_hx_state", None))


class HxOptimizer(metaclass=_HxOptimizerType):
    """``isinstance(opt, HxOptimizer)``: whether ``opt`` is an ``hx.DistributedOptimizer``."""


def abandon_reductions(opt, timeout: float = ABANDON_TIMEOUT_S) -> tuple[int, int]:
    """Drop the reductions ``opt`` has in flight so that none issues another collective; return
    (dropped, unfinished): how many there were and how many had not ended yet.

    Closes each unfinished reduction's codec generator (so it can never start another phase) and
    waits, at most ``timeout`` seconds, for the driver thread to see its current Horovod handle end
    (after a lost worker Horovod fails them all). Then forgets them all."""
    from .optimizer import _Done
    entries = {**opt._pending, **opt._inflight}
    dropped = [r for r in opt._reductions(entries) if not isinstance(r, _Done)]
    reds = [r for r in dropped if not r.done]
    for red in reds:
        deadline = time.monotonic() + 5.0
        while True:
            try:
                red.gen.close()
                break
            except ValueError:             # the driver thread is inside this generator right now
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
    driver = opt._driver
    if driver is not None and reds:
        with driver._cond:
            finished = driver._cond.wait_for(lambda: all(r.done for r in reds), timeout)
        if not finished:
            warnings.warn(f"horovod_ext: {sum(not r.done for r in reds)} abandoned reduction(s) still wait on "
                          f"Horovod after {timeout:.0f} s; their generators are closed, so they issue no "
                          f"further collectives", stacklevel=2)
    opt._pending.clear()
    opt._inflight.clear()
    opt._ready.clear()
    return len(dropped), len(reds)


def replicated_state(opt) -> dict:
    """What every worker must agree on (taken from rank 0 at ``sync``): see the module docstring."""
    inflight = {}
    if opt._inflight:
        opt._wait(opt._inflight)
        inflight = {opt._names[p]: e.result.detach().clone() for p, e in opt._inflight.items()}
    per_worker = set(codec_state_io.PER_WORKER_AVERAGED) | set(codec_state_io.PER_WORKER_FRESH)
    codec = {name: {k: v for k, v in st.items() if k not in per_worker}
             for name, st in codec_state_io.save_codec_states(opt._codec_state).items()}
    return {"steps": opt._steps_taken, "adaptive": {"decided": opt.adaptive.decided, "compress": opt.adaptive.compress},
            "inflight": inflight, "codec": codec}


def load_replicated_state(opt, rep: dict) -> None:
    """Install rank 0's :func:`replicated_state`; this worker's residuals and RNGs stay."""
    from .optimizer import _Done
    devices = {name: p.device for p, name in opt._names.items()}
    loaded = codec_state_io.load_codec_states(rep["codec"], devices)
    for name, entries in loaded.items():
        opt._codec_state[name].update(entries)
    opt._steps_taken = int(rep["steps"])
    opt.adaptive.decided = bool(rep["adaptive"]["decided"])
    opt.adaptive.compress = bool(rep["adaptive"]["compress"])
    by_name = {name: p for p, name in opt._names.items()}
    opt._inflight.clear()
    for name, result in rep["inflight"].items():
        p = by_name[name]
        opt._inflight[p] = _Done(opt._context(name, p, None), result.to(p.device))
    with torch.no_grad():
        for p, name in opt._names.items():
            opt._compression.on_load(p, opt._codec_state[name], opt._group_of[p])
    opt._checked_world = None


class OptimizerStateHandler(_hvd_state.OptimizerStateHandler):
    """Horovod's optimizer handler for ``hvd.elastic.TorchState``, made right for hx optimizers
    (and for the aliasing of restored tensors): see the module docstring."""

    def restore(self):
        opt = self.value
        dropped, unfinished = abandon_reductions(opt)
        stats["dropped"] += dropped
        stats["unfinished"] += unfinished
        stats["restores"] += 1
        saved = copy.deepcopy(self._saved_optimizer_state)
        hx_state = saved.get("horovod_ext")
        if hx_state is not None and "ranks" not in hx_state:
            # Our own share, whatever the worker count Horovod reports between failure and reset.
            hx_state["world_size"] = opt.process_set.size()
        opt.load_state_dict(saved)

    def sync(self):
        opt = self.value
        params = [p for g in opt.param_groups for p in g["params"]]
        fresh = len(opt.state) == 0
        before = [p.detach().clone() for p in params] if fresh else None
        grads = [p.grad for p in params]
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        with torch.no_grad():
            if fresh:       # Horovod initialised this worker's empty state with a step: undo its update
                for p, b in zip(params, before):
                    p.copy_(b)
            for p, g in zip(params, grads):
                p.grad = g
        rep = replicated_state(opt) if hvd.rank() == 0 else None
        rep = hvd.broadcast_object(rep, root_rank=0, name="hx.elastic.sync")
        load_replicated_state(opt, rep)
        opt._compression.validate(opt.process_set.size(), opt.op)
        stats["syncs"] += 1


def register() -> None:
    """Put :class:`OptimizerStateHandler` first in Horovod's TorchState handler registry (idempotent)."""
    registry = _hvd_state.get_handler_registry()
    if not any(handler is OptimizerStateHandler for _, handler in registry):
        _hvd_state.set_handler_registry([(HxOptimizer, OptimizerStateHandler)] + list(registry))


register()
