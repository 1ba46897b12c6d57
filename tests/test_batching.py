"""Length bucketing (asr.batching.pack_by_length): the packing asr-lm uses is the acoustic sampler's."""
import random

from asr.batching import pack_by_length
from asr.loader import BucketBatchSampler
from asr.train_lm import _batches


def test_batches_stay_within_the_padded_budget_and_keep_every_item():
    sizes = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 30]
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    batches = pack_by_length(order, sizes, budget=12)
    assert [i for b in batches for i in b] == order                     # in order, each once, none dropped
    assert all(max(sizes[i] for i in b) * len(b) <= 12 for b in batches if len(b) > 1)
    assert batches[-1] == [11]                                          # larger than the budget: alone
    assert max(len(b) for b in pack_by_length(order, sizes, budget=1000, max_items=4)) == 4
    assert pack_by_length([], [], 10) == []


def test_same_packing_as_the_acoustic_sampler():
    rng = random.Random(0)
    for _ in range(50):
        durations = [rng.uniform(0.5, 20.0) for _ in range(rng.randint(1, 120))]
        sampler = BucketBatchSampler(durations, rng.choice([10.0, 60.0]), rng.choice([1, 8, 64]), shuffle=False)
        order = sorted(range(len(durations)), key=lambda i: durations[i])
        assert pack_by_length(order, durations, sampler.batch_seconds, sampler.max_batch) == sampler.epoch_batches()


def test_language_model_batches_count_the_end_of_sentence_piece():
    lengths = [5, 1, 7, 3, 3, 9, 2]
    batches = _batches(lengths, batch_tokens=20, rng=random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(max(lengths[i] + 1 for i in b) * len(b) <= 20 for b in batches)


def test_each_steps_batches_are_matched_in_length_across_ranks():
    """Issue 15: with match_lengths the workers' batches at one step are neighbours in length order; every
    utterance is still dealt once, the steps (not the batches) are shuffled per epoch."""
    import random
    from asr.loader import BucketBatchSampler
    rng = random.Random(1)
    durations = [rng.uniform(1.0, 12.0) for _ in range(600)]

    def dealt(match: bool, epoch: int = 0):
        per_rank = []
        for rank in range(2):
            s = BucketBatchSampler(durations, 40.0, 32, num_replicas=2, rank=rank, seed=3, match_lengths=match)
            s.set_epoch(epoch)
            per_rank.append(list(s))
        return per_rank

    def mean_gap(per_rank):
        longest = lambda b: max(durations[i] for i in b)
        return sum(abs(longest(a) - longest(b)) for a, b in zip(*per_rank)) / len(per_rank[0])

    matched, unmatched = dealt(True), dealt(False)
    assert mean_gap(matched) < 0.1 * mean_gap(unmatched), (mean_gap(matched), mean_gap(unmatched))
    every = sorted(i for rank in matched for b in rank for i in b)
    assert len(every) == len(set(every)) and len(every) >= len(durations) - 2 * 32
    assert [b[0] for b in dealt(True, epoch=1)[0]] != [b[0] for b in matched[0]]     # reshuffled per epoch


def test_short_first_curriculum_epochs_then_shuffled():
    """Issue 15: the curriculum deals the first epoch(s) shortest first on every rank (lengths still matched
    across the ranks' steps), then the usual shuffled steps; every utterance is dealt either way."""
    rng = random.Random(2)
    durations = [rng.uniform(1.0, 12.0) for _ in range(400)]
    longest = lambda b: max(durations[i] for i in b)

    def steps(epoch):
        ranks = []
        for rank in range(2):
            s = BucketBatchSampler(durations, 30.0, 32, num_replicas=2, rank=rank, seed=5, short_first_epochs=1)
            s.set_epoch(epoch)
            ranks.append([longest(b) for b in s])
        return ranks

    first, second = steps(0), steps(1)
    for rank in first:   # shortest first to the end of the epoch (up to the sampler's 10% length jitter)
        assert all(b >= a / 1.1 for a, b in zip(rank, rank[1:])) and rank[-1] > 5 * rank[0]
    gaps = [abs(a - b) / max(a, b) for a, b in zip(*first)]
    assert sum(gaps) / len(gaps) < 0.05                            # both ranks' batches alike at each step
    assert second[0] != sorted(second[0])                         # epoch 1: shuffled as usual
    assert sum(len(b) for b in BucketBatchSampler(durations, 30.0, 32, short_first_epochs=1)) == len(durations)
