"""VTLP (the front end's warped mel filterbank, the augmenter's warp draw): warp factor 1 is torchaudio's
filterbank bit for bit, warped banks stay monotone and cover the band, and the warp is Kaldi's VTLN warp with the
inverse factor."""
import numpy as np
import pytest
import torch
import torchaudio
import torchaudio.functional as F
from torchaudio.compliance import kaldi

from asr.augment.vtlp import sample_warp
from asr.frontend import FeatureSettings, mel_features, mel_filterbank, mel_points_hz, warp_frequencies

SR, NYQ = 16000, 8000.0


def test_factor_one_is_torchaudio_exactly():
    ref = F.melscale_fbanks(257, 20.0, 8000.0, 40, SR, norm=None, mel_scale="htk")
    assert torch.equal(mel_filterbank(), ref)
    assert torch.equal(mel_filterbank(FeatureSettings(), 1.0), ref)
    # other shapes take the same path
    ref2 = F.melscale_fbanks(201, 0.0, 7600.0, 80, SR, norm=None, mel_scale="htk")
    assert torch.equal(mel_filterbank(FeatureSettings(n_fft=400, n_mels=80, f_min=0.0, f_max=7600.0)), ref2)


def test_factor_one_features_equal_torchaudio_melspectrogram():
    wave = torch.randn(SR * 2, generator=torch.Generator().manual_seed(0)) * 0.1
    mel = torchaudio.transforms.MelSpectrogram(SR, n_fft=512, win_length=400, hop_length=160, f_min=20.0,
                                               f_max=8000.0, n_mels=40, mel_scale="htk")(wave).t()
    fb = mel_filterbank(warp=1.0)
    assert torch.equal(mel_features(wave, fb, FeatureSettings(mel_compression="log")), torch.log(mel + 1e-6))
    assert torch.equal(mel_features(wave, fb, FeatureSettings(mel_compression="power")), mel.pow(1.0 / 15.0))
    assert mel_features(wave, fb).shape == (201, 40) and mel_features(wave, fb).dtype == torch.float32


@pytest.mark.parametrize("warp", [0.9, 1.0, 1.1])
def test_warped_bank_is_monotone_and_covers_the_band(warp):
    fb = mel_filterbank(warp=warp)
    pts = mel_points_hz(warp=warp)
    assert fb.shape == (257, 40)
    assert torch.all(pts[1:] > pts[:-1]), "corner/centre frequencies must increase"
    centres_by_peak = fb.argmax(dim=0)
    assert torch.all(centres_by_peak[1:] >= centres_by_peak[:-1])
    assert torch.all(fb.max(dim=0).values > 0), "no empty filter"
    # first filter starts near f_min * warp, last one ends at f_max (= Nyquist stays Nyquist)
    assert pts[0].item() == pytest.approx(20.0 * warp, rel=1e-5)
    assert pts[-1].item() == pytest.approx(NYQ, rel=1e-6)
    freqs = torch.linspace(0, NYQ, 257)
    inside = (freqs > pts[0]) & (freqs < pts[-1])
    assert inside.sum() == 255        # every bin but DC and Nyquist
    assert torch.all(fb[inside].sum(dim=1) > 0), "every bin between f_min and f_max gets weight"


def test_warp_direction_and_fixed_points():
    f = torch.tensor([0.0, 1000.0, 4000.0, NYQ])
    up, down = warp_frequencies(f, 1.1), warp_frequencies(f, 0.9)
    assert up[1].item() == pytest.approx(1100.0) and down[1].item() == pytest.approx(900.0)
    assert up[0] == 0 and down[0] == 0 and up[-1] == NYQ and down[-1] == NYQ
    # continuous at the knee (boundary 4800 Hz: knee 4800/alpha for alpha > 1, 4800 for alpha < 1)
    for alpha, knee in ((1.1, 4800.0 / 1.1), (0.9, 4800.0)):
        eps = torch.tensor([knee - 1e-3, knee + 1e-3], dtype=torch.float64)
        w = warp_frequencies(eps, alpha)
        assert abs(w[1] - w[0]) < 1e-2


@pytest.mark.parametrize("alpha", [0.9, 0.95, 1.05, 1.1])
def test_warp_is_kaldi_vtln_with_inverse_factor(alpha):
    """Found mapping: warp_frequencies(f, alpha, boundary_hz=B) == kaldi.vtln_warp_freq(low_cutoff, B, low_freq=0,
    high_freq=Nyquist, 1 / alpha, f) on the whole band (Kaldi's middle segment is f / factor; with low_freq=0 its
    lower segment is the same line through the origin). With Kaldi's low_freq > 0 the two agree above Kaldi's
    lower knee l = low_cutoff * max(1, 1/alpha), the interior band."""
    f = torch.linspace(0.0, NYQ, 2001, dtype=torch.float64)
    mine = warp_frequencies(f, alpha, SR, 4800.0)
    theirs = kaldi.vtln_warp_freq(100.0, 4800.0, 0.0, NYQ, 1.0 / alpha, f)
    torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-9)
    theirs_lo = kaldi.vtln_warp_freq(100.0, 4800.0, 20.0, NYQ, 1.0 / alpha, f)
    interior = f >= 100.0 * max(1.0, 1.0 / alpha)
    torch.testing.assert_close(mine[interior], theirs_lo[interior], rtol=1e-12, atol=1e-9)
    assert not torch.allclose(mine[f < 20.0], theirs_lo[f < 20.0])   # Kaldi pins low_freq; the paper does not
    # and Kaldi's own warped filterbank puts its centres where ours are (it triangulates in mel, we in Hz)
    ours = mel_points_hz(FeatureSettings(n_mels=40, sample_rate=SR, f_min=0.0, f_max=NYQ), alpha)[1:-1]
    _, centres = kaldi.get_mel_banks(40, 512, float(SR), 0.0, NYQ, 100.0, 4800.0, 1.0 / alpha)
    torch.testing.assert_close(ours, centres.flatten(), rtol=1e-5, atol=1e-3)


def test_sample_warp_is_seeded_and_in_range():
    draws = [sample_warp(np.random.default_rng(7)) for _ in range(2)]
    assert draws[0] == draws[1]
    rng = np.random.default_rng(0)
    xs = np.array([sample_warp(rng, 0.9, 1.1) for _ in range(1000)])
    assert xs.min() >= 0.9 and xs.max() <= 1.1 and abs(xs.mean() - 1.0) < 0.01
    with pytest.raises(ValueError, match="low"):
        sample_warp(rng, 1.2, 1.1)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="f_max"):
        FeatureSettings(f_max=9000.0)
    with pytest.raises(ValueError, match="boundary_hz"):
        mel_filterbank(warp=1.1, boundary_hz=9000.0)
    with pytest.raises(ValueError, match="warp"):
        mel_filterbank(warp=0.0)
