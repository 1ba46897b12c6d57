"""Issue 15: the pronunciation lexicon (espeak-ng), the phone CTC head, the word n-gram (KenLM) and the lexicon
decoder that turns phone posteriors into words."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from asr.data.lexicon import Lexicon, LexiconError, build_lexicon, phones_of
from asr.data.ngram import NgramError, build_ngram, kenlm_tool
from asr.decode import LexiconDecoder
from asr.loader import collate
from asr.models.bfa import BFA, BFAConfig

TEXT = ["turn on the lights", "the cat sat on the mat", "call mom", "what is the weather like today"]


@pytest.fixture(scope="module")
def lexicon_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lex")
    (d / "text.txt").write_text("".join(t + "\n" for t in TEXT))
    (d / "train.jsonl").write_text(json.dumps({"id": "u1", "audio_filepath": "a.flac", "duration": 1.0,
                                               "text": "hello world"}) + "\n")
    summary = build_lexicon(d / "text.txt", [d / "train.jsonl"], d / "lexicon")
    assert summary["words"] == len({w for t in TEXT + ["hello world"] for w in t.split()})
    return d


def test_phones_of_drops_stress_and_variant_marks():
    assert phones_of("h_@_l_'oU") == ["h", "@", "l", "oU"]
    assert phones_of(",a_b_3_r_'eI_S_@_n_z") == ["a", "b", "3", "r", "eI", "S", "@", "n", "z"]
    assert phones_of("a#_b_'a_n_d_@_n\n") == ["a", "b", "a", "n", "d", "@", "n"]


def test_lexicon_spells_every_word_and_encodes_transcripts(lexicon_dir):
    lex = Lexicon(lexicon_dir / "lexicon")
    assert lex.phones == sorted(lex.phones) and len(set(lex.phones)) == len(lex)
    assert lex.words["hello"] == ["h", "@", "l", "oU"]           # espeak-ng en-us, stress dropped
    ids = lex.encode("call mom")
    assert [lex.phones[i] for i in ids] == lex.words["call"] + lex.words["mom"]
    with pytest.raises(LexiconError, match=r"'zebra'.*lexicon\.txt|lexicon\.txt.*'zebra'"):
        lex.encode("call zebra")


def test_a_malformed_lexicon_names_its_file_and_line(tmp_path, lexicon_dir):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "phones.txt").write_text((lexicon_dir / "lexicon" / "phones.txt").read_text())
    (bad / "lexicon.txt").write_text("cat k a t\ndog d Q! g\n")
    with pytest.raises(LexiconError, match=r"lexicon\.txt:2"):
        Lexicon(bad)
    with pytest.raises(LexiconError, match="asr-prep lexicon"):
        Lexicon(tmp_path / "missing")


def test_collate_with_a_lexicon_pads_phones(lexicon_dir):
    lex = Lexicon(lexicon_dir / "lexicon")
    items = [("a", torch.zeros(5, 40), [1, 2], "call mom"), ("b", torch.zeros(3, 40), [3], "hello")]
    b = collate(items, lexicon=lex)
    assert b.plen.tolist() == [len(lex.encode("call mom")), len(lex.encode("hello"))]
    assert b.phones.shape == (2, int(b.plen.max())) and int(b.phones[1, int(b.plen[1]):].max()) == -1
    assert collate(items).phones is None


def test_the_phone_head_upsamples_and_its_loss_joins_the_total():
    cfg = BFAConfig(vocab_size=10, enc_hidden=16, enc_layers=2, pool_after=[0], frame_stack=2, dec_hidden=16,
                    emb_dim=8, att_dim=16, ctc_weight=0.5, phone_vocab=7, phone_ctc_weight=0.5, phone_upsample=2,
                    dropout=0.0)
    torch.manual_seed(0)
    model = BFA(cfg)
    feats, flen = torch.randn(2, 40, 40), torch.tensor([40, 30])
    enc, enc_len = model.encode(feats, flen)
    lp, lp_len = model.phone_log_probs(enc, enc_len)
    assert lp.shape == (2, enc.shape[1] * 2, 8) and lp_len.tolist() == (enc_len * 2).tolist()
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2, enc.shape[1] * 2), atol=1e-5)
    toks, tlen = torch.tensor([[1, 2, 3], [4, 5, -1]]), torch.tensor([3, 2])
    phones, plen = torch.tensor([[0, 1, 2, 3], [4, 5, -1, -1]]), torch.tensor([4, 2])
    loss, stats = model(feats, flen, toks, tlen, phones, plen)
    assert torch.isfinite(loss) and stats["phone_ctc_loss"] > 0
    assert abs(stats["loss"] - (0.5 * stats["att_loss"] + 0.5 * stats["ctc_loss"] + 0.5 * stats["phone_ctc_loss"])) < 1e-4
    with pytest.raises(ValueError, match="phone"):
        model(feats, flen, toks, tlen)
    with pytest.raises(ValueError, match="phone_vocab"):
        BFA(BFAConfig(vocab_size=10, phone_ctc_weight=0.5))


def _emissions(lex: Lexicon, words: list[str], frames_per_phone: int = 2) -> torch.Tensor:
    """Log-posteriors that spell ``words`` phone by phone, each phone followed by a blank (blank = len(lex))."""
    P = len(lex)
    rows = []
    for w in words:
        for p in lex.words[w]:
            rows += [lex.index[p]] * frames_per_phone + [P]
    lp = torch.full((len(rows), P + 1), -12.0)
    lp[torch.arange(len(rows)), torch.tensor(rows)] = -0.01
    return lp.log_softmax(-1)[None]


def test_the_lexicon_decoder_finds_the_words_whose_phones_it_hears(lexicon_dir, tmp_path):
    lex = Lexicon(lexicon_dir / "lexicon")
    words = "the cat sat on the mat".split()
    em = _emissions(lex, words)
    alone = LexiconDecoder(lexicon_dir / "lexicon", ngram=None, phone_vocab=len(lex))
    assert alone(em, torch.tensor([em.shape[1]])) == ["the cat sat on the mat"]
    ngram = build_ngram(lexicon_dir / "text.txt", tmp_path / "words.3gram.bin", order=3)
    with_lm = LexiconDecoder(lexicon_dir / "lexicon", ngram=ngram, lm_weight=1.0, phone_vocab=len(lex))
    # a batch: the shorter utterance padded, its length given
    em2 = _emissions(lex, ["call", "mom"])
    batch = torch.cat([em, torch.nn.functional.pad(em2, (0, 0, 0, em.shape[1] - em2.shape[1]))])
    assert with_lm(batch, torch.tensor([em.shape[1], em2.shape[1]])) == ["the cat sat on the mat", "call mom"]
    with pytest.raises(LexiconError, match="phone head has 3"):
        LexiconDecoder(lexicon_dir / "lexicon", phone_vocab=3)
    with pytest.raises(FileNotFoundError, match="asr-prep ngram"):
        LexiconDecoder(lexicon_dir / "lexicon", ngram=tmp_path / "none.bin")


def test_a_blank_penalty_brings_back_a_word_whose_phones_blank_narrowly_outscores(lexicon_dir):
    """Reverberant speech: every frame of a word's phones has the blank a little ahead (-0.5 against -1.0), so the
    best path is all blank and the word is deleted; a blank penalty of 1 lets the phones win, and leaves the
    caller's posteriors as they were."""
    lex = Lexicon(lexicon_dir / "lexicon")
    em = _emissions(lex, ["cat"])
    P = len(lex)
    phone_frames = em[0].argmax(-1) != P
    em[0, phone_frames] = torch.full((P + 1,), -12.0)
    em[0, phone_frames, P] = -0.5
    em[0, phone_frames.nonzero()[:, 0], em.new_tensor([lex.index[p] for p in lex.words["cat"] for _ in (0, 1)],
                                                     dtype=torch.long)] = -1.0
    before = em.clone()
    n = torch.tensor([em.shape[1]])
    assert LexiconDecoder(lexicon_dir / "lexicon", phone_vocab=P)(em, n) == [""]
    assert LexiconDecoder(lexicon_dir / "lexicon", phone_vocab=P, blank_penalty=1.0)(em, n) == ["cat"]
    assert torch.equal(em, before)


def test_ngram_errors_say_what_is_missing(tmp_path, monkeypatch):
    with pytest.raises(NgramError, match="no LM text"):
        build_ngram(tmp_path / "absent.txt", tmp_path / "lm.bin")
    monkeypatch.setenv("HX_KENLM_BIN", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(NgramError, match="make setup"):
        kenlm_tool("lmplz")
