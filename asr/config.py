"""Recipe configuration: one YAML file per configuration, ``key=value`` overrides, strict validation.

Sections mirror the pipeline: ``data`` (manifests, tokenizer, feature statistics), ``features`` (feature
settings the run asks for), ``model`` (BFA sizes), ``augment`` (VTLP, acoustic simulator, SpecAugment),
``train`` (optimisation and communication) and ``decode``. Unknown keys are rejected with the list of valid
ones, so a typo never silently falls back to a default.

``model`` is :class:`asr.models.bfa.BFAConfig` itself (vocab_size and feat_dim come from the tokenizer and the
statistics file). ``features`` is a mapping of some asr.frontend.FeatureSettings (e.g. ``features.mel_compression=log``): the
feature settings themselves come from the statistics file (``data.stats``, written by ``asr-prep stats``);
a setting named here that differs from the file's is an error naming the file and both values. Empty: the
file's settings, whatever they are.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .frontend.settings import FeatureSettings
from .augment.config import AugmentConfig
from .models.bfa import BFAConfig


@dataclass
class DataConfig:
    train: str = "exp/corpus/train.jsonl"
    dev: str = "exp/corpus/dev.jsonl"
    tokenizer: str = "exp/corpus/tokenizer/tokenizer.model"
    stats: str = "exp/corpus/stats/feature_stats.json"
    max_duration: float = 20.0          # longer training utterances are skipped (logged)
    cmvn: str = "global"                # feature normalization: "global" (corpus statistics) or "utterance"
    dev_subset: int = 200               # dev utterances decoded for the per-epoch WER (0: all)
    feature_cache: str = "auto"         # clean spectrograms kept on disk (asr.frontend.cache): auto | off | FOLDER
    lexicon: str = ""                   # asr-prep lexicon folder: the phone CTC head's targets (model.phone_ctc_weight)


@dataclass
class AugmentSection(AugmentConfig):
    """The augmenter's own settings (:class:`asr.augment.config.AugmentConfig`, each default there) plus what
    only a recipe decides: whether to augment at all, and where the simulated rooms are kept ("auto":
    ``rir_cache/`` next to data.train, shared by every worker and run; "": memory only). The feature settings
    are not set here: they are the statistics file's (the top-level ``features`` section checks them)."""
    enabled: bool = True
    rir_cache: str | None = "auto"


@dataclass
class TrainConfig:
    epochs: int = 10
    max_minutes: float = 0.0            # training time budget: stop (mid-epoch) when it is used up (0: no limit)
    max_steps: int = 0                  # step budget: stop (mid-epoch) after this many optimizer steps (0: no limit);
                                        # a cosine/linear schedule then runs to it, so paired runs compare at equal steps
    batch_seconds: float = 60.0         # audio per batch per worker (length-bucketed)
    max_batch: int = 64                 # utterances per batch at most
    match_lengths: bool = True          # the workers' batches of a step are neighbours in length (no long waits)
    short_first_epochs: int = 0         # curriculum: the first N epochs go from short utterances to long
    lr: float = 1e-3                    # per worker; the peak learning rate is lr * world size
    warmup_steps: int = 200
    schedule: str = "epoch"             # epoch: lr x decay per epoch; cosine | linear: to final_lr at the budget's end
    decay: float = 0.85                 # schedule=epoch: per epoch after warm-up
    final_lr: float = 0.05              # schedule=cosine|linear: the last step's lr, as a fraction of the peak
    weight_decay: float = 0.0
    fused_adam: bool = True             # Adam's fused kernel (CPU and CUDA): the same update in one pass over the
                                        # weights; on one CPU thread 2.5 against 9.7 ms per step for cpu-small's 2.9M
                                        # weights (RESULTS.md, fifteenth session)
    clip: float = 5.0
    compression: str = "none"           # hx.Compression.from_spec: none, fp16, bf16, global_qsgd8, topk0.01, ...
    pipeline: bool = False
    predict_weights: bool = False       # pipelined: each gradient taken at the predicted weights it is applied to
                                        # (true weights + the last update) instead of one update behind; no effect
                                        # without train.pipeline or with train.slowmo / train.gossip
    slowmo: str = ""                    # hx.SlowMo instead of every-step averaging: slowmo<tau>[-m<momentum>][-<codec>]
                                        # (e.g. slowmo4: local Adam steps, an average every 4); compression must be none
    gossip: str = ""                    # hx.Gossip instead of allreduce: gossip-ring (D-PSGD) | gossip-exp (SGP) [-a<k>:
                                        # an exact average every k steps]; compression must be none
    comm_warmup_steps: int = 0          # first steps reduce plain fp32, synchronously (no codec, no pipeline)
    backward_passes_per_step: int = 1
    amp: str = "none"                   # none | bf16 | fp16: autocast on GPU hosts; bf16 also on a CPU with native bf16
                                        # (AVX512-BF16 or AMX; otherwise a note and fp32)
    pad_frames: int = 1                 # each training batch's frames padded up to a multiple of this: fewer distinct
                                        # shapes, so oneDNN's bf16 LSTM kernels are built once, not per batch
    nonfinite: str = "skip"             # a NaN/Inf averaged gradient: every worker skips the step (logged) or raises
    seed: int = 0
    loader_workers: int = 1             # DataLoader worker processes per trainer (augmentation runs there)
    threads: int = 1                    # torch threads per trainer
    flush_denormal: bool = True         # CPU: subnormal floats read and written as zero (torch.set_flush_denormal).
                                        # A trained model's step hits them: one thread, the 60-minute model's step
                                        # at epoch 7 took 184 ms, 155 flushed; at epoch 0 152 / 148
                                        # (scripts/denormal_probe.py, RESULTS.md 2026-12-05 ninth session). The
                                        # 60-minute benchmark: 11,170 steps against 9,900, combined WER 27.7 / 52.9%
                                        # against 27.8 / 53.9% clean / far-field (tenth session)
    cycle_time_ms: float = 0.0          # Horovod's cycle time (HOROVOD_CYCLE_TIME) unless the launcher set one;
                                        # 0: Horovod's default (1 ms). Every cycle is a small collective even when
                                        # idle: on a few CPU cores a longer one leaves them to training
    log_every: int = 10
    dev_every: int = 1                  # dev WER after every N-th epoch (and after the last one)
    dev_attention: bool = False         # the dev pass also decodes greedily with the attention decoder (slower)
    keep_epochs: int = 0                # epoch checkpoints to keep (0: all); last.pt is always kept
    out_dir: str = "exp/run"
    elastic: bool = False               # hvd.elastic.run (also on when horovodrun sets HOROVOD_ELASTIC=1)
    commit_every: int = 20              # elastic: commit the state every this many steps (and at epoch end)
    ema_decay: float = 0.0              # > 0: decode with an exponential moving average of the weights (asr.ema), its
                                        # decay per step warmed up as min(decay, (1 + n) / (10 + n)); 0: the weights

    def __post_init__(self):
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay: expected a decay per step in [0, 1) (0: off; e.g. 0.99), "
                              f"got {self.ema_decay}")
        if self.pad_frames < 1:
            raise ConfigError(f"train.pad_frames: expected a frame count >= 1 (1: no padding; e.g. 16), "
                              f"got {self.pad_frames}")
        if self.gossip:
            self._check_gossip()
        if not self.slowmo:
            return
        if self.gossip:
            raise ConfigError(f"train.slowmo={self.slowmo} and train.gossip={self.gossip}: pick one")
        from horovod_ext.slowmo import parse_spec
        try:
            spec = parse_spec(self.slowmo)
        except ValueError as e:
            raise ConfigError(f"train.slowmo: {e}") from None
        if self.compression != "none":
            raise ConfigError(f"train.slowmo={self.slowmo} with train.compression={self.compression}: state SlowMo's "
                              f"inner codec in its spec instead (e.g. train.slowmo=slowmo{spec['tau']}-"
                              f"{self.compression}) and leave train.compression=none")
        if not spec["inner"] and (self.pipeline or self.comm_warmup_steps or self.backward_passes_per_step != 1):
            raise ConfigError(f"train.slowmo={self.slowmo} takes local steps: train.pipeline, comm_warmup_steps and "
                              f"backward_passes_per_step are for an inner codec (e.g. slowmo{spec['tau']}-global_qsgd8)")

    def _check_gossip(self) -> None:
        from horovod_ext.gossip import parse_spec
        try:
            parse_spec(self.gossip)
        except ValueError as e:
            raise ConfigError(f"train.gossip: {e}") from None
        if self.compression != "none" or self.pipeline or self.comm_warmup_steps or self.backward_passes_per_step != 1:
            raise ConfigError(f"train.gossip={self.gossip} exchanges models, not gradients: leave train.compression=none, "
                              f"train.pipeline=false, comm_warmup_steps=0 and backward_passes_per_step=1")
    trace_utterances: bool = False      # write every step's utterance ids to OUT_DIR/trace/ (audit of an epoch)


TEST_WARP_RANGE = (0.5, 2.0)           # decode.warps / asr-eval --warps: the VTLP warp factors accepted


@dataclass
class DecodeConfig:
    """Decoding: the per-epoch dev pass and asr-eval's defaults (its flags override them)."""
    method: str = "joint"               # asr-eval's method without --method (asr.decode.METHODS): the best measured
    beam: int = 1                       # attention: 1 = greedy, else beam search
    ctc_weight: float = 0.0             # attention beam search: CTC rescoring weight
    batch_seconds: float = 120.0        # audio per decoding batch
    # asr-eval --method ctc_beam. Defaults from a grid on 100 dev utterances (never test): LM weight
    # 0.2/0.35/0.5 x bonus 0.5/1/2/3.
    prefix_beam: int = 8                # CTC prefix beam width
    lm_weight: float = 0.5              # LM shallow-fusion weight (with --lm)
    length_bonus: float = 3.0           # score per piece, against the LM's pull to short hypotheses (with --lm; 0 without)
    att_weight: float = 0.5             # attention weight when rescoring the n-best (0: CTC and LM only)
    # asr-eval --method joint (joint CTC/attention beam search, asr.decode.joint_search). Defaults from grids on
    # 100 dev utterances (never test) of exp/demo, the finalists checked on all 250: CTC weight 0.2-0.7 x bonus
    # 0/0.5/1; with the LM, CTC weight 0.3-0.8 x LM weight 0.1-0.5 x bonus 0.5-4. Beam 8 beat 4 by 2 points.
    joint_beam: int = 8                 # beam width
    joint_ctc_weight: float = 0.5       # CTC prefix score's weight against the attention decoder's (without --lm)
    joint_ctc_weight_lm: float = 0.7    # the same with --lm (CTC carries more of the search once an LM helps)
    joint_lm_weight: float = 0.2        # LM shallow-fusion weight (with --lm)
    joint_length_bonus: float = 3.0     # score per piece (with --lm; 0 without)
    max_ratio: float = 1.0              # joint: at most this many pieces per encoder frame
    # asr-eval --tune-on DEV (joint): CTC weight first, without the LM, then LM weight x length bonus at the best
    # CTC weight; the lowest dev WER wins (the LM only if it helps). On 200 dev utterances the 60-minute benchmark's
    # model wanted CTC weight 0.2, LM 0.1, bonus 1 (41.1% against 47.2% at the defaults above; 0.1 and 0.15 were
    # worse), the demo's model CTC weight 0.7 and no LM (90.8% against 95.9%): the best settings move with the
    # model, so run.sh tunes them per run (RESULTS.md, 2026-12-02).
    tune_ctc_weights: list = field(default_factory=lambda: [0.1, 0.2, 0.35, 0.5, 0.7])
    tune_lm_weights: list = field(default_factory=lambda: [0.1, 0.2, 0.3])
    tune_length_bonuses: list = field(default_factory=lambda: [0.0, 1.0, 2.0])
    # asr-eval --method lexicon (a model with a phone CTC head): the phone posteriors searched over the words of
    # data.lexicon with the word n-gram LM ``ngram`` (asr-prep ngram), torchaudio's lexicon decoder.
    ngram: str = ""                     # word n-gram LM (KenLM binary); "": the lexicon alone
    lexicon_beam: int = 50
    lexicon_lm_weight: float = 1.5
    word_score: float = 0.0
    tune_ngram_weights: list = field(default_factory=lambda: [0.5, 1.0, 1.5, 2.5])
    lexicon_nbest: int = 10             # hypotheses the word-piece heads rescore (lexicon_rescore_weight > 0)
    lexicon_rescore_weight: float = 0.0 # their weight: score + w x (log P_att + log P_ctc) of the words' pieces
    tune_word_scores: list = field(default_factory=lambda: [-1.0, 0.0, 1.0, 2.0])
    tune_rescore_weights: list = field(default_factory=lambda: [0.0, 0.1, 0.2, 0.4])
    lexicon_blank_penalty: float = 0.0  # taken off the blank's log-probability per frame (asr-eval --blank-penalty)
    tune_blank_penalties: list = field(default_factory=lambda: [0.0, 0.5, 1.0, 1.5, 2.0])
    # asr-eval --method combine: the lexicon n-best and the joint search's pooled and reranked (asr.combine);
    # weights of asr.combine.FEATURES, {} = asr.combine.START (the lexicon decoder's own trade-off). --tune-on
    # chooses them on dev, after the joint search's settings.
    combine_weights: dict = field(default_factory=dict)
    # ... and its lexicon decoder searching again at its blank penalty + each of these (asr-eval
    # --combine-blank-offsets): words a blank narrowly hid, mostly on reverberant speech, become candidates
    combine_blank_offsets: list = field(default_factory=list)
    # Every decoder's front end: "wpe" removes late reverberation from each utterance before its features
    # (asr.frontend.dereverb; about 0.4 s per utterance, cached). asr-eval --dereverb overrides it.
    dereverb: str = "off"
    # Test-time VTLP warps: each utterance encoded once per warp (the same frames, another mel filterbank on its
    # spectrogram) and the encoder outputs averaged, so every head and the attention decoder read the mean
    # (asr.decode.encode). [] = the features as they are. asr-eval --warps overrides it.
    warps: list = field(default_factory=list)

    def __post_init__(self):
        from .decode import METHODS
        if self.method not in METHODS:
            raise ConfigError(f"decode.method: expected one of {', '.join(METHODS)}, got {self.method!r}")
        for name in ("joint_ctc_weight", "joint_ctc_weight_lm"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"decode.{name}: expected a weight in [0, 1], got {getattr(self, name)}")
        if self.max_ratio <= 0:
            raise ConfigError(f"decode.max_ratio: expected a positive number, got {self.max_ratio}")
        from .frontend.dereverb import METHODS as DEREVERB
        if self.dereverb not in DEREVERB:
            raise ConfigError(f"decode.dereverb: expected one of {', '.join(DEREVERB)}, got {self.dereverb!r}")
        lo, hi = TEST_WARP_RANGE
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and lo <= x <= hi for x in self.warps):
            raise ConfigError(f"decode.warps: expected a list of VTLP warp factors in [{lo}, {hi}] (e.g. [0.9, 1.0, "
                              f"1.1]; [] for none), got {self.warps!r}")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in self.combine_blank_offsets):
            raise ConfigError(f"decode.combine_blank_offsets: expected a list of numbers (added to the lexicon "
                              f"decoder's blank penalty), got {self.combine_blank_offsets!r}")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    features: dict = field(default_factory=dict)   # some FeatureSettings, checked against data.stats
    model: BFAConfig = field(default_factory=BFAConfig)
    augment: AugmentSection = field(default_factory=AugmentSection)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def rir_cache_dir(self) -> str | None:
        """The folder of simulated rooms shared by every loader worker and run ("auto": ``rir_cache/`` next to
        data.train), or None for rooms kept in memory only."""
        c = self.augment.rir_cache
        if c == "auto":
            return str(Path(self.data.train).resolve().parent / "rir_cache")
        return c or None


class ConfigError(ValueError):
    pass


# Keys whose value must be one of a few words (checked after the types).
CHOICES = {"data.cmvn": ("global", "utterance"), "train.amp": ("none", "bf16", "fp16"),
           "train.nonfinite": ("skip", "raise"), "train.schedule": ("epoch", "cosine", "linear")}


def _coerce(value, typ, where: str):
    origin = typing.get_origin(typ) or typ
    if origin is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if origin is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if origin is list:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return value
    if origin is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def _build(cls, values: dict, where: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)       # real types (annotations are strings here)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(hints))}")
    kwargs = {}
    for name, value in values.items():
        typ, key = hints[name], f"{where}.{name}" if where else name
        kwargs[name] = _build(typ, value, key) if dataclasses.is_dataclass(typ) else _coerce(value, typ, key)
    return cls(**kwargs)


def _set_path(tree: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {k} is not a section")
    node[keys[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read a YAML config and apply ``section.key=value`` overrides; errors name the file and key."""
    tree: dict = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"{path}: config file not found")
        try:
            tree = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {e}") from e
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value (e.g. train.epochs=3)")
        key, value = item.split("=", 1)
        _set_path(tree, key.strip(), yaml.safe_load(value) if value.strip() else "")
    if isinstance(tree.get("augment"), dict) and "features" in tree["augment"]:
        raise ConfigError(f"{path or 'config'}: augment.features: the feature settings come from data.stats; "
                          f"state them in the top-level features section (e.g. features.mel_compression=log)")
    try:
        cfg = _build(Config, tree, "")
        for key, allowed in CHOICES.items():
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            if value not in allowed:
                raise ConfigError(f"{key}: expected one of {', '.join(allowed)}, got {value!r}")
        try:
            cfg.features = FeatureSettings.validate_partial(cfg.features)
        except ValueError as e:
            raise ConfigError(f"features: {e}") from None
        return cfg
    except ConfigError as e:
        raise ConfigError(f"{path or 'config'}: {e}") from None
