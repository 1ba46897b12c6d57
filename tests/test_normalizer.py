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
