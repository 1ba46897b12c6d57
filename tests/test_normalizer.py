"""Issue 7: feature normalization, global (corpus statistics) and per utterance (no Horovod, no audio)."""
import json

import pytest
import torch

from asr.config import ConfigError, load_config
from asr.loader import Normalizer


@pytest.fixture
def stats(tmp_path):
    path = tmp_path / "feature_stats.json"
    path.write_text(json.dumps({"mean": [0.5] * 40, "std": [2.0] * 40, "compression": "power"}))
    return path


def test_global_cmvn_uses_the_corpus_statistics(stats):
    feats = torch.randn(50, 40)
    assert torch.allclose(Normalizer(stats)(feats), (feats - 0.5) / 2.0)


def test_utterance_cmvn_gives_zero_mean_unit_variance_per_band(stats):
    feats = torch.randn(200, 40) * torch.linspace(0.1, 3.0, 40) + torch.linspace(-5, 5, 40)
    out = Normalizer(stats, cmvn="utterance")(feats)
    assert torch.allclose(out.mean(0), torch.zeros(40), atol=1e-5)
    assert torch.allclose(out.std(0, unbiased=False), torch.ones(40), atol=1e-4)


def test_utterance_cmvn_removes_a_constant_colouring_per_band(stats):
    """A voice's or a room's spectral tilt is a constant per band in the compressed domain: it vanishes."""
    feats = torch.randn(120, 40)
    tilt = torch.linspace(-1.0, 2.0, 40)
    norm = Normalizer(stats, cmvn="utterance")
    assert torch.allclose(norm(feats + tilt), norm(feats), atol=1e-5)


def test_utterance_cmvn_on_silence_is_finite(stats):
    out = Normalizer(stats, cmvn="utterance")(torch.zeros(3, 40))
    assert torch.isfinite(out).all() and (out == 0).all()


def test_a_bad_cmvn_value_is_refused_naming_the_key(stats):
    with pytest.raises(ValueError, match="cmvn must be one of"):
        Normalizer(stats, cmvn="speaker")
    with pytest.raises(ConfigError, match=r"data\.cmvn: expected one of global, utterance, got 'speaker'"):
        load_config(None, ["data.cmvn=speaker"])


def test_the_statistics_file_decides_the_feature_settings(tmp_path):
    """New files carry FeatureSettings; old ones (no "features") mean the defaults, their "compression" kept."""
    from asr.frontend import FeatureSettings
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"features": FeatureSettings(mel_compression="log").to_dict(),
                               "mean": [0.0] * 40, "std": [1.0] * 40}))
    assert Normalizer(new).settings == FeatureSettings(mel_compression="log")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"mean": [0.0] * 40, "std": [1.0] * 40}))
    assert Normalizer(old).settings == FeatureSettings()
    old.write_text(json.dumps({"mean": [0.0] * 40, "std": [1.0] * 40, "compression": "log"}))
    assert Normalizer(old).settings.mel_compression == "log"
    eighty = tmp_path / "eighty.json"
    eighty.write_text(json.dumps({"features": {"n_mels": 80}, "mean": [0.0] * 40, "std": [1.0] * 40}))
    with pytest.raises(ValueError, match=r"eighty\.json: expected 80-dim 'mean'"):
        Normalizer(eighty)


def test_a_config_asking_for_other_features_than_the_statistics_is_refused(tmp_path):
    """The error names the statistics file and both values; asking for the file's own values is fine."""
    from asr.frontend import FeatureMismatchError, FeatureSettings
    path = tmp_path / "feature_stats.json"
    path.write_text(json.dumps({"features": FeatureSettings(mel_compression="log").to_dict(),
                                "mean": [0.0] * 40, "std": [1.0] * 40}))
    cfg = load_config(None, ["features.mel_compression=power", f"data.stats={path}"])
    assert cfg.features == {"mel_compression": "power"}
    with pytest.raises(FeatureMismatchError) as e:
        Normalizer(cfg.data.stats, expect=cfg.features)
    msg = str(e.value)
    assert str(path) in msg and "mel_compression='power'" in msg and "mel_compression='log'" in msg
    cfg = load_config(None, ["features.mel_compression=log", "features.n_mels=40", "features.f_max=8000"])
    assert Normalizer(path, expect=cfg.features).settings.mel_compression == "log"
    assert Normalizer(path, expect=load_config(None, []).features).settings.mel_compression == "log"  # asks nothing
    with pytest.raises(FeatureMismatchError, match=r"f_min=0\.0.*f_min=20\.0"):
        Normalizer(path, expect=load_config(None, ["features.f_min=0"]).features)


def test_feature_settings_in_a_config_are_checked_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"features: unknown feature setting\(s\) n_mel; valid: sample_rate"):
        load_config(None, ["features.n_mel=80"])
    with pytest.raises(ConfigError, match="mel_compression must be one of"):
        load_config(None, ["features.mel_compression=cube"])
    with pytest.raises(ConfigError, match="hop_length must be a positive integer"):
        load_config(None, ["features.hop_length=1.5"])
    with pytest.raises(ConfigError, match="unknown key.*compression"):      # the old name is gone
        load_config(None, ["augment.compression=log"])


def test_an_augmenter_with_other_features_than_the_statistics_is_refused(tmp_path):
    from asr.augment.pipeline import AugmentConfig, Augmenter
    from asr.data.manifest import write_manifest
    from asr.frontend import FeatureMismatchError, FeatureSettings
    from asr.loader import SpeechDataset
    path = tmp_path / "feature_stats.json"
    path.write_text(json.dumps({"features": FeatureSettings(mel_compression="log").to_dict(),
                                "mean": [0.0] * 40, "std": [1.0] * 40}))
    write_manifest(tmp_path / "m.jsonl", [{"id": "a", "audio_filepath": "a.flac", "duration": 1.0, "text": "a"}])

    class Tok:
        def encode(self, text):
            return [1]

    ds = SpeechDataset(tmp_path / "m.jsonl", Tok(), Normalizer(path))
    with pytest.raises(FeatureMismatchError, match=r"feature_stats\.json: the augmenter.*'power'.*'log'"):
        ds.augmenter = Augmenter(AugmentConfig())
    ds.augmenter = Augmenter(AugmentConfig(features=ds.normalizer.settings))
