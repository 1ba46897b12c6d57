"""A word-piece LSTM language model for shallow fusion at decode time.

The paper decodes its BFA model with an RNN-LM trained on text only; this is that LM at CPU size. It shares
the acoustic model's token layout (pieces 0..V-1 from the same sentencepiece model, ``eos = V`` as both the
start and the end symbol), so its scores add directly to the CTC and attention scores of a hypothesis.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LMConfig:
    vocab_size: int                 # sentencepiece pieces (without eos)
    emb_dim: int = 128
    hidden: int = 256
    layers: int = 1
    dropout: float = 0.1

    @property
    def eos(self) -> int:
        return self.vocab_size


class PieceLM(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size + 1, config.emb_dim)
        self.lstm = nn.LSTM(config.emb_dim, config.hidden, config.layers, batch_first=True,
                            dropout=config.dropout if config.layers > 1 else 0.0)
        self.dropout = nn.Dropout(config.dropout)
        self.out = nn.Linear(config.hidden, config.vocab_size + 1)

    def forward(self, tokens_in: torch.Tensor, state=None):
        """tokens_in [B, L] (eos first) -> logits [B, L, V+1] and the LSTM state."""
        x, state = self.lstm(self.dropout(self.embed(tokens_in)), state)
        return self.out(self.dropout(x)), state

    def _shifted(self, tokens: torch.Tensor, lengths: torch.Tensor):
        """Inputs (eos y1 .. yL) and targets (y1 .. yL eos, -1 on padding) for ``tokens`` padded with -1."""
        B = tokens.shape[0]
        eos = torch.full((B, 1), self.config.eos, dtype=torch.long, device=tokens.device)
        tin = torch.cat([eos, tokens.clamp_min(0)], dim=1)
        tout = torch.cat([tokens, torch.full_like(eos, -1)], dim=1)
        tout[torch.arange(B, device=tokens.device), lengths.to(tokens.device)] = self.config.eos
        return tin, tout

    def loss(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Summed negative log-likelihood of ``tokens`` [B, L] (padded with -1) plus eos, and the token count."""
        tin, tout = self._shifted(tokens, lengths)
        logits, _ = self(tin)
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tout.reshape(-1), ignore_index=-1,
                              reduction="sum")
        return nll, int((tout >= 0).sum())

    @torch.no_grad()
    def step(self, prev: torch.Tensor, state=None):
        """One token per row: log-probabilities of the next piece [B, V+1] and the new state."""
        logits, state = self(prev[:, None], state)
        return F.log_softmax(logits[:, 0], dim=-1), state

    @torch.no_grad()
    def score(self, hyps: list[list[int]]) -> list[float]:
        """log P(hyp + eos) of each piece sequence."""
        if not hyps:
            return []
        dev = self.embed.weight.device
        tin, tout = self._shifted(*(t.to(dev) for t in pad_pieces(hyps)))
        logp = F.log_softmax(self(tin)[0], dim=-1)
        picked = logp.gather(-1, tout.clamp_min(0)[..., None])[..., 0] * (tout >= 0)
        return picked.sum(-1).tolist()


def pad_pieces(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Piece sequences as a (batch, longest) tensor padded with -1, and their lengths."""
    tokens = torch.full((len(seqs), max(len(s) for s in seqs)), -1, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return tokens, torch.tensor([len(s) for s in seqs])


def save_lm(model: PieceLM, path, **extra) -> None:
    """Atomic (asr.checkpoint.atomic_save), so a crash never leaves half an LM; ``extra`` must be plain data."""
    from ..checkpoint import atomic_save
    atomic_save({"model": model.state_dict(), "lm_config": asdict(model.config), **extra}, path)


def load_lm(path) -> tuple[PieceLM, dict]:
    """The LM and its saved metadata; an unreadable or foreign file raises asr.checkpoint.CheckpointError (a
    ValueError) naming it."""
    from ..checkpoint import load_checkpoint
    ckpt = load_checkpoint(path, expect_keys=("model", "lm_config"), what="a language model written by asr-lm")
    model = PieceLM(LMConfig(**ckpt["lm_config"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    return model, ckpt
