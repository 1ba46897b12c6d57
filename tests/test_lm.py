"""Issue 7: CTC prefix beam search (torchaudio's decoder since issue 15), the word-piece LM and its shallow fusion
(no audio, no Horovod)."""
import itertools
import math

import torch

from asr.decode import prefix_search
from asr.models.rnnlm import LMConfig, PieceLM, load_lm, save_lm


def exact_prefix_logprobs(logp: torch.Tensor, blank: int) -> dict:
    """log P(prefix) by enumerating every alignment (collapse repeats, drop blanks)."""
    T, V = logp.shape
    probs: dict = {}
    for path in itertools.product(range(V), repeat=T):
        out, prev = [], None
        for k in path:
            if k != prev and k != blank:
                out.append(k)
            prev = k
        p = sum(float(logp[t, k]) for t, k in enumerate(path))
        probs[tuple(out)] = probs.get(tuple(out), 0.0) + math.exp(p)
    return {k: math.log(v) for k, v in probs.items()}


def test_prefix_search_sums_alignments_where_best_path_does_not():
    # Two frames, P(a) = 0.4, P(blank) = 0.6 each: the best path is "blank blank" (empty, 0.36), but the prefix
    # "a" has three alignments (a a, a -, - a) worth 0.64 together.
    blank = 1
    logp = torch.tensor([[0.4, 0.6], [0.4, 0.6]]).log()
    best = prefix_search(logp, blank, beam=4)
    assert best[0][0] == [0]
    assert math.isclose(best[0][1], math.log(0.64), rel_tol=1e-6)


def test_prefix_search_matches_exhaustive_enumeration():
    torch.manual_seed(0)
    blank = 3
    for _ in range(5):
        logp = torch.log_softmax(torch.randn(5, 4) * 2, dim=-1)
        exact = exact_prefix_logprobs(logp, blank)
        found = prefix_search(logp, blank, beam=64)
        best = max(exact, key=exact.get)
        assert tuple(found[0][0]) == best
        for pieces, ctc, _ in found:                      # every prefix's probability is exact
            assert math.isclose(ctc, exact[tuple(pieces)], rel_tol=1e-6, abs_tol=1e-9)


def tiny_lm(vocab=3):
    torch.manual_seed(0)
    return PieceLM(LMConfig(vocab_size=vocab, emb_dim=4, hidden=8, dropout=0.0)).eval()


def test_lm_score_is_the_sum_of_its_steps_including_eos():
    lm = tiny_lm()
    hyp = [2, 0, 1]
    state, prev, total = None, torch.tensor([lm.config.eos]), 0.0
    for tok in hyp + [lm.config.eos]:
        logp, state = lm.step(prev, state)
        total += float(logp[0, tok])
        prev = torch.tensor([tok])
    assert math.isclose(lm.score([hyp, [1]])[0], total, rel_tol=1e-5)


def test_lm_fusion_breaks_an_acoustic_tie_and_reports_the_lm_score(tmp_path):
    lm = tiny_lm()
    with torch.no_grad():                                  # an LM that strongly prefers piece 1 over piece 0
        lm.out.weight.zero_()
        lm.out.bias.copy_(torch.tensor([-5.0, 0.0, -5.0, 0.0]))
    blank = 3
    logp = torch.tensor([[0.45, 0.45, 0.0, 0.10]]).clamp_min(1e-9).log()
    assert prefix_search(logp, blank, beam=4, lm=lm, lm_weight=0.0)[0][0] in ([0], [1])
    fused = prefix_search(logp, blank, beam=4, lm=lm, lm_weight=1.0)
    assert fused[0][0] == [1]
    assert math.isclose(fused[0][2], lm.score([[1]])[0], rel_tol=1e-5)
    save_lm(lm, tmp_path / "lm.pt", tokenizer_digest="x")  # and it survives a save / load round trip
    again, meta = load_lm(tmp_path / "lm.pt")
    assert meta["tokenizer_digest"] == "x" and math.isclose(again.score([[1]])[0], lm.score([[1]])[0])
