"""hx.Gossip (issue 19): the pairing rule and arguments in one process, then real horovodrun jobs at 2, 3 and
4 workers whose models after every step are compared with a one-process replay of D-PSGD / SGP."""
import pytest
import torch
import horovod.torch as hvd

import horovod_ext as hx
from horovod_ext.gossip import parse_spec, peers
from tests.horovod_harness import run_horovod
from tests.workers.slowmo_problem import batch, make_model

STEPS = 7


@pytest.fixture(scope="module", autouse=True)
def horovod_single():
    hvd.init()
    yield


def test_pairing_is_a_permutation_every_step():
    for n in range(2, 9):
        for topology in ("ring", "exponential"):
            for step in range(6):
                sends = {r: peers(topology, step, r, n) for r in range(n)}
                # whoever i sends to lists i among those it receives from, and nobody talks to itself
                for r, (to, _) in sends.items():
                    assert r not in to
                    for peer in to:
                        assert r in sends[peer][1], (n, topology, step, r, peer)
    assert [peers("exponential", s, 0, 8)[0] for s in range(4)] == [[1], [2], [4], [1]]
    assert peers("ring", 0, 0, 5) == ([4, 1], [4, 1]) and peers("ring", 3, 1, 2) == ([0], [0])


def test_arguments_and_specs():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="topology"):
        hx.Gossip(opt, model.named_parameters(), topology="torus")
    with pytest.raises(ValueError, match="push_sum"):
        hx.Gossip(opt, model.named_parameters(), topology="ring", push_sum=True)
    assert not hx.Gossip(opt, model.named_parameters(), topology="ring").push_sum        # the default follows
    assert hx.Gossip(opt, model.named_parameters()).push_sum                             # the topology
    assert parse_spec("gossip-ring") == {"topology": "ring", "push_sum": False, "average_every": 0}
    assert parse_spec("gossip-exp-a10") == {"topology": "exponential", "push_sum": True, "average_every": 10}
    for bad in ("gossip", "gossip-star", "gossip-exp-x3"):
        with pytest.raises(ValueError, match="Gossip spec"):
            parse_spec(bad)
    g = hx.Gossip.from_spec(opt, model.named_parameters(), "gossip-exp")
    g.zero_grad()
    model(batch(0, 0)[0]).sum().backward()
    g.step()                                       # one worker: a plain local step
    assert g.comm_stats()["total"]["bytes_handed"] == 0


def replay(cfg: dict, n: int):
    """Every worker's parameters after every step, and after the final exact average."""
    models = [make_model() for _ in range(n)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    def write(m, v):
        off = 0
        for p in m.parameters():
            p.data.copy_(v[off:off + p.numel()].view_as(p))
            off += p.numel()

    def exact_average():
        for i, ps in enumerate(zip(*[list(m.parameters()) for m in models])):
            total = ps[0].detach().clone()
            for p in ps[1:]:
                total += p.detach()
            for p in ps:
                p.data.copy_(total * (1.0 / n))
            bufs = [o.state[p]["momentum_buffer"] for o, p in zip(opts, ps)]
            total = bufs[0].clone()
            for b in bufs[1:]:
                total += b
            for b in bufs:
                b.copy_(total * (1.0 / n))

    trail, since = [], 0
    for t in range(STEPS):
        for w in range(n):
            x, y = batch(w, t)
            opts[w].zero_grad()
            torch.nn.functional.mse_loss(models[w](x), y).backward()
            opts[w].step()
        xs = [flat(m) for m in models]
        for w in range(n):
            if cfg["topology"] == "ring":
                nbrs = [1 - w] if n == 2 else [(w - 1) % n, (w + 1) % n]
                total = xs[w].clone()
                for v in nbrs:
                    total += xs[v]
                write(models[w], total * (1.0 / (len(nbrs) + 1)))
            else:
                shifts = [1 << m for m in range((n - 1).bit_length())]
                write(models[w], (xs[w] + xs[(w - shifts[t % len(shifts)]) % n]) * 0.5)
        since += 1
        if cfg["average_every"] and since == cfg["average_every"]:
            exact_average()
            since = 0
        trail.append([flat(m) for m in models])
    if since:
        exact_average()
    return trail, flat(models[0])


CONFIGS = {"ring": dict(topology="ring", average_every=0), "exp": dict(topology="exponential", average_every=0),
           "exp_avg3": dict(topology="exponential", average_every=3)}


@pytest.fixture(scope="module", params=[2, 3, 4], ids=["np2", "np3", "np4"])
def reports(request):
    return request.param, run_horovod("workers/gossip_checks.py", np=request.param, timeout=300,
                                      env={"HOROVOD_FUSION_THRESHOLD": "0"})


@pytest.mark.horovod
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_one_process_replay(reports, name):
    n, reps = reports
    trail, final = replay(CONFIGS[name], n)
    for rep in reps:
        for t in range(STEPS):
            got = torch.tensor(rep["trail"][name][t])
            diff = (got - trail[t][rep["rank"]]).abs().max().item()
            # the mixing is local arithmetic on received bits: exact; an exact average sums in the ring's order
            exact = n == 2 or not CONFIGS[name]["average_every"] or t < CONFIGS[name]["average_every"] - 1
            assert diff <= (0.0 if exact else 1e-6), (name, rep["rank"], t, diff)
        assert (torch.tensor(rep["final"][name]) - final).abs().max().item() <= (0.0 if n == 2 else 1e-6)
    # one peer per step on the exponential graph, two on a ring of 3 or more
    stats = reps[0]["stats"][name]
    model_bytes = sum(p.numel() for p in make_model().parameters()) * 4 + (4 if name == "exp" else 0)
    if n == 2:      # the pair's mean: one allreduce per step
        assert stats["alltoall_calls"] == 0 and stats["allreduce_calls"] >= STEPS
        return
    peers_per_step = 2 if name == "ring" else 1
    assert stats["bytes_alltoall"] / STEPS == peers_per_step * model_bytes


@pytest.mark.horovod
def test_flush_and_resume(reports):
    _, reps = reports
    for rep in reps:
        assert rep["resume_equal"], rep["rank"]
        for name in CONFIGS:          # after the exact average every worker holds the same bits
            assert rep["final"][name] == reps[0]["final"][name], (name, rep["rank"])
