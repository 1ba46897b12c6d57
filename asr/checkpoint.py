"""Checkpoint files: written atomically, read back with ``torch.load(weights_only=True)``.

``atomic_save`` writes to a temporary file in the destination's folder, flushes it to disk (fsync) and
renames it over the destination (``os.replace``), so a crash or a full disk leaves the last good file, never
half of one; concurrent writers of the same path each use their own temporary file.

``load_checkpoint`` unpickles only tensors and plain Python data (dicts, lists, tuples, sets, strings,
numbers, ``None``), so a checkpoint cannot run code when it is opened. Everything this project saves is such
data; ``atomic_save`` converts the few harmless values that would not load that way (``pathlib.Path`` ->
``str``, NumPy scalars -> Python numbers, NumPy arrays -> tensors) and refuses any other object at save time,
naming where it sits, rather than writing a file that cannot be read back. A missing, empty, truncated or
foreign file raises :class:`CheckpointError` naming the file and what was expected.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import pickle
import warnings
from collections import OrderedDict
from pathlib import Path

import torch

from .atomic import atomic_path

__all__ = ["CheckpointError", "TrainingCheckpoint", "atomic_save", "average_checkpoints", "load_checkpoint",
           "to_loadable"]


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and what was expected."""


_PLAIN = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.Size, torch.device, torch.dtype)


def to_loadable(obj, where: str = "checkpoint"):
    """``obj`` with every value ``torch.load(weights_only=True)`` accepts: tensors and plain data are kept
    (the same tensor objects, so shared storage stays shared), ``os.PathLike`` -> ``str``, NumPy scalars ->
    Python numbers, NumPy arrays -> tensors, enum members -> their value, named tuples -> tuples. Anything
    else raises ``TypeError`` naming its place in ``obj`` (e.g. ``checkpoint['config']['x']``)."""
    if isinstance(obj, torch.Tensor) or type(obj) in _PLAIN:
        return obj
    if isinstance(obj, dict):
        items = ((to_loadable(k, f"{where} key {k!r}"), to_loadable(v, f"{where}[{k!r}]")) for k, v in obj.items())
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if isinstance(obj, (list, tuple, set, frozenset)):
        vals = [to_loadable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if isinstance(obj, (set, frozenset)):
            return set(vals)
        return list(vals) if isinstance(obj, list) else tuple(vals)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, enum.Enum):
        return to_loadable(obj.value, where)
    if isinstance(obj, _PLAIN):                    # subclasses of str, int, float (not enums)
        return next(t for t in (bool, int, float, complex, str, bytes, bytearray) if isinstance(obj, t))(obj)
    try:
        import numpy as np
    except ImportError:                            # pragma: no cover - numpy comes with torch here
        np = None
    if np is not None and isinstance(obj, np.generic):
        return obj.item()
    if np is not None and isinstance(obj, np.ndarray):
        try:
            return torch.from_numpy(np.ascontiguousarray(obj).copy())
        except TypeError as e:
            raise TypeError(f"{where}: a NumPy array of dtype {obj.dtype} cannot be stored as a tensor") from e
    raise TypeError(f"{where}: a {type(obj).__module__}.{type(obj).__qualname__} would not load with "
                    f"torch.load(weights_only=True); store tensors and plain data (dict, list, str, int, float, "
                    f"None) only")


def atomic_save(obj, path) -> None:
    """``torch.save(obj, path)`` atomically: a temporary file in the same folder, fsync, then ``os.replace``.

    ``obj`` goes through :func:`to_loadable` first, so what is written can be read by
    :func:`load_checkpoint`; the folder is created if needed."""
    obj = to_loadable(obj)
    with atomic_path(path) as tmp:
        with open(tmp, "xb") as f:
            torch.save(obj, f)


_ZIP_MAGIC = b"PK\x03\x04"


def load_checkpoint(path, map_location="cpu", expect_keys=None, what: str = "a checkpoint"):
    """``torch.load(path, map_location, weights_only=True)``, with a :class:`CheckpointError` naming the file
    for a missing, empty, truncated or foreign file. With ``expect_keys`` the file must hold a dict with at
    least those keys. ``what`` says what the caller expected, for the messages (e.g. "a BFA checkpoint
    written by asr.train")."""
    p = Path(path)
    expected = f"expected {what}"
    if expect_keys:
        expected += " (a dict with " + ", ".join(repr(k) for k in expect_keys) + ")"
    if not p.exists():
        raise CheckpointError(f"{p}: file not found; {expected}")
    if p.is_dir():
        raise CheckpointError(f"{p}: is a folder; {expected}")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read: {e}; {expected}") from e
    if not head:
        raise CheckpointError(f"{p}: empty file (0 bytes; an interrupted write?); {expected}")
    try:
        with warnings.catch_warnings():        # a foreign pickle's protocol: the error below says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            obj = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        msg = str(e)
        if "weights only" in msg.lower() or "weights_only" in msg:
            detail = next((ln.strip() for ln in msg.splitlines() if "Unsupported" in ln), "")
            detail = detail.split(" was not an allowed global")[0].removeprefix("WeightsUnpickler error: ")
            if head != _ZIP_MAGIC:             # e.g. pickle.dump output: not torch's zip format
                raise CheckpointError(f"{p}: not a file written by torch.save ({_describe(head)}"
                                      f"{f', {detail}' if detail else ''}); {expected}") from e
            raise CheckpointError(
                f"{p}: holds Python objects other than tensors and plain data, which torch.load(weights_only=True) "
                f"refuses{f' ({detail})' if detail else ''}; {expected}, saved by asr.checkpoint.atomic_save"
            ) from e
        raise CheckpointError(f"{p}: not a torch file ({_describe(head)}); {expected}") from e
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError, EOFError, ValueError, ... for bad files
        if head == _ZIP_MAGIC:
            why = f"truncated or damaged torch file ({_first_sentence(e)})"
        elif head[:1] == b"\x80":
            why = f"truncated or damaged pickle ({type(e).__name__}: {_first_sentence(e)})"
        else:
            why = f"not a torch file ({_describe(head)})"
        raise CheckpointError(f"{p}: {why}; {expected}") from e
    if expect_keys:
        if not isinstance(obj, dict):
            raise CheckpointError(f"{p}: holds a {type(obj).__name__}; {expected}")
        missing = [k for k in expect_keys if k not in obj]
        if missing:
            raise CheckpointError(f"{p}: no {', '.join(repr(k) for k in missing)} in it; {expected}")
    return obj


def _describe(head: bytes) -> str:
    return f"starts with {head!r}"


def _first_sentence(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")


TRAINING_FORMAT = 2


@dataclasses.dataclass
class TrainingCheckpoint:
    """What ``asr.train`` writes after every epoch and what ``--resume`` and ``asr-eval`` read: one typed record
    instead of a dict read with ``.get`` chains.

    Paths (tokenizer, statistics, and the config's lexicon and n-gram that asr-eval reads) are stored relative to
    the checkpoint's folder, so a run folder moved together with its corpus still finds them; ``tokenizer_digest``
    names the sentencepiece model the model was trained with (an LM or a tokenizer of another model is
    recognised); ``features`` are the feature settings of the statistics file; ``optimizer`` holds the wrapped
    optimizer's state and every worker's codec state.

    ``model`` holds the weights to decode with. With ``train.ema_decay`` that is the EMA of the trained weights
    (:mod:`asr.ema`, ``ema_updates`` steps averaged), and ``train_model`` holds the optimizer's own weights, which
    ``--resume`` continues from; without it ``train_model`` is None and ``model`` is both."""
    model: dict
    model_config: dict
    config: dict
    epoch: int
    step: int
    tokenizer: str
    stats: str
    optimizer: dict | None = None
    tokenizer_digest: str = ""
    features: dict = dataclasses.field(default_factory=dict)
    dev_wer_greedy: float | None = None
    train_model: dict | None = None
    ema_updates: int = 0
    format: int = TRAINING_FORMAT

    # config entries that name a file asr-eval opens (section, key): kept relative like tokenizer and stats
    CONFIG_PATHS = (("data", "lexicon"), ("decode", "ngram"))

    @classmethod
    def _path_slots(cls, rec: dict):
        """(dict, key) of every path a record holds: tokenizer, stats and the config's CONFIG_PATHS that are set."""
        yield from ((rec, "tokenizer"), (rec, "stats"))
        for section, key in cls.CONFIG_PATHS:
            if (rec["config"].get(section) or {}).get(key):
                yield rec["config"][section], key

    def save(self, path) -> None:
        path = Path(path)
        rec = dataclasses.asdict(self)
        here = path.resolve().parent
        for d, key in self._path_slots(rec):
            d[key] = os.path.relpath(Path(d[key]).resolve(), here)
        atomic_save(rec, path)

    @classmethod
    def load(cls, path, map_location="cpu") -> "TrainingCheckpoint":
        """Read a checkpoint of any format asr.train has written (older ones: absolute paths, fewer fields)."""
        path = Path(path)
        rec = load_checkpoint(path, map_location, expect_keys=("model", "model_config", "tokenizer", "stats"),
                              what="a BFA checkpoint written by asr.train")
        known = {f.name for f in dataclasses.fields(cls)}
        rec = {k: v for k, v in rec.items() if k in known}
        rec.setdefault("config", {})
        rec.setdefault("epoch", 0)
        rec.setdefault("step", 0)
        rec["format"] = rec.get("format", 1)
        here = path.resolve().parent
        for d, key in cls._path_slots(rec):
            d[key] = str((here / d[key]).resolve())       # absolute stays absolute
        return cls(**rec)


def average_checkpoints(paths) -> TrainingCheckpoint:
    """The element-wise mean of the model parameters of several training checkpoints of one run (as ESPnet's
    ``average_checkpoints``): floating tensors are averaged in float64 and cast back, integer buffers come
    from the last checkpoint, and so does everything else (config, position). The optimizer state is left
    out, and so are the trained weights beside an EMA: an average is for decoding, not for resuming. (With
    ``train.ema_decay`` the averaged weights are the epochs' EMAs, the weights each epoch decodes with.)"""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints: no checkpoint given")
    cks = [TrainingCheckpoint.load(p) for p in paths]
    last = cks[-1]
    for p, ck in zip(paths, cks):
        if ck.model.keys() != last.model.keys() or ck.model_config != last.model_config:
            raise CheckpointError(f"{p}: another model than {paths[-1]} (parameters or model_config differ); "
                                  f"average checkpoints of one run")
    model = {}
    for k, v in last.model.items():
        if v.is_floating_point():
            model[k] = (sum(ck.model[k].double() for ck in cks) / len(cks)).to(v.dtype)
        else:
            model[k] = v.clone()
    return dataclasses.replace(last, model=model, optimizer=None, train_model=None)
