"""The lane arithmetic of Global-QSGD, checked without Horovod, for up to 64 workers."""
import random

import pytest
import torch

from horovod_ext import packing

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def words_as_ints(words):
    return [int(w) for w in words.tolist()]


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7, 8, 16, 33, 64])
def test_sum_of_packed_words_is_packed_sum_without_overflow(bits, workers):
    try:
        m = packing.check_capacity(bits, workers)
    except ValueError:
        assert (1 << (bits - 1)) - 1 < workers
        return
    numel = 3 * packing.lanes_per_word(bits) + 5      # includes padding lanes
    gen = torch.Generator().manual_seed(bits * 100 + workers)
    qs = [torch.randint(-m, m + 1, (numel,), generator=gen) for _ in range(workers)]
    # the extremes: every worker at +m in some lanes, at -m in others (the top lanes included)
    for q in qs:
        q[:numel // 3] = m
        q[numel // 3: 2 * numel // 3] = -m
    packed = [packing.pack(q, bits, m) for q in qs]
    # Partial sums in exact integer arithmetic must stay inside int64 (no wrap-around anywhere,
    # whatever order the ring sums in).
    order = list(range(workers))
    random.Random(0).shuffle(order)
    acc = [0] * packed[0].numel()
    for i in order:
        acc = [a + b for a, b in zip(acc, words_as_ints(packed[i]))]
        assert all(INT64_MIN <= a <= INT64_MAX for a in acc)
    total = torch.tensor(acc, dtype=torch.int64)
    assert torch.equal(total, torch.stack(packed).sum(0))
    out = packing.unpack(total, bits, m, workers, numel)
    assert torch.equal(out.to(torch.int64), torch.stack(qs).sum(0))


def test_levels_and_capacity():
    assert packing.levels_for(8, 1) == 127
    assert packing.levels_for(8, 4) == 31
    assert packing.levels_for(8, 64) == 1
    assert packing.levels_for(4, 4) == 1
    with pytest.raises(ValueError, match="cannot carry the sum of 4 workers"):
        packing.check_capacity(2, 4)
    with pytest.raises(ValueError, match="cannot carry the sum of 128 workers"):
        packing.check_capacity(8, 128)
    with pytest.raises(ValueError, match="bits must be one of"):
        packing.levels_for(3, 2)


def test_wire_size():
    assert packing.packed_words(64, 8) == 8          # 8 bits per element
    assert packing.packed_words(65, 8) == 9
    assert packing.packed_words(64, 4) == 4
    assert packing.packed_words(64, 2) == 2


def test_unpack_rejects_wrong_dtype():
    with pytest.raises(TypeError, match="int64"):
        packing.unpack(torch.zeros(4, dtype=torch.int32), 8, 1, 1, 4)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_joined_workers_all_zero_words_are_neutral_with_a_contributor_count(bits):
    """Horovod adds all-zero words for a rank that called hvd.join(); unpacking with the number of
    contributing workers (summed in an extra word, as Global-QSGD does) recovers the active sum."""
    workers = (1 << (bits - 1)) - 1           # the most workers the lanes carry
    m = packing.check_capacity(bits, workers)
    active = max(1, workers - 2)              # the others have joined
    numel = 2 * packing.lanes_per_word(bits) + 3
    gen = torch.Generator().manual_seed(bits)
    qs = [torch.randint(-m, m + 1, (numel,), generator=gen) for _ in range(active)]
    words = packing.packed_words(numel, bits)
    packed = []
    for q in qs:
        p = packing.pack(q, bits, m, extra_words=1)
        assert p.numel() == words + 1 and int(p[-1]) == 0
        p[-1] = 1
        packed.append(p)
    packed += [torch.zeros(words + 1, dtype=torch.int64)] * (workers - active)
    total = torch.stack(packed).sum(0)
    assert int(total[-1]) == active
    out = packing.unpack(total[:words], bits, m, total[words], numel)
    assert torch.equal(out.to(torch.int64), torch.stack(qs).sum(0))
    # an int count works the same
    assert torch.equal(packing.unpack(total[:words], bits, m, active, numel), out)
