"""asr.metrics: one WER (jiwer's alignment) kept as counts that add up across utterances and workers."""
import jiwer
import pytest
import torchaudio.functional as AF

from asr.metrics import ErrorCounts, corpus_errors, utterance_errors, word_errors

REFS = ["set an alarm for seven", "play some music", "turn off the lights", "call my mother", "what time is it"]
HYPS = ["set alarm for seven thirty", "play sum music", "turn off the lights", "call my my mother", "what is"]


def test_counts_equal_jiwers():
    total = corpus_errors(REFS, HYPS)
    out = jiwer.process_words(REFS, HYPS)
    assert (total.substitutions, total.deletions, total.insertions) == (out.substitutions, out.deletions,
                                                                         out.insertions)
    assert total.ref_words == sum(len(r.split()) for r in REFS) and total.wer == pytest.approx(out.wer)
    assert total.sentences == 5 and total.sentence_errors == 4 and total.ser == 0.8
    for ref, hyp, c in zip(REFS, HYPS, utterance_errors(REFS, HYPS)):
        assert c == word_errors(ref, hyp)
        assert c.wer == pytest.approx(jiwer.wer(ref, hyp))
        assert c.errors == AF.edit_distance(ref.split(), hyp.split())     # what asr.train counted before


def test_counts_add_up_across_workers():
    parts = [corpus_errors(REFS[:2], HYPS[:2]), corpus_errors(REFS[2:], HYPS[2:])]
    assert sum(parts, ErrorCounts()) == parts[0] + parts[1] == sum(parts) == corpus_errors(REFS, HYPS)
    summed = [a + b for a, b in zip(parts[0].to_list(), parts[1].to_list())]    # an allreduce with op=Sum
    assert ErrorCounts.from_list([float(x) for x in summed]) == corpus_errors(REFS, HYPS)
    d = corpus_errors(REFS, HYPS).to_dict()
    assert d["wer"] == corpus_errors(REFS, HYPS).wer and d["ref_words"] == 19


def test_empty_hypothesis_is_all_deletions():
    c = word_errors("call my mother", "")
    assert (c.substitutions, c.deletions, c.insertions, c.ref_words) == (0, 3, 0, 3)
    assert c.wer == 1.0 and c.ser == 1.0


def test_empty_reference_counts_insertions_over_no_words():
    """An empty reference has 0 words: its hypothesis words are insertions; a set with 0 reference words has
    WER errors / 1 (0.0 when the hypothesis is empty too, and then no sentence error)."""
    c = word_errors("", "hello there")
    assert (c.insertions, c.ref_words, c.sentence_errors) == (2, 0, 1) and c.wer == 2.0
    assert word_errors("", "") == ErrorCounts(sentences=1) and word_errors("  ", "").wer == 0.0
    total = corpus_errors(["", "a b"], ["x", "a b"])
    assert total.wer == pytest.approx(1 / 2) and total.ser == 0.5


def test_whitespace_is_not_an_error_and_lengths_must_match():
    assert word_errors("a  b ", " a b").errors == 0
    assert utterance_errors([], []) == []
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        utterance_errors(["a", "b"], ["a"])
