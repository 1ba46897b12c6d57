"""Decoding for the BFA model: batched greedy search and beam search (optional CTC rescoring), and CTC best path."""
from __future__ import annotations

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


def _select(state, idx):
    out = {}
    for k, v in state.items():
        if k == "hidden":
            out[k] = [(h[idx], c[idx]) for h, c in v]
        else:
            out[k] = v[idx]
    return out


@torch.no_grad()
def ctc_score(model: BFA, enc, enc_length, hyps: list[list[int]]) -> list[float]:
    """log P_ctc(hyp | audio) of each hypothesis for one utterance."""
    if model.ctc_head is None or not hyps:
        return [0.0] * len(hyps)
    lp = F.log_softmax(model.ctc_head(enc[:1, :enc_length]), dim=-1)     # [1, T, V+1]
    n = len(hyps)
    lp = lp.expand(n, -1, -1).transpose(0, 1)
    lens = torch.tensor([max(len(h), 1) for h in hyps])
    targets = torch.tensor([t for h in hyps for t in (h or [0])])
    nll = F.ctc_loss(lp, targets, torch.full((n,), int(enc_length)), lens, blank=model.config.eos,
                     reduction="none", zero_infinity=True)
    return [-float(x) for x in nll]


@torch.no_grad()
def beam_search(model: BFA, feats, feat_lengths, beam: int = 4, length_bonus: float = 0.0,
                ctc_weight: float = 0.0, max_ratio: float = 1.0) -> list[list[int]]:
    """Beam search per utterance; scores are attention log-probabilities (+ length_bonus per piece),
    and with ``ctc_weight`` > 0 the final beam is rescored with (1-w)*attention + w*CTC."""
    eos = model.config.eos
    enc_all, enc_lengths = model.encode(feats, feat_lengths)
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
