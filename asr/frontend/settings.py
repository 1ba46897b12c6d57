"""The feature settings: one frozen dataclass, written into the statistics file by ``asr-prep stats``.

Every number that decides what a feature vector is lives here once: the sample rate, the STFT framing (a Hann
window of ``win_length`` samples in an ``n_fft``-point FFT every ``hop_length`` samples), the HTK mel filterbank
(``n_mels`` bands from ``f_min`` to ``f_max``, no filter normalization) and the compression of the mel energies
(``mel_compression``: "power" = x ** (1/15), "log" = log(x + 1e-6)). The statistics file records the settings its
mean and variance were computed with; the loader computes features with exactly those, and a config that asks for
other values is refused (:meth:`FeatureSettings.check`).

No torch here: the config reads this module too.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

MEL_COMPRESSIONS = ("power", "log")
POWER_EXPONENT = 1.0 / 15.0      # Kim et al. (ASRU 2019): bounded at silence, close to log over the speech range
LOG_FLOOR = 1e-6


class FeatureMismatchError(ValueError):
    """Feature settings that differ from those a statistics file was computed with."""


@dataclass(frozen=True)
class FeatureSettings:
    sample_rate: int = 16000         # Hz
    n_mels: int = 40
    n_fft: int = 512
    win_length: int = 400            # samples of the Hann window (25 ms)
    hop_length: int = 160            # samples between frames (10 ms)
    f_min: float = 20.0              # Hz, lower edge of the first mel filter
    f_max: float = 8000.0            # Hz, upper edge of the last mel filter
    mel_compression: str = "power"   # "power" (x ** (1/15)) or "log" (log(x + 1e-6))

    def __post_init__(self):
        for name, value in self.validate_partial(dataclasses.asdict(self)).items():
            object.__setattr__(self, name, value)
        if not 0 < self.win_length <= self.n_fft:
            raise ValueError(f"FeatureSettings: need 0 < win_length <= n_fft, got win_length={self.win_length}, "
                             f"n_fft={self.n_fft}")
        if not 0 <= self.f_min < self.f_max <= self.sample_rate / 2:
            raise ValueError(f"FeatureSettings: need 0 <= f_min < f_max <= sample_rate/2, got f_min={self.f_min}, "
                             f"f_max={self.f_max}, sample_rate={self.sample_rate}")

    @classmethod
    def validate_partial(cls, values: Mapping) -> dict:
        """Some of the settings (a config's ``features`` section) with their types checked and coerced; unknown
        names and bad values raise ValueError naming the setting."""
        if not isinstance(values, Mapping):
            raise ValueError(f"feature settings: expected a mapping, got {values!r}")
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise ValueError(f"unknown feature setting(s) {', '.join(unknown)}; valid: {', '.join(types)}")
        out = {}
        for name, value in values.items():
            typ = types[name]
            if typ == "str":
                if value not in MEL_COMPRESSIONS:
                    raise ValueError(f"{name} must be one of {MEL_COMPRESSIONS}, got {value!r}")
                out[name] = str(value)
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {value!r}") from None
            if typ == "int":
                if not (math.isfinite(number) and number == int(number) and number > 0):
                    raise ValueError(f"{name} must be a positive integer, got {value!r}")
                out[name] = int(number)
            else:
                if not (math.isfinite(number) and number >= 0):
                    raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
                out[name] = number
        return out

    @classmethod
    def from_dict(cls, values: Mapping) -> "FeatureSettings":
        """Settings from a mapping; names left out take the defaults."""
        return cls(**cls.validate_partial(values))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def win_s(self) -> float:
        return self.win_length / self.sample_rate

    @property
    def hop_s(self) -> float:
        return self.hop_length / self.sample_rate

    def differences(self, asked) -> dict:
        """{name: (asked value, this value)} for every setting in ``asked`` (a mapping or FeatureSettings) that
        differs from this one."""
        asked = asked.to_dict() if isinstance(asked, FeatureSettings) else self.validate_partial(asked or {})
        return {k: (v, getattr(self, k)) for k, v in asked.items() if v != getattr(self, k)}

    def check(self, asked, source, asker: str = "the config") -> None:
        """Raise FeatureMismatchError naming ``source`` (the statistics file these settings come from) and both
        values of every setting where ``asked`` differs; ``None`` or an empty mapping asks for nothing."""
        diff = self.differences(asked)
        if diff:
            want = ", ".join(f"{k}={a!r}" for k, (a, _) in diff.items())
            have = ", ".join(f"{k}={h!r}" for k, (_, h) in diff.items())
            raise FeatureMismatchError(
                f"{source}: {asker} asks for features {want}, but this statistics file was computed with {have}; "
                f"compute the statistics again with those settings (asr-prep stats) or ask for the file's")


DEFAULT_FEATURES = FeatureSettings()
VTLP_BOUNDARY_HZ = 4800.0        # F_hi of the VTLP warp: frequencies above it are squeezed so Nyquist stays Nyquist
SAMPLE_RATE = DEFAULT_FEATURES.sample_rate     # the recipe's audio rate (asr-prep writes every corpus at it)
N_MELS = DEFAULT_FEATURES.n_mels
