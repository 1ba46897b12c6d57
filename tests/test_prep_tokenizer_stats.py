"""Tokenizer (sentencepiece unigram), feature function and normalization statistics."""
import json
import random

import numpy as np
import pytest
import sentencepiece as spm
import soundfile as sf
import torch

from asr.checkpoint import load_checkpoint
from asr.data.cli import main
from asr.data.manifest import write_manifest
from asr.features import compute_features

WORDS = ("alarm timer weather music call message tomorrow morning seven thirty play navigate city remind "
         "the a to for in of and my me please set turn on off").split()


def text_manifest(path, n=200, seed=0):
    rng = random.Random(seed)
    write_manifest(path, [{"id": f"u{i}", "audio_filepath": f"u{i}.flac", "duration": 1.0,
                           "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))}
                          for i in range(n)])


def test_tokenizer_trains_encodes_decodes_deterministically(tmp_path):
    text_manifest(tmp_path / "train.jsonl")
    for out in ("tok1", "tok2"):
        assert main(["tokenizer", "--manifest", str(tmp_path / "train.jsonl"), "--vocab-size", "40",
                     "--out", str(tmp_path / out)]) == 0
    model = (tmp_path / "tok1" / "tokenizer.model").read_bytes()
    assert model == (tmp_path / "tok2" / "tokenizer.model").read_bytes()
    vocab = (tmp_path / "tok1" / "tokenizer.vocab").read_text().splitlines()
    assert len(vocab) == 40 and vocab[0].split("\t")[0] == "<unk>"
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok1" / "tokenizer.model"))
    for sentence in ("set an alarm for seven thirty", "play music tomorrow morning please"):
        ids = sp.encode(sentence)
        assert ids and sp.decode(ids) == sentence
    assert sp.piece_size() == 40


def test_tokenizer_too_large_vocabulary_is_a_clear_error(tmp_path, capfd):
    text_manifest(tmp_path / "train.jsonl", n=5)
    assert main(["tokenizer", "--manifest", str(tmp_path / "train.jsonl"), "--vocab-size", "5000",
                 "--out", str(tmp_path / "tok")]) == 2
    assert "5000-piece" in capfd.readouterr().err


def test_compute_features_shape_and_compression():
    wave = torch.from_numpy(np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1)
    f = compute_features(wave)
    assert f.shape == (101, 40) and torch.isfinite(f).all() and (f >= 0).all()
    assert compute_features(wave[None]).shape == (101, 40)
    log = compute_features(wave, compression="log")
    assert torch.allclose(torch.exp(log), f.pow(15) + 1e-6, rtol=1e-3, atol=1e-6)
    with pytest.raises(ValueError):
        compute_features(wave, compression="cube")


def test_stats_writes_json_pt_and_png(tmp_path, capsys):
    entries = []
    for i, (sec, hz) in enumerate([(0.5, 300), (1.2, 800), (2.5, 1500)]):
        t = np.arange(int(sec * 16000)) / 16000
        sf.write(tmp_path / f"s{i}.flac", (0.2 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 16000)
        entries.append({"id": f"s{i}", "audio_filepath": f"s{i}.flac", "duration": sec, "text": "x y z"})
    write_manifest(tmp_path / "train.jsonl", entries)
    assert main(["stats", "--manifest", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "stats"),
                 "--jobs", "2"]) == 0
    stats = json.loads((tmp_path / "stats" / "feature_stats.json").read_text())
    assert stats["n_mels"] == 40 and len(stats["mean"]) == 40 and len(stats["var"]) == 40
    assert stats["frames"] == 51 + 121 + 251 and stats["compression"] == "power"
    feats = torch.cat([compute_features(torch.from_numpy(sf.read(tmp_path / f"s{i}.flac", dtype="float32")[0]))
                       for i in range(3)]).double()
    assert np.allclose(stats["mean"], feats.mean(0).numpy(), rtol=1e-6)
    assert np.allclose(stats["var"], feats.var(0, unbiased=False).numpy(), rtol=1e-5, atol=1e-9)
    pt = load_checkpoint(tmp_path / "stats" / "feature_stats.pt", expect_keys=("mean", "var", "std"))
    assert pt["mean"].shape == (40,)
    assert (tmp_path / "stats" / "durations.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "durations: 3 utterances" in out and "2-3 s" in out


def test_features_match_the_augmentation_pipeline_framing():
    """Stats are only valid for training if both compute the same features (skipped until asr.augment exists)."""
    aug = pytest.importorskip("asr.augment.features")
    vtlp = pytest.importorskip("asr.augment.vtlp")
    wave = torch.from_numpy(np.random.default_rng(1).standard_normal(8000).astype(np.float32) * 0.1)
    theirs = aug.mel_features(wave, vtlp.warped_mel_filterbank())
    assert torch.allclose(compute_features(wave), theirs, rtol=1e-4, atol=1e-6)
