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

import torch
import horovod.torch as hvd
from horovod.torch.elastic import state as _hvd_state


ABANDON_TIMEOUT_S = 60.0
# What this process's handlers did (for logs and tests): commits restored, reductions in flight
# dropped at a restore (and how many of them had not ended yet), syncs.
stats = {"restores": 0, "dropped": 0, "unfinished": 0, "syncs": 0}


class _HxOptimizerType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.optim.Optimizer) and callable(getattr(type(obj), "_hx_state", None))


class HxOptimizer(metaclass=_HxOptimizerType):
    """``isinstance(opt, HxOptimizer)``: whether ``opt`` is an ``hx.DistributedOptimizer``."""


class OptimizerStateHandler(_hvd_state.OptimizerStateHandler):
    """Horovod's optimizer handler for ``hvd.elastic.TorchState``, made right for hx optimizers
    (and for the aliasing of restored tensors): see the module docstring."""

    def restore(self):
        opt = self.value
        dropped, unfinished = opt._rounds.abandon(ABANDON_TIMEOUT_S)
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
        rep = opt._replicated_state() if hvd.rank() == 0 else None
        rep = hvd.broadcast_object(rep, root_rank=0, name="hx.elastic.sync")
        opt._load_replicated(rep, codec=rep["codec"])
        opt._compression.validate(opt.process_set.size(), opt.op)
        stats["syncs"] += 1


def register() -> None:
    """Put :class:`OptimizerStateHandler` first in Horovod's TorchState handler registry (idempotent)."""
    registry = _hvd_state.get_handler_registry()
    if not any(handler is OptimizerStateHandler for _, handler in registry):
        _hvd_state.set_handler_registry([(HxOptimizer, OptimizerStateHandler)] + list(registry))


register()
