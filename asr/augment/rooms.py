"""Acoustic simulator, room half (Kim et al., Interspeech 2017): random shoebox rooms and a deterministic RIR pool.

Every pool entry is one random room (image method, pyroomacoustics) with the impulse responses from a speech
source and from up to ``max_noise_sources`` noise positions to one microphone. RIR generation costs 0.01-1 s per
source on one core, so entries are built lazily and reused by many utterances, and the pool is refreshed over time.

Determinism (why the pool has no use counter): a DataLoader worker sees an arbitrary subset of the items, in an
order that depends on the number of workers, so anything that depends on "how many items this process has seen"
would make an utterance's augmentation depend on the worker layout. Instead the content of slot ``i`` is a pure
function of ``(seed, i, version)``, and the version of a slot is a pure function of the epoch: every
``refresh_every`` epochs the next ``ceil(refresh_fraction * size)`` slots (round robin) get a new room. Any process
asked for ``(slot, epoch)`` therefore builds or reuses exactly the same RIRs. Building is lazy per slot (the first
utterance that draws a slot in a process pays for it), and single-threaded (pyroomacoustics' multi-threaded
fractional-delay sum is not bit-reproducible across thread counts). With a ``cache_dir`` the rooms are also kept on
disk, keyed by (spec, seed, slot, version, pyroomacoustics version): the loader workers of every rank build the
same pool, so each room is built once for all of them and for later runs on the same corpus.

Absorption: ``pra.inverse_sabine`` gives the max reflection order (never capped: a cap shortens the tail) and
Sabine's absorption. But the image method's decay is neither Sabine's nor, in non-cubic rooms, Eyring's: energy
loses a factor (1 - a) per reflection, and a specular shoebox is not diffuse, so a ray travelling in direction u
reflects c * sum_i |u_i| / L_i times per second; in a flat room the near-horizontal rays hit walls rarely and set
the late decay. Measured (T20 via Schroeder integration, tests/test_augment_rooms.py): Sabine's absorption gives
0.13-0.16 s for 0.2 s requested in near-cubic rooms; Eyring's gives +5..15% there but +40..80% in flat rooms
(e.g. 6.6 x 9.7 x 2.7 m). ``absorption="ism"`` (default) models that decay directly, E(t) ~ mean over directions of
exp(ln(1 - a) * rate(u) * t), whose T20 is T20_unit(room) / -ln(1 - a); inverting gives
a = 1 - exp(-T20_unit / T60) in closed form (one small model evaluation per room). Measured T20 is then within 5%
of the request from 0.2 to 0.9 s in cubic and flat rooms alike. "eyring" and "sabine" are kept for comparison.
Each entry also records the T60 measured (pra.experimental.measure_rt60, T20) on its own speech RIR.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyroomacoustics as pra
import torch

from ..frontend import SAMPLE_RATE

from .config import ABSORPTION_MODELS
_CACHE_FORMAT = 1                                # bump when RoomEntry or build_room changes what a room holds
SPEED_OF_SOUND = float(pra.constants.get("c"))   # what ShoeBox uses without temperature/humidity


@dataclass(frozen=True)
class RoomSpec:
    """Ranges a random room is drawn from (metres, seconds)."""
    sides: tuple[float, float] = (3.0, 10.0)
    height: tuple[float, float] = (2.5, 4.0)
    t60: tuple[float, float] = (0.1, 0.9)
    wall_margin: float = 0.5           # sources and microphone at least this far from every wall
    min_source_distance: float = 0.3   # microphone at least this far from any source
    max_noise_sources: int = 3
    absorption: str = "ism"            # "ism", "eyring" or "sabine" (see module docstring)
    tail_db: float = 60.0              # RIRs are cut where the backward-integrated energy is this far down
    sample_rate: int = SAMPLE_RATE

    def __post_init__(self):
        for name in ("sides", "height", "t60"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"RoomSpec.{name} must be (low, high) with 0 < low <= high, got {(lo, hi)}")
        if self.sides[0] <= 2 * self.wall_margin or self.height[0] <= 2 * self.wall_margin:
            raise ValueError(f"RoomSpec.wall_margin={self.wall_margin} leaves no room inside the smallest room")
        if self.absorption not in ABSORPTION_MODELS:
            raise ValueError(f"RoomSpec.absorption must be one of {ABSORPTION_MODELS}, got {self.absorption!r}")
        if not 0 <= self.max_noise_sources <= 3:
            raise ValueError(f"RoomSpec.max_noise_sources must be in 0..3, got {self.max_noise_sources}")


@dataclass
class RoomEntry:
    """One simulated room: speech RIR and noise RIRs (float32, direct path at index 0, tail cut) plus metadata."""
    speech_rir: torch.Tensor
    noise_rirs: list[torch.Tensor]
    dims: tuple[float, float, float]
    t60: float               # requested
    t60_measured: float      # T20 of the speech RIR, extrapolated to 60 dB
    absorption: float
    max_order: int
    build_s: float
    info: dict = field(default_factory=dict)


def _sphere_directions(n: int = 800) -> np.ndarray:
    """|direction cosines| of n near-uniform directions (Fibonacci sphere), fixed so results are reproducible."""
    i = np.arange(n) + 0.5
    z = 1.0 - 2.0 * i / n
    r = np.sqrt(1.0 - z * z)
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    return np.abs(np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1))


_DIRECTIONS = _sphere_directions()


def ism_t20_unit(dims) -> float:
    """T20-based T60 (s) of the specular shoebox decay model with -ln(1 - a) = 1 (see module docstring); 800
    directions x 800 times is within 0.2% of a 2000 x 3000 evaluation and takes ~10 ms."""
    rate = SPEED_OF_SOUND * (_DIRECTIONS / np.asarray(dims, dtype=np.float64)).sum(axis=1)  # reflections / s
    t = np.linspace(0.0, 3.0 * 13.82 / rate.mean(), 800)                  # 3x the Eyring-like T60
    edc = (np.exp(-np.outer(t, rate)) / rate).mean(axis=1)                 # backward-integrated energy
    edc_db = 10.0 * np.log10(edc / edc[0])
    sel = (edc_db <= -5.0) & (edc_db >= -25.0)
    slope = np.polyfit(t[sel], edc_db[sel], 1)[0]
    return -60.0 / slope


def absorption_for_t60(dims, t60: float, model: str = "ism") -> float:
    """Energy absorption coefficient (all walls) for a requested T60: "ism" (decay of the image method itself),
    "eyring" or "sabine" (pra.inverse_sabine)."""
    dims = np.asarray(dims, dtype=np.float64)
    if model == "ism":
        return float(1.0 - math.exp(-ism_t20_unit(dims) / t60))
    if model == "eyring":
        volume = float(np.prod(dims))
        surface = 2.0 * float(dims[0] * dims[1] + dims[0] * dims[2] + dims[1] * dims[2])
        return float(1.0 - math.exp(-24.0 * math.log(10.0) * volume / (SPEED_OF_SOUND * surface * t60)))
    if model == "sabine":
        return float(pra.inverse_sabine(t60, dims, c=SPEED_OF_SOUND)[0])
    raise ValueError(f"absorption model must be one of {ABSORPTION_MODELS}, got {model!r}")


def sample_room(rng: np.random.Generator, spec: RoomSpec) -> dict:
    """Draw room size, T60 and positions. (room, T60) pairs for which Sabine's absorption would exceed 1 (a short
    T60 in a big room: pra.inverse_sabine refuses them) are redrawn, so short T60s come with small rooms."""
    for _ in range(10000):
        dims = np.array([rng.uniform(*spec.sides), rng.uniform(*spec.sides), rng.uniform(*spec.height)])
        t60 = float(rng.uniform(*spec.t60))
        try:
            _, max_order = pra.inverse_sabine(t60, dims, c=SPEED_OF_SOUND)
        except ValueError:
            continue
        break
    else:
        raise ValueError(f"RoomSpec {spec}: no feasible (room, T60) pair found; widen RoomSpec.sides or t60")
    absorption = absorption_for_t60(dims, t60, spec.absorption)
    def position():
        return rng.uniform(spec.wall_margin, dims - spec.wall_margin)

    mic = position()
    sources = []
    for _ in range(1 + spec.max_noise_sources):
        for _ in range(1000):
            p = position()
            if np.linalg.norm(p - mic) >= spec.min_source_distance:
                break
        sources.append(p)
    return {"dims": dims, "t60": t60, "absorption": absorption, "max_order": int(max_order), "mic": mic,
            "sources": sources}


@contextlib.contextmanager
def _pra_threads(n: int):
    old = pra.constants.get("num_threads")
    pra.constants.set("num_threads", n)
    try:
        yield
    finally:
        pra.constants.set("num_threads", old)


def _align_and_cut(rir: np.ndarray, direct_index: int, tail_db: float) -> torch.Tensor:
    """Start the RIR at its direct-path peak (so reverberant speech is not delayed) and cut the tail where the
    Schroeder backward-integrated energy has fallen by tail_db (the rest is inaudible under speech)."""
    lo, hi = max(direct_index - 4, 0), min(direct_index + 5, len(rir))
    peak = lo + int(np.argmax(np.abs(rir[lo:hi])))
    h = np.asarray(rir[peak:], dtype=np.float64)
    edc = np.cumsum(h[::-1] ** 2)[::-1]
    below = np.nonzero(edc < edc[0] * 10.0 ** (-tail_db / 10.0))[0]
    end = int(below[0]) if len(below) else len(h)
    return torch.from_numpy(h[:max(end, 1)].astype(np.float32))


def build_room(rng: np.random.Generator, spec: RoomSpec, n_noise: int | None = None) -> RoomEntry:
    """Sample a room and compute its RIRs with pyroomacoustics (image method, uncapped max order)."""
    t0 = time.perf_counter()
    room = sample_room(rng, spec)
    n_noise = spec.max_noise_sources if n_noise is None else n_noise
    fs = spec.sample_rate
    shoebox = pra.ShoeBox(room["dims"], fs=fs, materials=pra.Material(room["absorption"]),
                          max_order=room["max_order"])
    used = room["sources"][:1 + n_noise]
    for p in used:
        shoebox.add_source(p)
    shoebox.add_microphone(room["mic"])
    with _pra_threads(1):
        shoebox.compute_rir()
    global_delay = pra.constants.get("frac_delay_length") // 2
    rirs = []
    for k, p in enumerate(used):
        direct = int(round(np.linalg.norm(p - room["mic"]) / SPEED_OF_SOUND * fs)) + global_delay
        rirs.append(_align_and_cut(np.asarray(shoebox.rir[0][k]), direct, spec.tail_db))
    measured = float(pra.experimental.measure_rt60(rirs[0].double().numpy(), fs=fs, decay_db=20))
    return RoomEntry(speech_rir=rirs[0], noise_rirs=rirs[1:], dims=tuple(float(d) for d in room["dims"]),
                     t60=room["t60"], t60_measured=measured, absorption=room["absorption"],
                     max_order=room["max_order"], build_s=time.perf_counter() - t0,
                     info={"mic": room["mic"].tolist(), "sources": [p.tolist() for p in used]})


class RIRPool:
    """A deterministic, lazily built, epoch-refreshed pool of simulated rooms (see the module docstring).

    ``get(slot, epoch)`` returns the room of ``slot`` as of ``epoch``: built in this process on first use and
    rebuilt when the slot's version changes. Content depends only on (seed, slot, version), never on use order.
    """

    def __init__(self, size: int = 64, seed: int = 0, refresh_every: int = 1, refresh_fraction: float = 0.25,
                 spec: RoomSpec = RoomSpec(), cache_dir: str | os.PathLike | None = None):
        if size < 1:
            raise ValueError(f"RIRPool size must be >= 1, got {size}")
        if refresh_every < 0:
            raise ValueError(f"RIRPool refresh_every (epochs) must be >= 0 (0 = never), got {refresh_every}")
        if not 0 <= refresh_fraction <= 1:
            raise ValueError(f"RIRPool refresh_fraction must be in [0, 1], got {refresh_fraction}")
        self.size, self.seed, self.spec = size, seed, spec
        self.refresh_every, self.refresh_fraction = refresh_every, refresh_fraction
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._entries: dict[int, tuple[int, RoomEntry]] = {}
        self.builds = 0

    def generation(self, epoch: int) -> int:
        """Refresh generation at ``epoch`` (how many refreshes have happened)."""
        if self.refresh_every == 0 or self.refresh_fraction == 0:
            return 0
        return max(epoch, 0) // self.refresh_every

    def version(self, slot: int, epoch: int) -> int:
        """How many times ``slot`` has been replaced by ``epoch``: refreshes replace slots round robin,
        ceil(refresh_fraction * size) per generation."""
        replaced = self.generation(epoch) * math.ceil(self.refresh_fraction * self.size)
        return max(0, -(-(replaced - slot) // self.size))

    def get(self, slot: int, epoch: int) -> RoomEntry:
        if not 0 <= slot < self.size:
            raise IndexError(f"RIRPool slot {slot} out of range 0..{self.size - 1}")
        version = self.version(slot, epoch)
        cached = self._entries.get(slot)
        if cached is None or cached[0] != version:
            entry = self._load(slot, version)
            if entry is None:
                entry = build_room(np.random.default_rng([self.seed, slot, version]), self.spec)
                self.builds += 1
                self._store(slot, version, entry)
            cached = (version, entry)
            self._entries[slot] = cached
        return cached[1]

    # The on-disk cache: every process that builds a pool with the same (spec, seed) builds the same rooms (the
    # loader workers of all ranks, later runs on the same corpus), so the first to build a room leaves it there
    # for the others. Files are written atomically; one that cannot be read is rebuilt and replaced.

    def cache_path(self, slot: int, version: int) -> Path | None:
        if self.cache_dir is None:
            return None
        key = repr((dataclasses.astuple(self.spec), self.seed, slot, version, pra.__version__, _CACHE_FORMAT))
        return self.cache_dir / f"room-{hashlib.blake2b(key.encode(), digest_size=10).hexdigest()}.pt"

    def _load(self, slot: int, version: int) -> RoomEntry | None:
        path = self.cache_path(slot, version)
        if path is None or not path.exists():
            return None
        from ..checkpoint import load_checkpoint
        try:
            return RoomEntry(**load_checkpoint(path, what="a simulated room"))
        except Exception:      # truncated, foreign or from another format: rebuild it
            return None

    def _store(self, slot: int, version: int, entry: RoomEntry) -> None:
        path = self.cache_path(slot, version)
        if path is None:
            return
        from ..checkpoint import atomic_save
        atomic_save(dataclasses.asdict(entry), path)     # own temp file per writer, then os.replace

    def warm(self, epoch: int = 0) -> float:
        """Build every slot for ``epoch`` now (benchmarks, or to move the cost out of the first batches);
        returns the seconds spent."""
        t0 = time.perf_counter()
        for slot in range(self.size):
            self.get(slot, epoch)
        return time.perf_counter() - t0

    def unbuilt(self, epoch: int) -> int:
        """How many of ``epoch``'s rooms are not in the on-disk cache (0 without one): the rooms a loader worker
        would build mid-epoch while the trainers wait (the trainer logs it; asr-prep rooms builds them ahead)."""
        if self.cache_dir is None:
            return 0
        return sum(not self.cache_path(slot, self.version(slot, epoch)).exists() for slot in range(self.size))

    def rooms_for_epochs(self, epochs: int) -> list[tuple[int, int]]:
        """``(slot, epoch)`` for every distinct room that epochs ``0 .. epochs-1`` use, each with the first epoch
        that needs it: what :func:`prebuild_rooms` builds ahead of training."""
        seen, out = set(), []
        for epoch in range(epochs):
            for slot in range(self.size):
                key = (slot, self.version(slot, epoch))
                if key not in seen:
                    seen.add(key)
                    out.append((slot, epoch))
        return out

    def __getstate__(self):
        # Entries are cheap to rebuild and large to pickle: a spawned DataLoader worker starts empty.
        state = self.__dict__.copy()
        state["_entries"] = {}
        return state


def _prebuild_one(arg) -> tuple[bool, float]:
    pool, slot, epoch = arg
    if pool._load(slot, pool.version(slot, epoch)) is not None:      # cached and readable
        return False, 0.0
    t0 = time.perf_counter()
    pool.get(slot, epoch)
    return True, time.perf_counter() - t0


def prebuild_rooms(pool: RIRPool, epochs: int, jobs: int | None = None) -> dict:
    """Build into ``pool.cache_dir`` every room the first ``epochs`` epochs use, on ``jobs`` processes.

    Why: a room not in the cache is built by the first loader worker that needs it, while both trainers wait
    for its batch (the 60-minute benchmark's epochs took 79-99 s instead of 49-74 s once new rooms were due).
    Built at prep time, training only reads them. Rooms already cached (and readable) are skipped."""
    if pool.cache_dir is None:
        raise ValueError("prebuild_rooms needs a pool with a cache_dir (augment.rir_cache is empty)")
    if epochs < 1:
        raise ValueError(f"prebuild_rooms: epochs must be >= 1, got {epochs}")
    from ..data.pool import parallel_map
    pool.cache_dir.mkdir(parents=True, exist_ok=True)
    todo = pool.rooms_for_epochs(epochs)
    t0 = time.perf_counter()
    res = parallel_map(_prebuild_one, [(pool, slot, epoch) for slot, epoch in todo], jobs, desc="rooms",
                       unit="room")
    built = [s for b, s in res if b]
    return {"rooms": len(todo), "built": len(built), "cached": len(todo) - len(built), "epochs": epochs,
            "build_s": round(sum(built), 2), "wall_s": round(time.perf_counter() - t0, 2),
            "cache_dir": str(pool.cache_dir)}
