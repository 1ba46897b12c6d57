"""Issue 17: each setting defined once: the config's sections are the dataclasses the code uses."""
import dataclasses

import pytest

from asr.augment.config import AugmentConfig
from asr.config import ConfigError, load_config
from asr.models.bfa import BFAConfig

CONF = "recipes/bfa/conf/cpu-small.yaml"


def test_model_and_augment_sections_are_the_library_dataclasses():
    cfg = load_config(CONF, ["augment.sim_prob=0.2", "augment.t60=[0.2, 0.5]", "model.enc_hidden=64"])
    assert isinstance(cfg.model, BFAConfig) and cfg.model.enc_hidden == 64
    assert isinstance(cfg.augment, AugmentConfig) and cfg.augment.sim_prob == 0.2 and cfg.augment.t60 == (0.2, 0.5)
    # every default not set in the YAML is the library's own
    plain = AugmentConfig()
    for f in dataclasses.fields(AugmentConfig):
        if f.name not in ("vtlp", "vtlp_range", "sim_prob", "t60", "snr_db", "noise_sources", "pool_size", "rir_cache",
                          "start_epoch", "ramp_epochs", "speed_factors"):
            assert getattr(cfg.augment, f.name) == getattr(plain, f.name), f.name
    assert cfg.augment.rir_cache == "auto" and cfg.augment.enabled


def test_feature_settings_are_not_an_augment_setting():
    with pytest.raises(ConfigError, match="augment.features: the feature settings come from data.stats"):
        load_config(CONF, ["augment.features.n_mels=80"])


def test_choices_and_unknown_keys_are_refused():
    with pytest.raises(ConfigError, match="train.amp: expected one of none, bf16, fp16"):
        load_config(CONF, ["train.amp=fp61"])
    with pytest.raises(ConfigError, match="train.schedule: expected one of epoch, cosine, linear"):
        load_config(CONF, ["train.schedule=step"])
    with pytest.raises(ConfigError, match="unknown key\\(s\\) bogus"):
        load_config(CONF, ["augment.bogus=1"])
    with pytest.raises(ConfigError, match="decode.combine_blank_offsets: expected a list of numbers"):
        load_config(CONF, ["decode.combine_blank_offsets=[1.5, loud]"])
    assert load_config(CONF, ["decode.combine_blank_offsets=[1.5]"]).decode.combine_blank_offsets == [1.5]
    with pytest.raises(ConfigError, match="decode.warps: expected a list of VTLP warp factors in \\[0.5, 2.0\\]"):
        load_config(CONF, ["decode.warps=[0.9, 3.0]"])
    assert load_config(CONF, ["decode.warps=[0.9, 1.0, 1.1]"]).decode.warps == [0.9, 1.0, 1.1]


def test_slowmo_settings_are_checked():
    cfg = load_config(None, ["train.slowmo=slowmo4-m0.25"])
    assert cfg.train.slowmo == "slowmo4-m0.25"
    with pytest.raises(ConfigError, match="train.slowmo: SlowMo spec 'slowmox'"):
        load_config(None, ["train.slowmo=slowmox"])
    with pytest.raises(ConfigError, match="train.slowmo=slowmo4-global_qsgd8"):      # names the spec to write
        load_config(None, ["train.slowmo=slowmo4", "train.compression=global_qsgd8"])
    with pytest.raises(ConfigError, match="takes local steps"):
        load_config(None, ["train.slowmo=slowmo4", "train.pipeline=true"])
    load_config(None, ["train.slowmo=slowmo4-global_qsgd8", "train.pipeline=true"])   # pipelining the inner codec


def test_gossip_settings_are_checked():
    assert load_config(None, ["train.gossip=gossip-exp-a10"]).train.gossip == "gossip-exp-a10"
    with pytest.raises(ConfigError, match="train.gossip: Gossip spec 'gossip-star'"):
        load_config(None, ["train.gossip=gossip-star"])
    with pytest.raises(ConfigError, match="exchanges models, not gradients"):
        load_config(None, ["train.gossip=gossip-ring", "train.compression=topk0.01"])
    with pytest.raises(ConfigError, match="pick one"):
        load_config(None, ["train.gossip=gossip-ring", "train.slowmo=slowmo4"])
