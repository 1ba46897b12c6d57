"""Issue 14 (item 4): the recipe's elastic mode, end to end.

``asr.train`` on the cpu-tiny config under ``horovodrun -np 3 --min-np 2 --max-np 3
--host-discovery-script recipes/bfa/discover_hosts.sh`` (HOROVOD_ELASTIC=1 switches the elastic mode on; one local host name per
worker, see tests/elastic_harness.py), one utterance per batch so an epoch has 7 steps on 3
workers; Global-QSGD 8-bit, pipelined with weight prediction, so its commits run inside
``true_parameters()``, and an EMA of the weights (``train.ema_decay``), part of the elastic state. The test SIGKILLs the worker of rank 0 (or of another rank) once the utterance trace shows it
in the middle of epoch 0; training goes on with 2 workers and ends. Checked: the log's reset record, epoch records
with every training utterance counted once in committed steps, the utterance trace (none missing,
at most commit_every x 3 batches trained twice), checkpoints and DONE.
"""
import json
from pathlib import Path
import sys
import time

import pytest

from tests.elastic_harness import ROOT, ElasticJob, LOCAL_HOSTS, epoch_coverage, read_jsonl, write_hosts
from tests.test_recipe import CONF, corpus, log_records, overrides  # noqa: F401  (corpus is a fixture)

pytestmark = pytest.mark.horovod

COMMIT = 2


def _victim_host(trace: Path, rank0: bool):
    """The host whose worker has rank 0 (or, else, the last other one), from the trace file names
    utts.HOST.RANK.PID.jsonl: which rank lands on which host name is Horovod's choice."""
    ranks = {}
    for f in trace.glob("utts.*.jsonl"):
        host, rank = f.name[len("utts."):].rsplit(".", 3)[:2]
        ranks[int(rank)] = host
    if len(ranks) < 3:
        return None
    return ranks[0] if rank0 else ranks[max(ranks)]


def _run_and_kill(corpus, folder: Path, victim: str):
    """One elastic job of 3 workers; the victim's worker SIGKILLed mid-epoch 0. Returns (run dir, exit
    code, output, the victim's last step)."""
    run = folder / "run"
    hosts_file = folder / "hosts.txt"          # read by the recipe's discovery script
    folder.mkdir(parents=True, exist_ok=True)
    write_hosts(hosts_file, LOCAL_HOSTS[:3])
    args = overrides(corpus, run, train="train.jsonl", train__epochs=2, train__batch_seconds=20, train__max_batch=1,
                     train__commit_every=COMMIT, train__trace_utterances="true", train__compression="global_qsgd8",
                     train__pipeline="true", train__predict_weights="true", train__ema_decay=0.9, data__dev_subset=2)
    job = ElasticJob([sys.executable, "-m", "asr.train", "--config", CONF, *args], np=3, min_np=2, max_np=3,
                     script=ROOT / "recipes" / "bfa" / "discover_hosts.sh", log=folder / "horovodrun.log",
                     env={"BFA_HOSTS_FILE": str(hosts_file), "HOROVOD_GLOO_TIMEOUT_SECONDS": "10"})
    killed_at = None
    try:
        deadline = time.time() + 180
        while killed_at is None and time.time() < deadline and job.proc.poll() is None:
            host = _victim_host(run / "trace", victim == "rank0") if (run / "trace").exists() else None
            rows = read_jsonl((run / "trace").glob(f"utts.{host}.*.jsonl")) if host else []
            done = [r["step"] for r in rows if r["epoch"] == 0]
            if done and max(done) >= 3:          # mid-epoch 0: past a commit (step 2), 7 steps in all
                job.kill(host, "asr.train")
                killed_at = max(done)
            time.sleep(0.02)
        rc, output = job.wait(timeout=240)
    finally:
        job.stop()
    return run, rc, output, killed_at


@pytest.mark.parametrize("victim", ["rank0", "other"])
def test_recipe_elastic_survives_a_lost_worker(corpus, tmp_path, victim):  # noqa: F811
    # A hang fails with the output and the py-spy stacks of horovodrun and every worker (JobHung). The one
    # seen before (a survivor deadlocked inside Horovod's shutdown) is fixed by horovod_ext's pinned
    # collectives: tests/test_finalize_deadlock.py.
    run, rc, output, killed_at = _run_and_kill(corpus, tmp_path, victim)
    assert killed_at is not None, output[-4000:]
    assert rc == 0, output[-6000:]

    recs = log_records(run)
    start = next(r for r in recs if r["event"] == "start")
    assert start["workers"] == 3 and start["elastic"] and start["batches_per_epoch"] == 7
    resets = [r for r in recs if r["event"] == "reset"]
    assert len(resets) == 1 and resets[0]["workers"] == 2 and resets[0]["epoch"] == 0, resets
    epochs = [r for r in recs if r["event"] == "epoch"]
    utts = start["train_utts"]
    assert [e["epoch"] for e in epochs] == [0, 1] and all(e["workers"] == 2 for e in epochs), epochs
    assert [e["utterances"] for e in epochs] == [utts, utts]       # committed steps: each utterance once
    assert (run / "checkpoints" / "epoch001.pt").exists() and json.loads((run / "DONE").read_text())["epochs"] == 2
    # The EMA of the weights is part of the elastic state: rolled back with the steps, synced to the new rank 0
    from asr.checkpoint import TrainingCheckpoint
    ck = TrainingCheckpoint.load(run / "checkpoints" / "last.pt")
    assert ck.train_model is not None and ck.ema_updates == ck.step, (ck.ema_updates, ck.step)

    # The trace: every utterance of every epoch trained; repeats only from the rolled-back steps.
    ids = {json.loads(x)["id"] for x in (corpus / "train.jsonl").read_text().splitlines()}
    rows = read_jsonl((run / "trace").glob("utts.*.jsonl"))
    bound = COMMIT * 3 * 1          # commit_every steps x old workers x max_batch
    for epoch in range(2):
        cov = epoch_coverage(rows, epoch, ids)
        assert cov["missing"] == [] and cov["unexpected"] == [] and cov["repeats"] <= bound, (epoch, cov)
        print(f"recipe epoch {epoch}: {len(ids)} utterances, {cov['visits']} trained, {cov['repeats']} repeats "
              f"(bound {bound}); killed after victim step {killed_at}; reset {resets[0]}")
    assert {r["workers"] for r in rows if r["epoch"] == 0} == {2, 3}
    assert {r["workers"] for r in rows if r["epoch"] == 1} == {2}


@pytest.mark.parametrize("sizes", [(3, 2), (2, 3), (3, 1, 4)])
def test_bucket_sampler_resumes_mid_epoch_and_redeals_to_another_world(sizes):
    """BucketBatchSampler(pad=True): consume a few steps at one worker count, re-deal the rest to the
    next; every batch of the epoch is dealt exactly once and every rank runs the same number of steps."""
    import random

    from asr.loader import BucketBatchSampler
    durations = [random.Random(i).uniform(1, 6) for i in range(41)]
    sampler = BucketBatchSampler(durations, 9.0, 3, seed=5, pad=True)
    sampler.set_epoch(2)
    everything = sampler.epoch_batches()
    dealt, start = [], 0
    for k, n in enumerate(sizes):
        per_rank = []
        for rank in range(n):
            sampler.set_world(n, rank)
            sampler.set_epoch(2, start=start)
            per_rank.append(list(sampler))
        assert len({len(p) for p in per_rank}) == 1 and len(per_rank[0]) == len(sampler)
        steps = len(per_rank[0]) if k == len(sizes) - 1 else 2     # commit after 2 steps, then the world changes
        for s in range(steps):
            dealt += [per_rank[r][s] for r in range(n) if per_rank[r][s]]
        start += steps * n
    assert sorted(map(tuple, dealt)) == sorted(map(tuple, everything))
    # not padded (the default): the tail that does not divide evenly is dropped, as before
    plain = BucketBatchSampler(durations, 9.0, 3, num_replicas=3, rank=0, seed=5)
    plain.set_epoch(2)
    assert len(plain) == len(everything) // 3
