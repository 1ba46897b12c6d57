"""Issue 7: the BFA recipe end to end on a few real synthesized utterances.

A tiny model overfits a handful of utterances to WER 0; resuming from a checkpoint gives the same
next loss as the uninterrupted run; asr-eval on a tiny run writes its JSON and plot; training runs
under horovodrun with 2 workers, compression and pipelining.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CONF = ROOT / "recipes" / "bfa" / "conf" / "cpu-tiny.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus"))


def tiny_corpus(out: Path) -> Path:
    """24 tiny synthesized utterances in ``out`` with few.jsonl, a 60-piece tokenizer and feature statistics
    (also used by scripts/stress_elastic.py)."""
    subprocess.run([BIN / "asr-prep", "synth", "--out", out, "--size", "tiny", "--seed", "3", "--limit", "24"],
                   check=True, capture_output=True)
    # The 4 shortest training utterances, also used as "dev" so that overfitting shows as WER 0.
    rows = sorted((json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()),
                  key=lambda r: r["duration"])[:4]
    (out / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    subprocess.run([BIN / "asr-prep", "tokenizer", "--manifest", out / "train.jsonl", "--vocab-size", "60",
                    "--out", out / "tok"], check=True, capture_output=True)
    subprocess.run([BIN / "asr-prep", "stats", "--manifest", out / "train.jsonl", "--out", out / "stats"],
                   check=True, capture_output=True)
    return out


def overrides(corpus, run, train="few.jsonl", dev="few.jsonl", **extra):
    args = [f"data.train={corpus / train}", f"data.dev={corpus / dev}", f"data.tokenizer={corpus / 'tok' / 'tokenizer.model'}",
            f"data.stats={corpus / 'stats' / 'feature_stats.json'}", f"train.out_dir={run}", "train.log_every=1"]
    return args + [f"{k.replace('__', '.')}={v}" for k, v in extra.items()]


def train(args, np_=1, timeout=600, env=None, check=True):
    cmd = [sys.executable, "-m", "asr.train", "--config", str(CONF), *map(str, args)]
    if np_ > 1:
        cmd = [str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 or not check, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def log_records(run):
    return [json.loads(line) for line in (Path(run) / "train_log.jsonl").read_text().splitlines()]


def test_tiny_model_overfits_a_handful_of_utterances(corpus, tmp_path):
    run = tmp_path / "overfit"
    # One step per epoch. A cosine to the 70th keeps the end stable: at a constant rate the greedy attention
    # reading reached 0 and left it again between dev passes, with rounding deciding where it stood at the end.
    train(overrides(corpus, run, train__epochs=70, train__batch_seconds=1000, train__lr=0.008,
                    train__schedule="cosine", train__warmup_steps=5, train__keep_epochs=2, data__dev_subset=0,
                    train__dev_every=8, train__dev_attention=True))
    epochs = [r for r in log_records(run) if r["event"] == "epoch"]
    assert epochs[-1]["dev_wer_greedy"] == 0.0, [round(e.get("dev_wer_greedy", -1), 3) for e in epochs[-10:]]
    # the dev pass every 8th epoch and after the last; CTC first in the record
    assert [e["epoch"] for e in epochs if "dev_wer_ctc" in e] == [7, 15, 23, 31, 39, 47, 55, 63, 69]
    assert [k for k in epochs[-1] if k.startswith("dev_")] == ["dev_wer_ctc", "dev_wer_greedy"]
    # asr-eval on the same run: JSON with every hypothesis, and the per-epoch plot. Its attention greedy decode
    # is the trainer's dev pass, so it reads WER 0 too.
    out = tmp_path / "eval.json"
    subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                    corpus / "few.jsonl", "--json", out, "--method", "attention"], check=True, capture_output=True)
    res = json.loads(out.read_text())
    assert res["method"] == "attention" and res["wer"] == 0.0 and len(res["hypotheses"]) == 4
    assert sum(x["utterances"] for x in res["per_speaker"].values()) == 4
    # the default, the joint CTC/attention search: it mixes in the CTC head, still at dev WER 1.0 after these 70
    # one-step epochs, so where it lands depends on the CPU's rounding (on an AVX-512 host "elijah" became
    # "rajah"); it must decode every utterance
    subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                    corpus / "few.jsonl", "--json", out], check=True, capture_output=True)
    res = json.loads(out.read_text())
    assert res["method"] == "joint" and len(res["hypotheses"]) == 4 and 0.0 <= res["wer"] <= 0.25
    # the CTC head's best path, no decoder
    subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                    corpus / "few.jsonl", "--json", out, "--method", "ctc"], check=True, capture_output=True)
    res = json.loads(out.read_text())
    assert res["method"] == "ctc" and len(res["hypotheses"]) == 4 and 0.0 <= res["wer"]
    subprocess.run([BIN / "asr-eval", "--run-dir", run, "--manifest", corpus / "few.jsonl"], check=True,
                   capture_output=True)
    table = json.loads((run / "wer_per_epoch.json").read_text())
    assert table["few"] and (run / "wer_per_epoch.png").stat().st_size > 1000
    # WPE before the features: every epoch decoded again (its cached results were decoded without), the
    # dereverberated spectrograms computed once (2 processes) into a cache folder of their own
    subprocess.run([BIN / "asr-eval", "--run-dir", run, "--manifest", corpus / "few.jsonl", "--method", "ctc",
                    "--dereverb", "wpe", "--jobs", "2"], check=True, capture_output=True)
    per_epoch = [json.loads(f.read_text()) for f in (run / "eval").glob("few.ctc.epoch*.json")]
    assert per_epoch and {r["dereverb"] for r in per_epoch} == {"wpe"}
    subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                    corpus / "few.jsonl", "--json", out, "--method", "ctc", "--dereverb", "wpe"], check=True,
                   capture_output=True)
    assert json.loads(out.read_text())["dereverb"] == "wpe"
    described = [json.loads(f.read_text()) for f in (corpus / "feature_cache").glob("*/settings.json")]
    assert [d["dereverb"]["method"] for d in described if "dereverb" in d] == ["wpe"]
    # test-time warps: every utterance encoded at each warp and the encodings averaged, one hypothesis each; the
    # per-epoch results decoded without them are decoded again
    subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                    corpus / "few.jsonl", "--json", out, "--method", "ctc", "--warps", "0.95,1,1.05"], check=True,
                   capture_output=True)
    res = json.loads(out.read_text())
    assert res["warps"] == [0.95, 1.0, 1.05] and len(res["hypotheses"]) == 4
    subprocess.run([BIN / "asr-eval", "--run-dir", run, "--manifest", corpus / "few.jsonl", "--method", "ctc",
                    "--dereverb", "wpe", "--warps", "0.9,1.1"], check=True, capture_output=True)
    per_epoch = [json.loads(f.read_text()) for f in (run / "eval").glob("few.ctc.epoch*.json")]
    assert per_epoch and {tuple(r["warps"]) for r in per_epoch} == {(0.9, 1.1)}
    bad = subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                          corpus / "few.jsonl", "--warps", "0.3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "warp factors must lie in [0.5, 2.0]" in bad.stderr
    # CTC prefix beam search with the LM from asr-prep lm-text + asr-lm, n-best rescored by the attention decoder
    lm_dir = tmp_path / "lm"
    subprocess.run([BIN / "asr-prep", "lm-text", "--corpus", corpus, "--out", lm_dir / "text.txt", "--extra", "200"],
                   check=True, capture_output=True)
    lm_text = (lm_dir / "text.txt").read_text().splitlines()
    held_out = {json.loads(x)["text"] for m in ("dev.jsonl", "test.jsonl") for x in (corpus / m).read_text().splitlines()}
    assert len(lm_text) == 200 + len((corpus / "train.jsonl").read_text().splitlines()) and not held_out & set(lm_text)
    subprocess.run([BIN / "asr-lm", "--text", lm_dir / "text.txt", "--tokenizer", corpus / "tok" / "tokenizer.model",
                    "--out", lm_dir, "--epochs", "1", "--threads", "1"], check=True, capture_output=True)
    lm_log = [json.loads(x) for x in (lm_dir / "lm_log.jsonl").read_text().splitlines()]
    assert len(lm_log) == 1 and 1.0 < lm_log[0]["dev_ppl"] < 1e4
    subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                    corpus / "few.jsonl", "--json", out, "--method", "ctc_beam", "--lm", lm_dir / "lm.pt",
                    "--lm-weight", "0.1"], check=True, capture_output=True)
    res = json.loads(out.read_text())
    assert res["method"] == "ctc_beam" and res["lm_weight"] == 0.1 and len(res["hypotheses"]) == 4
    # an LM trained on another tokenizer is refused, naming both
    subprocess.run([BIN / "asr-prep", "tokenizer", "--manifest", corpus / "train.jsonl", "--vocab-size", "40",
                    "--out", tmp_path / "tok40"], check=True, capture_output=True)
    subprocess.run([BIN / "asr-lm", "--text", lm_dir / "text.txt", "--tokenizer", tmp_path / "tok40" / "tokenizer.model",
                    "--out", tmp_path / "lm40", "--epochs", "1", "--threads", "1"], check=True, capture_output=True)
    bad = subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                          corpus / "few.jsonl", "--method", "ctc_beam", "--lm", tmp_path / "lm40" / "lm.pt"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "tok40" in bad.stderr and "tokenizer" in bad.stderr, bad.stderr


def test_resume_gives_the_same_next_loss(corpus, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    common = dict(train__batch_seconds=20, data__dev_subset=2)
    train(overrides(corpus, full, train="train.jsonl", train__epochs=2, **common))
    train(overrides(corpus, part, train="train.jsonl", train__epochs=1, **common))
    train(overrides(corpus, part, train="train.jsonl", train__epochs=2, **common) + ["--resume"])
    steps = lambda run: [(r["step"], r["loss"]) for r in log_records(run) if r["event"] == "step"]
    resume = next(r for r in log_records(part) if r["event"] == "resume")
    full_steps, part_steps = dict(steps(full)), dict(steps(part))
    next_step = resume["step"] + 1
    assert part_steps[next_step] == full_steps[next_step]      # the first loss after resuming
    assert part_steps == full_steps                            # and every one after it


@pytest.mark.parametrize("codec", ["none", "global_qsgd8+pipe", "global_qsgd8+pipe+pred", "global_qsgd8+pipe+pred+bf16",
                                   "slowmo2", "gossip-exp"])
def test_resume_under_horovodrun_gives_the_same_losses_and_skips_a_bad_file(corpus, tmp_path, codec):
    """Issue 14: a 2-worker --resume used to hang. Now the steps after resuming from an epoch
    checkpoint have exactly the losses of the uninterrupted run (fusion off: Horovod's sums are then
    deterministic), codec state included; and a corrupt audio file in the training manifest is
    skipped, counted and logged without desynchronizing the workers. Issue 19: the same for SlowMo
    (local Adam steps, an average every 2) and Gossip (SGP): the epoch's end flushes into an exact
    average, which the checkpoint holds. Issue 15: the same pipelined with weight prediction (the
    checkpoint holds the true weights, not the predicted ones), with dropout and a persistent loader
    worker, whose start used to draw from the RNG that dropout uses, so resumed dropout masks differed;
    and with the EMA of the weights (train.ema_decay), which goes on from the checkpoint to the same bits. And the same
    under bf16 autocast with batches padded to 16 frames (train.amp=bf16, train.pad_frames=16; fp32 on a CPU without
    native bf16)."""
    rows = [json.loads(x) for x in (corpus / "train.jsonl").read_text().splitlines()]
    (corpus / "corrupt.flac").write_bytes(b"fLaC" + bytes(200))
    rows[3] = dict(rows[3], audio_filepath="corrupt.flac")
    (corpus / "train_bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    full, part = tmp_path / "full", tmp_path / "part"
    averaging = codec.split("-")[0].rstrip("0123456789") if codec.startswith(("slowmo", "gossip")) else None
    pipe, pred = "+pipe" in codec, "+pred" in codec
    extra = dict(train__batch_seconds=20, data__dev_subset=2, train__compression="none" if averaging else codec.split("+")[0],
                 train__pipeline=str(pipe).lower(), train__predict_weights=str(pred).lower(),
                 **({f"train__{averaging}": codec} if averaging else {}))
    if pred:                        # as the recipe trains: dropout, a persistent loader worker, cpu-small's decoder
        extra.update(model__dropout=0.1, train__loader_workers=1, train__ema_decay=0.9, model__attention="additive",
                     model__dec_input_feeding="false")
    if codec.endswith("+bf16"):
        extra.update(train__amp="bf16", train__pad_frames=16)
    env = {"HOROVOD_FUSION_THRESHOLD": "0"}
    proc = train(overrides(corpus, full, train="train_bad.jsonl", train__epochs=2, **extra), np_=2, env=env)
    assert "corrupt.flac" in proc.stdout + proc.stderr        # the skip names the file
    start = next(r for r in log_records(full) if r["event"] == "start")
    assert start["pipeline"] == pipe and start.get("predict_weights", False) == pred
    epochs = [r for r in log_records(full) if r["event"] == "epoch"]
    # Once per epoch in which its batch is dealt (the batches that do not divide evenly are dropped).
    skipped = [e["skipped_utterances"] for e in epochs]
    assert set(skipped) <= {0, 1} and sum(skipped) >= 1, skipped
    # Stopped after epoch 0 (its checkpoint is what a 1-epoch run leaves), then resumed.
    (part / "checkpoints").mkdir(parents=True)
    (part / "checkpoints" / "last.pt").write_bytes((full / "checkpoints" / "epoch000.pt").read_bytes())
    train(overrides(corpus, part, train="train_bad.jsonl", train__epochs=2, **extra) + ["--resume"], np_=2,
          env=env, timeout=300)
    resume = next(r for r in log_records(part) if r["event"] == "resume")
    assert resume["epoch"] == 1 and resume["codec_state_workers"] == (None if averaging else 2)
    steps = lambda run: [(r["step"], r["loss"]) for r in log_records(run) if r["event"] == "step"]
    after = [s for s in steps(full) if s[0] > resume["step"]]
    assert after and steps(part) == after
    if pred:                        # the decoded weights (the EMA) and the trained ones, bit for bit
        from asr.checkpoint import TrainingCheckpoint
        a, b = (TrainingCheckpoint.load(r / "checkpoints" / "last.pt") for r in (full, part))
        assert a.train_model is not None and a.ema_updates == b.ema_updates == a.step
        for k in a.model:
            assert torch.equal(a.model[k], b.model[k]) and torch.equal(a.train_model[k], b.train_model[k]), k
        assert any(not torch.equal(a.model[k], a.train_model[k]) for k in a.model)
    # The same checkpoint resumes at another worker count: codec state resharded by the stated rule.
    one = tmp_path / "one"
    (one / "checkpoints").mkdir(parents=True)
    (one / "checkpoints" / "last.pt").write_bytes((full / "checkpoints" / "epoch000.pt").read_bytes())
    proc = train(overrides(corpus, one, train="train_bad.jsonl", train__epochs=2, **extra) + ["--resume"])
    assert [r["epoch"] for r in log_records(one) if r["event"] == "epoch"] == [1]


def test_train_under_horovodrun_with_compression_and_pipelining(corpus, tmp_path):
    run = tmp_path / "hvd"
    train(overrides(corpus, run, train="train.jsonl", train__epochs=2, train__batch_seconds=8,
                    train__compression="global_qsgd8", train__pipeline="true", augment__enabled="true",
                    augment__pool_size=4, train__loader_workers=1, data__dev_subset=4, train__cycle_time_ms=7,
                    train__amp="bf16", train__pad_frames=16),
          np_=2)
    recs = log_records(run)
    start = next(r for r in recs if r["event"] == "start")
    assert start["workers"] == 2 and start["compression"] == "global_qsgd8" and start["pipeline"]
    assert start["cycle_time_ms"] == 7.0        # train.cycle_time_ms reached hvd.init() on the workers
    assert start["flush_denormal"]              # train.flush_denormal (default on) took effect on the CPU
    assert start["pad_frames"] == 16
    from asr.train import cpu_has_native_bf16   # bf16 autocast where the CPU runs bf16 natively, else a note and fp32
    amp_notes = [r["message"] for r in recs if r["event"] == "note" and r["message"].startswith("train.amp=bf16")]
    assert (start.get("amp"), len(amp_notes)) == (("bf16", 0) if cpu_has_native_bf16() else (None, 1))
    epochs = [r for r in recs if r["event"] == "epoch"]
    assert len(epochs) == 2 and epochs[1]["train_loss"] < epochs[0]["train_loss"]
    # The communication and loader waits are each epoch's own share, within that epoch's training time.
    assert all(0 <= e["comm_wait_s"] <= e["train_s"] and 0 <= e["data_wait_s"] <= e["train_s"] for e in epochs)
    # Throughput: the audio trained on, per core-second, in the log (2 workers x (1 thread + 1 loader) here).
    assert start["cores"] >= 1 and all(e["audio_s"] > 0 and e["audio_per_core_s"] > 0 for e in epochs)
    assert (run / "checkpoints" / "epoch001.pt").exists() and (run / "DONE").exists()
    # Both ranks' loader workers share the simulated rooms through rir_cache/ next to the training manifest.
    assert list((corpus / "rir_cache").glob("room-*.pt"))
    # Nothing built them ahead (asr-prep rooms): the log says so, epoch by epoch (epoch 1 renews one of 4 slots).
    notes = [r["message"] for r in recs if r["event"] == "note" and "simulated rooms" in r["message"]]
    assert notes[0].startswith("epoch 0: 4 of its 4 simulated rooms are not in ") and "--room-epochs 1" in notes[0]
    assert notes[1].startswith("epoch 1: 1 of its 4 ") and len(notes) == 2


def test_cycle_time_from_the_config_unless_the_launcher_set_one(monkeypatch):
    from asr.train import set_cycle_time
    # setenv first so that monkeypatch restores the variable's absence: set_cycle_time writes os.environ
    # itself, and a leaked HOROVOD_CYCLE_TIME=10 would reach every later test's horovodrun jobs.
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "")
    monkeypatch.delenv("HOROVOD_CYCLE_TIME")
    assert set_cycle_time(0) == "" and "HOROVOD_CYCLE_TIME" not in os.environ     # 0: Horovod's default
    assert set_cycle_time(10) == "10" and os.environ["HOROVOD_CYCLE_TIME"] == "10"
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "2.5")                               # horovodrun --cycle-time-ms 2.5
    assert set_cycle_time(10) == "2.5"


def _can_emulate_hosts() -> bool:
    import shutil
    return os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("tc"))


@pytest.mark.skipif(not _can_emulate_hosts(), reason="emulated hosts need root and iproute2 (ip, tc)")
def test_run_sh_across_two_emulated_hosts_gives_the_localhost_losses(corpus, tmp_path):
    """Issue 18: recipes/bfa/run.sh launches training with horovodrun across 2 namespace hosts with
    1 Gbit/s links (`hx-bench hosts up 2`, no localhost slots), Global-QSGD 8-bit + pipelining, and
    every step's loss equals the localhost run's (fusion off, as in the resume test)."""
    from horovod_ext.bench import hosts
    state = tmp_path / "hosts"
    info = hosts.up(2, "1gbit", state_dir=str(state))
    try:
        assert info["hosts"] == "198.18.1.2:1,198.18.1.3:1"
        data = [f"data.train={corpus / 'train.jsonl'}", f"data.dev={corpus / 'few.jsonl'}",
                f"data.tokenizer={corpus / 'tok' / 'tokenizer.model'}",
                f"data.stats={corpus / 'stats' / 'feature_stats.json'}", "train.log_every=1", "train.epochs=1",
                "train.batch_seconds=8", "train.compression=global_qsgd8", "train.pipeline=true",
                "augment.enabled=false", "data.dev_subset=2", "train.loader_workers=1"]
        env = dict(os.environ, HX_VENV=sys.prefix, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                   HOROVOD_FUSION_THRESHOLD="0")

        def run(exp, *where, path=None):
            cmd = ["bash", str(ROOT / "recipes" / "bfa" / "run.sh"), "--stage", "2", "--stop-stage", "2",
                   "--conf", str(CONF), "--workers", "2", *where, "--exp", str(exp), "--", *data]
            e = dict(env, PATH=f"{path}:{env['PATH']}") if path else env
            proc = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            return proc

        local, remote = tmp_path / "local", tmp_path / "hosts_run"
        run(local)
        proc = run(remote, "--hosts", info["hosts"], "--network-interface", info["interface"], path=info["ssh_dir"])
        assert "198.18.1.2:1,198.18.1.3:1" in proc.stdout
        start = next(r for r in log_records(remote) if r["event"] == "start")
        assert start["workers"] == 2 and start["compression"] == "global_qsgd8" and start["pipeline"]
        steps = lambda run_dir: [(r["step"], r["loss"]) for r in log_records(run_dir) if r["event"] == "step"]
        assert len(steps(remote)) >= 3 and steps(remote) == steps(local)
    finally:
        hosts.down(state_dir=str(state))
    assert hosts.status(state_dir=str(state)) is None


def test_time_budget_stops_before_an_epoch_that_would_overrun(corpus, tmp_path):
    run = tmp_path / "budget"
    train(overrides(corpus, run, train__epochs=5, train__max_minutes=0.0001, data__dev_subset=2))
    recs = log_records(run)
    assert [r["epoch"] for r in recs if r["event"] == "epoch"] == [0]
    assert "stopping before epoch 1" in next(r for r in recs if r["event"] == "budget")["message"]
    assert json.loads((run / "DONE").read_text())["epochs"] == 1
    assert "dev_wer_ctc" in next(r for r in recs if r["event"] == "epoch")


def test_time_budget_stops_mid_epoch_and_leaves_no_minutes_unused(corpus, tmp_path):
    """Issue 15: the budget is checked every 10 steps (an agreed clock), so a run stops mid-epoch when
    train.max_minutes is used up, evaluates, checkpoints and says so, instead of skipping a whole epoch."""
    run = tmp_path / "budget_mid"
    train(overrides(corpus, run, train="train.jsonl", train__epochs=3, train__batch_seconds=4,
                    train__max_minutes=0.0001, train__schedule="cosine", data__dev_subset=2))
    recs = log_records(run)
    epochs = [r for r in recs if r["event"] == "epoch"]
    assert len(epochs) == 1 and epochs[0]["step"] == 10 and epochs[0]["stopped_at_budget"]
    assert (run / "checkpoints" / "last.pt").exists() and json.loads((run / "DONE").read_text())["epochs"] == 1


def test_step_budget_stops_mid_epoch_at_exactly_max_steps(corpus, tmp_path):
    """train.max_steps: a budget in steps (paired runs then compare at equal steps whatever the host's
    speed); the cosine schedule runs to it, so the lr falls every step to the budget's end."""
    run = tmp_path / "budget_steps"
    train(overrides(corpus, run, train="train.jsonl", train__epochs=3, train__batch_seconds=4,
                    train__max_steps=7, train__schedule="cosine", train__warmup_steps=1, data__dev_subset=2))
    recs = log_records(run)
    epochs = [r for r in recs if r["event"] == "epoch"]
    assert len(epochs) == 1 and epochs[0]["step"] == 7 and epochs[0]["stopped_at_budget"]
    lrs = [r["lr"] for r in recs if r["event"] == "step"]
    assert len(lrs) == 7 and all(a > b for a, b in zip(lrs[1:], lrs[2:]))     # falling to the budget's end
    assert json.loads((run / "DONE").read_text())["epochs"] == 1


def test_unknown_config_key_lists_valid_ones(corpus, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "asr.train", "--config", str(CONF), "train.epoch=3"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "unknown key(s) epoch" in proc.stderr and "epochs" in proc.stderr


def test_phone_head_trains_on_two_workers_and_the_lexicon_decoder_reads_it(corpus, tmp_path):
    """Issue 15: a model with a phone CTC head (targets from asr-prep lexicon) trains under horovodrun with 2
    workers, logs its phone loss, and asr-eval --method lexicon decodes it over the lexicon's words with the word
    n-gram from asr-prep ngram, its weights tuned on a dev set; every hypothesis word is a lexicon word. --method
    combine pools its n-best with the joint search's and picks from them with weights tuned on dev."""
    lm = tmp_path / "lm"
    subprocess.run([BIN / "asr-prep", "lm-text", "--corpus", corpus, "--out", lm / "text.txt", "--extra", "100"],
                   check=True, capture_output=True)
    subprocess.run([BIN / "asr-prep", "lexicon", "--text", lm / "text.txt", "--manifest", corpus / "train.jsonl",
                    "--out", tmp_path / "lexicon"], check=True, capture_output=True)
    subprocess.run([BIN / "asr-prep", "ngram", "--text", lm / "text.txt", "--out", lm / "words.3gram.bin",
                    "--order", "3"], check=True, capture_output=True)
    run = tmp_path / "phones"
    train(overrides(corpus, run, train="train.jsonl", train__epochs=2, train__batch_seconds=8, data__dev_subset=2,
                    model__phone_ctc_weight=1.0, data__lexicon=tmp_path / "lexicon",
                    decode__ngram=lm / "words.3gram.bin"), np_=2)
    epochs = [r for r in log_records(run) if r["event"] == "epoch"]
    assert len(epochs) == 2 and all(e["train_phone_ctc_loss"] > 0 for e in epochs)
    assert epochs[1]["train_phone_ctc_loss"] < epochs[0]["train_phone_ctc_loss"]
    out = tmp_path / "lex.json"
    proc = subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                           corpus / "test.jsonl", "--json", out, "--method", "lexicon", "--tune-on",
                           corpus / "dev.jsonl", "--tune-limit", "3", "--jobs", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    words = {ln.split()[0] for ln in (tmp_path / "lexicon" / "lexicon.txt").read_text().splitlines()}
    assert res["method"] == "lexicon" and res["ngram"] == str(lm / "words.3gram.bin")
    assert len(res["hypotheses"]) == len((corpus / "test.jsonl").read_text().splitlines())
    assert all(w in words for h in res["hypotheses"] for w in h["hyp"].split())
    assert set(res["tuned_on"]["chosen"]) == {"lm_weight", "word_score", "blank_penalty", "att_weight"}
    grid, chosen = res["tuned_on"]["grid"], res["tuned_on"]["chosen"]
    assert {r["blank_penalty"] for r in grid} == {0.0, 0.5, 1.0, 1.5, 2.0}
    # the second pass: every blank penalty at the chosen word score (the two interact), no setting decoded twice
    keys = ("lm_weight", "word_score", "blank_penalty", "att_weight")
    same = [r for r in grid if all(r[k] == chosen[k] for k in keys if k != "blank_penalty")]
    assert {r["blank_penalty"] for r in same} == {0.0, 0.5, 1.0, 1.5, 2.0}
    assert len({tuple(r[k] for k in keys) for r in grid}) == len(grid)
    assert min(r["wer"] for r in grid) == next(r["wer"] for r in grid if all(r[k] == chosen[k] for k in keys))
    # --method combine: the lexicon decoder's and the joint search's n-best pooled, the weights tuned on dev
    out = tmp_path / "combine.json"
    proc = subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                           corpus / "test.jsonl", "--json", out, "--method", "combine", "--tune-on",
                           corpus / "dev.jsonl", "--tune-limit", "3", "--jobs", "2", "--combine-blank-offsets", "1.5"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["method"] == "combine" and sum(res["picked_from"].values()) == len(res["hypotheses"])
    assert res["combine"]["blank_offsets"] == [1.5] and set(res["picked_from"]) == {"lexicon", "lexicon+1.5", "joint"}
    assert all(h["hyp"] in [c["hyp"] for c in h["candidates"]] for h in res["hypotheses"])
    tuned = res["tuned_on"]["combination"]
    assert tuned["errors"] <= tuned["start_errors"] and res["combine"]["weights"] == tuned["chosen"]
    bad = subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                          corpus / "test.jsonl", "--method", "combine", "--combine-weights", '{"acoustic": 1}'],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "acoustic" in bad.stderr and "phone_ctc" in bad.stderr, bad.stderr
    bad = subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                          corpus / "test.jsonl", "--method", "combine", "--combine-blank-offsets", "1.5,x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--combine-blank-offsets" in bad.stderr and "1.5,x" in bad.stderr, bad.stderr
    # a lexicon folder that is not there is refused, naming it
    bad = subprocess.run([BIN / "asr-eval", "--checkpoint", run / "checkpoints" / "last.pt", "--manifest",
                          corpus / "test.jsonl", "--method", "lexicon", "--lexicon", tmp_path / "missing"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "missing" in bad.stderr and "asr-prep lexicon" in bad.stderr, bad.stderr


def test_resume_a_checkpoint_from_before_fused_adam_under_horovodrun(corpus, tmp_path):
    """A checkpoint written by the per-weight Adam (train.fused_adam=false, as every checkpoint before it) resumes on 2
    workers with the fused kernel on: no hang, and the steps after it follow the uninterrupted run to rounding (the
    two kernels differ in the last bits)."""
    full, part = tmp_path / "full", tmp_path / "part"
    extra = dict(train__batch_seconds=20, data__dev_subset=2)
    env = {"HOROVOD_FUSION_THRESHOLD": "0"}
    train(overrides(corpus, full, train="train.jsonl", train__epochs=2, train__fused_adam="false", **extra), np_=2,
          env=env)
    (part / "checkpoints").mkdir(parents=True)
    (part / "checkpoints" / "last.pt").write_bytes((full / "checkpoints" / "epoch000.pt").read_bytes())
    train(overrides(corpus, part, train="train.jsonl", train__epochs=2, **extra) + ["--resume"], np_=2, env=env,
          timeout=300)
    resume = next(r for r in log_records(part) if r["event"] == "resume")
    assert resume["epoch"] == 1
    steps = lambda run: [(r["step"], r["loss"]) for r in log_records(run) if r["event"] == "step"]
    after = [s for s in steps(full) if s[0] > resume["step"]]
    got = steps(part)
    assert after and [s for s, _ in got] == [s for s, _ in after]
    for (_, a), (_, b) in zip(after, got):
        assert abs(a - b) <= 1e-3 * max(1.0, abs(a)), (after, got)


def test_resuming_a_checkpoint_of_another_model_shape_names_the_settings_on_every_worker(corpus, tmp_path):
    """A run directory trained with one decoder, resumed under a config that builds another (e.g. `make demo` re-run
    after cpu-small's decoder changed): both workers stop with exit code 2 and a message naming the model settings
    that differ, not PyTorch's list of tensors, and no worker hangs."""
    run = tmp_path / "run"
    extra = dict(train__batch_seconds=20, data__dev_subset=2)
    train(overrides(corpus, run, train="train.jsonl", train__epochs=1, **extra), np_=2)
    before = (run / "checkpoints" / "last.pt").read_bytes()
    proc = train(overrides(corpus, run, train="train.jsonl", train__epochs=2, model__attention="additive",
                           model__dec_input_feeding="false", **extra) + ["--resume"], np_=2, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "cannot resume" in out, out[-3000:]
    assert "model.attention: 'location' there, 'additive' here" in out, out[-3000:]
    assert "model.dec_input_feeding: True there, False here" in out, out[-3000:]
    assert out.count("holds a model of another shape") >= 2          # every worker says it
    assert (run / "checkpoints" / "last.pt").read_bytes() == before  # the last good state is untouched
