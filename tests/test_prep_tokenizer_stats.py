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
from asr.data.stats import read_stats
from asr.frontend import FeatureSettings, compute_features

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


def test_tokenizer_on_a_text_file_equals_the_same_text_as_a_manifest(tmp_path, capfd):
    """The recipe trains the pieces on the LM text (asr-prep lm-text's one sentence per line)."""
    text_manifest(tmp_path / "train.jsonl")
    lines = [json.loads(x)["text"] for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n\n")
    assert main(["tokenizer", "--text", str(tmp_path / "text.txt"), "--vocab-size", "40", "--out",
                 str(tmp_path / "a")]) == 0
    assert main(["tokenizer", "--manifest", str(tmp_path / "train.jsonl"), "--vocab-size", "40", "--out",
                 str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "tokenizer.model").read_bytes() == (tmp_path / "b" / "tokenizer.model").read_bytes()
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 au lait\n")
    assert main(["tokenizer", "--text", str(tmp_path / "bad.txt"), "--vocab-size", "40", "--out",
                 str(tmp_path / "c")]) == 2
    assert "bad.txt: cannot read text (expected UTF-8" in capfd.readouterr().err
    with pytest.raises(SystemExit):   # one source, not both
        main(["tokenizer", "--text", "t.txt", "--manifest", "m.jsonl", "--vocab-size", "40", "--out", "x"])


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
    log = compute_features(wave, FeatureSettings(mel_compression="log"))
    assert torch.allclose(torch.exp(log), f.pow(15) + 1e-6, rtol=1e-3, atol=1e-6)
    with pytest.raises(ValueError):
        FeatureSettings(mel_compression="cube")
    with pytest.raises(ValueError, match="8000 Hz"):
        compute_features(wave, sample_rate=8000)


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
    assert stats["features"] == FeatureSettings().to_dict() and len(stats["mean"]) == 40 and len(stats["var"]) == 40
    assert stats["frames"] == 51 + 121 + 251
    assert read_stats(tmp_path / "stats" / "feature_stats.json").settings == FeatureSettings()
    feats = torch.cat([compute_features(torch.from_numpy(sf.read(tmp_path / f"s{i}.flac", dtype="float32")[0]))
                       for i in range(3)]).double()
    assert np.allclose(stats["mean"], feats.mean(0).numpy(), rtol=1e-6)
    assert np.allclose(stats["var"], feats.var(0, unbiased=False).numpy(), rtol=1e-5, atol=1e-9)
    pt = load_checkpoint(tmp_path / "stats" / "feature_stats.pt", expect_keys=("mean", "var", "std"))
    assert pt["mean"].shape == (40,)
    assert (tmp_path / "stats" / "durations.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "durations: 3 utterances" in out and "2-3 s" in out


def test_stats_record_the_settings_they_were_computed_with(tmp_path):
    """asr-prep stats --mel-compression log: the file says so, and its mean is that of log features."""
    t = np.arange(8000) / 16000
    sf.write(tmp_path / "a.flac", (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    write_manifest(tmp_path / "m.jsonl", [{"id": "a", "audio_filepath": "a.flac", "duration": 0.5, "text": "x"}])
    assert main(["stats", "--manifest", str(tmp_path / "m.jsonl"), "--out", str(tmp_path / "st"), "--jobs", "1",
                 "--mel-compression", "log"]) == 0
    stats = read_stats(tmp_path / "st" / "feature_stats.json")
    assert stats.settings == FeatureSettings(mel_compression="log")
    feats = compute_features(torch.from_numpy(sf.read(tmp_path / "a.flac", dtype="float32")[0]), stats.settings)
    assert np.allclose(stats.mean.numpy(), feats.double().mean(0).numpy(), rtol=1e-5)


def test_stats_fill_the_feature_cache_training_reads_and_give_the_same_figures(tmp_path):
    """asr-prep stats leaves each clean spectrogram where training's data.feature_cache=auto looks (keyed by the
    manifest's md5), and its figures equal those computed without a cache."""
    from asr.data.audio import md5_file
    from asr.frontend.cache import open_feature_cache

    entries = []
    for i, (sec, hz) in enumerate([(0.7, 250), (1.3, 900)]):
        t = np.arange(int(sec * 16000)) / 16000
        sf.write(tmp_path / f"s{i}.flac", (0.2 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 16000)
        entries.append({"id": f"s{i}", "audio_filepath": f"s{i}.flac", "duration": sec, "text": "x",
                        "md5": md5_file(tmp_path / f"s{i}.flac")})
    manifest = tmp_path / "train.jsonl"
    write_manifest(manifest, entries)
    assert main(["stats", "--manifest", str(manifest), "--out", str(tmp_path / "off"), "--jobs", "1",
                 "--feature-cache", "off"]) == 0
    assert not (tmp_path / "feature_cache").exists()
    assert main(["stats", "--manifest", str(manifest), "--out", str(tmp_path / "on"), "--jobs", "2"]) == 0
    off, on = (json.loads((tmp_path / d / "feature_stats.json").read_text()) for d in ("off", "on"))
    assert on["mean"] == off["mean"] and on["var"] == off["var"] and on["frames"] == off["frames"]
    cache = open_feature_cache("auto", manifest, read_stats(tmp_path / "on" / "feature_stats.json").settings)
    for i, e in enumerate(entries):
        cache.power(tmp_path / e["audio_filepath"], e["md5"])
    assert (cache.hits, cache.misses) == (2, 0)                # training's first epoch computes nothing
