"""The clean-feature cache (asr.frontend.cache): features from it equal those computed from the audio, a change of
any feature setting reads another folder (never a stale entry), a damaged entry is recomputed, and two processes
can fill one cache at once."""
import dataclasses
import json
import logging
import multiprocessing as mp

import numpy as np
import pytest
import soundfile as sf
import torch

from asr.augment import AugmentConfig, AugmentedDataset, Augmenter
from asr.augment.pipeline import single_thread
from asr.data.manifest import write_manifest
from asr.frontend import FeatureSettings, compute_features, load_wave
from asr.frontend.cache import FeatureCache, open_feature_cache, settings_digest, utterance_key
from asr.loader import Normalizer, SkippedItem, SpeechDataset

SETTINGS = FeatureSettings()


class CharTokenizer:
    vocab_size = 27

    def encode(self, text):
        return [ord(c) - 96 if c.isalpha() else 0 for c in text]


def _write_audio(path, seconds, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    x = 0.2 * np.sin(2 * np.pi * (150 + 40 * seed) * t * (1 + 0.1 * t)) + 0.01 * rng.standard_normal(t.size)
    x[:800] = 0.0                                     # digital silence, as TTS audio starts
    sf.write(path, x.astype(np.float32), 16000, subtype="PCM_16")


@pytest.fixture
def corpus(tmp_path):
    """4 FLACs (two with an md5 in the manifest, two without) and a statistics file with SETTINGS."""
    (tmp_path / "audio").mkdir()
    entries = []
    for i in range(4):
        _write_audio(tmp_path / "audio" / f"u{i}.flac", 0.5 + 0.2 * i, i)
        e = {"id": f"u{i}", "audio_filepath": f"audio/u{i}.flac", "duration": 0.5 + 0.2 * i, "text": "call mom"}
        if i % 2 == 0:
            e["md5"] = f"{i:032x}"
        entries.append(e)
    write_manifest(tmp_path / "train.jsonl", entries)
    write_stats(tmp_path / "stats.json", SETTINGS)
    return tmp_path


def write_stats(path, settings):
    path.write_text(json.dumps({"features": settings.to_dict(), "mean": [0.5] * settings.n_mels,
                                "std": [1.0] * settings.n_mels}))


def uncached(path, settings=SETTINGS, warp=1.0):
    with single_thread():      # what DataLoader workers (and the cache's fill) use
        return compute_features(load_wave(path), settings, warp=warp)


def test_cached_features_equal_uncached_clean_and_warped(corpus):
    cache = FeatureCache(corpus / "cache", SETTINGS)
    path = corpus / "audio" / "u1.flac"
    miss = cache.features(path)
    hit = cache.features(path)
    assert (cache.misses, cache.hits) == (1, 1)
    assert torch.equal(miss, uncached(path)) and torch.equal(hit, uncached(path))     # float32 files: bitwise
    for warp in (0.9, 1.07):
        assert torch.equal(cache.features(path, warp=warp), uncached(path, warp=warp))
    assert not torch.equal(cache.features(path, warp=0.9), hit)


def test_bfloat16_files_are_within_a_small_tolerance(corpus):
    cache = FeatureCache(corpus / "cache", SETTINGS, dtype="bfloat16")
    path = corpus / "audio" / "u3.flac"
    first, second = cache.features(path, warp=1.05), cache.features(path, warp=1.05)
    assert torch.equal(first, second)                       # a miss gives what a hit gives
    assert (first - uncached(path, warp=1.05)).abs().max() < 2e-3     # power-law features span ~0..3
    assert cache.dir != FeatureCache(corpus / "cache", SETTINGS).dir


def test_the_augmenter_gives_the_same_features_from_the_cache(corpus):
    """Unsimulated utterances come from the cached spectrogram (no decoding); simulated ones decode the audio.
    Either way the features equal the uncached pipeline's."""
    cache = FeatureCache(corpus / "cache", SETTINGS)
    aug = Augmenter(AugmentConfig(sim_prob=0.0, features=SETTINGS), seed=3)
    path = corpus / "audio" / "u2.flac"
    decoded = []

    def wave():
        decoded.append(1)
        return load_wave(path)
    out = aug.augment(wave, "u2", 4, power=lambda: cache.power(path))
    ref = aug.augment(load_wave(path), "u2", 4)
    assert torch.equal(out.features, ref.features) and out.info["warp"] == ref.info["warp"] != 1.0
    assert decoded == [] and out.wave is None


def test_speech_dataset_with_the_cache_gives_the_same_items(corpus):
    stats = corpus / "stats.json"
    for augmenter in (None, Augmenter(AugmentConfig(sim_prob=0.0, features=SETTINGS), seed=1)):
        plain = SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats), augmenter=augmenter)
        cached = SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats), augmenter=augmenter,
                               feature_cache="auto")
        for ds in (plain, cached):
            ds.set_epoch(2)
        with single_thread():
            for _ in range(2):                               # a filling pass, then a reading pass
                for i in range(len(plain)):
                    a, b = plain[i], cached[i]
                    assert a[0] == b[0] and torch.equal(a[1], b[1]) and a[2] == b[2]
    assert cached.feature_cache.dir.parent == corpus / "feature_cache"
    assert len(list(cached.feature_cache.dir.glob("*.pspec"))) == 4
    assert SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats),
                         feature_cache="off").feature_cache is None


def test_a_simulated_utterance_stores_its_clean_spectrogram(corpus):
    stats = corpus / "stats.json"
    aug = Augmenter(AugmentConfig(sim_prob=1.0, pool_size=1, features=SETTINGS, room_sides=(3.0, 3.5),
                                  t60=(0.1, 0.15), noise_sources=(0, 0)), seed=1)
    ds = SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats), augmenter=aug,
                       feature_cache=corpus / "fc")
    ds.entries = ds.entries[:1]
    assert not isinstance(ds[0], SkippedItem)
    cache = ds.feature_cache
    assert (cache.misses, cache.hits) == (1, 0)             # offered while the audio was decoded
    assert torch.equal(cache.features(corpus / "audio" / "u0.flac", "0" * 32), uncached(corpus / "audio" / "u0.flac"))
    assert cache.hits == 1


@pytest.mark.parametrize("change", [{"n_mels": 32}, {"mel_compression": "log"}, {"hop_length": 128},
                                    {"n_fft": 400}, {"f_max": 7000.0}])
def test_a_changed_feature_setting_reads_another_folder(corpus, change):
    path = corpus / "audio" / "u1.flac"
    old = FeatureCache(corpus / "cache", SETTINGS)
    old.features(path)
    other = dataclasses.replace(SETTINGS, **change)
    new = FeatureCache(corpus / "cache", other)
    assert new.digest != old.digest and settings_digest(other) == new.digest
    feats = new.features(path)
    assert (new.misses, new.hits) == (1, 0)                   # recomputed, the old entry never read
    assert torch.equal(feats, uncached(path, other))
    assert feats.shape != old.features(path).shape or not torch.equal(feats, old.features(path))
    assert json.loads((new.dir / "settings.json").read_text())["settings"] == other.to_dict()
    # through the loader: a statistics file with other settings gives features with those settings
    write_stats(corpus / "stats2.json", other)
    ds = SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(corpus / "stats2.json"),
                       feature_cache=corpus / "cache")
    assert ds.feature_cache.dir == new.dir and ds[1][1].shape[1] == other.n_mels


def test_a_replaced_audio_file_gets_a_new_key(corpus):
    path = corpus / "audio" / "u1.flac"
    key = utterance_key(path)
    cache = FeatureCache(corpus / "cache", SETTINGS)
    cache.features(path)
    _write_audio(path, 0.9, 7)                                # other audio, other size and mtime
    assert utterance_key(path) != key
    assert torch.equal(cache.features(path), uncached(path)) and cache.misses == 2
    assert utterance_key(path, "ab" * 16) != utterance_key(path, "cd" * 16)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_entry_is_detected_and_recomputed(corpus, damage, caplog):
    path = corpus / "audio" / "u3.flac"
    cache = FeatureCache(corpus / "cache", SETTINGS)
    good = cache.features(path)
    entry = cache.path_of(utterance_key(path))
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:len(data) - 1000]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "empty":
        data = b""
    else:
        data = b"not a spectrogram\n" * 100
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="asr.frontend.cache"):
        again = cache.features(path)
    assert torch.equal(again, good) and cache.rejected == 1
    assert any(str(entry) in r.getMessage() for r in caplog.records)
    assert cache.load(utterance_key(path)) is not None and cache.rejected == 1    # rewritten whole


def test_a_missing_file_is_the_loaders_audio_error(corpus):
    cache = FeatureCache(corpus / "cache", SETTINGS)
    with pytest.raises(ValueError, match=r"missing\.flac: audio file not found"):
        cache.power(corpus / "audio" / "missing.flac")


def test_an_unwritable_cache_is_not_fatal(corpus, caplog):
    blocker = corpus / "blocked"
    blocker.write_text("a file where the cache folder should be\n")
    cache = FeatureCache(blocker / "sub", SETTINGS)
    path = corpus / "audio" / "u0.flac"
    with caplog.at_level(logging.WARNING, logger="asr.frontend.cache"):
        assert torch.equal(cache.features(path), uncached(path))
        assert torch.equal(cache.features(path), uncached(path))
    assert cache.write_errors == 1 and "cannot write" in caplog.text
    with pytest.raises(ValueError, match="data.feature_cache: .*blocked exists and is not a folder"):
        open_feature_cache(str(blocker), corpus / "train.jsonl", SETTINGS)


def test_open_feature_cache_reads_the_config_values(corpus):
    manifest = corpus / "train.jsonl"
    assert open_feature_cache("auto", manifest, SETTINGS).root == corpus / "feature_cache"
    for off in ("off", "", "False", None):       # YAML reads an unquoted off as false
        assert open_feature_cache(off, manifest, SETTINGS) is None
    assert open_feature_cache(str(corpus / "x"), manifest, SETTINGS).root == corpus / "x"
    with pytest.raises(ValueError, match="data.feature_cache: expected"):
        open_feature_cache(3, manifest, SETTINGS)


def test_augmented_dataset_takes_spectrograms_from_the_cache(corpus):
    items = [(f"u{i}", str(corpus / "audio" / f"u{i}.flac")) for i in range(2)]
    aug = Augmenter(AugmentConfig(sim_prob=0.0), seed=5)
    plain = AugmentedDataset(items, aug)
    cached = AugmentedDataset(items, aug, feature_cache=corpus / "cache")
    for i in range(2):
        assert torch.equal(plain[i][0], cached[i][0])
    assert cached.feature_cache.misses == 2


def _fill(root, paths, barrier, out):
    """Fill, then keep rewriting every entry while reading them all back: the other process does the same."""
    torch.set_num_threads(1)
    cache = FeatureCache(root, SETTINGS)
    barrier.wait()
    first = [cache.power(p) for p in paths]
    keys = [utterance_key(p) for p in paths]
    bad = 0
    for _ in range(15):
        for key, power in zip(keys, first):
            cache._store(key, power)                     # what a miss writes: temp file, then os.replace
            got = cache.load(key)
            bad += got is None or not torch.equal(got, power)
    out.put(([p.numpy().tobytes() for p in first], bad, cache.rejected, cache.write_errors))


def test_two_processes_fill_one_cache_at_once(corpus):
    """Both fill every entry and rename their own temporary files over it, again and again, while reading them
    back: each reads whole entries only, both get the same spectrograms, no temporary file is left behind."""
    paths = [str(corpus / "audio" / f"u{i}.flac") for i in range(4)]
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    out, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_fill, args=(corpus / "cache", paths, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0][0] == results[1][0]
    assert [r[1:] for r in results] == [(0, 0, 0), (0, 0, 0)]      # no partial, damaged or unwritable entry seen
    cache = FeatureCache(corpus / "cache", SETTINGS)
    for p in paths:
        assert torch.equal(cache.features(p), uncached(p))
    assert cache.hits == 4 and cache.rejected == 0
    assert [f.name for f in cache.dir.iterdir() if f.name.startswith(".")] == []


def test_test_time_warps_stack_the_features_and_encode_averages_them(corpus):
    """decode.warps / asr-eval --warps: an item holds its features at every warp ([warps, frames, n_mels], warp 1
    the plain item), collate pads them as a batch [B, warps, T, n_mels], and asr.decode.encode gives the mean of
    the warps' encoder outputs (one decode per utterance)."""
    from asr.decode import encode
    from asr.loader import collate
    from asr.models.bfa import BFA, BFAConfig
    stats = corpus / "stats.json"
    warps = (0.9, 1.0, 1.1)
    ds = SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats, "utterance"),
                       feature_cache="auto", warps=warps)
    plain = SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats, "utterance"),
                          feature_cache="auto")
    norm = Normalizer(stats, "utterance")
    with single_thread():
        items = [ds[i] for i in range(len(ds))]
        for i, item in enumerate(items):
            ref = plain[i]
            assert item[0] == ref[0] and item[2] == ref[2] and item[1].shape == (3, *ref[1].shape)
            assert torch.equal(item[1][1], ref[1])
            assert torch.equal(item[1][0], norm(uncached(corpus / "audio" / f"u{i}.flac", warp=0.9)))
    batch = collate([items[3], items[0]])
    frames = [items[3][1].shape[1], items[0][1].shape[1]]
    assert batch.feats.shape == (2, 3, max(frames), SETTINGS.n_mels) and batch.flen.tolist() == frames
    assert torch.equal(batch.feats[1, :, :frames[1]], items[0][1]) and not batch.feats[1, :, frames[1]:].any()
    torch.manual_seed(0)
    model = BFA(BFAConfig(vocab_size=27, feat_dim=SETTINGS.n_mels, enc_hidden=8, enc_layers=2, pool_after=[0],
                          dec_hidden=8, emb_dim=8, att_dim=8, ctc_weight=0.5)).eval()
    with torch.no_grad():
        enc, lengths = encode(model, batch.feats, batch.flen)
        each = [model.encode(batch.feats[:, k], batch.flen) for k in range(3)]
        one = encode(model, batch.feats[:, 1], batch.flen)
    assert torch.allclose(enc, sum(e[0] for e in each) / 3, atol=1e-6) and torch.equal(lengths, each[0][1])
    assert torch.equal(one[0], each[1][0])                 # no warps: model.encode itself
    with pytest.raises(ValueError, match="feature_cache"):
        SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats), warps=warps)
    with pytest.raises(ValueError, match="augmenter"):
        SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(stats), feature_cache="auto", warps=warps,
                      augmenter=Augmenter(AugmentConfig(sim_prob=0.0, features=SETTINGS)))


def test_decode_manifest_memo_reads_and_encodes_a_dataset_once(corpus):
    """asr-eval's tuning decodes one dev set with setting after setting: with memo=True the same model object
    reads each item and runs the encoder once (the same rows); another model object, or memo off (a trainer's dev
    pass, whose weights change), reads them again."""
    from asr.decode import decode_manifest
    from asr.models.bfa import BFA, BFAConfig

    class Tok(CharTokenizer):
        def decode(self, ids):
            return "".join(chr(96 + i) if i else " " for i in ids)

    calls = []

    class Counting(SpeechDataset):
        def __getitem__(self, i):
            calls.append(i)
            return super().__getitem__(i)

    ds = Counting(corpus / "train.jsonl", Tok(), Normalizer(corpus / "stats.json", "utterance"),
                  feature_cache="auto", warps=(0.9, 1.1))

    def model(seed):
        torch.manual_seed(seed)
        return BFA(BFAConfig(vocab_size=27, feat_dim=SETTINGS.n_mels, enc_hidden=8, enc_layers=1, pool_after=[0],
                             dec_hidden=8, emb_dim=8, att_dim=8, ctc_weight=0.5)).eval()
    m = model(0)
    first = decode_manifest(m, Tok(), ds, ("ctc",), memo=True)["ctc"]
    assert sorted(calls) == [0, 1, 2, 3]
    again = decode_manifest(m, Tok(), ds, ("ctc", "attention"), memo=True)
    assert len(calls) == 4 and again["ctc"] == first and len(again["attention"]) == 4
    decode_manifest(m, Tok(), ds, ("ctc",))
    assert len(calls) == 8
    other = decode_manifest(model(1), Tok(), ds, ("ctc",), memo=True)["ctc"]
    assert len(calls) == 12 and [r["id"] for r in other] == [r["id"] for r in first]
