"""The pipeline is a function of (seed, epoch, utterance): same result in any process, in any order, with any
number of DataLoader workers; SpecAugment is deterministic too."""
import json

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from torch.utils.data import DataLoader

from asr.augment import AugmentConfig, AugmentedDataset, Augmenter, utterance_seed
from asr.augment.specaugment import SpecAugmentConfig, spec_augment

FS = 16000
FAST_ROOMS = dict(pool_size=3, t60=(0.1, 0.3), room_sides=(3.0, 5.0))   # cheap RIRs for tests


def _wave(seed, seconds=1.0):
    g = torch.Generator().manual_seed(seed)
    env = torch.sin(torch.linspace(0, 20, int(FS * seconds))).abs()
    return 0.1 * torch.randn(int(FS * seconds), generator=g) * env


def test_stable_seed_is_not_pythons_hash():
    assert utterance_seed(0, 0, "utt-1") == utterance_seed(0, 0, "utt-1")
    assert utterance_seed(0, 0, "utt-1") == 3598371552559296273   # fixed forever: same draws on every machine
    assert len({utterance_seed(0, 0, "a"), utterance_seed(0, 1, "a"), utterance_seed(1, 0, "a"),
                utterance_seed(0, 0, "b")}) == 4


def test_same_seed_epoch_utt_same_result_in_any_order():
    cfg = AugmentConfig(sim_prob=1.0, specaugment=True, **FAST_ROOMS)
    babble = [_wave(100 + k) for k in range(3)]
    a = Augmenter(cfg, seed=7, babble=babble)
    first = a(_wave(1), "u1", 0)
    for k in range(4):                      # other utterances in between change nothing
        a(_wave(k), f"x{k}", k % 2)
    again = a(_wave(1), "u1", 0)
    fresh = Augmenter(cfg, seed=7, babble=babble)(_wave(1), "u1", 0)
    for other in (again, fresh):
        assert torch.equal(first[0], other[0]) and first[1] == other[1]
    next_epoch = a(_wave(1), "u1", 1)
    other_seed = Augmenter(cfg, seed=8, babble=babble)(_wave(1), "u1", 0)
    assert not torch.equal(first[0], next_epoch[0]) and first[1] != next_epoch[1]
    assert not torch.equal(first[0], other_seed[0])
    assert first[0].dtype == torch.float32 and first[0].shape == (101, 40)
    json.dumps(first[1])                    # info is plain data


def test_no_augmentation_gives_torchaudio_power_law_features():
    wave = _wave(3, 2.0)
    feats, info = Augmenter(AugmentConfig(vtlp=False, sim_prob=0.0))(wave, "u", 0)
    mel = torchaudio.transforms.MelSpectrogram(FS, n_fft=512, win_length=400, hop_length=160, f_min=20.0,
                                               f_max=8000.0, n_mels=40, mel_scale="htk")(wave).t()
    assert torch.equal(feats, mel.pow(1.0 / 15.0))
    assert info["warp"] == 1.0 and not info["simulated"]


def test_vtlp_draws_cover_the_range():
    aug = Augmenter(AugmentConfig(sim_prob=0.0))
    warps = [aug(_wave(0, 0.2), f"u{k}", 0)[1]["warp"] for k in range(200)]
    assert 0.9 <= min(warps) < 0.92 and 1.08 < max(warps) <= 1.1


def test_specaugment_is_deterministic_and_leaves_global_rng_alone():
    feats = torch.rand(300, 40) + 0.1
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = spec_augment(feats, torch.Generator().manual_seed(5))
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(999)
    b = spec_augment(feats, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    masked = a == 0
    assert masked.any() and masked.all(dim=0).any() and masked.all(dim=1).any()   # frequency and time masks
    assert torch.equal(spec_augment(feats, torch.Generator(), SpecAugmentConfig(freq_masks=0, time_masks=0)), feats)
    assert not AugmentConfig().specaugment       # off by default


def _collect(ds, workers, epochs):
    loader = DataLoader(ds, batch_size=None, shuffle=False, num_workers=workers, persistent_workers=workers > 0)
    out = {}
    for epoch in epochs:
        ds.set_epoch(epoch)
        for feats, info in loader:
            out[(epoch, info["utt_id"])] = (feats, info)
    return out


def test_dataloader_0_and_2_workers_give_identical_tensors(tmp_path):
    items = []
    for k in range(8):
        wave = _wave(k, 0.5 + 0.1 * k)
        if k % 2:
            path = tmp_path / f"u{k}.wav"
            sf.write(path, wave.numpy(), FS, subtype="FLOAT")
            items.append((f"u{k}", path, f"label {k}"))
        else:
            items.append((f"u{k}", wave, f"label {k}"))
    cfg = AugmentConfig(sim_prob=0.75, specaugment=True, **FAST_ROOMS)
    ds = AugmentedDataset(items, Augmenter(cfg, seed=1), babble_from_items=True)
    serial = _collect(ds, 0, (0, 1))
    parallel = _collect(ds, 2, (0, 1))      # persistent workers: the epoch reaches them through shared memory
    assert serial.keys() == parallel.keys() and len(serial) == 16
    for key, (feats, info) in serial.items():
        assert torch.equal(feats, parallel[key][0]), key
        assert info == parallel[key][1]
        assert info["label"] == f"label {key[1][1:]}"
    assert any(v[1]["simulated"] for v in serial.values())
    assert any(not torch.equal(serial[(0, f"u{k}")][0], serial[(1, f"u{k}")][0]) for k in range(8))


def test_bad_config_and_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="snr_db"):
        AugmentConfig(snr_db=(30, 0))
    with pytest.raises(ValueError, match="noise_sources"):
        AugmentConfig(noise_sources=(0, 4))
    with pytest.raises(ValueError, match="mel_compression"):
        AugmentConfig(features={"mel_compression": "mfcc"})
    with pytest.raises(ValueError, match="AugmentConfig.features"):
        AugmentConfig(features=3)
    with pytest.raises(ValueError, match="sim_prob"):
        AugmentConfig(sim_prob=1.5)
    with pytest.raises(ValueError, match="babble"):
        Augmenter(AugmentConfig(noise_kinds=("babble",), noise_sources=(1, 1), **FAST_ROOMS)).augment(
            torch.ones(1000), "u", 0, simulate=True)
    with pytest.raises(ValueError, match="'u'"):
        Augmenter()(torch.zeros(2, 100), "u", 0)
    path = tmp_path / "8k.wav"
    sf.write(path, np.zeros(800, dtype=np.float32), 8000)
    ds = AugmentedDataset([("u", path)], Augmenter())
    with pytest.raises(ValueError, match="8k.wav.*8000"):
        ds[0]


def test_feature_settings_reach_the_features():
    """AugmentConfig.features are the front end's settings: the augmenter computes with them (log here)."""
    from asr.frontend import FeatureSettings, compute_features
    wave = _wave(4, 0.5)
    settings = FeatureSettings(mel_compression="log")
    feats, _ = Augmenter(AugmentConfig(vtlp=False, sim_prob=0.0, features=settings))(wave, "u", 0)
    torch.testing.assert_close(feats, compute_features(wave, settings), rtol=1e-5, atol=1e-6)
    assert AugmentConfig(features=settings.to_dict()).features == settings


def test_spawned_workers_match_too():
    """spawn (macOS/Windows default) pickles the augmenter and dataset: the pool restarts empty, the shared epoch
    tensor travels by handle, and the results are still identical."""
    items = [(f"s{k}", _wave(20 + k, 0.5)) for k in range(4)]
    ds = AugmentedDataset(items, Augmenter(AugmentConfig(sim_prob=1.0, **FAST_ROOMS), seed=2), babble_from_items=True)
    serial = _collect(ds, 0, (0, 3))
    loader = DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=True, multiprocessing_context="spawn")
    for epoch in (0, 3):
        ds.set_epoch(epoch)
        for feats, info in loader:
            assert torch.equal(feats, serial[(epoch, info["utt_id"])][0])
