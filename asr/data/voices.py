"""Synthetic voices: the voice list (data/voices.yaml) and the four offline synthesizer backends.

Three backends are Debian programs run as subprocesses: espeak-ng, flite and festival's text2wave. The fourth is
SVOX Pico (``ttspico`` from PyPI, which bundles the engine and its two English voices, US and GB, both female and
HMM-based like the slt HTS test voice, but other speakers), run in-process. All four are deterministic for a given
text and settings, so a seeded choice of prosody per utterance makes the audio reproducible.

A *derived* voice (``name~tag`` in data/voices.yaml, e.g. ``kal_diphone~f``) is a diphone voice with its pitch and
vocal-tract length changed: the synthesizer is asked for a higher mean F0 and a longer duration, then the waveform
is resampled so it plays ``formant`` times faster, which scales every formant (and F0) by that factor and brings the
duration back. F0 x1.7 and formants x1.15-1.2 turn a male diphone voice into a female-like one; Debian has no
female flite/festival English voice besides slt, which is held out for dev and test. Pico voices honour F0
targets too (its ``pitch`` property, a percentage of the voice's own mean F0 in :data:`PICO_BASE_F0`).
Reserved voices (flite awb, any Piper voice) belong to an outside evaluation: :func:`refuse_reserved` stops any
attempt to construct or run one, whatever the YAML says.
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
ENGINES = ("espeak", "flite", "festival", "pico")
FESTIVAL_VOICE_DIRS = (Path("/usr/share/festival/voices"),)
DEBIAN_PACKAGES = {"espeak": "espeak-ng", "flite": "flite",
                   "festival": "festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"}
PICO_HINT = "install the PyPI package ttspico (make setup does: pip install .[asr])"
#: SVOX Pico's voices (``ttspico`` language codes) and their mean F0 in Hz at pitch 100%, measured with librosa's
#: pyin on a 5 s sentence (163.9 and 172.7 Hz); the pitch property scales it linearly within 50-200%.
PICO_BASE_F0 = {"en-US": 164.0, "en-GB": 173.0}
PICO_PITCH_RANGE = (50, 200)
TIMEOUT_S = 120
#: The person behind each non-espeak voice (see Voice.speaker).
RECORDED_SPEAKERS = {"flite:kal": "kal", "flite:kal16": "kal", "festival:kal_diphone": "kal",
                     "festival:ked_diphone": "ked", "flite:rms": "arctic-rms", "flite:slt": "arctic-slt",
                     "festival:cmu_us_slt_arctic_hts": "arctic-slt",
                     "pico:en-US": "svox-lh0", "pico:en-GB": "svox-kh0"}
#: Voices whose F0 targets the synthesizer honours (diphone voices and Pico; flite's clustergen voices ignore them).
F0_CAPABLE = {"flite": ("kal", "kal16"), "festival": ("kal_diphone", "ked_diphone"), "pico": tuple(PICO_BASE_F0)}


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
    weight: float = 1.0                          # share of its split's utterances, relative to the other voices

    def __post_init__(self):
        refuse_reserved(self.engine, self.name)
        if self.engine not in ENGINES:
            raise VoiceConfigError(f"voice {self.id}: unknown engine {self.engine!r} (one of {', '.join(ENGINES)})")
        if (self.f0 or self.formant) and "~" not in self.name:
            raise VoiceConfigError(f"voice {self.id}: f0/formant make a derived voice; name it {self.name}~TAG")
        if not self.weight > 0:
            raise VoiceConfigError(f"voice {self.id}: weight must be > 0, got {self.weight!r}")
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

    @property
    def speaker(self) -> str:
        """The recorded person (or espeak-ng variant) behind this voice: splits must not share one.

        Diphone, clustergen and HTS voices built from one recording share it (flite kal/kal16 and festival
        kal_diphone are all Kal; flite slt and festival's slt HTS voice are both CMU ARCTIC SLT); a derived voice
        keeps its base voice's speaker; an espeak-ng voice is its variant (``+m3``; none: the accent's default)."""
        if self.engine == "espeak":
            return "espeak:" + (self.name.split("+", 1)[1] if "+" in self.name else "default")
        return RECORDED_SPEAKERS.get(f"{self.engine}:{self.program_voice}", f"{self.engine}:{self.program_voice}")

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
        """The argv (and stdin) that writes ``text`` spoken by this voice to ``wav_path`` (subprocess engines)."""
        refuse_reserved(self.engine, self.name)
        if self.engine == "pico":
            raise ValueError(f"{self.id}: Pico runs in-process (Voice.synthesize), not as a program")
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

    def pico_settings(self, params: dict) -> dict[str, int]:
        """Pico's ``rate`` and ``pitch`` (percent) for drawn ``params``: like the diphone voices, a derived Pico
        voice speaks slower and lower by ``formant`` before the resampling that undoes both."""
        alpha = params.get("formant", 1.0)
        rate = round(100.0 / (params.get("stretch", 1.0) * alpha))
        pitch = round(100.0 * params["f0"] / alpha / PICO_BASE_F0[self.program_voice]) if "f0" in params else 100
        lo, hi = PICO_PITCH_RANGE
        if not lo <= pitch <= hi:
            raise RuntimeError(f"{self.id}: F0 {params['f0']} Hz at formant {alpha} needs Pico pitch {pitch}%, "
                               f"outside its {lo}-{hi}%")
        return {"rate": rate, "pitch": pitch}

    def synthesize(self, text: str, params: dict, wav_path: Path) -> None:
        """Run the synthesizer; raise RuntimeError naming the voice and the program's error on failure."""
        if self.engine == "pico":
            _pico_synthesize(self, text, params, wav_path)
        else:
            self._run_program(text, params, wav_path)
        if params.get("formant", 1.0) != 1.0:
            shift_formants(wav_path, params["formant"])

    def _run_program(self, text: str, params: dict, wav_path: Path) -> None:
        """A subprocess engine writes ``wav_path``; RuntimeError names the voice and the program's error."""
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

    def check_installed(self) -> None:
        """Raise VoiceConfigError (naming the package) if this voice's program or data is missing."""
        if self.engine == "pico":
            if self.program_voice not in PICO_BASE_F0:
                raise VoiceConfigError(f"voice {self.id}: Pico has no voice {self.program_voice!r} "
                                       f"(has {', '.join(PICO_BASE_F0)})")
            try:
                _pico_engine(self.program_voice)
            except (ImportError, RuntimeError) as e:
                raise VoiceConfigError(f"voice {self.id}: cannot start SVOX Pico ({e}); {PICO_HINT}") from e
            return
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


def _pico_engine(language: str):
    """A fresh ttspico engine (about 2 ms). A Pico engine is stateful: the same text spoken twice by one engine gives
    other samples, so reusing one would make an utterance's audio depend on what its worker spoke before (and on
    the job count). Each engine keeps about 25 KB after it is freed (ttspico 0.3.2), 90 MB per worker for the 7,000
    Pico utterances of a 21,000-utterance corpus."""
    import ttspico
    return ttspico.TtsEngine(language)


def _pico_synthesize(voice: Voice, text: str, params: dict, wav_path: Path) -> None:
    """Speak ``text`` with SVOX Pico into a 16 kHz 16-bit WAV file."""
    import numpy as np
    import soundfile as sf
    settings = voice.pico_settings(params)
    try:
        engine = _pico_engine(voice.program_voice)
        engine.rate, engine.pitch = settings["rate"], settings["pitch"]
        pcm = engine.speak(text) or b""
    except (ImportError, RuntimeError, ValueError) as e:
        raise RuntimeError(f"{voice.id}: SVOX Pico failed: {e}") from e
    sf.write(str(wav_path), np.frombuffer(pcm, dtype=np.int16), 16000, subtype="PCM_16")


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


def espeak_variants() -> list[str]:
    """Every installed espeak-ng voice variant (the ``NAME`` of ``-v en+NAME``), sorted."""
    if shutil.which("espeak-ng") is None:
        raise VoiceConfigError(f"espeak-ng not found; install Debian package(s): apt-get install -y "
                               f"{DEBIAN_PACKAGES['espeak']}")
    out = subprocess.run(["espeak-ng", "--voices=variant"], capture_output=True, text=True, timeout=30).stdout
    names = sorted({tok.split("!v/", 1)[1] for line in out.splitlines() for tok in line.split()
                    if tok.startswith("!v/")})
    if not names:
        raise VoiceConfigError("espeak-ng --voices=variant lists no variants; is espeak-ng-data installed?")
    return names


def _expand_family(spec: dict, where: str, held_out: set[str]) -> list[dict]:
    """``{engine: espeak, variants: all, accents: [...], weight: W}``: one voice per installed variant (minus
    ``exclude`` and the variants held out for dev/test), the accents assigned in turn, plus each accent's own
    default voice; the family's weight is shared equally by its members."""
    if spec.get("engine") != "espeak" or spec.get("variants") != "all":
        raise VoiceConfigError(f"{where}: a voice family needs engine: espeak and variants: all")
    accents = spec.get("accents")
    if not isinstance(accents, list) or not accents or not all(isinstance(a, str) for a in accents):
        raise VoiceConfigError(f"{where}: accents must be a non-empty list of espeak-ng languages, got {accents!r}")
    exclude = set(spec.get("exclude") or ()) | held_out
    variants = [v for v in espeak_variants() if v not in exclude]
    names = list(accents) + [f"{accents[i % len(accents)]}+{v}" for i, v in enumerate(variants)]
    weight = float(spec.get("weight", len(names))) / len(names)
    keep = {k: spec[k] for k in ("pitch", "speed") if k in spec}
    return [{"engine": "espeak", "name": n, "weight": weight, **keep} for n in names]


def load_voices(data_dir: Path = DATA_DIR) -> dict[str, list[Voice]]:
    """Voices per split from data/voices.yaml; checks that splits share no voice and no speaker
    (:attr:`Voice.speaker`), and that none is reserved. Voice families (``variants: all``) are expanded
    after dev and test are read, so a variant held out for them never trains."""
    path = Path(data_dir) / "voices.yaml"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise VoiceConfigError(f"{path}: cannot read voice list: {e}") from e
    out: dict[str, list[Voice]] = {}
    seen: dict[str, str] = {}
    held_out: set[str] = set()
    for split in ("dev", "test", "train"):
        specs = doc.get(split)
        if not isinstance(specs, list) or not specs:
            raise VoiceConfigError(f"{path}: split {split!r} needs a non-empty list of voices")
        out[split] = []
        for i, spec in enumerate(specs):
            where = f"{path}: {split}[{i}]"
            if not isinstance(spec, dict) or "engine" not in spec or ("name" not in spec and "variants" not in spec):
                raise VoiceConfigError(f"{where}: expected {{engine: ..., name: ...}} or a family "
                                       f"{{engine: espeak, variants: all, accents: [...]}}, got {spec!r}")
            members = _expand_family(spec, where, held_out) if "variants" in spec else [spec]
            for m in members:
                try:
                    weight = float(m.get("weight", 1.0))
                except (TypeError, ValueError):
                    raise VoiceConfigError(f"{where}: weight must be a number, got {m.get('weight')!r}") from None
                v = Voice(str(m["engine"]), str(m["name"]), split, _range(m, "pitch", where),
                          _range(m, "speed", where), _range(m, "stretch", where), _range(m, "f0", where),
                          _range(m, "formant", where), weight)
                if v.id in seen:
                    raise VoiceConfigError(f"{where}: voice {v.id} is already in split {seen[v.id]!r}; "
                                           "splits must be disjoint by voice")
                seen[v.id] = split
                out[split].append(v)
        if split != "train":
            held_out |= {v.name.split("+", 1)[1] for v in out[split] if v.engine == "espeak" and "+" in v.name}
    speakers = {s: {v.speaker: v.id for v in out[s] if not (v.engine == "espeak" and "+" not in v.name)}
                for s in SPLITS}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        for spk in speakers[a].keys() & speakers[b].keys():
            raise VoiceConfigError(f"{path}: {a} voice {speakers[a][spk]} and {b} voice {speakers[b][spk]} are the "
                                   f"same speaker ({spk}); splits must be disjoint by speaker")
    return {s: out[s] for s in SPLITS}


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
    try:
        from importlib.metadata import version
        out["ttspico"] = f"ttspico {version('ttspico')} (SVOX Pico)"
    except Exception:  # noqa: BLE001 - a version string only
        out["ttspico"] = "not installed"
    return out
