"""BFA: a BiLSTM encoder with max-pool time reduction and a full-attention LSTM decoder over word pieces.

After Kim et al. (ASRU 2019): stacked bidirectional LSTMs read 40-dim features; max-pooling between
the first layers reduces the frame rate (x4 by default); an LSTM decoder attends over all encoder
frames (additive or location-aware attention) and emits sentencepiece word pieces. An optional CTC
head on the encoder gives joint CTC-attention training and CTC rescoring at decode time.

Token layout: word pieces 0..V-1 from sentencepiece, ``eos = V`` (also the decoder's start
symbol), and for CTC ``blank = V`` as well (CTC never emits eos, attention never emits blank, and
the two heads are separate layers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..frontend.settings import N_MELS


@dataclass
class BFAConfig:
    """The model's settings; also the recipe config's ``model`` section, so each default exists once.
    ``vocab_size`` and ``feat_dim`` come from the tokenizer and the feature statistics (0: take them)."""
    vocab_size: int = 0                   # sentencepiece pieces (without eos)
    feat_dim: int = N_MELS                # the front end's default mel bands
    enc_hidden: int = 256                 # per direction
    enc_layers: int = 4
    residual: bool = False                # encoder layers after the first add their input to their output
    pool_after: list = field(default_factory=lambda: [0, 1])   # max-pool x2 after these encoder layers
    frame_stack: int = 1                  # stack k frames into one before the first layer (x k reduction)
    dec_hidden: int = 256
    dec_layers: int = 1
    emb_dim: int = 128
    att_dim: int = 256
    attention: str = "location"           # "additive", "location" or "dot" (scaled dot product of the projected
                                          # query and keys: no tanh over [B, L, T, A])
    dec_input_feeding: bool = True        # the last context goes into the decoder cell with the token. False with
                                          # additive or dot attention: nothing feeds back but the cell's own state, so
                                          # training runs the cell over all word pieces at once (fused kernel) and
                                          # attends for all of them in one batch
    loc_channels: int = 10
    loc_kernel: int = 31
    dropout: float = 0.1
    fused_lstm: bool = True               # padded batches on the fused LSTM kernel (False: packed sequences)
    ctc_weight: float = 0.3               # 0 disables the CTC head
    phone_vocab: int = 0                  # phones of the lexicon (data.lexicon); 0: take them
    phone_ctc_weight: float = 0.0         # > 0: a phone CTC head on the encoder, its loss added with this weight
    phone_upsample: int = 2               # output frames per encoder frame for the phone head (x8 reduction leaves
                                          # 12.5 frames/s; speech has 10-15 phones/s, CTC needs a frame each and more)
    label_smoothing: float = 0.1

    @property
    def eos(self) -> int:
        return self.vocab_size


def reversal_index(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """[B, T] time index that reverses each sequence within its own length and leaves its padding in
    place (an involution: applying it twice gives the identity)."""
    t = torch.arange(T, device=lengths.device)[None, :]
    L = lengths.to(t.device)[:, None]
    return torch.where(t < L, L - 1 - t, t)


def bilstm_padded(lstm: nn.LSTM, x: torch.Tensor, order: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A bidirectional one-layer ``lstm`` over a padded batch, on the fused (cuDNN / MKL) kernel.

    Packed sequences of mixed lengths make PyTorch's CPU LSTM step time by time; a padded batch runs
    the fused kernel. The forward direction reads the padded batch as is (padding comes after each
    sequence, so it cannot reach a valid output); the backward direction reads each sequence reversed
    within its own length (``order``), so it starts at the sequence's last frame, not at padding.
    Padded outputs are zeroed, as ``pad_packed_sequence`` leaves them. Same parameters as the packed
    path; the outputs agree to rounding."""
    w = lstm._flat_weights
    fwd, bwd = w[:4], w[4:8]
    h0 = x.new_zeros(1, x.shape[0], lstm.hidden_size)
    gather = order[:, :, None]
    out_f = torch._VF.lstm(x, (h0, h0), fwd, True, 1, 0.0, lstm.training, False, True)[0]
    x_rev = x.gather(1, gather.expand(-1, -1, x.shape[2]))
    out_b = torch._VF.lstm(x_rev, (h0, h0), bwd, True, 1, 0.0, lstm.training, False, True)[0]
    out_b = out_b.gather(1, gather.expand(-1, -1, out_b.shape[2]))
    valid = (torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None])[:, :, None]
    return torch.cat([out_f, out_b], dim=2) * valid


class Encoder(nn.Module):
    """BiLSTM stack. Time reduction: ``frame_stack`` (k consecutive frames concatenated before the first
    layer, as in low-frame-rate LAS models) times x2 per max-pool in ``pool_after``. Stacking is the
    cheap reduction: every LSTM layer, the first included, runs at the reduced rate, which is what
    makes training on a CPU fast enough; max-pooling is the paper's."""

    def __init__(self, c: BFAConfig):
        super().__init__()
        if c.frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1, got {c.frame_stack}")
        bad = [i for i in c.pool_after if not 0 <= i < c.enc_layers]
        if bad:
            raise ValueError(f"pool_after {list(c.pool_after)}: layers must be in 0..{c.enc_layers - 1}")
        self.stack = c.frame_stack
        self.layers = nn.ModuleList()
        dim = c.feat_dim * c.frame_stack
        for _ in range(c.enc_layers):
            self.layers.append(nn.LSTM(dim, c.enc_hidden, batch_first=True, bidirectional=True))
            dim = 2 * c.enc_hidden
        self.pool_after = set(c.pool_after)
        self.dropout = nn.Dropout(c.dropout)
        self.out_dim = dim
        self.fused = c.fused_lstm
        self.feat_dim = c.feat_dim
        self.residual = c.residual

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        if x.dim() != 3 or x.shape[-1] != self.feat_dim:
            # Checked here: the fused CPU LSTM kernel does not check its input width and crashes the process.
            raise ValueError(f"BFA encoder: expected features [batch, frames, {self.feat_dim}] (model.feat_dim), got "
                             f"{list(x.shape)}; were the features made with other settings than the model's?")
        if self.stack > 1:
            B, T, D = x.shape
            pad = (-T) % self.stack
            if pad:
                x = F.pad(x, (0, 0, 0, pad))
            x = x.reshape(B, (T + pad) // self.stack, D * self.stack)
            lengths = (lengths + self.stack - 1) // self.stack
        order = reversal_index(lengths, x.shape[1]) if self.fused else None
        for i, lstm in enumerate(self.layers):
            inp = x
            if self.fused:
                x = bilstm_padded(lstm, x, order, lengths)
            else:
                packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
                x, _ = lstm(packed)
                x, _ = pad_packed_sequence(x, batch_first=True, total_length=inp.shape[1])
            x = self.dropout(x)
            if self.residual and i > 0:
                x = x + inp
            if i in self.pool_after:
                if x.shape[1] % 2:
                    x = F.pad(x, (0, 0, 0, 1))
                x = F.max_pool1d(x.transpose(1, 2), kernel_size=2, stride=2).transpose(1, 2)
                lengths = (lengths + 1) // 2
                if self.fused:
                    order = reversal_index(lengths, x.shape[1])
        return x, lengths

    def reduction(self) -> int:
        return self.stack * 2 ** len(self.pool_after)


class Attention(nn.Module):
    """Additive (Bahdanau) attention, optionally location-aware (Chorowski et al., 2015), or the scaled dot product
    of the projected query and keys (Luong's "general" score; a matmul where additive needs a tanh per frame)."""

    def __init__(self, c: BFAConfig, enc_dim: int):
        super().__init__()
        if c.attention not in ("additive", "location", "dot"):
            raise ValueError(f"model.attention must be 'additive', 'location' or 'dot', got {c.attention!r}")
        self.enc_proj = nn.Linear(enc_dim, c.att_dim)
        self.dec_proj = nn.Linear(c.dec_hidden, c.att_dim, bias=False)
        self.dot = c.attention == "dot"
        self.scale = c.att_dim ** -0.5
        if not self.dot:
            self.v = nn.Linear(c.att_dim, 1, bias=False)
        self.location = c.attention == "location"
        if self.location:
            self.loc_conv = nn.Conv1d(1, c.loc_channels, c.loc_kernel, padding=c.loc_kernel // 2, bias=False)
            self.loc_proj = nn.Linear(c.loc_channels, c.att_dim, bias=False)

    def location_matrix(self) -> torch.Tensor:
        """The location filter and its projection as one [kernel, att_dim] matrix: both are linear and bias-free,
        so conv-then-project equals one matmul of each frame's window of the previous weights with this matrix.
        Teacher forcing builds it once per batch instead of running a conv and a linear at every output step."""
        return (self.loc_proj.weight @ self.loc_conv.weight.squeeze(1)).t()

    def forward(self, enc_keys, enc, mask, query, prev_weights, loc_matrix=None):
        """enc_keys: projected encoder [B,T,A]; mask: [B,T] True on valid frames; query: [B,H]; loc_matrix: this
        module's location_matrix() when the caller has it (else it is built here)."""
        if self.dot:
            return self._dot(enc_keys, enc, mask, self.dec_proj(query).unsqueeze(1))
        e = enc_keys + self.dec_proj(query).unsqueeze(1)
        if self.location:
            m = self.location_matrix() if loc_matrix is None else loc_matrix
            half = m.shape[0] // 2
            windows = F.pad(prev_weights, (half, half)).unfold(1, m.shape[0], 1)     # [B, T, kernel]
            e = e + windows @ m
        scores = self.v(torch.tanh(e)).squeeze(-1).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        context = torch.bmm(weights.unsqueeze(1), enc).squeeze(1)
        return context, weights

    def attend_all(self, enc_keys, enc, mask, queries):
        """Additive attention for L queries at once [B, L, H]: the contexts [B, L, D] that L calls of forward()
        give (without location there is nothing from one call in the next)."""
        if self.location:
            raise ValueError("attend_all: location-aware attention depends on the previous step's weights")
        if self.dot:
            return self._dot(enc_keys, enc, mask, self.dec_proj(queries), all_queries=True)
        e = enc_keys.unsqueeze(1) + self.dec_proj(queries).unsqueeze(2)                 # [B, L, T, A]
        scores = self.v(torch.tanh(e)).squeeze(-1).masked_fill(~mask.unsqueeze(1), float("-inf"))
        return torch.softmax(scores, dim=-1) @ enc

    def _dot(self, enc_keys, enc, mask, q, all_queries=False):
        """Scaled dot-product attention of projected queries q [B, L, A] over the keys: the contexts [B, L, D]
        (all_queries) or, for one query (L = 1), the context [B, D] and the weights [B, T] as forward() returns."""
        scores = (q @ enc_keys.transpose(1, 2) * self.scale).masked_fill(~mask.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores, dim=-1)                                          # [B, L, T]
        contexts = weights @ enc
        return contexts if all_queries else (contexts.squeeze(1), weights.squeeze(1))


class Decoder(nn.Module):
    def __init__(self, c: BFAConfig, enc_dim: int):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab_size + 1, c.emb_dim)
        first = c.emb_dim + (enc_dim if c.dec_input_feeding else 0)
        self.cells = nn.ModuleList(
            nn.LSTMCell(first if i == 0 else c.dec_hidden, c.dec_hidden) for i in range(c.dec_layers))
        self.feeding = c.dec_input_feeding
        self.attention = Attention(c, enc_dim)
        self.out = nn.Linear(c.dec_hidden + enc_dim, c.vocab_size + 1)
        self.dropout = nn.Dropout(c.dropout)
        self.enc_dim = enc_dim

    def init_state(self, enc, enc_lengths):
        B, T, _ = enc.shape
        mask = torch.arange(T, device=enc.device)[None, :] < enc_lengths[:, None]
        zeros = enc.new_zeros(B, self.c.dec_hidden)
        hidden = [(zeros, zeros) for _ in self.cells]
        weights = mask.float() / enc_lengths[:, None].float()
        context = enc.new_zeros(B, self.enc_dim)
        return {"keys": self.attention.enc_proj(enc), "enc": enc, "mask": mask, "hidden": hidden,
                "weights": weights, "context": context}

    def _advance(self, state, emb, loc_matrix=None):
        """The recurrent part of one step (cells, attention) from the previous token's embedding: returns the top
        cell's output before dropout and the new state (the old one is not modified)."""
        x = torch.cat([emb, state["context"]], dim=-1) if self.feeding else emb
        hidden = []
        for i, cell in enumerate(self.cells):
            h, c = cell(x, state["hidden"][i])
            hidden.append((h, c))
            x = self.dropout(h) if i + 1 < len(self.cells) else h
        context, weights = self.attention(state["keys"], state["enc"], state["mask"], x, state["weights"], loc_matrix)
        return x, dict(state, hidden=hidden, context=context, weights=weights)

    def step(self, state, prev_tokens):
        """One decoder step: returns logits [B, V+1] and the new state (the old one is not modified)."""
        h, new = self._advance(state, self.embed(prev_tokens))
        return self.out(torch.cat([self.dropout(h), new["context"]], dim=-1)), new

    def forward(self, enc, enc_lengths, targets_in):
        """Teacher forcing: targets_in [B, L] starts with eos (the start symbol). The same arithmetic as L calls of
        step(), with what does not feed back into the recurrence (the embedding lookup, the top dropout and the
        output layer) done once for all L steps."""
        state = self.init_state(enc, enc_lengths)
        emb = self.embed(targets_in)
        if not self.feeding and not self.attention.location:
            return self._forward_parallel(state, emb)
        loc_matrix = self.attention.location_matrix() if self.attention.location else None
        tops, contexts = [], []
        for t in range(targets_in.shape[1]):
            h, state = self._advance(state, emb[:, t], loc_matrix)
            tops.append(h)
            contexts.append(state["context"])
        return self.out(torch.cat([self.dropout(torch.stack(tops, dim=1)), torch.stack(contexts, dim=1)], dim=-1))

    def _forward_parallel(self, state, emb):
        """Teacher forcing without feedback: each cell over all L word pieces on the fused LSTM kernel (the cells'
        own weights), then one batched attention; the same arithmetic as L calls of step()."""
        x = emb
        h0 = emb.new_zeros(1, emb.shape[0], self.c.dec_hidden)
        for i, cell in enumerate(self.cells):
            w = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
            x = torch._VF.lstm(x, (h0, h0), w, True, 1, 0.0, self.training, False, True)[0]
            if i + 1 < len(self.cells):
                x = self.dropout(x)
        contexts = self.attention.attend_all(state["keys"], state["enc"], state["mask"], x)
        return self.out(torch.cat([self.dropout(x), contexts], dim=-1))


class BFA(nn.Module):
    def __init__(self, config: BFAConfig):
        super().__init__()
        if config.vocab_size < 1:
            raise ValueError(f"BFAConfig.vocab_size must be >= 1 (the tokenizer's pieces), got {config.vocab_size}")
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config, self.encoder.out_dim)
        self.ctc_head = nn.Linear(self.encoder.out_dim, config.vocab_size + 1) if config.ctc_weight > 0 else None
        self.phone_head = None
        if config.phone_ctc_weight > 0:
            if config.phone_vocab < 1 or config.phone_upsample < 1:
                raise ValueError(f"model.phone_ctc_weight > 0 needs phone_vocab >= 1 (the lexicon's phones) and "
                                 f"phone_upsample >= 1, got {config.phone_vocab} and {config.phone_upsample}")
            self.phone_head = nn.Linear(self.encoder.out_dim, config.phone_upsample * (config.phone_vocab + 1))

    def phone_log_probs(self, enc, enc_lengths):
        """Phone CTC log-probabilities [B, T * phone_upsample, phone_vocab + 1] (blank last) and their lengths:
        each encoder frame gives ``phone_upsample`` output frames (a linear map to all of them at once)."""
        c = self.config
        B, T, _ = enc.shape
        logits = self.phone_head(enc).reshape(B, T * c.phone_upsample, c.phone_vocab + 1)
        return F.log_softmax(logits, dim=-1), enc_lengths * c.phone_upsample

    def encode(self, feats, feat_lengths):
        # Lengths follow the features to their device (the loader makes them on the CPU); packing
        # takes its own CPU copy.
        return self.encoder(feats, feat_lengths.to(feats.device))

    def forward(self, feats, feat_lengths, tokens, token_lengths, phones=None, phone_lengths=None):
        """Returns (loss, stats). tokens: [B, L] word pieces padded with -1; token_lengths: [B]; phones,
        phone_lengths: the same for the lexicon's phones (needed when the model has a phone head)."""
        c = self.config
        enc, enc_lengths = self.encode(feats, feat_lengths)
        B, L = tokens.shape
        eos = torch.full((B, 1), c.eos, dtype=tokens.dtype, device=tokens.device)
        valid = tokens >= 0
        tokens0 = tokens.masked_fill(~valid, c.eos)
        targets_in = torch.cat([eos, tokens0], dim=1)                          # eos y1 .. yL
        targets_out = torch.cat([tokens, torch.full_like(eos, -1)], dim=1)     # y1 .. yL eos
        targets_out[torch.arange(B, device=tokens.device), token_lengths] = c.eos
        logits = self.decoder(enc, enc_lengths, targets_in)
        att_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets_out.reshape(-1),
                                   ignore_index=-1, label_smoothing=c.label_smoothing)
        stats = {"att_loss": float(att_loss.detach())}
        loss = att_loss
        if self.ctc_head is not None:
            log_probs = F.log_softmax(self.ctc_head(enc), dim=-1).transpose(0, 1)   # [T, B, V+1]
            ctc_loss = F.ctc_loss(log_probs, tokens0, enc_lengths, token_lengths, blank=c.eos,
                                  reduction="mean", zero_infinity=True)
            stats["ctc_loss"] = float(ctc_loss.detach())
            loss = (1 - c.ctc_weight) * att_loss + c.ctc_weight * ctc_loss
        if self.phone_head is not None:
            if phones is None or phone_lengths is None:
                raise ValueError("BFA: this model has a phone CTC head (model.phone_ctc_weight > 0); give phones and "
                                 "phone_lengths (the loader makes them from data.lexicon)")
            lp, lp_lengths = self.phone_log_probs(enc, enc_lengths)
            phone_loss = F.ctc_loss(lp.transpose(0, 1), phones.clamp_min(0), lp_lengths, phone_lengths,
                                    blank=c.phone_vocab, reduction="mean", zero_infinity=True)
            stats["phone_ctc_loss"] = float(phone_loss.detach())
            loss = loss + c.phone_ctc_weight * phone_loss
        with torch.no_grad():
            pred = logits.argmax(-1)
            mask = targets_out >= 0
            stats["acc"] = float(((pred == targets_out) & mask).sum() / mask.sum().clamp_min(1))
        stats["loss"] = float(loss.detach())
        return loss, stats


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
