"""The epoch a Dataset's DataLoader worker processes see.

A plain attribute would stay frozen in each persistent worker's copy of the dataset (silently repeating epoch
0's augmentation draws); a shared-memory tensor set in the main process is seen by every worker.
"""
from __future__ import annotations

import torch


class SharedEpoch:
    def __init__(self, epoch: int = 0):
        self._value = torch.tensor(int(epoch), dtype=torch.int64).share_memory_()

    def set(self, epoch: int) -> None:
        self._value.fill_(int(epoch))

    def __int__(self) -> int:
        return int(self._value)
