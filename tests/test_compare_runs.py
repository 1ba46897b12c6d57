"""scripts/compare_runs.py: per-epoch series on a training-minutes axis, resumed epochs counted once."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"


def _write_log(run: Path, epochs):
    run.mkdir(parents=True)
    lines = [{"event": "start", "workers": 2}]
    for e, train_s, wer in epochs:
        lines.append({"event": "step", "epoch": e, "step": 1, "loss": 3.0})
        lines.append({"event": "epoch", "epoch": e, "train_s": train_s, "dev_wer_greedy": wer, "dev_wer_ctc": wer,
                      "train_ctc_loss": 2.0, "train_att_loss": 1.5, "bits_per_element": 8.2})
    (run / "train_log.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_minutes_accumulate_and_a_repeated_epoch_counts_once(tmp_path):
    # Epoch 1 logged twice (a crash after logging, then a resume): the later record wins.
    _write_log(tmp_path / "a", [(0, 120, 0.9), (1, 60, 0.8), (1, 90, 0.7), (2, 30, 0.6)])
    _write_log(tmp_path / "b", [(0, 60, 0.95)])
    out = tmp_path / "cmp"
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    series = json.loads(out.with_suffix(".json").read_text())
    a = series[str(tmp_path / "a")]
    assert [r["epoch"] for r in a] == [0, 1, 2]
    assert [r["minutes"] for r in a] == [2.0, 3.5, 4.0] and a[1]["dev_wer_ctc"] == 0.7
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_run_without_a_log_is_named(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing")], capture_output=True, text=True)
    assert res.returncode != 0 and "missing/train_log.jsonl not found" in res.stderr
