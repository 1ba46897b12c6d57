"""Word and sentence error rates: one computation (jiwer's word alignment), kept as counts.

:class:`ErrorCounts` holds substitutions, deletions, insertions, reference words, utterances and utterances with
at least one error. Counts add up (``a + b``, ``sum(...)``, or ``to_list``/``from_list`` around an allreduce), so
per-worker, per-speaker and whole-set rates all come from the same numbers; WER and SER are computed from counts
only.

Tokenization is jiwer's default (words separated by spaces; surrounding and repeated spaces ignored). An empty
hypothesis is all deletions; an empty reference has 0 words, its hypothesis words are all insertions. A set with
no reference words has WER ``errors / 1`` (0.0 when nothing was hypothesised either). An utterance is a sentence
error when it has any word error (so "a  b" against "a b" is not one).
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, fields


@dataclass(frozen=True)
class ErrorCounts:
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    ref_words: int = 0
    sentences: int = 0               # utterances
    sentence_errors: int = 0         # utterances with at least one word error

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        """Word error rate: (S + D + I) / reference words (the denominator at least 1)."""
        return self.errors / max(self.ref_words, 1)

    @property
    def ser(self) -> float:
        """Sentence error rate: utterances with an error / utterances (the denominator at least 1)."""
        return self.sentence_errors / max(self.sentences, 1)

    def __add__(self, other: "ErrorCounts") -> "ErrorCounts":
        if not isinstance(other, ErrorCounts):
            return NotImplemented
        return ErrorCounts(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def __radd__(self, other):           # sum() starts from 0
        return self if other == 0 else self.__add__(other)

    def to_list(self) -> list[int]:
        """The counts in field order (e.g. a float64 tensor for an allreduce with op=Sum)."""
        return list(astuple(self))

    @classmethod
    def from_list(cls, values) -> "ErrorCounts":
        """Counts from :meth:`to_list` order (floats from a reduction are rounded)."""
        values = [round(float(v)) for v in values]
        if len(values) != len(fields(cls)):
            raise ValueError(f"ErrorCounts.from_list: expected {len(fields(cls))} values, got {len(values)}")
        return cls(*values)

    def to_dict(self) -> dict:
        """Counts plus wer and ser (for JSON)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "wer": self.wer, "ser": self.ser}


def utterance_errors(refs: list[str], hyps: list[str]) -> list[ErrorCounts]:
    """Counts of each (reference, hypothesis) pair, from one jiwer alignment of all of them."""
    import jiwer
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    if not refs:
        return []
    out = jiwer.process_words(list(refs), list(hyps))
    counts = []
    for ref_words, chunks in zip(out.references, out.alignments):
        n = {"substitute": 0, "delete": 0, "insert": 0}
        for c in chunks:
            if c.type in ("substitute", "delete"):
                n[c.type] += c.ref_end_idx - c.ref_start_idx
            elif c.type == "insert":
                n["insert"] += c.hyp_end_idx - c.hyp_start_idx
        errors = sum(n.values())
        counts.append(ErrorCounts(n["substitute"], n["delete"], n["insert"], len(ref_words), 1, int(errors > 0)))
    return counts


def corpus_errors(refs: list[str], hyps: list[str]) -> ErrorCounts:
    """The summed counts of a set of (reference, hypothesis) pairs."""
    return sum(utterance_errors(refs, hyps), ErrorCounts())


def word_errors(ref: str, hyp: str) -> ErrorCounts:
    """The counts of one utterance."""
    return utterance_errors([ref], [hyp])[0]
