"""asr.checkpoint: atomic saves, weights_only loads, and errors that name the file."""
import dataclasses
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from asr.checkpoint import CheckpointError, atomic_save, load_checkpoint, to_loadable


class Arbitrary:
    """Any class: torch.load(weights_only=True) must refuse to rebuild it."""

    def __init__(self):
        self.x = 1


def trained_checkpoint():
    """What asr.train saves: model and optimizer state, config dicts, strings, ints, floats."""
    from asr.config import load_config
    cfg = load_config(Path(__file__).resolve().parent.parent / "recipes" / "bfa" / "conf" / "cpu-tiny.yaml", [])
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LSTM(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    out, _ = model[1](model[0](torch.randn(5, 4))[None])
    out.sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "step": 120,
            "model_config": {"enc_hidden": 8, "pool_after": [0, 1]}, "config": cfg.to_dict(),
            "tokenizer": "/x/tok.model", "stats": "/x/stats.json", "dev_wer_greedy": 0.25}


def test_round_trip_of_what_the_trainer_saves(tmp_path):
    ckpt = trained_checkpoint()
    path = tmp_path / "sub" / "last.pt"                      # the folder is created
    atomic_save(ckpt, path)
    again = load_checkpoint(path, expect_keys=("model", "optimizer", "epoch"))
    assert again.keys() == ckpt.keys()
    for k, v in ckpt["model"].items():
        assert torch.equal(again["model"][k], v)
    assert again["optimizer"]["param_groups"] == ckpt["optimizer"]["param_groups"]
    for i, st in ckpt["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(again["optimizer"]["state"][i][k], v)
    assert again["config"] == ckpt["config"] and again["dev_wer_greedy"] == 0.25 and again["step"] == 120
    assert os.listdir(path.parent) == ["last.pt"]            # no temporary file left behind
    # the optimizer state loads back into an optimizer
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LSTM(3, 2))
    model.load_state_dict(again["model"])
    torch.optim.Adam(model.parameters()).load_state_dict(again["optimizer"])


def test_values_that_weights_only_refuses_are_converted_at_save_time(tmp_path):
    atomic_save({"path": Path("/a/b"), "np_float": np.float32(0.5), "np_int": np.int64(7), "arr": np.arange(3),
                 "nested": [(Path("c"), np.bool_(True))], "set": {1, 2}}, tmp_path / "x.pt")
    back = load_checkpoint(tmp_path / "x.pt")
    assert back["path"] == "/a/b" and back["np_float"] == 0.5 and type(back["np_float"]) is float
    assert back["np_int"] == 7 and type(back["np_int"]) is int and torch.equal(back["arr"], torch.arange(3))
    assert back["nested"] == [("c", True)] and back["set"] == {1, 2}
    # anything else is refused before a file is written, naming where it sits
    with pytest.raises(TypeError, match=r"checkpoint\['meta'\]\[1\].*Arbitrary"):
        atomic_save({"meta": [1, Arbitrary()]}, tmp_path / "y.pt")
    assert not (tmp_path / "y.pt").exists() and sorted(os.listdir(tmp_path)) == ["x.pt"]


def test_a_failed_save_leaves_the_last_good_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    atomic_save({"epoch": 1}, path)

    def crash(obj, f, *a, **k):
        f.write(b"PK\x03\x04 half a file")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({"epoch": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path) == {"epoch": 1} and os.listdir(tmp_path) == ["last.pt"]


def test_dataclass_fields_and_shared_tensors(tmp_path):
    @dataclasses.dataclass
    class Entry:
        rir: torch.Tensor
        dims: tuple
    w = torch.randn(3)
    atomic_save(dataclasses.asdict(Entry(w, (1.0, 2.0))), tmp_path / "e.pt")
    back = load_checkpoint(tmp_path / "e.pt")
    assert back["dims"] == (1.0, 2.0) and torch.equal(back["rir"], w)
    atomic_save({"a": w, "b": [w[1:]]}, tmp_path / "s.pt")
    back = load_checkpoint(tmp_path / "s.pt")
    assert back["a"].untyped_storage().data_ptr() == back["b"][0].untyped_storage().data_ptr()  # sharing kept
    assert to_loadable(w) is w


def assert_names_file(path, match, **kw):
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path, what="a BFA checkpoint", **kw)
    msg = str(info.value)
    assert str(path) in msg and "expected a BFA checkpoint" in msg, msg
    assert isinstance(info.value, ValueError)
    return msg


def test_truncated_file(tmp_path):
    atomic_save(trained_checkpoint(), tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    for n in (len(data) // 2, len(data) - 10, 100):
        (tmp_path / "cut.pt").write_bytes(data[:n])
        assert_names_file(tmp_path / "cut.pt", "truncated or damaged")


def test_empty_file(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    assert_names_file(tmp_path / "empty.pt", "empty file")


def test_missing_file_and_folder(tmp_path):
    assert_names_file(tmp_path / "nope.pt", "file not found")
    assert_names_file(tmp_path, "is a folder")


def test_text_file(tmp_path):
    (tmp_path / "notes.pt").write_text("epoch 3: loss 1.2\n")
    assert_names_file(tmp_path / "notes.pt", "not a torch file")


def test_pickle_of_an_arbitrary_class_is_refused(tmp_path):
    torch.save({"model": {}, "hook": Arbitrary()}, tmp_path / "evil.pt")      # torch's own format
    msg = assert_names_file(tmp_path / "evil.pt", "weights_only")
    assert "Arbitrary" in msg
    with open(tmp_path / "evil.pkl", "wb") as f:                               # a plain pickle
        pickle.dump({"hook": Arbitrary()}, f, protocol=2)
    msg = assert_names_file(tmp_path / "evil.pkl", "not a file written by torch.save")
    assert "Arbitrary" in msg
    with open(tmp_path / "evil4.pkl", "wb") as f:
        pickle.dump({"hook": Arbitrary()}, f)
    assert_names_file(tmp_path / "evil4.pkl", "not a file written by torch.save")


def test_expected_keys(tmp_path):
    atomic_save({"model": {}, "epoch": 1}, tmp_path / "a.pt")
    msg = assert_names_file(tmp_path / "a.pt", "no 'model_config'", expect_keys=("model", "model_config"))
    assert "'model', 'model_config'" in msg
    atomic_save([1, 2], tmp_path / "b.pt")
    assert_names_file(tmp_path / "b.pt", "holds a list", expect_keys=("model",))


def test_language_model_files(tmp_path):
    from asr.models.rnnlm import LMConfig, PieceLM, load_lm, save_lm
    lm = PieceLM(LMConfig(vocab_size=5, emb_dim=4, hidden=6))
    save_lm(lm, tmp_path / "lm.pt", dev_ppl=3.5, epoch=0, tokenizer=str(tmp_path / "t.model"), tokenizer_digest="ab")
    again, meta = load_lm(tmp_path / "lm.pt")
    assert meta["dev_ppl"] == 3.5 and meta["tokenizer_digest"] == "ab"
    atomic_save({"model": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other\.pt: no 'lm_config'.*language model written by asr-lm"):
        load_lm(tmp_path / "other.pt")


def test_asr_eval_names_a_bad_checkpoint(tmp_path):
    from asr.evaluate import load_checkpoint as eval_load
    (tmp_path / "last.pt").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"asr-eval: .*last\.pt: empty file.*BFA checkpoint"):
        eval_load(tmp_path / "last.pt")
    atomic_save({"model": {}}, tmp_path / "lm.pt")
    with pytest.raises(SystemExit, match=r"lm\.pt: no 'model_config', 'tokenizer', 'stats'"):
        eval_load(tmp_path / "lm.pt")


def test_training_checkpoint_round_trip_with_relative_paths(tmp_path):
    """Issue 17: the typed training checkpoint stores the tokenizer and statistics relative to its folder, so a
    run moved together with its corpus still finds them; older dict checkpoints (absolute paths) still load.
    Issue 15: so do the config's lexicon and n-gram (what asr-eval --method lexicon opens); unset ones stay unset."""
    from asr.checkpoint import TrainingCheckpoint
    corpus, run = tmp_path / "exp" / "corpus", tmp_path / "exp" / "run"
    (corpus / "tok").mkdir(parents=True)
    (corpus / "tok" / "t.model").write_bytes(b"sp")
    config = {"data": {"lexicon": str(corpus / "lexicon"), "train": "x.jsonl"},
              "decode": {"ngram": str(corpus / "lm" / "words.4gram.bin")}}
    ck = TrainingCheckpoint(model={"w": torch.ones(2)}, model_config={"vocab_size": 5}, config=config, epoch=3,
                            step=40, tokenizer=str(corpus / "tok" / "t.model"), stats=str(corpus / "stats.json"),
                            optimizer={"state": {}, "param_groups": []}, tokenizer_digest="abc",
                            features={"n_mels": 40}, dev_wer_greedy=0.5)
    ck.save(run / "checkpoints" / "last.pt")
    raw = load_checkpoint(run / "checkpoints" / "last.pt")
    assert raw["tokenizer"] == "../../corpus/tok/t.model" and raw["format"] == 2
    assert raw["config"]["data"]["lexicon"] == "../../corpus/lexicon" and raw["config"]["data"]["train"] == "x.jsonl"
    assert raw["config"]["decode"]["ngram"] == "../../corpus/lm/words.4gram.bin"
    assert ck.config["data"]["lexicon"] == str(corpus / "lexicon")          # saving leaves the record as it was
    moved = tmp_path / "elsewhere" / "exp"
    moved.parent.mkdir()
    (tmp_path / "exp").rename(moved)
    again = TrainingCheckpoint.load(moved / "run" / "checkpoints" / "last.pt")
    assert again.tokenizer == str((moved / "corpus" / "tok" / "t.model").resolve())
    assert again.config["data"]["lexicon"] == str((moved / "corpus" / "lexicon").resolve())
    assert again.config["decode"]["ngram"] == str((moved / "corpus" / "lm" / "words.4gram.bin").resolve())
    TrainingCheckpoint(model={}, model_config={}, config={"data": {"lexicon": ""}}, epoch=0, step=0,
                       tokenizer="t", stats="s").save(tmp_path / "unset.pt")
    assert TrainingCheckpoint.load(tmp_path / "unset.pt").config == {"data": {"lexicon": ""}}
    assert again.epoch == 3 and again.step == 40 and torch.equal(again.model["w"], torch.ones(2))
    assert again.features == {"n_mels": 40} and again.tokenizer_digest == "abc" and again.optimizer["state"] == {}
    atomic_save({"model": {}, "model_config": {}, "epoch": 1, "step": 2, "tokenizer": "/abs/t.model",
                 "stats": "/abs/s.json", "optimizer": {}}, tmp_path / "old.pt")
    old = TrainingCheckpoint.load(tmp_path / "old.pt")
    assert old.format == 1 and old.tokenizer == "/abs/t.model" and old.config == {} and old.features == {}


def test_checkpoint_averaging_is_the_elementwise_mean(tmp_path):
    """Issue 15: averaging the last epochs' checkpoints gives the mean of each floating parameter (integer
    buffers and everything else from the last one, no optimizer state); a checkpoint of another model is refused."""
    from asr.average import main as average_main
    from asr.checkpoint import TrainingCheckpoint
    run = tmp_path / "run"
    for e, w in enumerate([1.0, 2.0, 6.0]):
        TrainingCheckpoint(model={"w": torch.full((2, 2), w), "n": torch.tensor(e)}, model_config={"vocab_size": 3},
                           config={}, epoch=e, step=10 * e, tokenizer=str(tmp_path / "t.model"),
                           stats=str(tmp_path / "s.json"), optimizer={"state": {}}).save(
            run / "checkpoints" / f"epoch{e:03d}.pt")
    assert average_main(["--run-dir", str(run), "--last", "2"]) == 0
    avg = TrainingCheckpoint.load(run / "checkpoints" / "avg_last2.pt")
    assert torch.equal(avg.model["w"], torch.full((2, 2), 4.0)) and int(avg.model["n"]) == 2
    assert avg.optimizer is None and avg.epoch == 2 and avg.step == 20
    assert average_main(["--run-dir", str(run), "--last", "4"]) == 2
    TrainingCheckpoint(model={"v": torch.ones(1)}, model_config={"vocab_size": 3}, config={}, epoch=3, step=30,
                       tokenizer="t", stats="s").save(run / "checkpoints" / "epoch003.pt")
    assert average_main(["--run-dir", str(run), "--last", "2"]) == 2
