"""What the augmentation does, as settings only (no audio code), so a recipe config can hold it cheaply.

:class:`AugmentConfig` is both the augmenter's configuration and, through ``asr.config``, the recipe config's
``augment`` section: each default exists once, here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..frontend.settings import DEFAULT_FEATURES, VTLP_BOUNDARY_HZ, FeatureSettings

NOISE_KINDS = ("white", "pink", "brown", "babble", "tone")
ABSORPTION_MODELS = ("ism", "eyring", "sabine")


@dataclass(frozen=True)
class SpecAugmentConfig:
    freq_masks: int = 2
    freq_width: int = 8        # max mask width in mel bands (of 40)
    time_masks: int = 2
    time_width: int = 40       # max mask width in frames (10 ms)
    time_max_fraction: float = 0.2   # a time mask covers at most this fraction of the utterance
    mask_value: float = 0.0    # 0 = silence for power-law features

    def __post_init__(self):
        for name in ("freq_masks", "freq_width", "time_masks", "time_width"):
            if getattr(self, name) < 0:
                raise ValueError(f"SpecAugmentConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.time_max_fraction <= 1.0:
            raise ValueError(f"SpecAugmentConfig.time_max_fraction must be in [0, 1], got {self.time_max_fraction}")


def _pair(name, value, low_bound=0.0):
    lo, hi = value
    if not low_bound <= lo <= hi:
        raise ValueError(f"AugmentConfig.{name} must be (low, high) with {low_bound} <= low <= high, got {value}")
    return (float(lo), float(hi))


@dataclass
class AugmentConfig:
    """What the pipeline does; defaults follow Kim et al. (VTLP U[0.9, 1.1], rooms 3-10 m, T60 0.1-0.9 s,
    SNR 0-30 dB, 0-3 noise sources, power-law features). ``features`` are the front end's settings: the
    statistics file's when the augmenter feeds a SpeechDataset (it checks)."""
    vtlp: bool = True
    vtlp_range: tuple[float, float] = (0.9, 1.1)
    vtlp_boundary_hz: float = VTLP_BOUNDARY_HZ
    vtlp_grid: float = 0.001            # warps are rounded to this grid so filterbanks can be cached
    sim_prob: float = 0.5               # probability that an utterance goes through the acoustic simulator
    room_sides: tuple[float, float] = (3.0, 10.0)
    room_height: tuple[float, float] = (2.5, 4.0)
    t60: tuple[float, float] = (0.1, 0.9)
    wall_margin: float = 0.5
    absorption: str = "ism"             # see asr.augment.rooms: "ism" hits the requested T60; "sabine" runs short
    snr_db: tuple[float, float] = (0.0, 30.0)
    noise_sources: tuple[int, int] = (0, 3)
    noise_kinds: tuple[str, ...] = NOISE_KINDS   # "babble" is skipped when the Augmenter has no babble source
    noise_gain_db: tuple[float, float] = (-6.0, 0.0)   # relative level of each source before the SNR scaling
    pool_size: int = 64
    pool_seed: int | None = None        # None: derived from the Augmenter seed
    pool_refresh_every: int = 1         # epochs between refreshes (0: never)
    pool_refresh_fraction: float = 0.25
    rir_cache: str | None = None        # folder shared by every process that builds this pool (None: memory only)
    speed_factors: tuple[float, ...] = ()   # speed perturbation (Ko et al. 2015), e.g. (0.9, 1.0, 1.1): one per
    #                                         utterance and epoch, on the spectrogram (asr.frontend.mel.stretch_frames)
    start_epoch: int = 0                # no augmentation before this epoch (clean features: the CTC plateau)
    ramp_epochs: int = 0                # then the strength rises over this many epochs (see Augmenter.strength)
    specaugment: bool = False
    specaugment_options: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    features: FeatureSettings = DEFAULT_FEATURES   # a dict is read with FeatureSettings.from_dict

    def __post_init__(self):
        self.vtlp_range = _pair("vtlp_range", self.vtlp_range, 1e-3)
        self.room_sides = _pair("room_sides", self.room_sides, 1e-3)
        self.room_height = _pair("room_height", self.room_height, 1e-3)
        self.t60 = _pair("t60", self.t60, 1e-3)
        self.snr_db = _pair("snr_db", self.snr_db, -100.0)
        self.noise_gain_db = _pair("noise_gain_db", self.noise_gain_db, -100.0)
        lo, hi = self.noise_sources
        if not 0 <= lo <= hi <= 3:
            raise ValueError(f"AugmentConfig.noise_sources must be (low, high) within 0..3, got {self.noise_sources}")
        self.noise_sources = (int(lo), int(hi))
        self.noise_kinds = tuple(self.noise_kinds)
        bad = [k for k in self.noise_kinds if k not in NOISE_KINDS]
        if bad or not self.noise_kinds:
            raise ValueError(f"AugmentConfig.noise_kinds must be a non-empty subset of {NOISE_KINDS}, got "
                             f"{self.noise_kinds}")
        if not 0.0 <= self.sim_prob <= 1.0:
            raise ValueError(f"AugmentConfig.sim_prob must be in [0, 1], got {self.sim_prob}")
        if isinstance(self.features, dict):
            self.features = FeatureSettings.from_dict(self.features)
        elif not isinstance(self.features, FeatureSettings):
            raise ValueError(f"AugmentConfig.features must be FeatureSettings, got {self.features!r}")
        if self.absorption not in ABSORPTION_MODELS:
            raise ValueError(f"AugmentConfig.absorption must be one of {ABSORPTION_MODELS}, got {self.absorption!r}")
        if self.pool_size < 1:
            raise ValueError(f"AugmentConfig.pool_size must be >= 1, got {self.pool_size}")
        if self.pool_refresh_every < 0 or not 0.0 <= self.pool_refresh_fraction <= 1.0:
            raise ValueError("AugmentConfig.pool_refresh_every must be >= 0 and pool_refresh_fraction in [0, 1], "
                             f"got {self.pool_refresh_every} and {self.pool_refresh_fraction}")
        if self.vtlp_grid <= 0:
            raise ValueError(f"AugmentConfig.vtlp_grid must be > 0, got {self.vtlp_grid}")
        self.speed_factors = tuple(float(f) for f in self.speed_factors)
        if any(not 0.5 <= f <= 2.0 for f in self.speed_factors):
            raise ValueError(f"AugmentConfig.speed_factors must lie in [0.5, 2.0], got {self.speed_factors}")
        if self.start_epoch < 0 or self.ramp_epochs < 0:
            raise ValueError(f"AugmentConfig.start_epoch and ramp_epochs must be >= 0, got {self.start_epoch} and "
                             f"{self.ramp_epochs}")
        if isinstance(self.specaugment_options, dict):
            self.specaugment_options = SpecAugmentConfig(**self.specaugment_options)

    def room_spec(self):
        from .rooms import RoomSpec
        return RoomSpec(sides=self.room_sides, height=self.room_height, t60=self.t60, wall_margin=self.wall_margin,
                        max_noise_sources=self.noise_sources[1], absorption=self.absorption,
                        sample_rate=self.features.sample_rate)

    def to_dict(self) -> dict:
        return asdict(self)
