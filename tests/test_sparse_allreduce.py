"""Issue 19: top-k's sparse allreduce transport (SparCML recursive doubling with a dense switch).
One-process checks of the encoding, the merge and the switch rule, then real horovodrun jobs at 2, 3
(the allgather fallback) and 4 workers."""
import pytest
import torch

import horovod_ext as hx
from horovod_ext.compression import sparse_allreduce as sar
from tests.horovod_harness import run_horovod


def test_switch_rule_and_encoding():
    assert not sar.dense_is_smaller(499, 1000, torch.float32) and sar.dense_is_smaller(500, 1000, torch.float32)
    assert not sar.dense_is_smaller(666, 1000, torch.float64) and sar.dense_is_smaller(667, 1000, torch.float64)
    idx, vals = torch.tensor([3, 9]), torch.tensor([1.5, -2.0])
    mode, i, v = sar.decode(sar.encode(sar.SPARSE, idx, vals), torch.float32)
    assert mode == sar.SPARSE and i.tolist() == [3, 9] and v.tolist() == [1.5, -2.0]
    mode, i, v = sar.decode(sar.encode(sar.DENSE, None, torch.arange(4.0, dtype=torch.float64)), torch.float64)
    assert mode == sar.DENSE and i is None and v.tolist() == [0, 1, 2, 3]
    assert [n for n in range(1, 17) if sar.applies(n)] == [2, 4, 8, 16]


def test_merge_is_the_same_bits_in_either_order_and_switches_to_dense():
    g = torch.Generator().manual_seed(0)
    a = (sar.SPARSE, torch.tensor([1, 5, 7]), torch.randn(3, generator=g))
    b = (sar.SPARSE, torch.tensor([5, 8]), torch.randn(2, generator=g))
    ab, ba = sar.merge(a, b, 100), sar.merge(b, a, 100)
    assert ab[0] == sar.SPARSE and ab[1].tolist() == [1, 5, 7, 8] and torch.equal(ab[2], ba[2])
    assert ab[2][1] == a[2][1] + b[2][0]
    # 6 of 10 elements nonzero: dense from here on; sparse + dense and dense + dense stay dense
    c = sar.merge((sar.SPARSE, torch.tensor([0, 1, 2]), torch.ones(3)), (sar.SPARSE, torch.tensor([3, 4, 5]), torch.ones(3)), 10)
    assert c[0] == sar.DENSE and c[2].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    d = sar.merge(c, (sar.SPARSE, torch.tensor([9]), torch.tensor([2.0])), 10)
    assert d[0] == sar.DENSE and d[2][9] == 2.0 and torch.equal(sar.merge(c, d, 10)[2], sar.merge(d, c, 10)[2])


def test_spec():
    c = hx.Compression.from_spec("topk0.01-imp-sar")
    assert c.transport == "sparse_allreduce" and c.label == "topk0.01-imp-sar"
    with pytest.raises(ValueError, match="transport"):
        hx.Compression.topk(0.01, transport="ring")


@pytest.fixture(scope="module", params=[2, 3, 4], ids=["np2", "np3", "np4"])
def reports(request):
    return request.param, run_horovod("workers/sparse_allreduce_checks.py", np=request.param, timeout=300)


@pytest.mark.horovod
def test_result_is_the_sum_of_every_rank_selection_on_every_rank(reports):
    n, reps = reports
    for key in reps[0]["runs"]:
        for t in range(len(reps[0]["runs"][key]["rows"])):
            expected = torch.tensor([r["runs"][key]["rows"][t]["sent"] for r in reps], dtype=torch.float64).sum(0)
            outs = [torch.tensor(r["runs"][key]["rows"][t]["out"], dtype=torch.float64) for r in reps]
            for out in outs[1:]:
                assert torch.equal(out, outs[0]), (key, t)              # the same bits everywhere
            tol = 1e-12 if "float64" in key else 1e-5
            assert torch.allclose(outs[0], expected, atol=tol, rtol=0), (key, t, (outs[0] - expected).abs().max())


@pytest.mark.horovod
def test_transport_used_and_bytes_against_allgather(reports):
    n, reps = reports
    runs = reps[0]["runs"]
    if n == 3:                                  # not a power of two: the stated fallback is allgather
        assert runs["topk0.01-sar@0.5"]["alltoall"] == 0 and runs["topk0.01-sar@0.5"]["allgather"] == 2
        return
    rounds = n.bit_length() - 1
    assert runs["topk0.01-sar@0.5"]["alltoall"] == 2 * rounds and runs["topk0.01-sar@0.5"]["allgather"] == 0
    # Wire bytes per worker (allgather: the (n-1) rows it receives and forwards; alltoall: what it sends).
    k = 40
    if n == 2:      # one round: this worker's k pairs, plus the 2-word header
        assert runs["topk0.01-sar@0.5"]["wire"] == runs["topk0.01@0.5"]["wire"] + 2 * 2 * 4
    if n == 4:
        for overlap in ("1.0", "0.5", "0.0"):
            sparse, gather = runs[f"topk0.01-sar@{overlap}"]["wire"], runs[f"topk0.01@{overlap}"]["wire"]
            if overlap == "0.0":     # disjoint: round 1 sends 2k pairs, 3k pairs in all, as allgather (+ headers)
                assert sparse == gather + 2 * 2 * 2 * 4, (sparse, gather)
            else:                    # overlapping positions: fewer bytes than gathering every worker's pairs
                assert sparse < gather, (overlap, sparse, gather)
        assert runs["topk0.01-sar@1.0"]["wire"] == 2 * 2 * 4 * (2 + 2 * k)      # the union stays k pairs
        # disjoint positions at 30%: round 1's union (60%) crosses the switch: dense, 4 bytes per element
        numel, k3 = 4000, 1200
        expected = 4 * (2 + 2 * k3) + 4 * (2 + numel)        # one step: round 0 sparse (k pairs), round 1 dense
        assert runs["topk0.3-sar@0.0"]["wire"] == expected
        assert expected < runs["topk0.3@0.0"]["wire"]
