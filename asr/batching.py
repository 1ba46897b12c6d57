"""Length bucketing: pack items, taken in a given (length-sorted) order, into batches of bounded padded size.

Used by asr-lm (sentences, sizes in word pieces) and meant for the acoustic sampler too (utterances, sizes in
seconds; asr.loader.BucketBatchSampler), so both bucket the same way.
"""
from __future__ import annotations

from typing import Iterable, Sequence


def pack_by_length(order: Iterable[int], sizes: Sequence[float], budget: float, max_items: int = 0
                   ) -> list[list[int]]:
    """Greedy batches of the indices in ``order``: an item starts a new batch when adding it would make the
    batch's padded size (its largest size x its item count) exceed ``budget``, or the batch already holds
    ``max_items`` (0: no limit). An item larger than the budget gets a batch of its own; none is dropped."""
    batches, cur, longest = [], [], 0.0
    for i in order:
        d = sizes[i]
        if cur and (max(longest, d) * (len(cur) + 1) > budget or (max_items and len(cur) >= max_items)):
            batches.append(cur)
            cur, longest = [], 0.0
        cur.append(i)
        longest = max(longest, d)
    if cur:
        batches.append(cur)
    return batches
