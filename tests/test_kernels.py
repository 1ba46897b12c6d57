"""Issue 16: the fused Global-QSGD kernels (horovod_ext.kernels) give the torch reference's bits,
and the counter-based dither is uniform and makes the quantizer unbiased."""
import os
import subprocess
import sys

import pytest
import torch

from horovod_ext import packing
from horovod_ext.kernels import native, qsgd, reference

CASES = [(1000, 512, 8), (1001, 512, 4), (1003, 512, 2), (777, 777, 2), (5000, 64, 8), (4096, 4096, 4),
         (70_001, 512, 8), (9, 512, 8), (1, 1, 8), (3000, 100, 8)]   # 3000/100: buckets straddle words


def test_native_kernels_build_here():
    assert native() is not None, "the machine has a C++ compiler; the native kernels must build"


@pytest.mark.parametrize("n,bucket,bits", CASES)
def test_native_and_reference_give_the_same_bits(n, bucket, bits):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 2, n)
    workers = 1 if bits == 2 else 2
    m = packing.levels_for(bits, workers)
    amax = qsgd.bucket_amax(x, bucket)
    assert torch.equal(amax, reference.bucket_amax(x, bucket))
    factor = m / amax
    key = qsgd.step_key(2024, 3)
    inputs = [x * (1 - 0.5 * r) for r in range(workers)]      # |x_r| <= amax: the scale is the global one
    sent = [qsgd.encode(xr, bucket, factor, m, bits, key, extra_words=1) for xr in inputs]
    ref = [reference.encode(xr, bucket, factor, m, bits, *key, extra_words=1) for xr in inputs]
    for a, b in zip(sent, ref):
        assert a.dtype == torch.int64 and torch.equal(a, b)
    total = sum(sent)
    words = packing.packed_words(n, bits)
    scale = amax / (m * workers)
    out = qsgd.decode(total[:words], n, bucket, scale, m, bits, workers)
    assert torch.equal(out, reference.decode(total[:words], n, bucket, scale, m, bits, workers))
    # decoding into a given buffer writes there
    buf = torch.full((n,), 7.0)
    assert qsgd.decode(total[:words], n, bucket, scale, m, bits, workers, out=buf) is buf and torch.equal(buf, out)
    # the bound: each worker's error is below its bucket's scale / m
    mean = sum(inputs) / workers
    per_elem = amax.repeat_interleave(bucket)[:n] / m
    assert bool(((out - mean).abs() <= per_elem * 1.0001 + 1e-30).all())


def test_nonfinite_bucket_reads_as_nonfinite():
    x = torch.randn(2048)
    x[700] = float("nan")
    x[1500] = float("-inf")
    a = qsgd.bucket_amax(x, 512)
    assert torch.isfinite(a).tolist() == [True, False, False, True]
    assert torch.equal(a[[0, 3]], reference.bucket_amax(x, 512)[[0, 3]])


def test_dither_is_uniform_and_differs_per_key():
    u = reference.dither(1 << 20, *qsgd.step_key(1, 0), device="cpu")
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 2e-3 and abs(float(u.var()) - 1 / 12) < 2e-3
    hist = torch.histc(u, bins=16, min=0, max=1) / u.numel()
    assert float((hist - 1 / 16).abs().max()) < 2e-3
    v = reference.dither(1 << 20, *qsgd.step_key(1, 1), device="cpu")
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 5e-3
    # the counter: any slice can be recomputed on its own
    assert torch.equal(reference.dither(100, *qsgd.step_key(1, 0), device="cpu", start=500), u[500:600])


def test_quantizer_is_unbiased_over_draws():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g)
    m = packing.levels_for(8, 2)
    amax = qsgd.bucket_amax(x, 512)
    words = packing.packed_words(x.numel(), 8)
    draws = 400
    acc = torch.zeros_like(x, dtype=torch.float64)
    for t in range(draws):
        p = qsgd.encode(x, 512, m / amax, m, 8, qsgd.step_key(7, t))
        acc += qsgd.decode(p[:words], x.numel(), 512, amax / m, m, 8, 1).double()
    mean = acc / draws
    # per element the error is within [0, s/m) uniform-ish: std of a mean of 400 draws <= 0.5 s/m / 20
    step = (amax / m).repeat_interleave(512).double()
    z = (mean - x.double()) / step
    assert float(z.mean().abs()) < 0.005 and float(z.abs().max()) < 0.15


def test_without_the_native_library_the_reference_runs():
    code = ("import torch\nfrom horovod_ext.kernels import status, qsgd\n"
            "x = torch.randn(5000)\na = qsgd.bucket_amax(x, 512)\n"
            "p = qsgd.encode(x, 512, 63 / a, 63, 8, qsgd.step_key(1, 1))\nprint(status(), int(p.sum()))")
    env = dict(os.environ, HX_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("reference (disabled by HX_NATIVE=0)")
