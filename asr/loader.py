"""Data for training and evaluation: manifest datasets, a length-bucketed distributed sampler, collate.

Everything that touches audio runs in DataLoader worker processes (reading FLAC, augmentation,
features, normalization, tokenization); the trainer receives padded feature tensors and token ids.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import NamedTuple

import torch
from torch.utils.data import Dataset, Sampler

from .batching import pack_by_length
from .config import CHOICES
from .shared_epoch import SharedEpoch
from .data.manifest import audio_path, read_manifest
from .data.stats import read_stats
from .frontend import N_MELS, compute_features, load_wave
from .frontend.cache import open_feature_cache

log = logging.getLogger(__name__)


class Normalizer:
    """Per-dimension mean/variance normalization.

    ``cmvn="global"``: one mean and deviation per mel band for the whole corpus, from ``asr-prep stats``.
    ``cmvn="utterance"``: each utterance's own mean and deviation per band, so a voice's or a room's
    spectral colouring (a constant offset per band in the compressed mel domain) is removed before the
    model sees it; the statistics file then only tells the feature settings.

    ``settings``: the feature settings the statistics were computed with (asr.frontend.FeatureSettings), which
    every feature of the run must use. ``expect``: the settings a config asks for (its ``features`` section, a
    mapping of some settings, or FeatureSettings); any that differ raise FeatureMismatchError naming the file and
    both values."""

    MODES = CHOICES["data.cmvn"]

    def __init__(self, stats_path, cmvn: str = "global", expect=None):
        if cmvn not in self.MODES:
            raise ValueError(f"cmvn must be one of {self.MODES}, got {cmvn!r}")
        stats = read_stats(stats_path)
        stats.settings.check(expect, stats_path)
        self.stats_path = str(stats_path)
        self.cmvn = cmvn
        self.settings = stats.settings
        self.mean = stats.mean
        self.std = stats.std.clamp_min(1e-5)

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        if self.cmvn == "utterance":
            return (feats - feats.mean(0)) / feats.std(0, unbiased=False).clamp_min(1e-3)
        return (feats - self.mean) / self.std


class Tokenizer:
    """sentencepiece word pieces; loaded lazily so the object pickles cheaply into loader workers."""

    def __init__(self, model_path):
        self.model_path = str(model_path)
        if not Path(self.model_path).exists():
            raise FileNotFoundError(f"{self.model_path}: tokenizer model not found (run asr-prep tokenizer)")
        self._sp = None

    @property
    def sp(self):
        if self._sp is None:
            import sentencepiece as spm
            self._sp = spm.SentencePieceProcessor(model_file=self.model_path)
        return self._sp

    def __getstate__(self):
        return {"model_path": self.model_path, "_sp": None}

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([i for i in ids if 0 <= i < self.vocab_size])


class SkippedItem(NamedTuple):
    """What :class:`SpeechDataset` returns for an utterance it cannot use (unreadable, empty or corrupt audio, no
    finite features): ``collate`` drops it from the batch and reports it in ``Batch.skipped``."""
    utt_id: str
    reason: str


class SpeechDataset(Dataset):
    """Utterances of a manifest -> (utt_id, normalized features [T, n_mels], token ids, text).

    With an ``augmenter`` (training), features come from it and depend on (seed, epoch, utt id); its feature
    settings must be the statistics file's (checked when it is set); without one (evaluation), clean features
    are computed with the statistics file's settings. An utterance whose audio cannot be read or gives
    no usable features comes back as a :class:`SkippedItem` (the reason names the file; logged once per
    process), so one bad file costs one utterance, not the run.

    ``feature_cache`` (``"auto"``: ``feature_cache/`` next to the manifest; a folder; ``"off"``/None; or an
    asr.frontend.cache.FeatureCache): clean power spectrograms computed once, so evaluation features and the
    augmenter's unsimulated utterances decode no audio and run no STFT (see asr.frontend.cache); the features
    are the same as without it.

    ``dereverb`` (asr.frontend.dereverb.METHODS; evaluation only, no augmenter): late reverberation removed from
    every utterance before its features (cached apart from the plain ones).

    ``warps`` (evaluation only, needs the feature cache): each item's features at each of these VTLP warps, stacked
    [warps, frames, n_mels] (a warp changes the mel filterbank, not the frames); :func:`asr.decode.encode` averages
    their encoder outputs."""

    def __init__(self, manifest, tokenizer: Tokenizer, normalizer: Normalizer, augmenter=None,
                 max_duration: float | None = None, feature_cache=None, dereverb: str = "off", warps=()):
        self.manifest = Path(manifest)
        entries = read_manifest(self.manifest)
        if max_duration:
            entries = [e for e in entries if e["duration"] <= max_duration]
        if not entries:
            raise ValueError(f"{self.manifest}: no utterances" + (f" of at most {max_duration} s" if max_duration else ""))
        self.entries = entries
        self.tokenizer = tokenizer
        self.normalizer = normalizer
        from .frontend.dereverb import check
        self.dereverb = check(dereverb, "SpeechDataset: dereverb")
        self.feature_cache = open_feature_cache(feature_cache, self.manifest, normalizer.settings, dereverb=dereverb)
        self.warps = tuple(float(w) for w in warps)
        if self.warps and self.feature_cache is None:
            raise ValueError("SpeechDataset: warps are computed from cached spectrograms; give a feature_cache")
        self.augmenter = augmenter
        self._epoch = SharedEpoch()             # seen by persistent DataLoader workers
        self._logged_skips: set[str] = set()

    def set_epoch(self, epoch: int) -> None:
        self._epoch.set(epoch)

    @property
    def augmenter(self):
        return self._augmenter

    @augmenter.setter
    def augmenter(self, augmenter) -> None:
        if augmenter is not None and (self.dereverb != "off" or self.warps):
            what = "dereverb" if self.dereverb != "off" else "warps"
            raise ValueError(f"SpeechDataset: {what} is a decoding front end; it does not combine with an augmenter")
        features = getattr(getattr(augmenter, "config", None), "features", None)
        if features is not None:
            self.normalizer.settings.check(features, self.normalizer.stats_path,
                                           "the augmenter (AugmentConfig.features)")
        self._augmenter = augmenter

    @property
    def durations(self) -> list[float]:
        return [e["duration"] for e in self.entries]

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int):
        e = self.entries[i]
        path = audio_path(e, self.manifest)
        settings = self.normalizer.settings
        cache = self.feature_cache
        try:
            if cache is None:
                wave = load_wave(path, settings.sample_rate)   # AudioError (a ValueError) naming the file
                if self.dereverb != "off":
                    from .frontend.dereverb import dereverberate
                    wave = dereverberate(wave, self.dereverb)
                if self.augmenter is not None:
                    feats, _ = self.augmenter(wave, e["id"], int(self._epoch))
                else:
                    feats = compute_features(wave, settings)
            elif self.warps:        # [warps, frames, n_mels]: each copy normalized on its own, as one utterance
                return self._finish(e, path, torch.stack([self.normalizer(cache.features(path, e.get("md5"), warp=w))
                                                          for w in self.warps]))
            elif self.augmenter is None:
                feats = cache.features(path, e.get("md5"))
            elif getattr(self.augmenter, "takes_cached_power", False):
                md5 = e.get("md5")

                def wave():     # decoded only for a simulated utterance; its clean spectrogram is kept meanwhile
                    w = load_wave(path, settings.sample_rate)
                    cache.offer(path, md5, w)
                    return w
                feats, _ = self.augmenter(wave, e["id"], int(self._epoch), power=lambda: cache.power(path, md5))
            else:
                feats, _ = self.augmenter(load_wave(path, settings.sample_rate), e["id"], int(self._epoch))
            feats = self.normalizer(feats)
        except (ValueError, RuntimeError, OSError, EOFError) as err:
            return self._skip(e["id"], str(err) if str(path) in str(err) else f"{path}: {type(err).__name__}: {err}")
        return self._finish(e, path, feats)

    def _finish(self, e: dict, path, feats: torch.Tensor):
        """The item of entry ``e`` with its features ([frames, n_mels], or [warps, frames, n_mels]), or a SkippedItem
        for features no model can read."""
        if feats.shape[-2] == 0:
            return self._skip(e["id"], f"{path}: no feature frames")
        if not torch.isfinite(feats).all():
            return self._skip(e["id"], f"{path}: non-finite features")
        return e["id"], feats, self.tokenizer.encode(e["text"]), e["text"]

    def _skip(self, utt_id: str, reason: str) -> SkippedItem:
        if utt_id not in self._logged_skips:       # once per process (each epoch would repeat it)
            self._logged_skips.add(utt_id)
            log.warning("skipping utterance %s of %s: %s", utt_id, self.manifest, reason)
        return SkippedItem(utt_id, reason)


class Batch(NamedTuple):
    """A padded batch from :func:`collate`.

    ``skipped`` lists ``(utt_id, reason)`` of the utterances dropped from it (see :class:`SkippedItem`). A batch
    whose items were all dropped has zero utterances (feats [0, 0, N_MELS], toks [0, 1], empty lengths, ids and
    texts): the trainer still takes part in the step, so every rank runs the same number of steps."""
    ids: list[str]
    feats: torch.Tensor                # [B, T, n_mels] float32, padded with 0 ([B, warps, T, n_mels] with test warps)
    flen: torch.Tensor                 # [B] int64 feature frames
    toks: torch.Tensor                 # [B, L] int64 token ids padded with -1, L >= 1
    tlen: torch.Tensor                 # [B] int64 tokens
    texts: list[str]
    skipped: list[tuple[str, str]]     # (utt_id, reason) of the dropped utterances
    phones: torch.Tensor | None = None  # [B, P] int64 phone ids padded with -1 (collate with a lexicon)
    plen: torch.Tensor | None = None    # [B] int64 phones


def pad_ids(seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """Id sequences -> ([B, max(L, 1)] int64 padded with -1, [B] lengths)."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    out = torch.full((len(seqs), max(int(lengths.max()) if len(seqs) else 0, 1)), -1, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out, lengths


def collate(batch, lexicon=None, pad_frames: int = 1) -> Batch:
    """Drop SkippedItems, pad features with 0 and tokens with -1: a :class:`Batch`. With a ``lexicon``
    (asr.data.lexicon.Lexicon; bind it with functools.partial) the batch also holds each transcript's phones.

    ``pad_frames``: the batch's frames are padded up to a multiple of it (``flen`` keeps each utterance's own
    length, so the model's masks see no difference). Fewer distinct batch shapes let oneDNN reuse the kernels it
    builds per shape, which bf16 LSTMs on the CPU pay for at every new one (``train.pad_frames``)."""
    if pad_frames < 1:
        raise ValueError(f"pad_frames must be >= 1, got {pad_frames}")
    skipped = [(b.utt_id, b.reason) for b in batch if isinstance(b, SkippedItem)]
    batch = [b for b in batch if not isinstance(b, SkippedItem)]
    if not batch:
        empty = torch.zeros(0, dtype=torch.long)
        phones = pad_ids([]) if lexicon is not None else (None, None)
        return Batch([], torch.zeros(0, 0, N_MELS), empty, torch.full((0, 1), -1, dtype=torch.long), empty.clone(),
                     [], skipped, *phones)
    ids, feats, toks, texts = zip(*batch)
    flen = torch.tensor([f.shape[-2] for f in feats], dtype=torch.long)
    frames = -(-int(flen.max()) // pad_frames) * pad_frames
    F = torch.zeros(len(batch), *feats[0].shape[:-2], frames, feats[0].shape[-1])
    for i, f in enumerate(feats):
        F[i, ..., :f.shape[-2], :] = f
    T, tlen = pad_ids(toks)
    phones = pad_ids([lexicon.encode(t) for t in texts]) if lexicon is not None else (None, None)
    return Batch(list(ids), F, flen, T, tlen, list(texts), skipped, *phones)


class BucketBatchSampler(Sampler):
    """Length-bucketed batches, split across ranks.

    Utterances are sorted by duration (with a seeded jitter so buckets vary per epoch), packed into
    batches of at most ``batch_seconds`` of padded audio (longest x count) and ``max_batch``
    utterances, shuffled per epoch with a seed shared by all ranks, and dealt round-robin to the
    ranks. With ``match_lengths`` (default), the batches of one step are neighbours in length order
    (groups of ``num_replicas`` consecutive batches are shuffled as units), so the workers' batches at
    each step have about the same padded length and none waits long for another. Every rank gets the same number of batches: a rank that ran out early would leave the
    others waiting in an allreduce. By default the last batches are dropped if they do not divide
    evenly; with ``pad=True`` (elastic training) none is dropped: the last step is padded with empty
    batches (zero utterances; the trainer still takes part in the step).

    Elastic training resumes mid-epoch: ``set_epoch(epoch, start)`` skips the first ``start``
    batches of the epoch's dealing order (every worker's, consumed in committed steps: each step
    consumes one batch per worker), and ``set_world(num_replicas, rank)`` re-deals the remaining
    ones to another worker count, so a lost or added worker loses no batch.

    ``short_first_epochs``: that many first epochs are dealt in length order, shortest first (a curriculum).
    """

    def __init__(self, durations, batch_seconds: float, max_batch: int, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, shuffle: bool = True, pad: bool = False, match_lengths: bool = True,
                 short_first_epochs: int = 0):
        self.durations = list(durations)
        # The step size the lengths are matched for: fixed at construction, so the epoch's dealing order
        # stays the same when an elastic run re-deals the rest of it to another worker count.
        self.match_lengths = match_lengths
        self.match_group = num_replicas
        self.batch_seconds, self.max_batch = batch_seconds, max_batch
        self.num_replicas, self.rank, self.seed, self.shuffle = num_replicas, rank, seed, shuffle
        self.pad = pad
        self.short_first_epochs = short_first_epochs
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The epoch to deal, and how many of its batches (all workers') were already consumed."""
        self.epoch, self.start = epoch, start

    def set_world(self, num_replicas: int, rank: int) -> None:
        self.num_replicas, self.rank = num_replicas, rank

    def epoch_batches(self) -> list[list[int]]:
        """Every batch of the epoch in dealing order (the same on every rank)."""
        rng = random.Random(self.seed * 100_003 + self.epoch)
        jitter = [rng.uniform(0, 0.1) if self.shuffle else 0.0 for _ in self.durations]
        order = sorted(range(len(self.durations)), key=lambda i: self.durations[i] * (1 + jitter[i]))
        batches = pack_by_length(order, self.durations, self.batch_seconds, self.max_batch)
        if self.shuffle and self.epoch < self.short_first_epochs:
            # Curriculum (SortaGrad, Amodei et al. 2016): the first epochs go from short utterances to long,
            # which eases the model off the all-blank CTC plateau; length order already matches the steps.
            return batches
        if self.shuffle and self.match_lengths and self.match_group > 1:
            # Neighbours in length order are dealt to the same step, so no worker waits at the step's
            # allreduce for another's much longer batch; the steps are shuffled, not the batches.
            n = self.match_group
            steps = [batches[i:i + n] for i in range(0, len(batches), n)]
            rng.shuffle(steps)
            batches = [b for step in steps for b in step]
        elif self.shuffle:
            rng.shuffle(batches)
        return batches

    def _batches(self) -> list[list[int]]:
        """This rank's batches from ``start`` on (empty lists pad the last step when ``pad``)."""
        batches = self.epoch_batches()[self.start:]
        n = self.num_replicas
        if self.pad:
            steps = -(-len(batches) // n)
            return [batches[i] if i < len(batches) else [] for i in range(self.rank, steps * n, n)]
        per_rank = len(batches) // n if n > 1 else len(batches)
        if per_rank == 0:
            raise ValueError(f"{len(batches)} batches cannot be split across {n} workers; "
                             f"lower train.batch_seconds or use more data")
        return batches[self.rank:per_rank * n:n]

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def eval_batches(durations, batch_seconds: float, max_batch: int = 64) -> list[list[int]]:
    """Deterministic length-sorted batches for evaluation (every utterance exactly once)."""
    return BucketBatchSampler(durations, batch_seconds, max_batch, shuffle=False)._batches()
