"""The audio front end (asr.frontend): features unchanged by the move (reference values captured from the code
before it, tests/data/frontend_reference.npz), the VTLP filterbank at warp 1.0 is the plain one, the one reader
names the file in every error, and the front end imports nothing above it."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as AF

from asr.augment.pipeline import AugmentConfig, Augmenter
from asr.frontend import (DEFAULT_FEATURES, AudioError, FeatureSettings, compute_features, load_wave,
                          mel_filterbank, mel_points_hz, read_audio, warp_frequencies)

REFERENCE = Path(__file__).parent / "data" / "frontend_reference.npz"


def fixed_wave() -> torch.Tensor:
    """0.75 s of a harmonic voice-like signal plus a little noise (the wave the reference was computed on)."""
    rng = np.random.default_rng(20240611)
    t = np.arange(12000) / 16000.0
    f0 = 140 + 30 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    x = sum(0.2 / k * np.sin(k * phase) for k in range(1, 12)) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    x = x + 0.01 * rng.standard_normal(t.size)
    return torch.from_numpy(x.astype(np.float32))


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as ref:
        return {k: ref[k] for k in ref.files}


def _close(actual: torch.Tensor, expected: np.ndarray):
    torch.testing.assert_close(actual, torch.from_numpy(expected), rtol=1e-5, atol=1e-6)


def test_features_are_those_of_the_code_before_the_move(reference):
    """Values captured with asr.features.compute_features / asr.augment.pipeline before asr.frontend existed."""
    wave = fixed_wave()
    log = FeatureSettings(mel_compression="log")
    _close(compute_features(wave), reference["power"])
    _close(compute_features(wave, log), reference["log"])
    _close(compute_features(wave, warp=1.1), reference["power_warp1.1"])
    _close(compute_features(wave, log, warp=0.9), reference["log_warp0.9"])
    feats, info = Augmenter(AugmentConfig(sim_prob=0.0), seed=3)(wave, "utt", 0)
    assert info["warp"] == float(reference["warp_augmenter"])
    _close(feats, reference["augmenter"])


def test_vtlp_filterbank_at_warp_one_is_the_plain_one():
    plain = AF.melscale_fbanks(257, 20.0, 8000.0, 40, 16000, norm=None, mel_scale="htk")
    assert torch.equal(mel_filterbank(DEFAULT_FEATURES, warp=1.0), plain)
    assert torch.equal(mel_filterbank(DEFAULT_FEATURES, warp=1.0, boundary_hz=3000.0), plain)
    # the warp itself is the identity at 1.0 (so skipping it there changes nothing)
    pts = mel_points_hz(DEFAULT_FEATURES)
    torch.testing.assert_close(warp_frequencies(pts, 1.0), pts, rtol=1e-6, atol=1e-3)
    torch.testing.assert_close(mel_filterbank(DEFAULT_FEATURES, warp=1.0 + 1e-7), plain, rtol=0, atol=1e-4)
    assert not torch.equal(mel_filterbank(DEFAULT_FEATURES, warp=1.05), plain)
    wave = fixed_wave()
    assert torch.equal(compute_features(wave, warp=1.0), compute_features(wave))


def test_feature_settings_shape_the_features():
    wave = fixed_wave()
    s = FeatureSettings(n_mels=80, n_fft=400, win_length=400, hop_length=320, f_min=0.0, f_max=7600.0)
    feats = compute_features(wave, s)
    assert feats.shape == (12000 // 320 + 1, 80)
    ref = AF.melscale_fbanks(201, 0.0, 7600.0, 80, 16000, norm=None, mel_scale="htk")
    spec = AF.spectrogram(wave, 0, torch.hann_window(400), 400, 320, 400, 2.0, False).t()
    torch.testing.assert_close(feats, (spec @ ref).pow(1 / 15), rtol=1e-5, atol=1e-6)
    assert FeatureSettings.from_dict(s.to_dict()) == s
    assert s.win_s == 0.025 and s.hop_s == 0.02


def test_feature_settings_are_validated_by_name():
    with pytest.raises(ValueError, match="n_mels must be a positive integer"):
        FeatureSettings(n_mels=0)
    with pytest.raises(ValueError, match="win_length <= n_fft"):
        FeatureSettings(win_length=1024)
    with pytest.raises(ValueError, match="f_max"):
        FeatureSettings(sample_rate=8000)          # f_max 8000 above Nyquist
    with pytest.raises(ValueError, match="unknown feature setting"):
        FeatureSettings.from_dict({"window": "hamming"})
    assert FeatureSettings(n_mels="40", f_min=0) == FeatureSettings(f_min=0.0)   # coerced


def test_reader_errors_name_the_file(tmp_path):
    good = tmp_path / "good.flac"
    t = np.arange(16000) / 16000
    sf.write(good, (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16000)
    wave = load_wave(good)
    assert wave.dtype == torch.float32 and wave.shape == (16000,)
    stereo = tmp_path / "stereo.wav"
    sf.write(stereo, np.stack([np.full(100, 0.5), np.full(100, -0.1)], 1).astype(np.float32), 16000)
    torch.testing.assert_close(load_wave(stereo), torch.full((100,), 0.2))
    data, sr = read_audio(stereo)
    assert data.shape == (100, 2) and sr == 16000
    (tmp_path / "empty.flac").write_bytes(b"")
    (tmp_path / "text.flac").write_text("not audio\n")
    (tmp_path / "cut.flac").write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])
    sf.write(tmp_path / "none.wav", np.zeros(0, np.float32), 16000)
    sf.write(tmp_path / "8k.wav", np.zeros(80, np.float32), 8000)
    sf.write(tmp_path / "nan.wav", np.array([0.0, np.nan], np.float32), 16000, subtype="FLOAT")
    cases = {"missing.flac": "missing_audio", "empty.flac": "empty_file", "text.flac": "corrupt_audio",
             "cut.flac": "truncated_audio", "none.wav": "empty_audio", "8k.wav": "wrong_sample_rate",
             "nan.wav": "corrupt_audio"}
    for name, code in cases.items():
        for strict in (False, True):
            with pytest.raises(AudioError) as e:
                load_wave(tmp_path / name, strict=strict)
            assert e.value.code == code and str(tmp_path / name) in str(e.value), (name, strict, e.value)
            assert isinstance(e.value, ValueError)
    assert "no samples" in str(pytest.raises(AudioError, load_wave, tmp_path / "none.wav").value)


def test_strict_reading_also_refuses_a_wav_whose_header_promises_more(tmp_path):
    """A WAV cut after its header: libsndfile decodes what is there, which a loader may use; asr-prep may not."""
    whole = tmp_path / "whole.wav"
    sf.write(whole, (0.1 * np.ones(8000)).astype(np.float32), 16000, subtype="PCM_16")
    cut = tmp_path / "cut.wav"
    cut.write_bytes(whole.read_bytes()[:44 + 4000])
    assert load_wave(cut).shape == (2000,)
    with pytest.raises(AudioError, match="cut.wav: WAV header sizes exceed the file") as e:
        read_audio(cut, strict=True)
    assert e.value.code == "truncated_audio"


def test_the_front_end_imports_nothing_above_it():
    code = ("import sys, asr.frontend as f; f.compute_features, f.load_wave, f.FeatureSettings; "
            "bad = [m for m in sys.modules if m.startswith(('asr.data', 'asr.augment', 'asr.loader', 'asr.models', "
            "'asr.train', 'asr.config'))]; print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    light = ("import sys, asr.frontend.settings, asr.config, asr.models.bfa; "
             "assert 'torchaudio' not in sys.modules and 'soundfile' not in sys.modules")
    subprocess.run([sys.executable, "-c", light], check=True)
