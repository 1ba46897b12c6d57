"""train.ema_decay: the EMA of the weights (asr.ema) follows its closed form, keeps to the model's device, survives a
checkpoint round trip, and the checkpoint's two sets of weights are used where they belong (decoding: the EMA;
resuming: the trained weights; averaging: the EMA, never the trained weights)."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asr.checkpoint import TrainingCheckpoint, average_checkpoints
from asr.config import ConfigError, load_config
from asr.ema import ema_state, ema_weight, load_ema_state, make_ema

ROOT = Path(__file__).resolve().parent.parent


def _steps(model, n):
    """n fake optimizer steps: every parameter moves by a step-dependent amount."""
    for k in range(n):
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p.add_(torch.full_like(p, (k + 1) * (i + 1) * 0.01))
        yield k


def test_ema_follows_its_closed_form_with_the_warm_up():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    ema = make_ema(model, 0.9)
    ref = None
    for n in _steps(model, 40):
        ema.update_parameters(model)
        cur = [p.detach().clone() for p in model.parameters()]
        if ref is None:           # the first update copies the weights
            ref = cur
        else:                     # update n + 1 after n averaged: decay min(0.9, (1 + n) / (10 + n))
            d = min(0.9, (1 + n) / (10 + n))
            ref = [d * r + (1 - d) * c for r, c in zip(ref, cur)]
    for a, r in zip(ema.module.parameters(), ref):
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-6)
    assert int(ema.n_averaged) == 40
    # the warm-up's shares: 1 - 2/11 at the second update, the floor 1 - decay once (1 + n) / (10 + n) passes it
    assert float(ema_weight(torch.tensor(1), 0.9)) == pytest.approx(1 - 2 / 11)
    assert float(ema_weight(torch.tensor(10_000), 0.9)) == pytest.approx(0.1)


def test_ema_state_round_trip_continues_exactly():
    torch.manual_seed(1)
    a = torch.nn.Linear(5, 5)
    b = torch.nn.Linear(5, 5)
    b.load_state_dict(a.state_dict())
    ea, eb = make_ema(a, 0.99), make_ema(b, 0.99)
    for _ in _steps(a, 7):
        ea.update_parameters(a)
    weights, updates = ema_state(ea)
    assert updates == 7 and set(weights) == set(a.state_dict())     # the model's own keys, no "module." prefix
    b.load_state_dict(a.state_dict())
    load_ema_state(eb, weights, updates)
    for _ in zip(_steps(a, 5), _steps(b, 5)):
        ea.update_parameters(a)
        eb.update_parameters(b)
    for x, y in zip(ea.module.parameters(), eb.module.parameters()):
        assert torch.equal(x, y)


def test_ema_keeps_to_the_model_device_and_dtype():
    """Written for the device the model is on (CPU here; CUDA where there is one): no host copies per step."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        model = torch.nn.Linear(3, 3).to(dev)
        ema = make_ema(model, 0.5)
        for _ in _steps(model, 3):
            ema.update_parameters(model)
        assert all(p.device.type == dev and p.dtype == torch.float32 for p in ema.module.parameters())


@pytest.mark.parametrize("bad", ["1.0", "-0.1", "2"])
def test_ema_decay_outside_0_1_is_a_config_error(bad):
    with pytest.raises(ConfigError, match=r"train\.ema_decay.*\[0, 1\)"):
        load_config(ROOT / "recipes" / "bfa" / "conf" / "cpu-small.yaml", [f"train.ema_decay={bad}"])
    with pytest.raises(ValueError, match="decay"):
        make_ema(torch.nn.Linear(2, 2), float(bad))


def _checkpoint(tmp_path, name, scale, ema=True):
    model = {"w": torch.full((2, 2), float(scale)), "steps": torch.tensor(scale, dtype=torch.long)}
    ck = TrainingCheckpoint(model=model, model_config={}, config={}, epoch=scale, step=10 * scale,
                            tokenizer=str(tmp_path / "tok.model"), stats=str(tmp_path / "stats.json"),
                            optimizer={"state": {}},
                            train_model={k: v + 100 for k, v in model.items()} if ema else None,
                            ema_updates=10 * scale if ema else 0)
    path = tmp_path / name
    ck.save(path)
    return path


def test_checkpoint_keeps_both_weights_and_averaging_takes_the_ema(tmp_path):
    p1, p2 = _checkpoint(tmp_path, "epoch001.pt", 1), _checkpoint(tmp_path, "epoch002.pt", 2)
    ck = TrainingCheckpoint.load(p2)
    assert ck.ema_updates == 20 and torch.equal(ck.train_model["w"], torch.full((2, 2), 102.0))
    avg = average_checkpoints([p1, p2])
    assert torch.equal(avg.model["w"], torch.full((2, 2), 1.5))        # the EMAs averaged
    assert avg.train_model is None and avg.optimizer is None             # nothing to resume from
    # a checkpoint written before the field existed reads as one without an EMA
    old = dataclasses.asdict(TrainingCheckpoint.load(_checkpoint(tmp_path, "old.pt", 3, ema=False)))
    del old["train_model"], old["ema_updates"]
    torch.save(old, tmp_path / "older.pt")
    ck = TrainingCheckpoint.load(tmp_path / "older.pt")
    assert ck.train_model is None and ck.ema_updates == 0


def test_trained_weights_twin_of_a_run(tmp_path):
    run, twin = tmp_path / "run", tmp_path / "twin"
    (run / "checkpoints").mkdir(parents=True)
    _checkpoint(run / "checkpoints", "epoch001.pt", 1)
    (run / "train_log.jsonl").write_text("{}\n")
    script = ROOT / "scripts" / "trained_weights_run.py"
    proc = subprocess.run([sys.executable, script, "--run-dir", run, "--out", twin], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ck = TrainingCheckpoint.load(twin / "checkpoints" / "epoch001.pt")
    assert torch.equal(ck.model["w"], torch.full((2, 2), 101.0)) and ck.train_model is None
    assert Path(ck.tokenizer) == (run / "checkpoints" / "tok.model").resolve()   # paths still point at the run's files
    # a run without an EMA has no trained weights to pull out: a clear error
    plain = tmp_path / "plain"
    (plain / "checkpoints").mkdir(parents=True)
    _checkpoint(plain / "checkpoints", "epoch001.pt", 1, ema=False)
    proc = subprocess.run([sys.executable, script, "--run-dir", plain, "--out", tmp_path / "x"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "train.ema_decay" in proc.stderr and "epoch001.pt" in proc.stderr
