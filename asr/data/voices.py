"""Synthetic voices: the voice list (data/voices.yaml) and the three offline synthesizer backends.

Backends are Debian programs run as subprocesses: espeak-ng, flite and festival's text2wave. All three are
deterministic for a given text and settings, so a seeded choice of prosody per utterance makes the audio
reproducible.

A *derived* voice (``name~tag`` in data/voices.yaml, e.g. ``kal_diphone~f``) is a diphone voice with its pitch and
vocal-tract length changed: the synthesizer is asked for a higher mean F0 and a longer duration, then the waveform
is resampled so it plays ``formant`` times faster, which scales every formant (and F0) by that factor and brings the
duration back. F0 x1.7 and formants x1.15-1.2 turn a male diphone voice into a female-like one; Debian has no
female flite/festival English voice besides slt, which is held out for dev and test. Reserved voices (flite awb, any Piper voice) belong to an outside evaluation: :func:`refuse_reserved`
stops any attempt to construct or run one, whatever the YAML says.
"""
from __future__ import annotations

import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import DATA_DIR

SPLITS = ("train", "dev", "test")
ENGINES = ("espeak", "flite", "festival")
FESTIVAL_VOICE_DIRS = (Path("/usr/share/festival/voices"),)
DEBIAN_PACKAGES = {"espeak": "espeak-ng", "flite": "flite",
                   "festival": "festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"}
TIMEOUT_S = 120
#: Voices whose F0 targets the synthesizer honours (diphone voices; flite's clustergen voices ignore them).
F0_CAPABLE = {"flite": ("kal", "kal16"), "festival": ("kal_diphone", "ked_diphone")}


class ReservedVoiceError(AssertionError):
    """A reserved voice was requested; they are never used by this project (training, tuning or testing)."""


class VoiceConfigError(ValueError):
    """data/voices.yaml is malformed or a listed voice is not installed; the message names file and voice."""


def refuse_reserved(engine: str, name: str) -> None:
    """Raise ReservedVoiceError for flite awb/awb_time and for every Piper voice."""
    e, n = engine.strip().lower(), name.strip().lower()
    if "piper" in e or "piper" in n or n.endswith(".onnx"):
        raise ReservedVoiceError(f"Piper voice {engine}:{name} is reserved for an outside evaluation; never used")
    if "awb" in n:
        raise ReservedVoiceError(f"voice {engine}:{name} (CMU ARCTIC awb) is reserved for an outside evaluation; "
                                 "never used")


@dataclass(frozen=True)
class Voice:
    engine: str
    name: str
    split: str
    pitch: tuple[int, int] | None = None     # espeak -p range
    speed: tuple[int, int] | None = None     # espeak -s range (words per minute)
    stretch: tuple[float, float] | None = None  # flite/festival duration stretch range
    f0: tuple[float, float] | None = None       # derived voices: mean F0 in Hz after the formant shift
    formant: tuple[float, float] | None = None  # derived voices: formant (and F0) scale by resampling

    def __post_init__(self):
        refuse_reserved(self.engine, self.name)
        if self.engine not in ENGINES:
            raise VoiceConfigError(f"voice {self.id}: unknown engine {self.engine!r} (one of {', '.join(ENGINES)})")
        if (self.f0 or self.formant) and "~" not in self.name:
            raise VoiceConfigError(f"voice {self.id}: f0/formant make a derived voice; name it {self.name}~TAG")
        if self.f0 and self.program_voice not in F0_CAPABLE.get(self.engine, ()):
            raise VoiceConfigError(f"voice {self.id}: f0 needs a voice that honours F0 targets "
                                   f"({', '.join(f'{e}:{n}' for e, ns in F0_CAPABLE.items() for n in ns)})")

    @property
    def program_voice(self) -> str:
        """The synthesizer's own voice name (a derived voice ``kal_diphone~f`` runs ``kal_diphone``)."""
        return self.name.split("~", 1)[0]

    @property
    def id(self) -> str:
        return f"{self.engine}:{self.name}"

    def draw_params(self, rng: random.Random) -> dict:
        """Seeded per-utterance prosody within this voice's ranges."""
        p = {}
        if self.pitch:
            p["pitch"] = rng.randint(*self.pitch)
        if self.speed:
            p["speed"] = rng.randint(*self.speed)
        if self.stretch:
            p["stretch"] = round(rng.uniform(*self.stretch), 2)
        if self.f0:
            p["f0"] = rng.randint(int(self.f0[0]), int(self.f0[1]))
        if self.formant:
            p["formant"] = round(rng.uniform(*self.formant), 2)
        return p

    def command(self, text: str, params: dict, wav_path: Path) -> tuple[list[str], bytes | None]:
        """The argv (and stdin) that writes ``text`` spoken by this voice to ``wav_path``."""
        refuse_reserved(self.engine, self.name)
        alpha = params.get("formant", 1.0)  # the synthesizer speaks slower and lower; resampling undoes both
        stretch = round(params.get("stretch", 1.0) * alpha, 4) if ("stretch" in params or alpha != 1.0) else None
        f0 = params["f0"] / alpha if "f0" in params else None
        if self.engine == "espeak":
            argv = ["espeak-ng", "-v", self.name, "-w", str(wav_path)]
            if "pitch" in params:
                argv += ["-p", str(params["pitch"])]
            if "speed" in params:
                argv += ["-s", str(params["speed"])]
            return argv + ["--stdin"], text.encode()
        if self.engine == "flite":
            argv = ["flite", "-voice", self.program_voice]
            if stretch is not None:
                argv += ["--setf", f"duration_stretch={stretch}"]
            if f0 is not None:
                argv += ["--setf", f"int_f0_target_mean={f0:.1f}", "--setf", f"int_f0_target_stddev={0.18 * f0:.1f}"]
            return argv + ["-t", text, "-o", str(wav_path)], None
        argv = ["text2wave", "-eval", f"(voice_{self.program_voice})"]
        if stretch is not None:
            argv += ["-eval", f"(Parameter.set 'Duration_Stretch {stretch})"]
        if f0 is not None:  # the diphone voices' linear-regression intonation model, retargeted
            argv += ["-eval", f"(set! int_lr_params '((target_f0_mean {f0:.1f}) (target_f0_std {0.18 * f0:.1f}) "
                              "(model_f0_mean 170) (model_f0_std 34)))"]
        return argv + ["-o", str(wav_path)], text.encode()

    def synthesize(self, text: str, params: dict, wav_path: Path) -> None:
        """Run the synthesizer; raise RuntimeError naming the voice and the program's error on failure."""
        argv, stdin = self.command(text, params, wav_path)
        try:
            res = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                 timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{self.id}: {argv[0]} timed out after {TIMEOUT_S} s") from e
        except OSError as e:
            raise RuntimeError(f"{self.id}: cannot run {argv[0]}: {e}") from e
        if res.returncode != 0:
            raise RuntimeError(f"{self.id}: {argv[0]} exited {res.returncode}: "
                               f"{res.stderr.decode(errors='replace').strip()[:300]}")
        if params.get("formant", 1.0) != 1.0:
            shift_formants(wav_path, params["formant"])

    def check_installed(self) -> None:
        """Raise VoiceConfigError (naming the Debian package) if this voice's program or data is missing."""
        prog = {"espeak": "espeak-ng", "flite": "flite", "festival": "text2wave"}[self.engine]
        hint = f"install Debian package(s): apt-get install -y {DEBIAN_PACKAGES[self.engine]}"
        if shutil.which(prog) is None:
            raise VoiceConfigError(f"voice {self.id}: program {prog} not found; {hint}")
        name = self.program_voice
        if self.engine == "flite":
            out = subprocess.run(["flite", "-lv"], capture_output=True, text=True).stdout.split()
            if name not in out:
                raise VoiceConfigError(f"voice {self.id}: flite has no voice {name!r} (has {' '.join(out[2:])})")
        if self.engine == "festival" and not any(any(d.glob(f"*/{name}")) for d in FESTIVAL_VOICE_DIRS
                                                 if d.is_dir()):
            raise VoiceConfigError(f"voice {self.id}: festival voice {name} not installed; {hint}")


def shift_formants(wav_path: Path, alpha: float) -> None:
    """Scale every frequency in a WAV file by ``alpha`` (and its duration by 1/alpha) by resampling, in place."""
    import soundfile as sf
    import torch
    import torchaudio.functional as AF

    from ..frontend import read_audio
    data, sr = read_audio(wav_path)
    y = AF.resample(torch.from_numpy(data.T.copy()), orig_freq=round(sr * alpha), new_freq=sr)
    sf.write(str(wav_path), y.T.numpy(), sr, subtype="PCM_16")


def _range(spec: dict, key: str, where: str):
    v = spec.get(key)
    if v is None:
        return None
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v) and v[0] <= v[1]):
        raise VoiceConfigError(f"{where}: {key} must be [low, high], got {v!r}")
    return tuple(v)


def load_voices(data_dir: Path = DATA_DIR) -> dict[str, list[Voice]]:
    """Voices per split from data/voices.yaml; checks that no voice is in two splits and none is reserved."""
    path = Path(data_dir) / "voices.yaml"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise VoiceConfigError(f"{path}: cannot read voice list: {e}") from e
    out: dict[str, list[Voice]] = {}
    seen: dict[str, str] = {}
    for split in SPLITS:
        specs = doc.get(split)
        if not isinstance(specs, list) or not specs:
            raise VoiceConfigError(f"{path}: split {split!r} needs a non-empty list of voices")
        out[split] = []
        for i, spec in enumerate(specs):
            where = f"{path}: {split}[{i}]"
            if not isinstance(spec, dict) or "engine" not in spec or "name" not in spec:
                raise VoiceConfigError(f"{where}: expected {{engine: ..., name: ...}}, got {spec!r}")
            v = Voice(str(spec["engine"]), str(spec["name"]), split, _range(spec, "pitch", where),
                      _range(spec, "speed", where), _range(spec, "stretch", where), _range(spec, "f0", where),
                      _range(spec, "formant", where))
            if v.id in seen:
                raise VoiceConfigError(f"{where}: voice {v.id} is already in split {seen[v.id]!r}; "
                                       "splits must be disjoint by voice")
            seen[v.id] = split
            out[split].append(v)
    held_out = {v.name.split("+", 1)[1] for s in ("dev", "test") for v in out[s] if v.engine == "espeak"
                and "+" in v.name}
    for v in out["train"]:
        if v.engine == "espeak" and "+" in v.name and v.name.split("+", 1)[1] in held_out:
            raise VoiceConfigError(f"{path}: train voice {v.id} uses an espeak-ng variant held out for dev/test")
    return out


def tool_versions() -> dict[str, str]:
    """First line of each synthesizer's version output (recorded in corpus.json)."""
    out = {}
    for name, argv in (("espeak-ng", ["espeak-ng", "--version"]), ("flite", ["flite", "--version"]),
                       ("festival", ["festival", "--version"])):
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
            out[name] = next((ln for ln in lines if "version" in ln.lower()), lines[0] if lines else "?")
        except (OSError, subprocess.TimeoutExpired):
            out[name] = "not installed"
    return out
