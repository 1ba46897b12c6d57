"""The trainer's Adam: fused where the device has a kernel, the same updates as the per-weight loop, and still fused
after resuming a checkpoint written by a non-fused optimizer."""
import copy

import torch

from asr.train import keep_fused, make_adam


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 20, generator=g)).pow(2).sum().backward()
        opt.step()


def test_fused_equals_loop():
    a, b = _model(), _model()
    oa = make_adam(a.parameters(), lr=1e-2, weight_decay=1e-4, fused=False)
    ob = make_adam(b.parameters(), lr=1e-2, weight_decay=1e-4, fused=True)
    assert ob.param_groups[0]["fused"] and not oa.param_groups[0]["fused"]
    _train(a, oa, 50)
    _train(b, ob, 50)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_resume_from_unfused_checkpoint_stays_fused():
    old = _model()
    o_old = make_adam(old.parameters(), lr=1e-2, weight_decay=0.0, fused=False)
    _train(old, o_old, 10)
    ckpt = copy.deepcopy(o_old.state_dict())
    ref = copy.deepcopy(old)
    o_ref = make_adam(ref.parameters(), lr=1e-2, weight_decay=0.0, fused=False)
    o_ref.load_state_dict(copy.deepcopy(ckpt))   # load_state_dict keeps the tensors it is given

    new = copy.deepcopy(old)
    o_new = make_adam(new.parameters(), lr=1e-2, weight_decay=0.0, fused=True)
    fused = [g["fused"] for g in o_new.param_groups]
    o_new.load_state_dict(copy.deepcopy(ckpt))
    assert o_new.param_groups[0]["fused"] is None          # what load_state_dict alone leaves
    keep_fused(o_new, fused)
    assert o_new.param_groups[0]["fused"] is True
    for p in new.parameters():
        step = o_new.state[p]["step"]
        assert step.dtype == torch.float32 and step.device == p.device and float(step) == 10
    _train(new, o_new, 5, seed=2)
    _train(ref, o_ref, 5, seed=2)
    for pn, pr in zip(new.parameters(), ref.parameters()):
        torch.testing.assert_close(pn, pr, rtol=1e-5, atol=1e-6)
    assert float(o_new.state[next(iter(new.parameters()))]["step"]) == 15
