"""Experiment: kill -9 a worker of a real 2-worker recipe run at random moments, resume, and compare.

    .venv/bin/python scripts/fault_injection.py --out out/faults --kills 5 --codec global_qsgd8 --pipeline
    .venv/bin/python scripts/fault_injection.py --out out/faults --conf recipes/bfa/conf/cpu-small.yaml \
        --set train.max_steps=1000 --kills 3 --epochs 4

``--conf`` trains another recipe config on the same corpus (cpu-small: dropout, a persistent loader worker,
augmentation, pipelining with weight prediction, as the recipe trains), ``--set key=value`` adds overrides. A
config whose schedule runs to a time budget (cpu-small's train.max_minutes) sets its learning rate from the wall
clock, so no two runs are equal: give it a step budget (train.max_steps) instead.

1. builds a tiny synthesized corpus (asr-prep synth --size tiny), a tokenizer, feature statistics and a lexicon;
2. trains the cpu-tiny BFA (or ``--conf``) uninterrupted for ``--epochs`` epochs under ``horovodrun -np 2`` (Horovod
   fusion off, so sums are deterministic);
3. trains the same run again, but SIGKILLs one worker (a random rank) at a random moment, ``--kills``
   times, each time restarting the job with ``--resume`` (it resumes from the last epoch checkpoint);
4. compares the final checkpoints tensor by tensor (model and optimizer state, every worker's codec
   state) and the per-step losses of the two runs.

Prints a table and writes ``OUT/faults.json``. "Lost" is what differs from the uninterrupted run:
nothing, when every tensor and every logged loss is equal.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def sh(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)


def corpus(out: Path) -> Path:
    c = out / "corpus"
    if not (c / "stats" / "feature_stats.json").exists():
        sh([BIN / "asr-prep", "synth", "--out", c, "--size", "tiny", "--seed", "5", "--limit", "60"])
        sh([BIN / "asr-prep", "tokenizer", "--manifest", c / "train.jsonl", "--vocab-size", "60", "--out", c / "tok"])
        sh([BIN / "asr-prep", "stats", "--manifest", c / "train.jsonl", "--out", c / "stats"])
    if not (c / "lexicon" / "lexicon.txt").exists():      # the phone CTC head's targets (cpu-small has one)
        (c / "transcripts.txt").write_text("".join(json.loads(x)["text"] + "\n" for x in
                                                   (c / "train.jsonl").read_text().splitlines()))
        sh([BIN / "asr-prep", "lexicon", "--text", c / "transcripts.txt", "--out", c / "lexicon"])
    return c


def command(c: Path, run: Path, args) -> list[str]:
    over = [f"data.train={c / 'train.jsonl'}", f"data.dev={c / 'dev.jsonl'}", "data.dev_subset=4",
            f"data.tokenizer={c / 'tok' / 'tokenizer.model'}", f"data.stats={c / 'stats' / 'feature_stats.json'}",
            f"data.lexicon={c / 'lexicon'}", f"train.out_dir={run}", "train.log_every=1", f"train.epochs={args.epochs}", "train.batch_seconds=10",
            f"train.compression={args.codec}", *(["train.pipeline=true"] if args.pipeline else []), *args.set]
    return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m", "asr.train",
            "--config", str(args.conf), "--resume", *over]


def env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HOROVOD_FUSION_THRESHOLD="0")


def workers_of(pid: int) -> list[int]:
    """PIDs of the asr.train processes under a horovodrun process."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    rows = [(int(a), int(b), rest) for a, b, rest in (line.split(None, 2) for line in out if line.strip())]
    children, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp, _ in rows if pp in frontier} - children
        children |= frontier
    return [p for p, _, args in rows if p in children and "asr.train" in args and "horovodrun" not in args
            and "-c" not in args.split()[:2]]


def losses(run: Path) -> dict:
    out = {}
    for line in (run / "train_log.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:          # the line being written right now
            continue
        if r["event"] == "step":
            out[r["step"]] = r["loss"]
    return out


def tensors(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{prefix}/{i}")


def compare(a: Path, b: Path) -> list[str]:
    from asr.checkpoint import load_checkpoint
    x = load_checkpoint(a / "checkpoints" / "last.pt")
    y = load_checkpoint(b / "checkpoints" / "last.pt")
    tx = dict(tensors({"model": x["model"], "optimizer": x["optimizer"]}))
    ty = dict(tensors({"model": y["model"], "optimizer": y["optimizer"]}))
    diff = sorted(set(tx) ^ set(ty))
    diff += [k for k in tx.keys() & ty.keys() if not torch.equal(tx[k], ty[k])]
    return diff


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("out/faults"))
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--codec", default="global_qsgd8")
    p.add_argument("--pipeline", action="store_true", help="train.pipeline=true (else the config's value)")
    p.add_argument("--conf", type=Path, default=ROOT / "recipes" / "bfa" / "conf" / "cpu-tiny.yaml",
                   help="the recipe config to train (default cpu-tiny)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an asr.train override after the script's own (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    c = corpus(args.out)
    tag = f"{args.codec}{'+pipe' if args.pipeline else ''}"
    if args.conf.stem != "cpu-tiny" or args.set:
        tag = "_".join([args.conf.stem, tag, *(kv.replace("=", "-") for kv in args.set)])
    ref, hurt = args.out / f"ref_{tag}", args.out / f"killed_{tag}"
    for d in (ref, hurt):
        subprocess.run(["rm", "-rf", str(d)])
    t0 = time.time()
    subprocess.run(command(c, ref, args), env=env(), cwd=ROOT, check=True, capture_output=True)
    ref_s = time.time() - t0
    print(f"[faults] uninterrupted run: {ref_s:.0f} s")
    total = max(losses(ref))
    targets = sorted(rng.sample(range(2, total), args.kills))       # kill once the log reaches these steps
    events = []
    for k in range(args.kills + 50):
        if (hurt / "DONE").exists():
            break
        proc = subprocess.Popen(command(c, hurt, args), env=env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        killed = None
        if len(events) < len(targets):
            target = targets[len(events)]
            logged = lambda: max(losses(hurt), default=0) if (hurt / "train_log.jsonl").exists() else 0
            while proc.poll() is None and logged() < target:
                time.sleep(0.05)
            ws = workers_of(proc.pid)
            if proc.poll() is None and ws:
                victim = rng.choice(ws)
                os.kill(victim, signal.SIGKILL)
                killed = {"at_step": logged(), "pid": victim}
        try:
            rc = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = "timeout"
        if killed:
            killed["job_exit"] = rc
            events.append(killed)
            print(f"[faults] kill {len(events)}: {killed}")
    done = (hurt / "DONE").exists()
    diff = compare(ref, hurt) if done else ["run did not finish"]
    lr, lh = losses(ref), losses(hurt)
    mismatched = [s for s in lr if lh.get(s) != lr[s]]
    result = {"codec": tag, "kills": events, "finished": done, "tensors_differing": diff,
              "steps": len(lr), "steps_with_different_loss": mismatched, "uninterrupted_s": ref_s,
              "command": " ".join(["scripts/fault_injection.py", *(argv or sys.argv[1:])])}
    (args.out / f"faults_{tag}.json").write_text(json.dumps(result, indent=1))
    print(f"[faults] {tag}: {len(events)} kills, finished={done}, tensors differing: {len(diff)}, "
          f"steps with a different loss: {len(mismatched)} of {len(lr)}")
    return 0 if done and not diff and not mismatched else 1


if __name__ == "__main__":
    sys.exit(main())
