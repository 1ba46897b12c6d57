"""Run a function over items on all cores with a progress bar (or inline with jobs=1, for debugging)."""
from __future__ import annotations

import multiprocessing as mp
import os
from typing import Callable, Iterable

from tqdm import tqdm


def _init_worker():
    import torch
    torch.set_num_threads(1)  # one process per core already; avoid oversubscription


def _call(arg):
    fn, i, item = arg
    return i, fn(item)


def parallel_map(fn: Callable, items: Iterable, jobs: int | None = None, desc: str = "", unit: str = "it") -> list:
    """``[fn(x) for x in items]`` over ``jobs`` processes (default: all cores), results in input order.

    ``fn`` must be a module-level function (it is pickled). Progress goes to stderr via tqdm.
    """
    items = list(items)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(items) or 1))
    out = [None] * len(items)
    bar = tqdm(total=len(items), desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)
    try:
        if jobs == 1:   # one thread, as in the workers: resampling's floats depend on the thread count
            from ..frontend.cache import single_thread
            with single_thread():
                for i, x in enumerate(items):
                    out[i] = fn(x)
                    bar.update()
        else:
            with mp.get_context("fork").Pool(jobs, initializer=_init_worker) as pool:
                for i, res in pool.imap_unordered(_call, ((fn, i, x) for i, x in enumerate(items)), chunksize=1):
                    out[i] = res
                    bar.update()
    finally:
        bar.close()
    return out
