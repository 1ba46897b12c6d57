"""Issue 15: bf16 autocast in CPU training (train.amp=bf16 where the CPU has native bf16) and training batches padded
to a multiple of frames (train.pad_frames), so that oneDNN's bf16 LSTM kernels are built once per shape."""

import os

import pytest
import torch

from asr.config import ConfigError, load_config
from asr.loader import collate
from asr.models.bfa import BFA, BFAConfig
from asr.train import cpu_has_native_bf16, size_onednn_cache


def cpu_small_like(seed=0):
    """cpu-small's structure at a tenth of its width: 4 stacked frames, a max-pool, residual layers, additive
    attention with nothing fed back, joint CTC and a phone CTC head."""
    torch.manual_seed(seed)
    return BFA(BFAConfig(vocab_size=20, enc_hidden=16, enc_layers=3, residual=True, frame_stack=4, pool_after=[0],
                         dec_hidden=16, emb_dim=8, att_dim=16, attention="additive", dec_input_feeding=False,
                         ctc_weight=0.5, phone_vocab=7, phone_ctc_weight=1.0, dropout=0.0, label_smoothing=0.1))


def items(lengths=(53, 37, 20), seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(f"u{i}", torch.randn(n, 40, generator=g), [1 + (i + k) % 19 for k in range(3 + i)], f"t{i}")
            for i, n in enumerate(lengths)]


def forward(model, b, phones):
    return model(b.feats, b.flen, b.toks, b.tlen, *phones)


def test_collate_pads_frames_to_a_multiple_and_keeps_each_length():
    plain, padded = collate(items()), collate(items(), pad_frames=16)
    assert plain.feats.shape == (3, 53, 40) and padded.feats.shape == (3, 64, 40)
    assert torch.equal(padded.flen, plain.flen) and torch.equal(padded.flen, torch.tensor([53, 37, 20]))
    assert torch.equal(padded.feats[:, :53], plain.feats) and not padded.feats[:, 53:].any()
    assert collate(items((48, 32)), pad_frames=16).feats.shape[1] == 48        # already a multiple: unchanged
    with pytest.raises(ValueError, match="pad_frames must be >= 1, got 0"):
        collate(items(), pad_frames=0)


def test_padded_frames_do_not_change_the_loss_or_the_gradients():
    """The padding lies past every utterance's length, so the masks hide it: the same loss and gradients, fp32."""
    phones = (torch.tensor([[1, 2, 3], [4, 5, -1], [6, -1, -1]]), torch.tensor([3, 2, 1]))
    results = []
    for pad in (1, 16, 32):
        model = cpu_small_like()
        loss, stats = forward(model, collate(items(), pad_frames=pad), phones)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, results[0][0], rtol=1e-5, atol=1e-6)
        for g, g0 in zip(grads, results[0][1]):
            torch.testing.assert_close(g, g0, rtol=1e-4, atol=1e-6)


def test_train_pad_frames_is_checked():
    assert load_config(None, ["train.pad_frames=16"]).train.pad_frames == 16
    assert load_config(None).train.pad_frames == 1
    with pytest.raises(ConfigError, match=r"train.pad_frames: expected a frame count >= 1 .* got 0"):
        load_config(None, ["train.pad_frames=0"])


def test_onednn_cache_size_is_set_unless_the_environment_names_one(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    size_onednn_cache(4096)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "4096"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "123")
    size_onednn_cache(4096)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "123"


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)")
def test_a_bf16_autocast_step_on_the_cpu_keeps_fp32_weights_and_gradients_and_is_close_to_fp32():
    """As the trainer runs a step with train.amp=bf16 on the CPU: the weights and their gradients stay fp32 (Adam
    and the allreduce see fp32), the loss is finite and within bf16's rounding of the fp32 loss."""
    phones = (torch.tensor([[1, 2, 3], [4, 5, -1], [6, -1, -1]]), torch.tensor([3, 2, 1]))
    b = collate(items(), pad_frames=16)
    ref = forward(cpu_small_like(), b, phones)[0]
    model = cpu_small_like()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, stats = forward(model, b, phones)
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=0.02)
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name


def test_native_bf16_check_answers_a_bool():
    assert isinstance(cpu_has_native_bf16(), bool)
