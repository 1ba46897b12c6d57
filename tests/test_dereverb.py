"""Dereverberation before decoding (asr.frontend.dereverb, WPE through nara_wpe): it brings reverberant speech's
features closer to the dry ones, reports the energy it removed, keeps length, level, dtype and device, is cached
apart from the plain features, and is refused where it does not belong (training's augmenter, an unknown method)."""
import json

import numpy as np
import pytest
import soundfile as sf
import torch

from asr.config import ConfigError, DecodeConfig
from asr.data.manifest import write_manifest
from asr.frontend import FeatureSettings
from asr.frontend.cache import FeatureCache, open_feature_cache, settings_digest
from asr.frontend.dereverb import check, dereverberate, wpe
from asr.loader import Normalizer, SpeechDataset

SR = 16000


def _rir(t60, seed=0):
    """An exponentially decaying random impulse response (-60 dB at t60) with a direct path."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(t60 * SR)) / SR
    rir = rng.standard_normal(t.size) * 10 ** (-3 * t / t60)
    rir[0] = 8.0
    return rir


def _reverberant(dry, t60, seed=0):
    wet = np.convolve(dry, _rir(t60, seed))[:dry.size]
    return wet / np.abs(wet).max()


def _speech():
    """A sentence from espeak-ng (installed by make setup), 16 kHz float64."""
    import io
    import shutil
    import subprocess

    import torchaudio.functional as AF
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (make setup installs it)")
    wav = subprocess.run(["espeak-ng", "--stdout", "-v", "en-us", "Turn on the kitchen lights and set a timer for "
                          "ten minutes please"], capture_output=True, check=True).stdout
    x, sr = sf.read(io.BytesIO(wav))
    return AF.resample(torch.from_numpy(x).float(), sr, SR).double().numpy()


@pytest.mark.parametrize("t60", [0.4, 0.8])
def test_wpe_brings_reverberant_speech_features_closer_to_the_dry_ones(t60):
    from asr.frontend import compute_features
    dry = _speech()
    wet = torch.from_numpy(_reverberant(dry, t60)).float()
    out = dereverberate(wet, "wpe")
    assert out.shape == wet.shape and out.dtype == torch.float32 and out.device == wet.device
    assert torch.isfinite(out).all()
    assert float(out.pow(2).mean()) == pytest.approx(float(wet.pow(2).mean()), rel=1e-4)     # the input's level

    def features(x):        # log-mel features with per-utterance CMVN, as the recipe reads them
        f = compute_features(torch.as_tensor(x).float(), FeatureSettings())
        return (f - f.mean(0)) / f.std(0)
    clean = features(dry)
    before, after = (float((features(x) - clean).pow(2).mean()) for x in (wet, out))
    assert after < 0.95 * before, (before, after)     # measured: 0.651 -> 0.564 (T60 0.4 s), 0.927 -> 0.841 (0.8 s)
    assert dereverberate(wet, "off") is wet


def test_wpe_reports_how_much_energy_it_removed():
    """Next to its output, wpe() gives the energy it removed: almost none from dry speech, more the longer the room's
    tail (what scripts/wpe_gate_probe.py measures on a corpus)."""
    dry = torch.from_numpy(_speech()).float()
    out, removed = wpe(dry)
    assert out.shape == dry.shape and abs(removed) < 0.1, removed            # measured 0.001 dB
    wet = [wpe(torch.from_numpy(_reverberant(dry.double().numpy(), t60)).float())[1] for t60 in (0.3, 0.8)]
    assert 0.3 < wet[0] < wet[1], wet                                          # measured 0.72 and 1.18 dB


def test_bad_methods_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="dereverb: expected one of off, wpe, got 'wpx'"):
        check("wpx")
    with pytest.raises(ConfigError, match="decode.dereverb: expected one of off, wpe"):
        DecodeConfig(dereverb="on")


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "audio").mkdir()
    rng = np.random.default_rng(0)
    wet = _reverberant(rng.standard_normal(int(1.5 * SR)), 0.6)
    sf.write(tmp_path / "audio" / "u0.flac", (0.5 * wet).astype(np.float32), SR, subtype="PCM_16")
    write_manifest(tmp_path / "test.jsonl", [{"id": "u0", "audio_filepath": "audio/u0.flac", "duration": 1.5,
                                              "text": "call mom"}])
    s = FeatureSettings()
    (tmp_path / "stats.json").write_text(json.dumps({"features": s.to_dict(), "mean": [0.0] * s.n_mels,
                                                     "std": [1.0] * s.n_mels}))
    return tmp_path


class CharTokenizer:
    vocab_size = 27

    def encode(self, text):
        return [ord(c) - 96 if c.isalpha() else 0 for c in text]


def test_dereverberated_features_are_cached_in_a_folder_of_their_own(corpus):
    s = FeatureSettings()
    assert settings_digest(s) != settings_digest(s, dereverb="wpe")
    assert settings_digest(s) == settings_digest(s, dereverb="off")        # plain caches keep their folders
    norm = Normalizer(corpus / "stats.json", "utterance")
    plain = SpeechDataset(corpus / "test.jsonl", CharTokenizer(), norm, feature_cache="auto")[0][1]
    ds = SpeechDataset(corpus / "test.jsonl", CharTokenizer(), norm, dereverb="wpe", feature_cache="auto")
    wpe = ds[0][1]
    assert wpe.shape == plain.shape and not torch.allclose(wpe, plain, atol=1e-3)
    folders = {p.name for p in (corpus / "feature_cache").iterdir()}
    assert folders == {settings_digest(s), settings_digest(s, dereverb="wpe")}
    described = json.loads((corpus / "feature_cache" / settings_digest(s, dereverb="wpe") / "settings.json").read_text())
    assert described["dereverb"]["method"] == "wpe" and described["dereverb"]["taps"] > 0
    assert torch.equal(ds[0][1], wpe)                                      # read back: the same features
    uncached = SpeechDataset(corpus / "test.jsonl", CharTokenizer(), norm, dereverb="wpe")[0][1]
    torch.testing.assert_close(uncached, wpe)
    with pytest.raises(ValueError, match="dereverberated cache is for evaluation"):
        ds.feature_cache.offer(corpus / "audio" / "u0.flac", None, torch.zeros(SR))
    with pytest.raises(ValueError, match="dereverb='off', asked for 'wpe'"):
        open_feature_cache(FeatureCache(corpus / "fc", s), corpus / "test.jsonl", s, dereverb="wpe")
    with pytest.raises(ValueError, match="does not combine with an augmenter"):
        ds.augmenter = object()
