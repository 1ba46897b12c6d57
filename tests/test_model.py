"""Issue 7: the BFA model's shapes, time reduction, losses and decoders (no Horovod, no audio)."""
import pytest
import torch

from asr.decode import beam_search, ctc_greedy, greedy
from asr.models.bfa import BFA, BFAConfig


def tiny(**kw):
    base = dict(vocab_size=12, enc_hidden=8, enc_layers=2, dec_hidden=8, emb_dim=4, att_dim=8, loc_channels=2,
                loc_kernel=3, dropout=0.0)
    base.update(kw)
    torch.manual_seed(0)
    return BFA(BFAConfig(**base)).eval()


def batch(lengths=(23, 10), n_tokens=(4, 2)):
    feats = torch.randn(len(lengths), max(lengths), 40)
    for i, n in enumerate(lengths):
        feats[i, n:] = 0
    tokens = torch.full((len(lengths), max(n_tokens)), -1)
    for i, n in enumerate(n_tokens):
        tokens[i, :n] = torch.arange(n) % 12
    return feats, torch.tensor(lengths), tokens, torch.tensor(n_tokens)


@pytest.mark.parametrize("stack,pools", [(1, [0, 1]), (4, [0]), (3, []), (2, [0, 1])])
def test_time_reduction_is_frame_stack_times_pools(stack, pools):
    model = tiny(frame_stack=stack, pool_after=pools)
    feats, flen, _, _ = batch()
    enc, elen = model.encode(feats, flen)
    r = model.encoder.reduction()
    assert r == stack * 2 ** len(pools)
    for n, e in zip(flen.tolist(), elen.tolist()):
        expected = -(-n // stack)                 # ceil after stacking, then ceil after each pool
        for _ in pools:
            expected = -(-expected // 2)
        assert e == expected
    assert enc.shape == (2, int(elen.max()), 16)


def test_padding_does_not_change_an_utterance_encoding():
    model = tiny(frame_stack=4, pool_after=[0])
    feats, flen, _, _ = batch()
    enc, elen = model.encode(feats, flen)
    alone, alone_len = model.encode(feats[1:, :10], flen[1:])
    assert int(alone_len[0]) == int(elen[1])
    torch.testing.assert_close(alone[0, :int(alone_len[0])], enc[1, :int(elen[1])])


@pytest.mark.parametrize("attention,feeding", [("location", True), ("dot", False)])
def test_joint_loss_and_decoders_run_on_a_batch(attention, feeding):
    model = tiny(frame_stack=2, pool_after=[0], ctc_weight=0.5, attention=attention, dec_input_feeding=feeding)
    feats, flen, tokens, tlen = batch()
    model.train()
    loss, stats = model(feats, flen, tokens, tlen)
    loss.backward()
    assert torch.isfinite(loss) and {"att_loss", "ctc_loss", "acc", "loss"} <= set(stats)
    assert stats["loss"] == pytest.approx(0.5 * stats["att_loss"] + 0.5 * stats["ctc_loss"], rel=1e-5)
    model.eval()
    for hyps in (greedy(model, feats, flen), ctc_greedy(model, feats, flen),
                 beam_search(model, feats, flen, beam=2, ctc_weight=0.3)):
        assert len(hyps) == 2 and all(0 <= t < 12 for h in hyps for t in h)


def test_an_unknown_attention_is_refused_by_name():
    with pytest.raises(ValueError, match="model.attention must be 'additive', 'location' or 'dot', got 'dott'"):
        tiny(attention="dott")


def test_ctc_greedy_merges_repeats_and_drops_blanks():
    model = tiny(frame_stack=1, pool_after=[], ctc_weight=0.3)
    blank = model.config.eos
    path = [blank, 3, 3, blank, 3, 5, 5, blank]
    # Fix the CTC posteriors: the "encoder" returns the logits of this path and the head passes them on.
    logits = torch.full((1, len(path), 13), -10.0)
    for t, k in enumerate(path):
        logits[0, t, k] = 10.0
    model.encode = lambda f, l: (logits, torch.tensor([len(path)]))
    model.ctc_head = torch.nn.Identity()
    assert ctc_greedy(model, torch.zeros(1, len(path), 40), torch.tensor([len(path)])) == [[3, 3, 5]]


def test_residual_encoder_adds_each_later_layer_input_to_its_output():
    plain = tiny(frame_stack=2, pool_after=[], enc_layers=3)
    res = tiny(frame_stack=2, pool_after=[], enc_layers=3, residual=True)
    res.load_state_dict(plain.state_dict())
    feats, flen, _, _ = batch()
    x = torch.cat([feats, feats.new_zeros(2, 1, 40)], dim=1).reshape(2, 12, 80)   # 2 frames stacked (23 -> 24)
    lengths = (flen + 1) // 2
    from asr.models.bfa import bilstm_padded, reversal_index
    order = reversal_index(lengths, 12)
    h0 = bilstm_padded(res.encoder.layers[0], x, order, lengths)          # the first layer: no residual
    h1 = h0 + bilstm_padded(res.encoder.layers[1], h0, order, lengths)
    h2 = h1 + bilstm_padded(res.encoder.layers[2], h1, order, lengths)
    enc, _ = res.encode(feats, flen)
    torch.testing.assert_close(enc, h2)
    assert not torch.allclose(enc, plain.encode(feats, flen)[0])


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="frame_stack"):
        tiny(frame_stack=0)
    with pytest.raises(ValueError, match="pool_after"):
        tiny(pool_after=[5])


def test_features_of_the_wrong_width_are_refused_not_crashed_on():
    model = tiny(frame_stack=2, pool_after=[0])
    feats, flen, _, _ = batch()
    with pytest.raises(ValueError, match=r"expected features \[batch, frames, 40\].*got \[2, 23, 80\]"):
        model.encode(torch.cat([feats, feats], dim=-1), flen)


@pytest.mark.parametrize("stack,pools,residual", [(1, [0, 1], False), (4, [0], False), (3, [], False), (4, [0], True)])
def test_fused_padded_bilstm_equals_the_packed_path(stack, pools, residual):
    """Issue 15: padded batches on the fused LSTM kernel, the backward direction reversed within each
    sequence's length, give the packed path's outputs and gradients (to rounding), padding zeroed."""
    feats, flen, tokens, tlen = batch(lengths=(37, 12, 29), n_tokens=(4, 2, 3))
    results = {}
    for fused in (False, True):
        model = tiny(frame_stack=stack, pool_after=pools, fused_lstm=fused, residual=residual).train()
        enc, enc_len = model.encode(feats, flen)
        loss, _ = model(feats, flen, tokens, tlen)
        loss.backward()
        results[fused] = (enc.detach(), enc_len, {n: p.grad.clone() for n, p in model.named_parameters()})
    (e0, l0, g0), (e1, l1, g1) = results[False], results[True]
    assert torch.equal(l0, l1) and e0.shape == e1.shape
    assert torch.allclose(e0, e1, atol=1e-6), float((e0 - e1).abs().max())
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-5, rtol=1e-4), (n, float((g0[n] - g1[n]).abs().max()))
    valid = torch.arange(e1.shape[1])[None, :] < l1[:, None]
    assert float(e1[~valid].abs().max()) == 0.0


@pytest.mark.parametrize("attention,layers,feeding", [("location", 1, True), ("location", 2, True),
                                                      ("additive", 1, True), ("additive", 1, False),
                                                      ("additive", 2, False), ("location", 1, False),
                                                      ("dot", 1, True), ("dot", 1, False), ("dot", 2, False)])
def test_teacher_forcing_equals_step_by_step_decoding(attention, layers, feeding):
    """Decoder.forward hoists the embedding, the top dropout and the output layer out of its loop and folds the
    location filter into one matrix; without input feeding and location it runs all word pieces at once. Its
    logits must be those of step() called once per token."""
    model = tiny(frame_stack=2, pool_after=[0], attention=attention, dec_layers=layers, loc_kernel=5,
                 dec_input_feeding=feeding)
    feats, flen, tokens, tlen = batch(lengths=(37, 12, 29), n_tokens=(4, 2, 3))
    enc, elen = model.encode(feats, flen)
    targets_in = torch.cat([torch.full((3, 1), model.config.eos), tokens.clamp(min=0)], dim=1)
    forced = model.decoder(enc, elen, targets_in)
    state, steps = model.decoder.init_state(enc, elen), []
    for t in range(targets_in.shape[1]):
        logits, state = model.decoder.step(state, targets_in[:, t])
        steps.append(logits)
    torch.testing.assert_close(forced, torch.stack(steps, dim=1), atol=1e-6, rtol=1e-5)


def test_location_matrix_equals_the_filter_then_the_projection():
    att = tiny(loc_kernel=7, loc_channels=3, att_dim=5).decoder.attention
    prev = torch.softmax(torch.randn(2, 11), dim=-1)
    conv_then_proj = att.loc_proj(att.loc_conv(prev.unsqueeze(1)).transpose(1, 2))
    windows = torch.nn.functional.pad(prev, (3, 3)).unfold(1, 7, 1)
    torch.testing.assert_close(windows @ att.location_matrix(), conv_then_proj, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_schedule_ends_at_the_final_lr_and_epoch_decay_is_unchanged(schedule):
    """Issue 15: cosine/linear schedules run from the peak (after warm-up) to final_lr at the end of the
    budget; the per-epoch decay is as before."""
    from asr.train import lr_factor
    assert lr_factor(0, 0, 10, 0.9, schedule, 0.0, 0.05) == pytest.approx(0.1)          # warm-up
    assert lr_factor(50, 0, 10, 0.9, schedule, 0.0, 0.05) == pytest.approx(1.0)
    assert lr_factor(50, 3, 10, 0.9, schedule, 0.5, 0.05) == pytest.approx(0.525)       # half-way: both shapes
    assert lr_factor(50, 3, 10, 0.9, schedule, 1.0, 0.05) == pytest.approx(0.05)        # the end value
    assert lr_factor(50, 3, 10, 0.9, schedule, 7.0, 0.05) == pytest.approx(0.05)        # past the end: clamped
    assert lr_factor(50, 2, 10, 0.9) == pytest.approx(0.81)


def test_flush_subnormals_reads_and_writes_them_as_zero_and_can_be_undone():
    """train.flush_denormal: a subnormal operand counts as zero and a subnormal result becomes zero; off, both
    are kept (the default of a fresh process, restored here so no other test sees the flag)."""
    from asr.train import flush_subnormals
    tiny = torch.finfo(torch.float32).tiny
    sub = torch.tensor([tiny / 4])
    try:
        assert flush_subnormals(True)
        assert (sub * 1.0).item() == 0.0 and (torch.tensor([tiny]) / 4).item() == 0.0
        assert (torch.tensor([tiny]) * 2).item() == 2 * tiny                  # normal values are untouched
    finally:
        assert not flush_subnormals(False)
    assert (sub * 1.0).item() == pytest.approx(tiny / 4) and (torch.tensor([tiny]) / 4).item() > 0
