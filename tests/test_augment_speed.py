"""Issue 15: speed perturbation on the spectrogram, and augmentation ramped in after the first epochs."""
import subprocess

import pytest
import soundfile as sf
import torch
import torchaudio.functional as AF

from asr.augment import AugmentConfig, Augmenter
from asr.frontend import (FeatureSettings, compress_mel, compute_features, mel_filterbank, power_spectrogram,
                          stretch_frames)

S = FeatureSettings()


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    wav = tmp_path_factory.mktemp("speed") / "s.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), "please set an alarm for seven tomorrow morning"],
                   check=True)
    x, sr = sf.read(wav, dtype="float32")
    return AF.resample(torch.from_numpy(x), sr, S.sample_rate)


@pytest.mark.parametrize("speed", [0.9, 1.1])
def test_spectrogram_speed_perturbation_matches_resampled_audio(speech, speed):
    """The filterbank scaled by the speed plus the frame stretch reads what resampled audio gives (Kaldi's
    speed perturbation) to a few percent of a feature's spread; the frame stretch alone is 3x further off."""
    exact = compute_features(AF.resample(speech, round(S.sample_rate * speed), S.sample_rate), S)
    power = power_spectrogram(speech, S)
    ours = compress_mel(stretch_frames(power @ mel_filterbank(S, 1.0, speed=speed), speed))
    tempo_only = compress_mel(stretch_frames(power @ mel_filterbank(S, 1.0), speed))
    assert abs(len(ours) - len(exact)) <= 1
    n = min(len(ours), len(exact))
    err = lambda f: float((f[:n] - exact[:n]).abs().mean() / exact.std())
    assert err(ours) < 0.1 and err(tempo_only) > 3 * err(ours), (err(ours), err(tempo_only))


def test_stretch_frames_interpolates_and_keeps_the_ends():
    mel = torch.arange(10, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
    assert torch.equal(stretch_frames(mel, 1.0), mel)
    slow = stretch_frames(mel, 0.5)                   # twice the frames, halfway points between
    assert slow.shape == (20, 3) and torch.allclose(slow[:19, 0], torch.arange(19) * 0.5)
    fast = stretch_frames(mel, 2.0)
    assert fast.shape == (5, 3) and torch.equal(fast[:, 0], torch.tensor([0.0, 2, 4, 6, 8]))
    with pytest.raises(ValueError, match="speed must be > 0"):
        mel_filterbank(S, 1.0, speed=0.0)


def test_augmenter_speed_factors_change_the_length_and_are_reproducible(speech):
    a = Augmenter(AugmentConfig(vtlp=False, sim_prob=0.0, speed_factors=(0.9, 1.1)), seed=3)
    seen = {}
    for k in range(12):
        feats, info = a(speech, f"u{k}", 0)
        assert torch.equal(feats, a(speech, f"u{k}", 0)[0])
        seen[info["speed"]] = feats.shape[0]
    clean = compute_features(speech, S).shape[0]
    assert set(seen) == {0.9, 1.1} and seen[0.9] > clean > seen[1.1]
    with pytest.raises(ValueError, match="speed_factors"):
        AugmentConfig(speed_factors=(0.1,))


def test_augmentation_ramps_in_after_start_epoch(speech):
    """Before start_epoch the features are the clean ones; then the strength rises over ramp_epochs epochs and
    scales the VTLP range, the simulation probability and the speed perturbation's chance."""
    cfg = AugmentConfig(vtlp_range=(0.8, 1.2), sim_prob=1.0, speed_factors=(0.9, 1.1), start_epoch=2,
                        ramp_epochs=1, pool_size=2, t60=(0.1, 0.3), room_sides=(3.0, 5.0))
    a = Augmenter(cfg, seed=1)
    assert [a.strength(e) for e in range(5)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    clean = compute_features(speech, S)
    for k in range(4):
        feats, info = a(speech, f"u{k}", 1)
        assert torch.equal(feats, clean) and not info["simulated"] and info["speed"] == 1.0
        assert info["warp"] == 1.0 and info["strength"] == 0.0
    half = [a(speech, f"u{k}", 2)[1] for k in range(40)]
    full = [a(speech, f"u{k}", 3)[1] for k in range(40)]
    assert all(0.9 <= i["warp"] <= 1.1 for i in half) and max(abs(i["warp"] - 1) for i in full) > 0.1
    assert 5 < sum(i["simulated"] for i in half) < 35 and all(i["simulated"] for i in full)
    assert 0 < sum(i["speed"] != 1.0 for i in half) < 40 and all(i["speed"] != 1.0 for i in full)
