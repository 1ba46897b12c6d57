"""Decoder combination (``asr-eval --method combine``): the lexicon decoder's and the joint search's n-best lists
pooled, and the best candidate picked by every model the run has.

Why: on the 60-minute benchmark's model the lexicon decoder (phone CTC head, word 4-gram) is best on clean
open-domain sentences and the joint CTC/attention search (word pieces, word-piece LM) on commands and far-field
speech. Picking the better of their two hypotheses per utterance would give 24.5% clean against 29.8% for the
better decoder alone (an oracle that reads the references; RESULTS.md, 2026-12-04). So every candidate word string
is scored by each model, whichever decoder proposed it (:data:`FEATURES`):

  phone_ctc   log P(its lexicon spelling | audio) under the phone CTC head; a word outside the lexicon is spelt
              by espeak-ng's rules, as the lexicon's words were
  piece_ctc   log P(its word pieces | audio) under the word-piece CTC head
  attention   log P(its word pieces, eos | audio) under the attention decoder
  piece_lm    log P(its word pieces, eos) under the word-piece LSTM LM (asr-lm; 0 without one)
  ngram       log10 P(its words, </s>) under the word n-gram (KenLM; 0 without one)
  words       its number of words
  pieces      its number of word pieces
  unspelt     its words outside the lexicon (the word-piece search's inventions)

The lexicon decoder can also search at higher blank penalties (``blank_offsets``, added to its own): each n-best
adds the words that a blank narrowly hid, which the models then judge; a candidate's source says which search found
it first ("lexicon", "lexicon+1.5", "joint").

The pick is the candidate with the highest weighted sum. :func:`tune` chooses the weights on a dev set by
coordinate descent on its word errors (minimum error rate training on a grid, as in Och 2003), starting from the
lexicon decoder's own trade-off (:data:`START`) and from the joint search's (:func:`joint_start`), keeping a step
only where dev's errors fall.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

FEATURES = ("phone_ctc", "piece_ctc", "attention", "piece_lm", "ngram", "words", "pieces", "unspelt")
# The lexicon decoder's own score: phone log-probabilities + 1.5 x log10 n-gram (decode.lexicon_lm_weight)
START = {"phone_ctc": 1.0, "piece_ctc": 0.0, "attention": 0.0, "piece_lm": 0.0, "ngram": 1.5, "words": 0.0,
         "pieces": 0.0, "unspelt": 0.0}
GRIDS = {"phone_ctc": (0.0, 0.25, 0.5, 0.75, 1.0),
         "piece_ctc": (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5),
         "attention": (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5),
         "piece_lm": (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0),
         "ngram": (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0),
         "words": (-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0),
         "pieces": (-1.0, 0.0, 0.5, 1.0, 2.0, 3.0),
         "unspelt": (-10.0, -5.0, -2.0, -1.0, 0.0)}
# A spelling the frames cannot hold (CTC's -inf), kept finite so that a weight of 0 ignores it and any other buries it
INFEASIBLE = -1e4
_LETTER = re.compile(r"[a-zA-Z]")


class Speller:
    """Word strings -> phone ids of the phone CTC head: the lexicon's spelling, else espeak-ng's (each new word
    spelt once, in one espeak-ng call per batch; phones outside the inventory dropped)."""

    def __init__(self, lexicon):
        self.lexicon = lexicon
        self.extra: dict[str, list[str]] = {}

    def __call__(self, texts: list[str]) -> list[tuple[list[int], int]]:
        """Per text: its phone ids and the number of its words outside the lexicon."""
        words = self.lexicon.words
        new = sorted({w for t in texts for w in t.split() if w not in words and w not in self.extra})
        if new:
            self.extra.update(self._espeak(new))
        index = self.lexicon.index
        out = []
        for t in texts:
            ws = t.split()
            phones = [p for w in ws for p in (words.get(w) or self.extra[w]) if p in index]
            out.append(([index[p] for p in phones], sum(w not in words for w in ws)))
        return out

    @staticmethod
    def _espeak(words: list[str]) -> dict[str, list[str]]:
        """espeak-ng's phones of each word; a word it says nothing for (no letter, or a piece's "⁇") gets none.
        One call for all; if espeak-ng's lines do not match the words one to one, one call per word."""
        from .data.lexicon import LexiconError, espeak_phones
        out = {w: [] for w in words if not _LETTER.search(w)}
        rest = [w for w in words if w not in out]
        try:
            return {**out, **espeak_phones(rest)} if rest else out
        except LexiconError:
            for w in rest:
                try:
                    out.update(espeak_phones([w]))
                except LexiconError:
                    out[w] = []
            return out


class NgramScorer:
    """log10 P(words, </s>) of a word string under a KenLM binary, read through flashlight-text (as the lexicon
    decoder reads it); a word outside ``vocabulary`` is KenLM's <unk>."""

    def __init__(self, path, vocabulary):
        from flashlight.lib.text.decoder.kenlm import KenLM
        from flashlight.lib.text.dictionary import Dictionary
        self.words = Dictionary()
        self.words.add_entry("<unk>")
        for w in vocabulary:
            self.words.add_entry(w)
        self.words.set_default_index(0)
        self.lm = KenLM(str(path), self.words)
        self.cache: dict[str, float] = {}

    def __call__(self, text: str) -> float:
        if text not in self.cache:
            state, total = self.lm.start(False), 0.0
            for w in text.split():
                state, s = self.lm.score(state, self.words.get_index(w))
                total += s
            self.cache[text] = total + self.lm.finish(state)[1]
        return self.cache[text]


@dataclass
class Combiner:
    """What ``--method combine`` needs besides the model: the lexicon decoder (built with an n-best), the speller
    over its lexicon, the n-gram scorer, the joint search's keywords (:func:`asr.decode.joint_search`: beam,
    ctc_weight, lm_weight, length_bonus, max_ratio), the word-piece LM, the weights of :data:`FEATURES`, and the
    ``blank_offsets`` at which the lexicon decoder searches again (added to its own blank penalty)."""
    lexicon_decoder: object
    speller: Speller
    ngram: NgramScorer | None = None
    joint: dict = field(default_factory=dict)
    lm: object = None
    weights: dict = field(default_factory=lambda: dict(START))
    blank_offsets: tuple = ()

    @torch.no_grad()
    def candidates(self, model, tok, enc, enc_lengths) -> list[list[dict]]:
        """Per utterance of an encoded batch: the pooled candidates ``{"hyp", "from", "features"}``, the lexicon
        decoder's n-best first (best first), then its n-best at each of ``blank_offsets``, then the joint search's
        hypotheses; each string once, under the source that proposed it first."""
        from .decode import joint_search
        phone_lp, phone_len = model.phone_log_probs(enc, enc_lengths)
        searches = [("lexicon", self.lexicon_decoder.nbest(phone_lp, phone_len))]
        own = self.lexicon_decoder.blank_penalty
        searches += [(name, self.lexicon_decoder.nbest(phone_lp, phone_len, own + off))
                     for name, off in zip(sources(self.blank_offsets)[1:], self.blank_offsets)]
        pools = []
        for b in range(enc.shape[0]):
            pool = {}
            for source, nbests in searches:
                for words, _ in nbests[b]:
                    pool.setdefault(" ".join(words.split()), source)
            for pieces, _ in joint_search(model, enc[b:b + 1], int(enc_lengths[b]), lm=self.lm, **self.joint):
                pool.setdefault(" ".join(tok.decode(pieces).split()), "joint")
            pools.append(pool)
        spelt = self.speller([t for pool in pools for t in pool])
        out, k = [], 0
        for b, pool in enumerate(pools):
            texts, T = list(pool), int(enc_lengths[b])
            phones, k = spelt[k:k + len(texts)], k + len(texts)
            pieces = [tok.encode(t) for t in texts]
            feats = {**acoustic_scores(model, enc[b:b + 1], T, phone_lp[b], int(phone_len[b]),
                                       [p for p, _ in phones], pieces),
                     "piece_lm": self.lm.score(pieces) if self.lm is not None else [0.0] * len(texts),
                     "ngram": [self.ngram(t) for t in texts] if self.ngram is not None else [0.0] * len(texts),
                     "words": [float(len(t.split())) for t in texts],
                     "pieces": [float(len(p)) for p in pieces],
                     "unspelt": [float(n) for _, n in phones]}
            out.append([{"hyp": t, "from": pool[t],
                         "features": [max(float(feats[f][i]), INFEASIBLE) for f in FEATURES]}
                        for i, t in enumerate(texts)])
        return out

    def pick(self, candidates: list[dict]) -> str:
        return candidates[best_index([candidates], self.weights)[0]]["hyp"]


def acoustic_scores(model, enc, enc_length: int, phone_lp, phone_length: int, phones: list[list[int]],
                    pieces: list[list[int]]) -> dict[str, list[float]]:
    """One utterance's candidates under the model's three acoustic heads (``enc`` [1, T, D]; ``phone_lp`` its phone
    CTC log-probabilities): ``phone_ctc`` of their phone ids, ``piece_ctc`` and ``attention`` of their word pieces."""
    from .decode import attention_score, ctc_score, forced_ctc
    return {"phone_ctc": forced_ctc(phone_lp, phone_length, phones, model.config.phone_vocab),
            "piece_ctc": ctc_score(model, enc, enc_length, pieces),
            "attention": attention_score(model, enc, enc_length, pieces)}


def sources(blank_offsets) -> list[str]:
    """The candidates' sources, in pooling order: the lexicon decoder, its searches at each blank offset, the joint
    search."""
    return ["lexicon", *(f"lexicon+{off:g}" for off in blank_offsets), "joint"]


def joint_start(ctc_weight: float, lm_weight: float, length_bonus: float) -> dict:
    """The joint search's own trade-off as combination weights: (1 - c) attention + c CTC + LM + bonus per piece."""
    return full_weights({"phone_ctc": 0.0, "ngram": 0.0, "attention": 1.0 - ctc_weight, "piece_ctc": ctc_weight,
                         "piece_lm": lm_weight, "pieces": length_bonus})


def _matrix(utterances: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidates' features as [U, C, F] (float64) and a [U, C] mask of the real ones."""
    U, C = len(utterances), max((len(c) for c in utterances), default=0)
    feats = torch.zeros(U, max(C, 1), len(FEATURES), dtype=torch.float64)
    mask = torch.zeros(U, max(C, 1), dtype=torch.bool)
    for u, cands in enumerate(utterances):
        for c, cand in enumerate(cands):
            feats[u, c] = torch.tensor(cand["features"], dtype=torch.float64)
            mask[u, c] = True
    return feats, mask


def full_weights(weights: dict | None) -> dict:
    """:data:`START` with ``weights`` over it; a name outside :data:`FEATURES` is refused."""
    unknown = set(weights or {}) - set(FEATURES)
    if unknown:
        raise ValueError(f"combination weights: unknown feature(s) {sorted(unknown)}; expected some of {FEATURES}")
    return {**START, **{k: float(v) for k, v in (weights or {}).items()}}


def _vector(weights: dict) -> torch.Tensor:
    w = full_weights(weights)
    return torch.tensor([w[f] for f in FEATURES], dtype=torch.float64)


def _argmax(feats: torch.Tensor, mask: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Each utterance's best candidate (the first of equals: the lexicon decoder's order wins ties)."""
    return (feats @ w).masked_fill(~mask, -torch.inf).argmax(dim=1)


def best_index(utterances: list[list[dict]], weights: dict) -> list[int]:
    """Per utterance, the index of its candidate with the highest weighted feature sum."""
    feats, mask = _matrix(utterances)
    return _argmax(feats, mask, _vector(weights)).tolist()


def tune(refs: list[str], utterances: list[list[dict]], starts: list[dict] | None = None, grids: dict | None = None,
         passes: int = 4) -> dict:
    """The weights with the fewest word errors on (``refs``, their ``utterances``' candidates): from each of
    ``starts`` (default [:data:`START`]), each feature's weight in turn set to the best value of its grid
    (:data:`GRIDS`; a value is taken only if it removes errors), for at most ``passes`` rounds or until a round
    changes nothing; the best end point wins (ties: the earlier start). Returns ``{"chosen", "errors",
    "start_errors" (of the first start), "oracle_errors", "ref_words", "rounds", "runs"}``."""
    from .metrics import utterance_errors
    if len(refs) != len(utterances):
        raise ValueError(f"tune: {len(refs)} references for {len(utterances)} utterances")
    if not refs:
        raise ValueError("tune: no utterances to tune on")
    starts = [full_weights(s) for s in (starts or [START])]
    grids = grids or GRIDS
    feats, mask = _matrix(utterances)
    flat = utterance_errors([r for r, cands in zip(refs, utterances) for _ in cands],
                            [c["hyp"] for cands in utterances for c in cands])
    errors = torch.full(mask.shape, 1 << 30, dtype=torch.long)
    k = 0
    for u, cands in enumerate(utterances):
        errors[u, :len(cands)] = torch.tensor([e.errors for e in flat[k:k + len(cands)]], dtype=torch.long)
        k += len(cands)

    def cost(w: dict) -> int:
        return int(errors.gather(1, _argmax(feats, mask, _vector(w))[:, None]).sum())

    def descend(weights: dict) -> dict:
        best = start = cost(weights)
        rounds = 0
        for rounds in range(1, passes + 1):
            changed = False
            for f in FEATURES:
                for v in grids.get(f, ()):
                    c = cost({**weights, f: v})
                    if c < best:
                        best, weights, changed = c, {**weights, f: v}, True
            if not changed:
                break
        return {"chosen": weights, "errors": best, "start_errors": start, "rounds": rounds}

    runs = [descend(w) for w in starts]
    best = min(runs, key=lambda r: r["errors"])          # the first of equals
    oracle = int(errors.masked_fill(~mask, 1 << 30).min(dim=1).values.sum())
    return {**best, "start_errors": runs[0]["start_errors"], "oracle_errors": oracle,
            "ref_words": sum(len(r.split()) for r in refs), "runs": runs}
