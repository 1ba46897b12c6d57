"""Stress the recipe's elastic recovery: one long ``asr.train`` job under ``horovodrun`` (3 local host
names, min 2, max 3, blacklist cooldown so a killed host comes back), and a loop that SIGKILLs a worker
(the host killed least so far) each time the job has trained a few steps at full size. A job that makes no progress for
``--hang-s`` seconds is a hang: the script writes ``py-spy dump --native`` of horovodrun and every worker
to OUT/stacks.txt and stops. Prints one line per kill and a summary.

    python scripts/stress_elastic.py --out /tmp/stress --minutes 20

Why: tests/test_recipe_elastic.py hung in about one CI run in three (survivors silent after the Gloo
error) and never in isolation; this gives many kill/recover cycles per minute instead of one per test.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.elastic_harness import ElasticJob, LOCAL_HOSTS, read_jsonl, write_hosts  # noqa: E402
from tests.test_recipe import tiny_corpus  # noqa: E402


def corpus(out: Path) -> Path:
    c = out / "corpus"
    if not (c / "stats" / "feature_stats.json").exists():
        c.mkdir(parents=True, exist_ok=True)
        tiny_corpus(c)
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--hang-s", type=float, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cycle-time-ms", default="10")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    c = corpus(args.out)
    run = args.out / f"run{int(time.time())}"
    hosts_file = args.out / "hosts.txt"
    write_hosts(hosts_file, LOCAL_HOSTS[:3])
    cfg = [f"data.train={c / 'train.jsonl'}", f"data.dev={c / 'train.jsonl'}",
           f"data.tokenizer={c / 'tok' / 'tokenizer.model'}", f"data.stats={c / 'stats' / 'feature_stats.json'}",
           f"train.out_dir={run}", "train.log_every=1", "train.epochs=10000", "train.batch_seconds=20",
           "train.max_batch=1", "train.commit_every=2", "train.trace_utterances=true",
           "train.compression=global_qsgd8", "train.pipeline=true", "data.dev_subset=2", "train.dev_every=1000"]
    job = ElasticJob([sys.executable, "-m", "asr.train", "--config", ROOT / "recipes/bfa/conf/cpu-tiny.yaml", *cfg],
                     np=3, min_np=2, max_np=3, script=ROOT / "recipes" / "bfa" / "discover_hosts.sh",
                     log=args.out / "horovodrun.log", cooldown=(1, 2),
                     env={"BFA_HOSTS_FILE": str(hosts_file), "HOROVOD_GLOO_TIMEOUT_SECONDS": "10",
                          "HOROVOD_CYCLE_TIME": args.cycle_time_ms})
    t_end = time.time() + args.minutes * 60
    kills, last_rows, last_progress, rows_at_kill, need = 0, 0, time.time(), 0, rng.randint(3, 9)
    status, per_host = "time up", {}
    try:
        while time.time() < t_end and job.proc.poll() is None:
            time.sleep(0.05)
            rows = read_jsonl((run / "trace").glob("utts.*.jsonl")) if (run / "trace").exists() else []
            if len(rows) > last_rows:
                last_rows, last_progress = len(rows), time.time()
            if time.time() - last_progress > args.hang_s:
                status = f"HANG: no step for {args.hang_s:.0f} s after kill {kills}"
                (args.out / "stacks.txt").write_text(job.stacks())
                break
            latest = max(rows, key=lambda r: r["step"], default=None)
            if latest is None or latest["workers"] != 3 or len(rows) - rows_at_kill < need:
                continue
            procs = {h: job.workers(h, "asr.train") for h in LOCAL_HOSTS[:3]}
            alive = [h for h, p in procs.items() if len(p) == 1]
            if len(alive) < 3:
                continue
            # the host killed least so far (ties at random): the blacklist cooldown doubles with each kill of a host
            host = min(alive, key=lambda h: (per_host.get(h, 0), rng.random()))
            job.kill(host, "asr.train")
            kills += 1
            per_host[host] = per_host.get(host, 0) + 1
            rows_at_kill, need = len(rows), rng.randint(3, 9)
            print(f"[stress] {time.strftime('%H:%M:%S')} kill {kills}: {host} at step {latest['step']}", flush=True)
    finally:
        job.stop()
    resets = sum(1 for line in (run / "train_log.jsonl").read_text().splitlines()
                 if json.loads(line)["event"] == "reset") if (run / "train_log.jsonl").exists() else 0
    print(f"[stress] {status}; kills {kills}, resets logged {resets}, trace rows {last_rows}; log {args.out}/horovodrun.log")
    return 1 if status.startswith("HANG") else 0


if __name__ == "__main__":
    sys.exit(main())
