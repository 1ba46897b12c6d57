"""Horovod shuts down with ops still queued while the training thread keeps enqueueing
(tests/test_finalize_deadlock.py).

Rank 1 queues ops that rank 0 never matches (they stay in rank 1's tensor queue), a second thread
calls ``hvd.shutdown()``, and the main thread keeps enqueueing, as gradient hooks do after a lost
worker, for a few seconds after the first refusal. With plain ``hvd.allreduce_async_`` Horovod's
background thread, destroying the queued ops under its process-set mutex, waits for the GIL that the
enqueueing thread holds while it waits for that mutex; faulthandler (a C watchdog that needs no GIL)
then ends the stalled process. ``how``: ``plain`` or ``pinned`` (horovod_ext.communicator).
"""
import faulthandler
import os
import sys
import threading
import time

import torch
import horovod.torch as hvd

from horovod_ext import communicator
from tests.workers.common import emit

QUEUED = 200          # ops rank 0 never matches
KEEP_ENQUEUEING_S = 3.0
STALL_S = 20          # far beyond a run that does not deadlock (about 4 s)


def main(how: str) -> None:
    hvd.init()
    marker = os.path.join(os.environ["HX_TEST_OUT"], "rank1.done")
    # Pinned ops that succeed release their pins.
    handles = [communicator.allreduce_async_(torch.ones(3), f"warm.{i}", hvd.Sum) for i in range(4)]
    warm = [communicator.wait(h).tolist() for h in handles]
    report = {"warm": warm, "pins_after_warm": len(communicator._pins)}
    if hvd.rank() == 0:
        deadline = time.time() + 2 * STALL_S
        while not os.path.exists(marker) and time.time() < deadline:
            time.sleep(0.1)
        emit(report)
        os._exit(0)

    enqueue = hvd.allreduce_async_ if how == "plain" else communicator.allreduce_async_
    faulthandler.dump_traceback_later(STALL_S, exit=True)
    for i in range(QUEUED):
        enqueue(torch.zeros(1), name=f"queued.{i}", op=hvd.Sum)
    report["pins_queued"] = len(communicator._pins)
    shutdown = {}

    def stop():
        time.sleep(0.5)
        hvd.shutdown()
        shutdown["returned"] = True

    threading.Thread(target=stop, daemon=True).start()
    ops, refused, first = QUEUED, 0, None
    while first is None or time.monotonic() - first < KEEP_ENQUEUEING_S:
        try:
            enqueue(torch.zeros(1), name=f"more.{ops}", op=hvd.Sum)
            ops += 1
        except Exception as err:            # HorovodInternalError: Horovod has been shut down
            refused += 1
            if first is None:
                first, report["error"] = time.monotonic(), type(err).__name__
    faulthandler.cancel_dump_traceback_later()
    report.update(ops=ops, refused=refused, shutdown_returned=shutdown.get("returned", False))
    emit(report, rank=1)
    open(marker, "w").close()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
