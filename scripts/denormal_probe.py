"""Experiment: does a training step get slower as the model trains because of subnormal floats, and does
flushing them to zero (``torch.set_flush_denormal(True)``) give the time back?

    .venv/bin/python scripts/denormal_probe.py --corpus exp/corpus_small_train20000_seed0 \
        --checkpoint RUN/checkpoints/epoch000.pt --checkpoint RUN/checkpoints/epoch008.pt

Why: in the 60-minute benchmark of 2026-12-05 (ninth session) the step time rose from 0.28 s in epoch 0 to 0.39 s in
epoch 7 with the loader and reduction waits flat, and Adam's state held 41 subnormal values at epoch 0 and 3,570 at
epoch 8 (almost all in the first moments). On x86 CPUs an operation on a subnormal operand can take many times
longer than on a normal one.

For each checkpoint: the model and its Adam state (rank 0's) are loaded, and the same real training batches (the
corpus's clean cached features, packed as the trainer packs them) go through forward, backward and Adam on one
thread, with subnormal flushing off and on, alternating batch by batch so that a change in the host's speed falls
on both. A step changes the weights, so every step starts again from the checkpoint's state. Also counts the
subnormal values in the gradients of one batch. Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path

import torch


def subnormals(tensors) -> tuple[int, int]:
    """(subnormal values, all values) over floating-point tensors."""
    tiny = torch.finfo(torch.float32).tiny
    s = n = 0
    for t in tensors:
        if t is not None and t.is_floating_point():
            t = t.detach().float()
            s += int(((t != 0) & (t.abs() < tiny)).sum())
            n += t.numel()
    return s, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="the run's corpus folder (train.jsonl)")
    p.add_argument("--checkpoint", action="append", required=True, help="a checkpoint of asr.train (repeatable)")
    p.add_argument("--batches", type=int, default=8, help="batches timed per setting (after one warm-up)")
    p.add_argument("--json", default="out/denormal_probe.json")
    args = p.parse_args()
    from asr.data.lexicon import Lexicon
    from asr.evaluate import load_checkpoint
    from asr.loader import BucketBatchSampler, SpeechDataset, collate
    torch.set_num_threads(1)
    results = []
    for path in args.checkpoint:
        model, tok, norm, ck = load_checkpoint(path)
        data = ck.config["data"]
        ds = SpeechDataset(str(Path(args.corpus) / "train.jsonl"), tok, norm, feature_cache=data.get("feature_cache"))
        lexicon = Lexicon(data["lexicon"]) if data.get("lexicon") else None
        sampler = BucketBatchSampler(ds.durations, ck.config["train"]["batch_seconds"], ck.config["train"]["max_batch"],
                                     1, 0, seed=0)
        picks = list(sampler)
        random.Random(0).shuffle(picks)
        batches = [collate([ds[i] for i in b], lexicon=lexicon) for b in picks[:args.batches + 1]]
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        opt.load_state_dict({"state": ck.optimizer["state"], "param_groups": ck.optimizer["param_groups"]})
        start_model, start_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
        times = {False: [], True: []}
        grads = None
        for k, batch in enumerate(batches):
            for flush in (False, True):
                model.load_state_dict(start_model)
                opt.load_state_dict(start_opt)
                torch.set_flush_denormal(flush)
                torch.manual_seed(k)
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                phones = (batch.phones, batch.plen) if batch.phones is not None else ()
                loss, _ = model(batch.feats, batch.flen, batch.toks, batch.tlen, *phones)
                loss.backward()
                if grads is None and not flush:
                    grads = subnormals(q.grad for q in model.parameters())
                opt.step()
                if k:
                    times[flush].append(time.perf_counter() - t0)
        torch.set_flush_denormal(False)
        state = [v for s in ck.optimizer["state"].values() for v in s.values() if torch.is_tensor(v)]
        row = {"checkpoint": path, "epoch": ck.epoch, "step": ck.step,
               "subnormal_adam_state": subnormals(state), "subnormal_grads_one_batch": grads,
               "step_ms": 1000 * sum(times[False]) / len(times[False]),
               "step_ms_flushed": 1000 * sum(times[True]) / len(times[True]), "batches": len(times[False])}
        results.append(row)
        print(f"epoch {ck.epoch} (step {ck.step}): {row['step_ms']:.0f} ms per step, {row['step_ms_flushed']:.0f} ms "
              f"with subnormals flushed; subnormal values: Adam state {row['subnormal_adam_state'][0]} of "
              f"{row['subnormal_adam_state'][1]}, one batch's gradients {grads[0]} of {grads[1]}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"threads": 1, "results": results}, indent=1))


if __name__ == "__main__":
    main()
