"""Noise sources are seeded and have the intended spectra; mixing hits the requested SNR on the reverberant
signals."""
import numpy as np
import pytest
import scipy.signal
import torch

import asr.augment.pipeline as pipeline
from asr.augment.noise import babble, colored_noise, make_noise, mix_at_snr, snr_db, tones
from asr.augment.pipeline import AugmentConfig, Augmenter
from asr.augment.rooms import RIRPool, RoomSpec

FS = 16000


def _slope(x):
    """Log-log slope of the Welch PSD between 100 Hz and 4 kHz (0 white, -1 pink, -2 brown)."""
    f, p = scipy.signal.welch(x.numpy(), FS, nperseg=4096)
    sel = (f >= 100) & (f <= 4000)
    return np.polyfit(np.log(f[sel]), np.log(p[sel]), 1)[0]


@pytest.mark.parametrize("color,slope", [("white", 0.0), ("pink", -1.0), ("brown", -2.0)])
def test_colored_noise_spectrum_and_seeding(color, slope):
    x = colored_noise(FS * 4, color, np.random.default_rng(0))
    assert x.dtype == torch.float32 and x.shape == (FS * 4,)
    assert float(x.pow(2).mean()) == pytest.approx(1.0, rel=1e-4)
    assert _slope(x) == pytest.approx(slope, abs=0.15)
    assert torch.equal(x, colored_noise(FS * 4, color, np.random.default_rng(0)))
    assert not torch.equal(x, colored_noise(FS * 4, color, np.random.default_rng(1)))


def test_tones_and_babble_are_seeded_unit_power():
    t1, t2 = tones(FS, np.random.default_rng(5)), tones(FS, np.random.default_rng(5))
    assert torch.equal(t1, t2) and float(t1.pow(2).mean()) == pytest.approx(1.0, rel=1e-4)
    talkers = [torch.sin(torch.arange(n) * 0.05 * (k + 1)) for k, n in enumerate((3000, 9000, 20000))]
    b1 = babble(FS * 2, np.random.default_rng(2), talkers)
    b2 = babble(FS * 2, np.random.default_rng(2), lambda rng: talkers[int(rng.integers(3))])
    assert b1.shape == (FS * 2,) and float(b1.pow(2).mean()) == pytest.approx(1.0, rel=1e-4)
    assert torch.equal(b1, babble(FS * 2, np.random.default_rng(2), talkers))
    assert torch.equal(b1, b2)   # a callable drawing from the given rng is as reproducible as a list
    with pytest.raises(ValueError, match="empty"):
        babble(100, np.random.default_rng(0), [])
    with pytest.raises(ValueError, match="babble source"):
        make_noise("babble", 100, np.random.default_rng(0))
    with pytest.raises(ValueError, match="kind"):
        make_noise("rain", 100, np.random.default_rng(0))


@pytest.mark.parametrize("snr", [0.0, 7.5, 15.0, 30.0])
def test_mix_hits_snr_on_reverberant_signals(snr):
    pool = RIRPool(size=1, seed=4, spec=RoomSpec(t60=(0.4, 0.4), sides=(4.0, 6.0)))
    entry = pool.get(0, 0)
    rng = np.random.default_rng(0)
    speech = colored_noise(FS * 2, "pink", rng) * torch.from_numpy(
        np.abs(np.sin(np.arange(FS * 2) / FS * 2 * np.pi * 3)).astype(np.float32))
    rirs = [entry.speech_rir, *entry.noise_rirs]
    r = max(h.numel() for h in rirs)
    noises = [make_noise(k, FS * 2 + r - 1, rng) for k in ("white", "brown", "tone")]
    rev = Augmenter._convolve(speech, noises, rirs, r)
    noise = rev[1] + 0.5 * rev[2] + 0.8 * rev[3]
    mixed, scaled = mix_at_snr(rev[0], noise, snr)
    assert snr_db(rev[0], scaled) == pytest.approx(snr, abs=0.5)
    assert snr_db(rev[0], mixed - rev[0]) == pytest.approx(snr, abs=0.5)
    assert snr_db(rev[0], scaled) == pytest.approx(snr, abs=1e-3)   # it is exact up to float32 rounding


def test_pipeline_mixture_has_the_drawn_snr(monkeypatch):
    seen = []
    real = pipeline.mix_at_snr

    def spy(speech, noise, snr):
        out = real(speech, noise, snr)
        seen.append((speech, out[0], snr))
        return out

    monkeypatch.setattr(pipeline, "mix_at_snr", spy)
    cfg = AugmentConfig(sim_prob=1.0, noise_sources=(1, 3), pool_size=2, t60=(0.1, 0.4), room_sides=(3.0, 6.0))
    aug = Augmenter(cfg, seed=3, babble=[torch.randn(8000)])
    wave = colored_noise(FS * 2, "pink", np.random.default_rng(9)) * 0.1
    for i in range(4):
        out = aug.augment(wave, f"utt{i}", 0)
        speech_rev, mixture, snr = seen[-1]
        assert torch.equal(mixture, out.wave)
        assert out.info["snr_db"] == snr and 0.0 <= snr <= 30.0
        assert snr_db(speech_rev, out.wave - speech_rev) == pytest.approx(snr, abs=0.5)
        # the reverberant speech keeps the clean utterance's level
        assert float(speech_rev.pow(2).mean()) == pytest.approx(float(wave.pow(2).mean()), rel=1e-4)


def test_talker_pool_passes_over_unreadable_files_and_pickles(tmp_path):
    """One babble-talker source for the trainer and AugmentedDataset: draws with the given rng, decodes a path
    once, passes over an unreadable file for the next talker, and pickles into spawned loader workers."""
    import pickle

    import numpy as np
    import soundfile as sf
    import torch

    from asr.augment.noise import TalkerPool
    good = tmp_path / "good.flac"
    sf.write(good, np.sin(np.arange(16000) / 10.0).astype("float32"), 16000)
    (tmp_path / "bad.flac").write_bytes(b"not audio")
    pool = TalkerPool([str(tmp_path / "bad.flac"), str(good)], 16000)
    rng = np.random.default_rng(0)
    waves = [pool(rng) for _ in range(6)]
    assert all(w.shape == (16000,) for w in waves) and pool._cache[0] is None
    assert torch.equal(pickle.loads(pickle.dumps(pool))(np.random.default_rng(1)), waves[0])
    with pytest.raises(ValueError, match="no readable babble talker"):
        TalkerPool([str(tmp_path / "bad.flac")], 16000)(rng)
