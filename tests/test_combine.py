"""Issue 15: decoder combination (asr.combine, asr-eval --method combine): the forced CTC score it reads, the
speller and word n-gram scorer, the pooled candidates' features, and the tuning of their weights on word errors.
Real espeak-ng, KenLM and sentencepiece; tiny random models, no training."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from asr.combine import (FEATURES, START, Combiner, NgramScorer, Speller, best_index, full_weights, joint_start,
                          tune)
from asr.data.lexicon import Lexicon, build_lexicon
from asr.data.ngram import build_ngram
from asr.data.tokenizer import train_tokenizer
from asr.decode import LexiconDecoder, forced_ctc
from asr.loader import Tokenizer
from asr.models.bfa import BFA, BFAConfig

TEXT = ["turn on the lights", "the cat sat on the mat", "call mom", "what is the weather like today",
        "turn off the lights", "call the cat"]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    d = tmp_path_factory.mktemp("combine")
    (d / "text.txt").write_text("".join(t + "\n" for t in TEXT))
    build_lexicon(d / "text.txt", [], d / "lexicon")
    return {"dir": d, "lexicon": Lexicon(d / "lexicon"), "ngram": build_ngram(d / "text.txt", d / "w.3gram.bin", 3),
            "tok": Tokenizer(train_tokenizer(None, 30, d / "tok", text=d / "text.txt"))}


def test_forced_ctc_sums_every_alignment_and_gives_minus_inf_to_what_the_frames_cannot_hold():
    torch.manual_seed(0)
    T, blank = 5, 3
    lp = F.log_softmax(2 * torch.randn(T, blank + 1), dim=-1)

    def collapse(path):
        out = [k for k, _ in itertools.groupby(path)]
        return [k for k in out if k != blank]
    brute = torch.logsumexp(torch.stack([lp[torch.arange(T), torch.tensor(p)].sum()
                                         for p in itertools.product(range(blank + 1), repeat=T)
                                         if collapse(p) == [1, 2]]), 0)
    empty, got, fits = forced_ctc(lp, T, [[], [1, 2], [1, 1, 1]], blank)
    assert got == pytest.approx(float(brute), abs=1e-4)
    assert empty == pytest.approx(float(lp[:, blank].sum()), abs=1e-5)
    assert math.isfinite(fits) and forced_ctc(lp, 4, [[1, 1, 1]], blank) == [-math.inf]  # 1 _ 1 _ 1: 5 frames
    assert forced_ctc(lp, T, [], blank) == []


def test_the_speller_takes_the_lexicon_and_asks_espeak_for_other_words(kit):
    lex = kit["lexicon"]
    speller = Speller(lex)
    (known, n_known), (mixed, n_mixed) = speller(["call mom", "call bob"])
    assert known == lex.encode("call mom") and n_known == 0
    assert mixed[:len(lex.encode("call"))] == lex.encode("call") and len(mixed) > len(lex.encode("call"))
    assert n_mixed == 1 and "bob" in speller.extra and all(0 <= i < len(lex) for i in mixed)
    # what espeak-ng says nothing for (sentencepiece's unknown piece, a lone apostrophe) has no phones
    assert speller(["call \u2047 '"]) == [(lex.encode("call"), 2)]


def test_the_ngram_scorer_prefers_the_sentences_it_was_trained_on(kit):
    score = NgramScorer(kit["ngram"], kit["lexicon"].words)
    assert score("turn on the lights") > score("lights the on turn")
    assert score("turn on the lights") > score("turn on the zyzzyva")   # not in its vocabulary: <unk>
    assert score("call mom") == score("call mom") and "call mom" in score.cache


def _cand(hyp, **features):
    return {"hyp": hyp, "from": "lexicon", "features": [features.get(f, 0.0) for f in FEATURES]}


def test_tuning_finds_the_weights_that_remove_errors_and_never_ends_worse():
    """The phone score prefers a wrong candidate in two utterances out of three; the attention score knows better
    there. Tuning moves weight to attention until no error is left; a feature that only misleads stays at 0."""
    refs = ["turn on the lights", "call mom", "the cat sat"]
    utts = [[_cand("turn of the lights", phone_ctc=-1.0, attention=-9.0, words=4),
             _cand("turn on the lights", phone_ctc=-2.0, attention=-1.0, words=4)],
            [_cand("call mom", phone_ctc=-1.0, attention=-3.0, words=2),
             _cand("call tom", phone_ctc=-3.0, attention=-2.5, words=2)],
            [_cand("the cat", phone_ctc=-1.0, attention=-8.0, words=2),
             _cand("the cat sat", phone_ctc=-1.5, attention=-2.0, words=3)]]
    assert best_index(utts, START) == [0, 0, 0]
    res = tune(refs, utts)
    assert res["start_errors"] == 2 and res["errors"] == 0 and res["oracle_errors"] == 0 and res["ref_words"] == 9
    assert best_index(utts, res["chosen"]) == [1, 0, 1]
    assert set(res["chosen"]) == set(FEATURES) and res["chosen"]["piece_lm"] == 0.0
    # already right at the start: nothing to gain, nothing changed
    right = tune(refs[1:2], utts[1:2])
    assert right["errors"] == right["start_errors"] == 0 and right["chosen"] == START and right["rounds"] == 1
    # a second start (the joint search's trade-off) is descended as well; the better end point wins
    both = tune(refs, utts, starts=[START, joint_start(0.3, 0.0, 0.0)])
    assert len(both["runs"]) == 2 and both["start_errors"] == 2 and both["errors"] == 0
    assert best_index(utts, joint_start(0.3, 0.0, 0.0)) == [1, 1, 1]     # attention alone hears "call tom"
    with pytest.raises(ValueError, match="2 references for 3"):
        tune(refs[:2], utts)
    with pytest.raises(ValueError, match="unknown feature.*'acoustic'"):
        full_weights({"acoustic": 1.0})


def _tiny_model(kit, seed: int) -> BFA:
    """A random BFA with both CTC heads, over the kit's word pieces and phones."""
    torch.manual_seed(seed)
    return BFA(BFAConfig(vocab_size=kit["tok"].vocab_size, feat_dim=8, enc_hidden=8, enc_layers=1, pool_after=[],
                         dec_hidden=8, emb_dim=4, att_dim=8, loc_channels=2, loc_kernel=3, dropout=0.0,
                         ctc_weight=0.3, phone_vocab=len(kit["lexicon"]), phone_ctc_weight=1.0)).eval()


def test_the_combiner_pools_both_decoders_and_scores_every_candidate_with_every_model(kit):
    lex, tok = kit["lexicon"], kit["tok"]
    model = _tiny_model(kit, seed=0)
    decoder = LexiconDecoder(kit["dir"] / "lexicon", ngram=kit["ngram"], phone_vocab=len(lex), nbest=5)
    combiner = Combiner(decoder, Speller(lex), NgramScorer(kit["ngram"], lex.words),
                        {"beam": 4, "ctc_weight": 0.5, "max_ratio": 0.5})
    feats, lengths = torch.randn(2, 30, 8), torch.tensor([30, 22])
    enc, enc_lengths = model.encode(feats, lengths)
    pools = combiner.candidates(model, tok, enc, enc_lengths)
    assert len(pools) == 2
    phone_lp, phone_len = model.phone_log_probs(enc, enc_lengths)
    for b, cands in enumerate(pools):
        hyps = [c["hyp"] for c in cands]
        sources = [c["from"] for c in cands]
        assert len(set(hyps)) == len(hyps) and "joint" in sources
        assert sources == sorted(sources, key=["lexicon", "joint"].index)     # the lexicon's n-best first
        for c in cands:
            f = dict(zip(FEATURES, c["features"]))
            assert len(c["features"]) == len(FEATURES) and all(math.isfinite(x) for x in c["features"])
            assert f["pieces"] == len(tok.encode(c["hyp"])) and f["words"] == len(c["hyp"].split()) and f["unspelt"] == sum(w not in lex.words
                                                                               for w in c["hyp"].split())
            assert f["piece_lm"] == 0.0 and f["ngram"] < 0
            if c["from"] == "lexicon":
                assert f["unspelt"] == 0
                want = forced_ctc(phone_lp[b], int(phone_len[b]), [lex.encode(c["hyp"])], len(lex))[0]
                assert f["phone_ctc"] == pytest.approx(max(want, -1e4), rel=1e-5)
        assert combiner.pick(cands) in hyps


def test_the_lexicon_decoder_searches_again_at_each_blank_offset_and_its_new_words_join_the_pool(kit):
    lex, tok = kit["lexicon"], kit["tok"]
    model = _tiny_model(kit, seed=1)
    feats, lengths = torch.randn(2, 40, 8), torch.tensor([40, 31])
    enc, enc_lengths = model.encode(feats, lengths)
    phone_lp, phone_len = model.phone_log_probs(enc, enc_lengths)
    decoder = LexiconDecoder(kit["dir"] / "lexicon", ngram=kit["ngram"], phone_vocab=len(lex), nbest=5,
                             blank_penalty=0.5)
    # a per-call blank penalty is the same search as a decoder built with it
    again = LexiconDecoder(kit["dir"] / "lexicon", ngram=kit["ngram"], phone_vocab=len(lex), nbest=5,
                           blank_penalty=3.5).nbest(phone_lp, phone_len)
    assert decoder.nbest(phone_lp, phone_len, blank_penalty=3.5) == again
    plain = Combiner(decoder, Speller(lex), NgramScorer(kit["ngram"], lex.words), {"beam": 2, "max_ratio": 0.5})
    more = Combiner(decoder, Speller(lex), NgramScorer(kit["ngram"], lex.words), {"beam": 2, "max_ratio": 0.5},
                    blank_offsets=(3.0,))
    added = 0
    for b, (p, m) in enumerate(zip(plain.candidates(model, tok, enc, enc_lengths),
                                   more.candidates(model, tok, enc, enc_lengths))):
        first = {c["hyp"]: c for c in p}
        sources = [c["from"] for c in m]
        assert sources == sorted(sources, key=["lexicon", "lexicon+3", "joint"].index)
        offset_words = {" ".join(w.split()) for w, _ in again[b]}
        for c in m:
            if c["from"] == "lexicon+3":     # found at blank penalty 0.5 + 3, not by the decoder's own search
                added += 1
                assert c["hyp"] in offset_words and (c["hyp"] not in first or first[c["hyp"]]["from"] == "joint")
            else:                            # everything else is the plain pool's, with the same scores
                assert first[c["hyp"]]["features"] == pytest.approx(c["features"])
        assert {h for h, c in first.items() if c["from"] == "lexicon"} <= {c["hyp"] for c in m}
    assert added > 0
