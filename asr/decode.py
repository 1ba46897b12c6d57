"""Decoding for the BFA model: batched greedy search, beam search (optional CTC rescoring), CTC best path,
CTC prefix beam search with LM shallow fusion and attention rescoring, and joint CTC/attention beam search
(CTC prefix scores inside the search, optional LM fusion; it cannot loop)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .models.bfa import BFA


def _max_len(enc_lengths: torch.Tensor, ratio: float = 1.0, floor: int = 5) -> int:
    return int(max(floor, enc_lengths.max().item() * ratio))


@torch.no_grad()
def greedy(model: BFA, feats, feat_lengths, max_ratio: float = 1.0, encoded=None) -> list[list[int]]:
    """Most likely piece at every step, for a whole batch; stops at eos (or after max_ratio * encoder frames).

    ``encoded``: ``model.encode(feats, feat_lengths)`` when the caller already has it (decoding twice)."""
    eos = model.config.eos
    enc, enc_lengths = encoded if encoded is not None else model.encode(feats, feat_lengths)
    state = model.decoder.init_state(enc, enc_lengths)
    B = enc.shape[0]
    prev = torch.full((B,), eos, dtype=torch.long, device=enc.device)
    done = torch.zeros(B, dtype=torch.bool, device=enc.device)
    hyps = [[] for _ in range(B)]
    for _ in range(_max_len(enc_lengths, max_ratio)):
        logits, state = model.decoder.step(state, prev)
        prev = logits.argmax(-1)
        for b in range(B):
            if not done[b] and prev[b].item() != eos:
                hyps[b].append(prev[b].item())
        done |= prev == eos
        if bool(done.all()):
            break
    return hyps


@torch.no_grad()
def ctc_greedy(model: BFA, feats, feat_lengths, encoded=None) -> list[list[int]]:
    """Best path of the CTC head: argmax per encoder frame, repeats merged, blanks dropped.

    Needs no decoder, so it reads what the encoder has learned even while the attention decoder still
    loops or stops early (the usual state of the first epochs)."""
    if model.ctc_head is None:
        raise ValueError("ctc_greedy needs a model trained with a CTC head (model.ctc_weight > 0)")
    blank = model.config.eos
    enc, enc_lengths = encoded if encoded is not None else model.encode(feats, feat_lengths)
    best = model.ctc_head(enc).argmax(-1)
    hyps = []
    for b in range(best.shape[0]):
        path = torch.unique_consecutive(best[b, :int(enc_lengths[b])])
        hyps.append([int(t) for t in path if int(t) != blank])
    return hyps


def utterance_ctc_log_probs(model: BFA, dataset):
    """(index, dataset item, CTC log-probabilities [T, V+1]) for each usable utterance of ``dataset`` (an
    asr.loader.SpeechDataset), one at a time, without gradients: what external CTC decoders read."""
    from .loader import SkippedItem
    with torch.no_grad():
        for i in range(len(dataset)):
            item = dataset[i]
            if isinstance(item, SkippedItem):
                continue
            feats = item[1]
            enc, enc_len = encode(model, feats[None], torch.tensor([feats.shape[-2]]))
            yield i, item, F.log_softmax(model.ctc_head(enc[0, :int(enc_len[0])]), dim=-1)


def _select(state, idx):
    out = {}
    for k, v in state.items():
        if k == "hidden":
            out[k] = [(h[idx], c[idx]) for h, c in v]
        else:
            out[k] = v[idx]
    return out


@torch.no_grad()
def forced_ctc(log_probs: torch.Tensor, length: int, seqs: list[list[int]], blank: int) -> list[float]:
    """log P_ctc(seq | audio) of each label sequence, summed over every alignment, from one utterance's CTC
    log-probabilities ``log_probs`` [>=length, C]. A sequence the ``length`` frames cannot hold scores -inf (not
    CTC loss's zero_infinity 0, which would make it the best)."""
    if not seqs:
        return []
    n = len(seqs)
    lp = log_probs[:length, None].expand(-1, n, -1)
    lens = torch.tensor([len(s) for s in seqs], device=lp.device)
    targets = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=lp.device)
    nll = F.ctc_loss(lp, targets, torch.full((n,), int(length), device=lp.device), lens, blank=blank,
                     reduction="none", zero_infinity=False)
    return [-float(x) for x in nll]


@torch.no_grad()
def ctc_score(model: BFA, enc, enc_length, hyps: list[list[int]]) -> list[float]:
    """log P_ctc(hyp | audio) of each hypothesis for one utterance (:func:`forced_ctc` of the word-piece head)."""
    if model.ctc_head is None or not hyps:
        return [0.0] * len(hyps)
    lp = F.log_softmax(model.ctc_head(enc[0, :enc_length]), dim=-1)     # [T, V+1]
    return forced_ctc(lp, int(enc_length), hyps, model.config.eos)


@torch.no_grad()
def beam_search(model: BFA, feats, feat_lengths, beam: int = 4, length_bonus: float = 0.0,
                ctc_weight: float = 0.0, max_ratio: float = 1.0, encoded=None) -> list[list[int]]:
    """Beam search per utterance; scores are attention log-probabilities (+ length_bonus per piece),
    and with ``ctc_weight`` > 0 the final beam is rescored with (1-w)*attention + w*CTC."""
    eos = model.config.eos
    enc_all, enc_lengths = encoded if encoded is not None else model.encode(feats, feat_lengths)
    results = []
    for b in range(enc_all.shape[0]):
        T = int(enc_lengths[b])
        enc = enc_all[b:b + 1, :T]
        states = model.decoder.init_state(enc, enc_lengths[b:b + 1])
        beams = [([], 0.0)]                 # (tokens, score)
        finished: list[tuple[list[int], float]] = []
        for _ in range(_max_len(enc_lengths[b:b + 1], max_ratio)):
            prev = torch.tensor([toks[-1] if toks else eos for toks, _ in beams])
            logits, new_states = model.decoder.step(states, prev)
            logp = F.log_softmax(logits, dim=-1)
            cand = []
            for i, (toks, score) in enumerate(beams):
                top = torch.topk(logp[i], min(beam + 1, logp.shape[-1]))
                for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
                    cand.append((score + lp + (length_bonus if tok != eos else 0.0), i, tok))
            cand.sort(key=lambda x: -x[0])
            next_beams, keep = [], []
            for score, i, tok in cand:
                if tok == eos:
                    finished.append((beams[i][0], score))
                else:
                    next_beams.append((beams[i][0] + [tok], score))
                    keep.append(i)
                if len(next_beams) == beam:
                    break
            if len(finished) >= beam or not next_beams:
                break
            best_open = next_beams[0][1]
            if finished and max(s for _, s in finished) > best_open:
                break
            beams = next_beams
            states = _select(new_states, torch.tensor(keep))
        if not finished:
            finished = beams
        finished.sort(key=lambda x: -x[1])
        finished = finished[:beam]
        if ctc_weight > 0 and model.ctc_head is not None:
            ctc = ctc_score(model, enc, T, [h for h, _ in finished])
            finished = [(h, (1 - ctc_weight) * s + ctc_weight * c) for (h, s), c in zip(finished, ctc)]
            finished.sort(key=lambda x: -x[1])
        results.append(finished[0][0])
    return results


@torch.no_grad()
def attention_score(model: BFA, enc, enc_length, hyps: list[list[int]]) -> list[float]:
    """log P_att(hyp + eos | audio) of each hypothesis for one utterance (teacher-forced, one batch)."""
    if not hyps:
        return []
    eos = model.config.eos
    n, L = len(hyps), max(len(h) for h in hyps) + 1
    tin = torch.full((n, L), eos, dtype=torch.long)
    tout = torch.full((n, L), -1, dtype=torch.long)
    for i, h in enumerate(hyps):
        tin[i, 1:len(h) + 1] = torch.tensor(h, dtype=torch.long)
        tout[i, :len(h)] = torch.tensor(h, dtype=torch.long)
        tout[i, len(h)] = eos
    tin, tout = tin.to(enc.device), tout.to(enc.device)
    enc = enc[:1, :enc_length].expand(n, -1, -1)
    logp = F.log_softmax(model.decoder(enc, torch.full((n,), int(enc_length), device=enc.device), tin), dim=-1)
    picked = logp.gather(-1, tout.clamp_min(0)[..., None])[..., 0] * (tout >= 0)
    return picked.sum(-1).tolist()


class _PieceLMForFlashlight:
    """Our word-piece LM behind torchaudio's CTCDecoderLM: a decoder state is a prefix (a node of flashlight's
    state trie); its LSTM state and next-piece log-probabilities are computed the first time it is extended.
    ``bonus`` (per piece) rides on the LM score: the lexicon-free decoder has no per-token score of its own."""

    def __new__(cls, lm, bonus: float):
        from torchaudio.models.decoder import CTCDecoderLM, CTCDecoderLMState

        class Adapter(CTCDecoderLM):
            def __init__(self):
                CTCDecoderLM.__init__(self)
                self.eos, self.next, self.parent = lm.config.eos, {}, {}

            def start(self, start_with_nothing: bool):
                self.next, self.parent = {}, {}            # one utterance's prefixes at a time
                state = CTCDecoderLMState()
                logp, hc = lm.step(torch.tensor([self.eos]))
                self.next[state] = (logp[0].tolist(), hc)
                return state

            def _next(self, state):
                if state not in self.next:
                    parent, token = self.parent[state]
                    logp, hc = lm.step(torch.tensor([token]), self._next(parent)[1])
                    self.next[state] = (logp[0].tolist(), hc)
                return self.next[state]

            def score(self, state, token: int):
                child = state.child(token)
                self.parent.setdefault(child, (state, token))
                return child, self._next(state)[0][token] + bonus

            def finish(self, state):
                return state, self._next(state)[0][self.eos]

        return Adapter()


def _flashlight_decoder(vocab: int, beam: int, lm, lm_weight: float, length_bonus: float):
    """torchaudio's CTC beam search decoder (flashlight-text), lexicon-free over ``vocab`` pieces + blank; a
    never-emitted silence column is flashlight's sil token. Kept over the hand-written prefix search it replaced
    by a paired run (scripts/ctc_decoder_pair.py): equal or better WER, 20x faster without the LM."""
    try:
        from torchaudio.models.decoder import ctc_decoder
        tokens = [f"p{i}" for i in range(vocab)] + ["<blank>", "<sil>"]
        use_lm = lm is not None and lm_weight != 0
        return ctc_decoder(lexicon=None, tokens=tokens,
                           lm=_PieceLMForFlashlight(lm, length_bonus / lm_weight) if use_lm else None,
                           nbest=beam, beam_size=beam, beam_size_token=vocab + 1, beam_threshold=1000.0,
                           lm_weight=lm_weight if use_lm else 0.0, sil_score=0.0, log_add=True,
                           blank_token="<blank>", sil_token="<sil>")
    except (ImportError, RuntimeError) as e:   # torchaudio raises RuntimeError without flashlight-text
        raise RuntimeError(f"CTC beam search needs torchaudio's decoder and flashlight-text ({e}); install it "
                           "with: .venv/bin/pip install flashlight-text (make setup does)") from e


def prefix_search(logp: torch.Tensor, blank: int, beam: int = 8, lm=None, lm_weight: float = 0.0,
                  length_bonus: float = 0.0, decoder=None) -> list[tuple[list[int], float, float]]:
    """CTC prefix beam search over one utterance's log-probabilities ``logp`` [T, V+1] (blank = V).

    Unlike the best path, a prefix's probability sums over every alignment that collapses to it. While
    searching, a prefix scores log P_ctc + lm_weight * log P_lm + length_bonus * |prefix| (the bonus only with
    an LM); ``lm`` is a PieceLM whose eos is ``blank``. The search is torchaudio's (flashlight). Returns the
    n-best as (pieces, log P_ctc, log P_lm including eos; 0 without an LM), best first, the scores recomputed
    exactly (torch's CTC forward algorithm, the LM's own score). ``decoder``: :func:`_flashlight_decoder` built
    with these settings (a batch's utterances share one)."""
    if blank != logp.shape[1] - 1:
        raise ValueError(f"prefix_search: blank must be the last of the {logp.shape[1]} classes, got {blank}")
    use_lm = lm is not None and lm_weight != 0
    dec = decoder or _flashlight_decoder(blank, beam, lm if use_lm else None, lm_weight, length_bonus if use_lm else 0.0)
    em = torch.cat([logp.float(), torch.full((logp.shape[0], 1), -1e4)], dim=1).contiguous()[None]
    hyps, seen = [], set()
    for h in dec(em.cpu(), torch.tensor([em.shape[1]]))[0]:
        pieces = tuple(int(t) for t in h.tokens if int(t) < blank)
        if pieces not in seen:
            seen.add(pieces)
            hyps.append(list(pieces))
    T = logp.shape[0]
    targets = torch.tensor([p for h in hyps for p in h] or [0], dtype=torch.long)
    ctc = -F.ctc_loss(logp.float().cpu()[:, None].expand(T, len(hyps), -1), targets,
                      torch.full((len(hyps),), T, dtype=torch.long), torch.tensor([len(h) for h in hyps]),
                      blank=blank, reduction="none", zero_infinity=False)
    lm_scores = lm.score(hyps) if use_lm else [0.0] * len(hyps)
    out = [(h, float(c), float(l)) for h, c, l in zip(hyps, ctc, lm_scores)]
    return sorted(out, key=lambda x: -(x[1] + (lm_weight * x[2] + length_bonus * len(x[0]) if use_lm else 0.0)))


@torch.no_grad()
def ctc_prefix_beam_search(model: BFA, feats, feat_lengths, beam: int = 8, lm=None, lm_weight: float = 0.0,
                           length_bonus: float = 0.0, att_weight: float = 0.0, encoded=None) -> list[list[int]]:
    """CTC prefix beam search (:func:`prefix_search`) with optional LM shallow fusion, then attention
    rescoring of the n-best: with ``att_weight`` > 0 each final hypothesis scores
    (1 - att_weight) * CTC + att_weight * attention + lm_weight * LM + length_bonus * |hyp|, as in WeNet's
    "attention rescoring"; the attention decoder never generates freely, so it cannot loop."""
    if model.ctc_head is None:
        raise ValueError("ctc_prefix_beam_search needs a model trained with a CTC head (model.ctc_weight > 0)")
    if lm is not None and lm.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"the LM has {lm.config.vocab_size} pieces, the acoustic model {model.config.vocab_size}: "
                         "they were trained with different tokenizers")
    enc_all, enc_lengths = encoded if encoded is not None else model.encode(feats, feat_lengths)
    logp_all = F.log_softmax(model.ctc_head(enc_all), dim=-1)
    use_lm = lm is not None and lm_weight != 0
    dec = _flashlight_decoder(model.config.eos, beam, lm if use_lm else None, lm_weight,
                              length_bonus if use_lm else 0.0)
    results = []
    for b in range(enc_all.shape[0]):
        T = int(enc_lengths[b])
        finals = prefix_search(logp_all[b, :T], model.config.eos, beam, lm, lm_weight, length_bonus, decoder=dec)
        att = attention_score(model, enc_all[b:b + 1], T, [h for h, _, _ in finals]) if att_weight > 0 else [0.0] * len(finals)
        scored = [((1 - att_weight) * c + att_weight * a + lm_weight * l + length_bonus * len(h), h)
                  for (h, c, l), a in zip(finals, att)]
        results.append(max(scored, key=lambda x: x[0])[1])
    return results


LOGZERO = -1e10      # log 0 in the CTC prefix scorer: finite, so differences of impossible scores are not NaN


class CTCPrefixScorer:
    """Incremental CTC prefix scores of one utterance (Watanabe et al. 2017, "Hybrid CTC/attention"; ESPnet's
    CTCPrefixScore), for a beam of equal-length prefixes each extended by its own candidate tokens at once.

    A prefix g carries its forward variables r[t] = (log r^n_t(g), log r^b_t(g)): the probability that frames
    1..t emitted exactly g, the last frame being g's last piece (n) or blank (b). Extending g by c costs one
    pass over the frames, so a hypothesis of L pieces costs L passes, however many candidates each has.
    The prefix score psi(g + c) sums every label sequence that starts with g + c; it never grows as a prefix
    gets longer. The candidate ``blank`` stands for end of sentence (in BFA, eos = blank = V) and scores the
    full sequence, log P_ctc(g | x). Works in ``logp``'s dtype."""

    def __init__(self, logp: torch.Tensor, blank: int):
        if logp.dim() != 2:
            raise ValueError(f"CTCPrefixScorer: expected log-probabilities [T, V+1], got shape {tuple(logp.shape)}")
        self.x, self.blank, self.T = logp, blank, logp.shape[0]

    def initial_state(self) -> torch.Tensor:
        """r [T, 2, 1] of the empty prefix: only blanks so far."""
        r = torch.full((self.T, 2, 1), LOGZERO, dtype=self.x.dtype, device=self.x.device)
        r[:, 1, 0] = torch.cumsum(self.x[:, self.blank], dim=0)
        return r

    def score(self, r_prev: torch.Tensor, last: torch.Tensor, length: int, cands: torch.Tensor):
        """Prefix scores of every (prefix k, candidate cands[k, j]).

        r_prev [T, 2, K]: the K prefixes' forward variables; last [K]: their last piece (-1 for the empty
        prefix); length: their common length; cands [K, C]. Returns psi [K, C] (log-probabilities, not
        differences) and the extended prefixes' r [T, 2, K, C]."""
        x, T, blank = self.x, self.T, self.blank
        K, C = cands.shape
        xs = x[:, cands.reshape(-1)].view(T, K, C)
        r = torch.full((T, 2, K, C), LOGZERO, dtype=x.dtype, device=x.device)
        if length == 0:
            r[0, 0] = xs[0]
        r_sum = torch.logaddexp(r_prev[:, 0], r_prev[:, 1])                      # [T, K]: g emitted by frame t
        # phi[t]: g complete at frame t and ready for c; after g's own last piece c needs a blank in between.
        phi = torch.where(cands == last[:, None], r_prev[:, 1, :, None], r_sum[:, :, None])
        start = max(length, 1)                       # c cannot be emitted before frame `length` (0-based)
        xb = x[:, blank, None, None]
        for t in range(start, T):
            r[t, 0] = torch.logaddexp(r[t - 1, 0], phi[t - 1]) + xs[t]
            r[t, 1] = torch.logaddexp(r[t - 1, 0], r[t - 1, 1]) + xb[t]
        first = r[min(start, T) - 1, 0]
        psi = torch.logsumexp(torch.cat([first[None], phi[start - 1:T - 1] + xs[start:T]]), dim=0)
        psi = torch.where(cands == blank, r_sum[-1][:, None], psi)
        return psi, r


@torch.no_grad()
def joint_search(model: BFA, enc: torch.Tensor, enc_length: int, beam: int = 8, ctc_weight: float = 0.3, lm=None,
                 lm_weight: float = 0.0, length_bonus: float = 0.0, max_ratio: float = 1.0,
                 pre_beam: int = 0) -> list[tuple[list[int], float]]:
    """Joint CTC/attention beam search over one utterance's encoding ``enc`` [1, >=T, D].

    Each hypothesis scores (1 - ctc_weight) * log P_att + ctc_weight * log psi_ctc + lm_weight * log P_lm
    + length_bonus * |pieces|, the CTC prefix score kept incrementally (:class:`CTCPrefixScorer`). Only the
    ``pre_beam`` (default 1.5 x beam) best pieces by attention (+ LM) per hypothesis are CTC-scored, plus eos,
    so CTC can end what the decoder would continue. It cannot loop: at most ``max_ratio`` x T pieces (T
    encoder frames; eos is forced at the last step), and with ctc_weight > 0 CTC gives no prefix longer than
    what the frames can emit any probability. Returns the finished hypotheses, best first, as (pieces, score)."""
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    if ctc_weight > 0 and model.ctc_head is None:
        raise ValueError("joint decoding with ctc_weight > 0 needs a model trained with a CTC head (model.ctc_weight > 0)")
    use_lm = lm is not None and lm_weight != 0
    if use_lm and lm.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"the LM has {lm.config.vocab_size} pieces, the acoustic model {model.config.vocab_size}: "
                         "they were trained with different tokenizers")
    eos, V1 = model.config.eos, model.config.vocab_size + 1
    T = int(enc_length)
    enc = enc[:1, :T]
    max_len = max(1, int(T * max_ratio))
    att_w = 1.0 - ctc_weight
    dev = enc.device
    state = model.decoder.init_state(enc, torch.tensor([T], device=dev))
    if ctc_weight > 0:
        ctc = CTCPrefixScorer(F.log_softmax(model.ctc_head(enc[0]), dim=-1), eos)
        r, psi = ctc.initial_state(), enc.new_zeros(1)
    lm_dev = next(lm.parameters()).device if use_lm else None
    lm_logp, lm_state = lm.step(torch.tensor([eos], device=lm_dev)) if use_lm else (None, None)
    pre_beam = min(pre_beam or max(beam + 1, int(1.5 * beam)), V1 - 1)
    full_vocab = att_w == 0 and not use_lm            # nothing to pre-prune by: CTC scores every piece
    hyps: list[list[int]] = [[]]
    scores = torch.zeros(1, device=dev)
    finished: list[tuple[list[int], float]] = []
    for i in range(max_len):
        K = len(hyps)
        logits, new_state = model.decoder.step(state, torch.tensor([h[-1] if h else eos for h in hyps], device=dev))
        step = att_w * F.log_softmax(logits, dim=-1) if att_w > 0 else logits.new_zeros(K, V1)
        if use_lm:
            step = step + lm_weight * lm_logp.to(dev)
        if i == max_len - 1:                          # the output bound: every open hypothesis ends here
            cands = torch.full((K, 1), eos, dtype=torch.long, device=dev)
        elif full_vocab:
            cands = torch.arange(V1, device=dev).expand(K, V1)
        else:
            pieces = torch.topk(step.index_fill(1, torch.tensor([eos], device=dev), -math.inf), pre_beam, dim=-1).indices
            cands = torch.cat([pieces, torch.full((K, 1), eos, device=dev)], dim=1)
        total = scores[:, None] + step.gather(1, cands) + length_bonus * (cands != eos)
        if ctc_weight > 0:
            last = torch.tensor([h[-1] if h else -1 for h in hyps], device=dev)
            psi_c, r_c = ctc.score(r, last, i, cands)
            total = total + ctc_weight * (psi_c - psi[:, None])
        C = cands.shape[1]
        best = torch.topk(total.flatten(), min(beam + K, K * C))     # enough for `beam` open ones (K end)
        ends = (cands == eos).flatten().tolist()
        keep_k, keep_j, best_open = [], [], None
        for s, f in zip(best.values.tolist(), best.indices.tolist()):
            k, j = divmod(f, C)
            if ends[f]:
                finished.append((hyps[k], s))
                continue
            keep_k.append(k)
            keep_j.append(j)
            best_open = s if best_open is None else best_open
            if len(keep_k) == beam:
                break
        if not keep_k or len(finished) >= beam:
            break
        # Every later step adds at most length_bonus (log-probabilities and CTC prefix scores only fall),
        # so no open hypothesis can still beat the best finished one: stop.
        if finished and max(s for _, s in finished) >= best_open + max(length_bonus, 0.0) * (max_len - i - 1):
            break
        ki, ji = torch.tensor(keep_k, device=dev), torch.tensor(keep_j, device=dev)
        new_toks = cands[ki, ji]
        hyps = [hyps[k] + [int(t)] for k, t in zip(keep_k, new_toks)]
        scores = total[ki, ji]
        state = _select(new_state, ki)
        if ctc_weight > 0:
            r, psi = r_c[:, :, ki, ji], psi_c[ki, ji]
        if use_lm:
            lk = ki.to(lm_dev)
            lm_logp, lm_state = lm.step(new_toks.to(lm_dev), (lm_state[0][:, lk], lm_state[1][:, lk]))
    return sorted(finished, key=lambda x: -x[1])


@torch.no_grad()
def joint_beam_search(model: BFA, feats, feat_lengths, beam: int = 8, ctc_weight: float = 0.3, lm=None,
                      lm_weight: float = 0.0, length_bonus: float = 0.0, max_ratio: float = 1.0,
                      encoded=None) -> list[list[int]]:
    """:func:`joint_search` for every utterance of a batch (encoded together, searched one by one)."""
    enc_all, enc_lengths = encoded if encoded is not None else model.encode(feats, feat_lengths)
    return [joint_search(model, enc_all[b:b + 1], int(enc_lengths[b]), beam, ctc_weight, lm, lm_weight,
                         length_bonus, max_ratio)[0][0] for b in range(enc_all.shape[0])]


class LexiconDecoder:
    """Phone CTC posteriors -> words (``--method lexicon``): torchaudio's lexicon-constrained CTC beam search
    (flashlight-text) over the words of an ``asr-prep lexicon`` folder, fused with a word n-gram LM (KenLM, from
    ``asr-prep ngram``) at ``lm_weight`` plus ``word_score`` per word. Every output is a word of the lexicon, and an
    unseen word is found from its phones, which the model has heard in other words. ``blank_penalty`` is taken off
    the blank's log-probability in every frame first (as icefall's and sherpa's ``blank_penalty``): where blank
    only narrowly wins, as on reverberant speech, the phones under it are searched instead of the word deleted."""

    def __init__(self, lexicon_dir, ngram=None, lm_weight: float = 1.5, word_score: float = 0.0, beam: int = 50,
                 phone_vocab: int | None = None, nbest: int = 1, blank_penalty: float = 0.0):
        from torchaudio.models.decoder import ctc_decoder
        from .data.lexicon import Lexicon, LexiconError
        lex = Lexicon(lexicon_dir)
        if phone_vocab is not None and len(lex) != phone_vocab:
            raise LexiconError(f"{lex.folder}: {len(lex)} phones, but the model's phone head has {phone_vocab}: "
                               f"decode with the lexicon the model was trained with (its data.lexicon)")
        if ngram is not None and not Path(ngram).is_file():
            raise FileNotFoundError(f"{ngram}: word n-gram LM not found (build it with asr-prep ngram)")
        self.blank_penalty = float(blank_penalty)
        # blank = the model's phone_vocab; "|" is the word boundary flashlight asks for, never emitted (its
        # posterior is set to -1e4): words follow each other directly, as the phones do.
        self.decoder = ctc_decoder(lexicon=str(lex.folder / "lexicon.txt"), tokens=lex.phones + ["<blank>", "|"],
                                   lm=str(ngram) if ngram else None, nbest=nbest, beam_size=beam,
                                   beam_size_token=len(lex) + 2, beam_threshold=25.0, lm_weight=lm_weight,
                                   word_score=word_score, unk_word="<unk>", sil_score=0.0, log_add=False,
                                   blank_token="<blank>", sil_token="|")

    def nbest(self, log_probs: torch.Tensor, lengths: torch.Tensor,
              blank_penalty: float | None = None) -> list[list[tuple[str, float]]]:
        """log_probs [B, T, phone_vocab + 1] (blank last), lengths [B] -> per utterance the n-best (words, score),
        best first (the score: phone log-probabilities, the blank's less the blank penalty (``blank_penalty``, else
        the decoder's own), + lm_weight x n-gram + word_score per word)."""
        B, T, _ = log_probs.shape
        penalty = self.blank_penalty if blank_penalty is None else float(blank_penalty)
        em = torch.cat([log_probs.float().cpu(), torch.full((B, T, 1), -1e4)], dim=-1)
        if penalty:
            em[..., -2] -= penalty                        # the blank: the model's last column, before "|"
        em = em.contiguous()
        results = self.decoder(em, lengths.to(torch.int32).cpu())
        return [[(" ".join(h.words), float(h.score)) for h in r] or [("", 0.0)] for r in results]

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        """The best word string per utterance."""
        return [nb[0][0] for nb in self.nbest(log_probs, lengths)]


@torch.no_grad()
def rescore_lexicon_nbest(model: BFA, tok, enc, enc_lengths, nbest: list[list[tuple[str, float]]],
                          weight: float) -> list[str]:
    """Each utterance's lexicon n-best rescored with the word-piece heads: score + weight x (log P_att + log P_ctc)
    of the words' pieces. The phone path finds words the word pieces never learned; the word pieces still know
    the frequent words and their order, and hear them in noise."""
    out = []
    for b, hyps in enumerate(nbest):
        T = int(enc_lengths[b])
        pieces = [tok.encode(words) for words, _ in hyps]
        att = attention_score(model, enc[b:b + 1], T, pieces)
        ctc = ctc_score(model, enc[b:b + 1], T, pieces)
        totals = [s + weight * (a + c) for (_, s), a, c in zip(hyps, att, ctc)]
        out.append(hyps[max(range(len(hyps)), key=totals.__getitem__)][0])
    return out


METHODS = ("attention", "ctc", "ctc_beam", "joint", "lexicon", "combine")


@torch.no_grad()
def encode(model: BFA, feats: torch.Tensor, feat_lengths: torch.Tensor):
    """``model.encode`` of a batch; a batch with test-time warps ([B, K, T, n_mels], asr.loader.SpeechDataset's
    ``warps``) is encoded as B x K utterances and each utterance's K encoder outputs are averaged. The heads are
    linear, so the CTC heads read the mean of their K logits and the attention decoder the mean encoding: one
    decode per utterance, whatever K."""
    if feats.dim() == 3:
        return model.encode(feats, feat_lengths)
    B, K = feats.shape[:2]
    enc, enc_lengths = model.encode(feats.flatten(0, 1), feat_lengths.repeat_interleave(K))
    return enc.unflatten(0, (B, K)).mean(1), enc_lengths[::K]


class _EncodedMemo:
    """The encoded batches of the last dataset one fixed model decoded in this process: a dev set decoded with
    setting after setting (asr-eval --tune-on) reads its features and runs the encoder once, not once per setting.
    One dataset at a time, so memory stays at one set's encodings (about 40 kB per utterance)."""

    def __init__(self):
        self.model, self.key, self.batches = None, None, {}

    def lookup(self, model, dataset, device) -> dict:
        key = (str(getattr(dataset, "manifest", id(dataset))), tuple(getattr(dataset, "warps", ())),
               getattr(dataset, "dereverb", "off"), tuple(e["id"] for e in dataset.entries), str(device))
        if self.model is None or self.model() is not model or self.key != key:
            import weakref
            self.model, self.key, self.batches = weakref.ref(model), key, {}
        return self.batches


_MEMO = _EncodedMemo()


@torch.no_grad()
def decode_manifest(model: BFA, tok, dataset, methods=("attention",), *, beam: int = 1, ctc_weight: float = 0.0,
                    lm=None, lm_weight: float = 0.0, length_bonus: float = 0.0, att_weight: float = 0.0,
                    max_ratio: float = 1.0, batch_seconds: float = 120.0, shard: tuple[int, int] = (0, 1), progress: str = "",
                    device=None, lexicon_decoder=None, combiner=None, memo: bool = False) -> dict[str, list[dict]]:
    """Decode every utterance of ``dataset`` (this worker's ``shard`` = (rank, size) of its length-sorted
    batches) with each of ``methods``; return per method the rows ``{"id", "ref", "hyp"}``.

    The one decoding loop of the project: the per-epoch dev pass, ``asr-eval`` and the experiment
    scripts all call it. ``dataset`` is indexable like :class:`asr.loader.SpeechDataset` (items or
    ``SkippedItem``; ``durations``, ``entries``). Each batch is encoded once for every method.
    ``attention`` is greedy (``beam`` 1) or beam search (optional CTC rescoring); ``ctc`` is the CTC
    best path; ``ctc_beam`` the CTC prefix beam search with optional LM fusion and attention
    rescoring; ``joint`` the joint CTC/attention beam search (``ctc_weight`` is then CTC's weight in the
    search, ``lm``/``lm_weight``/``length_bonus`` as for ``ctc_beam``; at most ``max_ratio`` x encoder
    frames pieces); ``lexicon`` the phone head's posteriors through ``lexicon_decoder`` (a
    :class:`LexiconDecoder`), its n-best rescored by the word-piece heads at ``att_weight`` (0: not rescored);
    ``combine`` the lexicon and joint n-best lists pooled and reranked by ``combiner`` (an
    :class:`asr.combine.Combiner`; each row also keeps its ``candidates`` with their features).
    An utterance whose audio could not be read gets an empty hypothesis (all its words are errors) and a
    ``skipped`` reason.

    ``memo``: keep this dataset's encoded batches in the process and reuse them when the same model object decodes
    the same dataset again (with another setting). Only for a model whose weights no longer change (asr-eval's);
    a trainer's dev pass, whose model changes between calls, leaves it off."""
    from tqdm import tqdm
    from .loader import collate, eval_batches
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown decoding method(s) {unknown}; expected {METHODS}")
    if model.ctc_head is None and ({"ctc", "ctc_beam"} & set(methods) or "joint" in methods and ctc_weight > 0):
        raise ValueError("CTC decoding needs a model trained with a CTC head (model.ctc_weight > 0)")
    if "lexicon" in methods and (model.phone_head is None or lexicon_decoder is None):
        raise ValueError("--method lexicon needs a model trained with a phone CTC head (model.phone_ctc_weight > 0) "
                         "and a lexicon decoder (asr.decode.LexiconDecoder)")
    if "combine" in methods and (model.phone_head is None or model.ctc_head is None or combiner is None):
        raise ValueError("--method combine needs a model trained with a phone CTC head and a word-piece CTC head "
                         "(model.phone_ctc_weight > 0, model.ctc_weight > 0) and a combiner (asr.combine.Combiner)")
    device = device if device is not None else next(model.parameters()).device
    one_by_one = "attention" in methods and beam > 1           # beam search decodes one utterance at a time
    batches = eval_batches(dataset.durations, 1e-9 if one_by_one else batch_seconds, max_batch=1 if one_by_one else 64)
    rank, size = shard
    rows = {m: [] for m in methods}
    ref_of = {e["id"]: e["text"] for e in dataset.entries}
    model.eval()
    memory = _MEMO.lookup(model, dataset, device) if memo else {}
    for b in tqdm(batches[rank::size], desc=progress or "decode", leave=False, dynamic_ncols=True,
                  disable=not (progress and sys.stderr.isatty())):
        if tuple(b) in memory:
            batch, encoded = memory[tuple(b)]
        else:
            batch = collate([dataset[i] for i in b])
            encoded = encode(model, batch.feats.to(device), batch.flen) if batch.ids else None
            if memo:   # the features are not kept: every method below reads the encoding
                memory[tuple(b)] = (batch._replace(feats=batch.feats[:, :0]), encoded)
        for utt, why in batch.skipped:
            for m in methods:
                rows[m].append({"id": utt, "ref": ref_of[utt], "hyp": "", "skipped": why})
        if not batch.ids:
            continue
        feats, flen = batch.feats.to(device), batch.flen
        for m in methods:
            if m == "lexicon":
                nbest = lexicon_decoder.nbest(*model.phone_log_probs(*encoded))
                words = (rescore_lexicon_nbest(model, tok, *encoded, nbest, att_weight) if att_weight > 0
                         else [nb[0][0] for nb in nbest])
                rows[m] += [{"id": i, "ref": r, "hyp": h} for i, r, h in zip(batch.ids, batch.texts, words)]
                continue
            if m == "combine":
                pools = combiner.candidates(model, tok, *encoded)
                rows[m] += [{"id": i, "ref": r, "hyp": combiner.pick(c), "candidates": c}
                            for i, r, c in zip(batch.ids, batch.texts, pools)]
                continue
            if m == "ctc":
                hyps = ctc_greedy(model, feats, flen, encoded=encoded)
            elif m == "joint":
                hyps = joint_beam_search(model, feats, flen, beam=beam, ctc_weight=ctc_weight, lm=lm, lm_weight=lm_weight,
                                         length_bonus=length_bonus, max_ratio=max_ratio, encoded=encoded)
            elif m == "ctc_beam":
                hyps = ctc_prefix_beam_search(model, feats, flen, beam=beam, lm=lm, lm_weight=lm_weight,
                                              length_bonus=length_bonus, att_weight=att_weight, encoded=encoded)
            elif beam == 1:
                hyps = greedy(model, feats, flen, encoded=encoded)
            else:
                hyps = beam_search(model, feats, flen, beam=beam, ctc_weight=ctc_weight, encoded=encoded)
            rows[m] += [{"id": i, "ref": r, "hyp": tok.decode(h)} for i, r, h in zip(batch.ids, batch.texts, hyps)]
    return rows
