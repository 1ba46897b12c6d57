"""The Python side of scripts/gpu_check.sh (one subcommand per phase; each writes one JSON file).

    python scripts/gpu_check.py env    --json OUT.json
    python scripts/gpu_check.py codecs --json OUT.json [--device cuda] [--bench-numel N]
    python scripts/gpu_check.py train  --json OUT.json [--device cuda] [--steps 300] [--seconds 100] [--tiny]

``env`` needs only torch; ``codecs`` needs Horovod (single process: ``hvd.init()`` without horovodrun
is a one-worker job) and runs every codec through the library's own reduction machinery on device
tensors, against the same codec on the CPU; ``train`` runs the BFA model of a recipe config on random
features (no corpus needed), with Horovod and hx.DistributedOptimizer when they import, plain torch
otherwise. Every check prints ``PASS``/``FAIL`` lines; the exit status is 0 only when all passed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

RESULTS: dict = {"checks": {}}


def check(name: str, ok: bool, detail="") -> bool:
    RESULTS["checks"][name] = {"ok": bool(ok), "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail != "" else ""), flush=True)
    return bool(ok)


def write(path: str | None) -> int:
    RESULTS["ok"] = all(c["ok"] for c in RESULTS["checks"].values())
    if path:
        Path(path).write_text(json.dumps(RESULTS, indent=1, default=str))
    return 0 if RESULTS["ok"] else 1


def device_for(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


# ------------------------------------------------------------------------------------------------ env
def cmd_env(args) -> int:
    info = {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        cap = torch.cuda.get_device_capability(0)
        info["capability"] = f"{cap[0]}{cap[1]}"
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None
    for mod in ("horovod", "yaml", "cloudpickle", "packaging", "setuptools", "wheel", "cmake"):
        try:
            m = __import__(mod)
            info[f"have_{mod}"] = getattr(m, "__version__", True)
        except Exception:   # noqa: BLE001
            info[f"have_{mod}"] = False
    RESULTS["env"] = info
    print(json.dumps(info, indent=1), flush=True)
    ok = check("env.torch", True, f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    if args.require_cuda:
        ok = check("env.cuda", torch.cuda.is_available(),
                   info.get("gpus", "torch.cuda.is_available() is False")) and ok
    return write(args.json)


# ------------------------------------------------------------------------------------------------ codecs
SPECS = ["none", "fp16", "bf16", "global_qsgd8", "global_qsgd8-tensor", "global_qsgd8-b64", "global_qsgd4",
         "global_qsgd2", "global_qsgd2-tensor", "topk0.05", "topk0.05-imp", "random_block0.05",
         "random_block0.05-ef", "powersgd4"]


def cmd_codecs(args) -> int:
    import horovod.torch as hvd
    import horovod_ext as hx
    from horovod_ext import packing
    from horovod_ext.communicator import Communicator
    from horovod_ext.compression import ReduceContext
    from horovod_ext.reduction import Reduction, complete

    hvd.init()
    dev = device_for(args.device)
    RESULTS["horovod"] = {"size": hvd.size(), "nccl_built": bool(hvd.nccl_built()), "gloo_built": bool(hvd.gloo_built()),
                          "cuda_built": bool(hvd.cuda_built()), "mpi_built": bool(hvd.mpi_built()),
                          "device": str(dev)}
    print(json.dumps(RESULTS["horovod"]), flush=True)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    comm = Communicator(hvd.global_process_set)

    def codec_for(spec):
        c = hx.Compression.from_spec(spec)
        if spec.startswith("global_qsgd"):
            c = hx.Compression.global_qsgd(c.bits, seed=3, bucket=c.bucket)
        return c

    def reduce(codec, x, name, state, param):
        ctx = ReduceContext(name=name, state=state, comm=comm, op=hvd.Average, param=param)
        red = Reduction(codec, x, ctx)
        complete([red])
        return red.result, ctx

    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
    shapes = [(3001,), (7,), (257, 129)]
    failures, cases, syncs, bitwise = [], 0, {}, {}
    for spec in SPECS:
        codec = codec_for(spec)
        for dname, dtype in dtypes.items():
            if spec == "none" and dtype == torch.bfloat16:
                continue            # Horovod itself has no bf16 allreduce; `none` is exactly Horovod's call
            for shape in shapes:
                key = f"{spec}|{dname}|{'x'.join(map(str, shape))}"
                g = torch.Generator().manual_seed(len(key))
                xs = [torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(2)]
                param = torch.randn(shape, generator=g).to(dtype)
                try:
                    cpu_state, dev_state, outs = {}, {}, []
                    for t, x in enumerate(xs):
                        ref, _ = reduce(codec, x.clone(), key, cpu_state, param)
                        with warnings.catch_warnings(record=True) as caught:
                            warnings.simplefilter("always")
                            if dev.type == "cuda":
                                torch.cuda.set_sync_debug_mode("warn")
                            try:
                                out, _ = reduce(codec, x.clone().to(dev), key, dev_state, param.to(dev))
                            finally:
                                if dev.type == "cuda":
                                    torch.cuda.set_sync_debug_mode(0)
                        syncs[spec] = max(syncs.get(spec, 0), sum("synchroniz" in str(w.message) for w in caught))
                        outs.append((x, ref, out))
                    cases += 1
                    for x, ref, out in outs:
                        if out.device != dev or out.dtype != dtype or out.shape != x.shape:
                            failures.append(f"{key}: output {out.dtype} on {out.device}, shape {tuple(out.shape)}")
                            continue
                        o, r, xd = out.double().cpu(), ref.double(), x.double()
                        if spec.startswith("global_qsgd") and dtype == torch.float32:
                            # the counter-based dither: CUDA (torch reference) and CPU (native kernels) agree bitwise
                            bitwise[key] = bitwise.get(key, True) and bool(torch.equal(out.cpu(), ref))
                        if spec.startswith("global_qsgd"):
                            m = packing.levels_for(codec.bits, 1)
                            # quantization (s/m), then the rounding of the result to the gradient's dtype
                            amax = float(xd.abs().max())
                            bound = amax / m * (1 + 1e-3) + 2 * amax * torch.finfo(dtype).eps + 1e-30
                            err = max(float((o - xd).abs().max()), float((r - xd).abs().max()))
                            if not err <= bound:
                                failures.append(f"{key}: error {err:.3g} > bound {bound:.3g}")
                        else:
                            tol = 1e-6 * float(r.abs().max()) + 1e-12
                            diff = float((o - r).abs().max())
                            if not diff <= tol:
                                failures.append(f"{key}: device vs CPU max |diff| {diff:.3g}")
                    if "residual" in cpu_state:
                        diff = float((dev_state["residual"].double().cpu() - cpu_state["residual"].double()).abs().max())
                        if diff > 1e-6 * float(cpu_state["residual"].abs().max()) + 1e-12:
                            failures.append(f"{key}: residual device vs CPU {diff:.3g}")
                        if dev_state["residual"].device != dev:
                            failures.append(f"{key}: residual on {dev_state['residual'].device}")
                    # NaN on the device: non-finite result, state untouched
                    before = {k: v.clone() for k, v in dev_state.items() if torch.is_tensor(v)}
                    bad = xs[0].to(dev).clone()
                    bad.view(-1)[-1] = float("nan")
                    out, _ = reduce(codec, bad, key, dev_state, param.to(dev))
                    if bool(torch.isfinite(out).all()):
                        failures.append(f"{key}: NaN input gave a finite result")
                    if any(not torch.equal(before[k], dev_state[k]) for k in before):
                        failures.append(f"{key}: NaN input changed the codec state")
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{key}: {type(e).__name__}: {e}")
                    traceback.print_exc()
    RESULTS["codec_cases"] = cases
    RESULTS["codec_failures"] = failures
    RESULTS["host_syncs_per_reduction"] = syncs
    RESULTS["qsgd_float32_cuda_equals_cpu_bitwise"] = bitwise
    for f in failures[:40]:
        print("  ", f)
    check("codecs.device_matches_cpu", not failures, f"{cases} cases, {len(failures)} failures on {dev}")
    if dev.type == "cuda":
        print("host syncs per reduction (torch sync debug mode):", json.dumps(syncs), flush=True)

    # throughput: one large tensor per codec (compress + Horovod + decompress, one worker)
    bench = {}
    if args.bench_numel:
        x = torch.randn(args.bench_numel, device=dev)
        for spec in SPECS:
            codec, state = codec_for(spec), {}
            try:
                reduce(codec, x.clone(), f"b.{spec}", state, x)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.bench_reps):
                    reduce(codec, x.clone(), f"b.{spec}", state, x)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                bench[spec] = round((time.perf_counter() - t0) / args.bench_reps * 1e3, 3)
            except Exception as e:  # noqa: BLE001
                bench[spec] = f"{type(e).__name__}: {e}"
        RESULTS["bench_ms_per_reduction"] = {"numel": args.bench_numel, **bench}
        print(f"ms per reduction of {args.bench_numel} elements:", json.dumps(bench), flush=True)
    return write(args.json)


# ------------------------------------------------------------------------------------------------ train
TINY = {"enc_hidden": 32, "enc_layers": 2, "dec_hidden": 32, "dec_layers": 1, "emb_dim": 16, "att_dim": 32}


def _scalar(text: str):
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(v) for v in text[1:-1].split(",") if v.strip()]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")


def load_sections(path: Path):
    """The config's ``model`` and ``train`` sections: through asr.config when PyYAML imports, else a
    reader of the two-level ``section: / key: value`` subset the recipe configs use."""
    from types import SimpleNamespace
    try:
        from asr.config import load_config
        import dataclasses
        cfg = load_config(path, [])
        model = dataclasses.asdict(cfg.model)
        model.pop("vocab_size", None)       # from --vocab here
        return model, cfg.train
    except ImportError as e:
        print(f"asr.config unavailable ({e}); reading {path.name} with a minimal parser", flush=True)
    tree, section = {}, None
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line.startswith((" ", "\t")) and line.endswith(":"):
            section = tree.setdefault(line[:-1].strip(), {})
        elif section is not None and ":" in line:
            key, value = line.split(":", 1)
            section[key.strip()] = _scalar(value)
    train = {"lr": 1e-3, "weight_decay": 0.0, "clip": 5.0, "compression": "none", "pipeline": False, "amp": "none"}
    train.update(tree.get("train", {}))
    return tree.get("model", {}), SimpleNamespace(**train)


def cmd_train(args) -> int:
    from asr.models.bfa import BFA, BFAConfig, parameter_count

    dev = device_for(args.device)
    model_kw, train_cfg = load_sections(ROOT / args.config)
    cfg = SimpleNamespace(train=train_cfg)
    if args.tiny:
        model_kw.update(TINY)
    torch.manual_seed(0)
    # a phone head (cpu-small has one) gets a 66-phone inventory, as espeak-ng's en-us rules give the demo's text
    phones = 66 if float(model_kw.get("phone_ctc_weight", 0) or 0) > 0 else 0
    model_cfg = BFAConfig(vocab_size=args.vocab, **{**model_kw, "phone_vocab": phones})
    model = BFA(model_cfg).to(dev)
    params = parameter_count(model)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.amp) if dev.type == "cuda" else None
    info = {"config": args.config, "device": str(dev), "parameters": params, "amp": str(amp), "batch": args.batch,
            "frames": args.frames, "tokens": args.tokens, "vocab": args.vocab, "tiny": args.tiny,
            "lr": cfg.train.lr, "compression": cfg.train.compression, "pipeline": cfg.train.pipeline}
    RESULTS["train"] = info
    print(json.dumps(info), flush=True)

    # a fixed pool of random batches, cycled: the model can fit them, so the loss must fall
    g = torch.Generator().manual_seed(1)
    pool = []
    for _ in range(args.pool):
        B, T, L = args.batch, args.frames, args.tokens
        feats = torch.randn(B, T, model_cfg.feat_dim, generator=g)
        flen = torch.randint(int(0.7 * T), T + 1, (B,), generator=g)
        flen[0] = T
        tlen = torch.randint(max(1, L // 2), L + 1, (B,), generator=g)
        toks = torch.randint(0, args.vocab, (B, L), generator=g)
        toks[torch.arange(L)[None, :] >= tlen[:, None]] = -1
        extra = ()
        if phones:
            plen = tlen * 3                                  # about 3 phones per word piece
            ph = torch.randint(0, phones, (B, int(plen.max())), generator=g)
            ph[torch.arange(ph.shape[1])[None, :] >= plen[:, None]] = -1
            extra = (ph.to(dev), plen.to(dev))
        pool.append((feats.to(dev), flen, toks.to(dev), tlen.to(dev), *extra))

    # asr/train.py passes the feature lengths on the CPU: does the model accept that on this device?
    feats, flen, toks, tlen, *ph = pool[0]
    try:
        with torch.no_grad(), torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            model(feats, flen, toks, tlen, *ph)
        info["cpu_lengths_like_train_py"] = "ok"
    except Exception as e:  # noqa: BLE001
        info["cpu_lengths_like_train_py"] = f"{type(e).__name__}: {e}"[:300]
    print("forward with CPU feature lengths (as asr/train.py passes them):", info["cpu_lengths_like_train_py"],
          flush=True)

    lr = args.lr if args.lr is not None else cfg.train.lr     # constant: no warm-up in a few hundred steps
    info["lr"] = lr
    from asr.train import FUSED_ADAM_DEVICES, make_adam      # the trainer's Adam (fused on CUDA)
    base = make_adam(model.parameters(), lr=lr, weight_decay=cfg.train.weight_decay,
                     fused=cfg.train.fused_adam and dev.type in FUSED_ADAM_DEVICES)
    info["fused_adam"] = bool(base.param_groups[0]["fused"])
    opt, hx_used = base, False
    if args.opt in ("auto", "hx"):
        try:
            import horovod.torch as hvd
            import horovod_ext as hx
            hvd.init()
            opt = hx.DistributedOptimizer(base, model.named_parameters(),
                                          compression=hx.Compression.from_spec(cfg.train.compression),
                                          pipeline=cfg.train.pipeline)
            hx_used = True
        except Exception as e:  # noqa: BLE001
            if args.opt == "hx":
                raise
            info["hx_unavailable"] = f"{type(e).__name__}: {e}"[:300]
            print("training with plain torch.optim.Adam:", info["hx_unavailable"], flush=True)
    info["optimizer"] = f"hx.DistributedOptimizer({cfg.train.compression}, pipeline={cfg.train.pipeline})" \
        if hx_used else "torch.optim.Adam"

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    losses, t_start, timed_steps = [], None, 0
    warm = min(5, max(1, args.steps // 4))
    t_begin = time.perf_counter()
    model.train()
    for step in range(args.steps):
        feats, flen, toks, tlen, *ph = pool[step % len(pool)]
        if step == warm:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            loss, stats = model(feats, flen.to(dev), toks, tlen, *ph)
        loss.backward()
        if hx_used:
            opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip)
        if hx_used:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        losses.append(stats["loss"])
        if step >= warm:
            timed_steps += 1
        if step % max(1, args.steps // 10) == 0:
            print(f"step {step} loss {stats['loss']:.4f} ({time.perf_counter() - t_begin:.1f} s)", flush=True)
        if t_start is not None and time.perf_counter() - t_start > args.seconds:
            print(f"time budget of {args.seconds} s reached after {step + 1} steps", flush=True)
            break
    if hx_used and cfg.train.pipeline:
        opt.flush()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - (t_start or t_begin)
    sps = timed_steps / elapsed if elapsed > 0 and timed_steps else float("nan")
    # the first and the last full pass over the batch pool (same batches, so comparable)
    P = min(len(pool), max(1, len(losses) // 2))
    head, tail = losses[:P], losses[len(losses) - P:]
    info.update({
        "steps": len(losses), "steps_per_s": round(sps, 3),
        "audio_s_per_s": round(sps * args.batch * args.frames / 100.0, 1),
        "loss_start": round(sum(head) / len(head), 4), "loss_end": round(sum(tail) / len(tail), 4),
        "loss_curve": [round(v, 4) for v in losses[::max(1, len(losses) // 20)]],
    })
    if dev.type == "cuda":
        info["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
        info["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(dev) / 2**30, 2)
    if hx_used:
        info["comm"] = opt.comm_stats().get("total")
    print(json.dumps({k: v for k, v in info.items() if k != "loss_curve"}), flush=True)
    check("train.finite", all(math.isfinite(v) for v in losses), f"{len(losses)} steps")
    check("train.loss_falls", info["loss_end"] < info["loss_start"],
          f"loss {info['loss_start']} -> {info['loss_end']}")
    check("train.steps", len(losses) >= min(args.steps, args.min_steps),
          f"{len(losses)} steps at {info['steps_per_s']} steps/s")
    return write(args.json)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env")
    e.add_argument("--require-cuda", action="store_true")
    c = sub.add_parser("codecs")
    c.add_argument("--device", default="auto")
    c.add_argument("--bench-numel", type=int, default=0)
    c.add_argument("--bench-reps", type=int, default=5)
    t = sub.add_parser("train")
    t.add_argument("--device", default="auto")
    t.add_argument("--config", default="recipes/bfa/conf/gpu-full.yaml")
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--min-steps", type=int, default=100, help="FAIL below this many steps (time budget)")
    t.add_argument("--seconds", type=float, default=100.0, help="stop timing and training after this long")
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--frames", type=int, default=600, help="frames per utterance (10 ms each)")
    t.add_argument("--tokens", type=int, default=40)
    t.add_argument("--vocab", type=int, default=1000)
    t.add_argument("--pool", type=int, default=4, help="distinct random batches, cycled")
    t.add_argument("--lr", type=float, default=None, help="constant learning rate (default: the config's train.lr)")
    t.add_argument("--opt", choices=("auto", "hx", "plain"), default="auto")
    t.add_argument("--tiny", action="store_true", help="tiny model (CPU dry run)")
    for s in (e, c, t):
        s.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    try:
        return {"env": cmd_env, "codecs": cmd_codecs, "train": cmd_train}[args.cmd](args)
    except Exception as ex:  # noqa: BLE001
        traceback.print_exc()
        check(f"{args.cmd}.ran", False, f"{type(ex).__name__}: {ex}"[:500])
        return write(args.json) or 1


if __name__ == "__main__":
    sys.exit(main())
