"""Experiment: what the gradient reduction adds to a step of the recipe's model, 2 workers on this host.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python scripts/reduce_overhead.py \
        --corpus exp/corpus_small_2500_seed0 [--modes local,hx_none,hx_q8,flat_none,flat_q8] [--steps 60]

Each worker trains the config's BFA model on its own share of the corpus's batch shapes (random features, real
word pieces; one thread) and times the steps of each mode, one mode after the other:
  local      no reduction at all (the two workers' compute side by side: the floor)
  hx_none    hx.DistributedOptimizer, no compression (one allreduce per parameter tensor)
  hx_q8      hx.DistributedOptimizer with Global-QSGD 8-bit on every tensor (per tensor, two phases)
  hx_CODEC[_a][_gN][_nodriver]   variants: _a the adaptive rule on (tensors under 8,192 elements go plain,
             as in the recipe); _gN groups=N (each group's reductions start together, so Horovod fuses their
             collectives); _nodriver overlap=False (no driver thread: every phase after backward, on the
             training thread)
  flat_none  every gradient copied into one flat tensor after backward, one hx reduction of it, no compression
  flat_q8    the same with Global-QSGD 8-bit
Also the CPU milliseconds per step of each of rank 0's threads (main, the hx driver; Horovod's and Gloo's show
as python.TID). Prints a table on rank 0 and writes JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import time
import threading
from pathlib import Path

import torch

from step_cost_split import synthetic_batch     # scripts/ is on sys.path when this file runs

ROOT = Path(__file__).resolve().parent.parent


def thread_cpu() -> dict:
    """CPU seconds so far of each of this process's threads, by thread name."""
    hz = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            s = open(f"/proc/self/task/{tid}/stat").read()
        except OSError:
            continue
        name = open(f"/proc/self/task/{tid}/comm").read().strip()
        f = s[s.rindex(")") + 2:].split()
        key = "main" if int(tid) == os.getpid() else names.get(int(tid), f"{name}.{tid}")
        out[key] = out.get(key, 0.0) + (int(f[11]) + int(f[12])) / hz
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--config", default=str(ROOT / "recipes/bfa/conf/cpu-small.yaml"))
    p.add_argument("--modes", default="local,hx_none,hx_q8,flat_none,flat_q8")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", default="out/reduce_overhead.json")
    args = p.parse_args()
    import horovod.torch as hvd
    import sentencepiece as spm
    import horovod_ext as hx
    from asr.config import load_config
    from asr.loader import BucketBatchSampler
    from asr.models.bfa import BFA
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    cfg = load_config(args.config, [])
    corpus = Path(args.corpus)
    recs = [json.loads(line) for line in open(corpus / "train.jsonl")]
    sp = spm.SentencePieceProcessor(model_file=glob.glob(str(corpus / "tokenizer" / "*.model"))[0])
    durs = [r["duration"] for r in recs]
    sampler = BucketBatchSampler(durs, cfg.train.batch_seconds, cfg.train.max_batch, num_replicas=size, rank=rank,
                                 seed=0)
    sampler.set_epoch(1)
    batches = list(sampler)          # the recipe's batches: matched in length across the workers at each step
    torch.manual_seed(0)
    model = BFA(dataclasses.replace(cfg.model, phone_ctc_weight=0.0, vocab_size=sp.get_piece_size()))
    model.train()
    dim = model.config.feat_dim
    params = [p for p in model.parameters() if p.requires_grad]
    n_elem = sum(p.numel() for p in params)

    def batch(k):
        return synthetic_batch(batches[k % len(batches)], recs, sp, dim, torch.Generator().manual_seed(k))

    results = {}
    for mode in args.modes.split(","):
        base = torch.optim.Adam(model.parameters(), 1e-4)
        flat = None
        if mode == "local":
            opt = base
        elif mode.startswith("hx_"):
            # hx_<codec>[_a][_g<N>][_nodriver]: a = the adaptive rule on (small tensors plain, as the
            # recipe runs), gN = groups=N (each group's reductions started together, so Horovod fuses them)
            parts = mode.split("_")[1:]
            spec = {"none": "none", "q8": "global_qsgd8"}[parts[0]]
            groups = next((int(x[1:]) for x in parts if x[0] == "g" and x[1:].isdigit()), None)
            opt = hx.DistributedOptimizer(base, model.named_parameters(), compression=hx.Compression.from_spec(spec),
                                          adaptive="a" in parts, groups=groups,
                                          overlap=parts[-1] != "nodriver")
        elif mode.startswith("flat_"):
            flat = torch.nn.Parameter(torch.zeros(n_elem))
            fopt = hx.DistributedOptimizer(torch.optim.SGD([flat], lr=0.0), [("flat", flat)],
                                           compression=hx.Compression.from_spec({"flat_none": "none", "flat_q8": "global_qsgd8"}[mode]),
                                           adaptive=False)
            opt = base
        else:
            raise SystemExit(f"unknown mode {mode}")
        hvd.allreduce(torch.zeros(1), name=f"barrier.{mode}")
        times = []
        for k in range(args.warmup + args.steps):
            if k == args.warmup:
                cpu0 = thread_cpu()
            feats, flen, toks, tlen = batch(k)
            t0 = time.perf_counter()
            opt.zero_grad()
            loss, _ = model(feats, flen, toks, tlen)
            loss.backward()
            if flat is not None:
                flat.grad = torch.cat([p.grad.reshape(-1) for p in params])
                fopt.synchronize()
                off = 0
                for p in params:
                    p.grad.copy_(flat.grad[off:off + p.numel()].view_as(p.grad))
                    off += p.numel()
                fopt.zero_grad()
            elif mode != "local":
                opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            if mode.startswith("hx_"):
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
            times.append(time.perf_counter() - t0)
        cpu1 = thread_cpu()
        hvd.allreduce(torch.zeros(1), name=f"barrier2.{mode}")
        per = times[args.warmup:]
        ms = torch.tensor(1000 * sum(per) / len(per))
        ms = float(hvd.allreduce(ms, op=hvd.Average, name=f"ms.{mode}"))
        cpu = {k: 1000 * (cpu1.get(k, 0) - cpu0.get(k, 0)) / args.steps for k in cpu1}
        cpu = {k: round(v, 1) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.5}
        results[mode] = {"ms_per_step": ms, "cpu_ms_per_step_rank0_threads": cpu}
        if rank == 0:
            print(f"{mode:10s} {ms:7.1f} ms/step  rank-0 thread CPU ms/step: {cpu}", flush=True)
        if mode.startswith("hx_"):
            for h in opt._hooks:       # this mode's optimizer leaves the model (the next mode has its own)
                h.remove()
    if rank == 0:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"corpus": str(corpus), "workers": size, "elements": n_elem,
                                               "tensors": len(params), "steps": args.steps, "results": results},
                                              indent=1))
        print(f"{len(params)} tensors, {n_elem} elements")


if __name__ == "__main__":
    main()
