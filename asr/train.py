"""Train the BFA model with Horovod through horovod_ext; one process per worker.

    horovodrun -np 2 -H localhost:2 python -m asr.train --config recipes/bfa/conf/cpu-small.yaml \\
        train.compression=global_qsgd8 train.pipeline=true
    horovodrun -np 8 -H node1:4,node2:4 python -m asr.train --config recipes/bfa/conf/gpu-full.yaml

Every epoch: length-bucketed batches dealt to the workers, augmentation and features on CPU loader
workers, gradients averaged by ``hx.DistributedOptimizer`` (compression and pipelining from the
config), gradient clipping, warm-up then decay of a learning rate scaled by the world size; at the
end of the epoch the pipeline is flushed, a greedy WER is measured on the dev set (shared across
workers), and rank 0 writes ``checkpoints/epochNNN.pt`` and ``last.pt`` atomically and appends to
``train_log.jsonl``. ``--resume`` continues from ``last.pt``. On GPU hosts each worker takes the GPU
of its local rank; elsewhere the same command runs on the CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m asr.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config (recipes/bfa/conf/*.yaml)")
    p.add_argument("--resume", action="store_true", help="continue from OUT_DIR/checkpoints/last.pt if it exists")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.epochs=3")
    return p.parse_args(argv)


def load_resume_checkpoint(path: Path):
    """The checkpoint to resume from, or the error message (a string) to show on every rank."""
    from .checkpoint import CheckpointError, load_checkpoint
    try:
        return load_checkpoint(path, expect_keys=("model", "optimizer", "epoch", "step"),
                               what="a BFA checkpoint written by asr.train")
    except CheckpointError as e:
        return f"cannot resume: {e}"


def lr_factor(step: int, epoch: int, warmup: int, decay: float) -> float:
    return min(1.0, (step + 1) / max(warmup, 1)) * decay ** epoch


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    import torchaudio.functional as AF
    r, h = ref.split(), hyp.split()
    return AF.edit_distance(r, h), len(r)


def _trained_seconds(log_path: Path) -> float:
    """Training + evaluation seconds already spent by the epochs in a run's log (for --resume)."""
    if not log_path.exists():
        return 0.0
    total = 0.0
    for line in log_path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "epoch":
            total += rec.get("train_s", 0.0) + rec.get("eval_s", 0.0)
    return total


class Babble:
    """Babble noise source for the simulator: random training utterances (picklable).

    Draws from a fixed subset of ``pool`` utterances, decoded once per loader worker and kept, so a
    babble source costs no audio decoding after warm-up."""

    def __init__(self, dataset, pool: int = 64):
        from .data.manifest import audio_path
        step = max(1, len(dataset.entries) // pool)
        self.paths = [str(audio_path(e, dataset.manifest)) for e in dataset.entries[::step][:pool]]
        self._cache: dict[int, torch.Tensor] = {}

    def __call__(self, rng):
        from .augment.dataset import load_wave
        i = int(rng.integers(len(self.paths)))
        for j in [i] + [k for k in range(len(self.paths)) if k != i]:   # an unreadable talker: the next one
            if j not in self._cache:
                try:
                    self._cache[j] = load_wave(self.paths[j])
                except ValueError:
                    self._cache[j] = None
            if self._cache[j] is not None:
                return self._cache[j]
        raise ValueError(f"no readable babble talker among {len(self.paths)} training files")


def build_augmenter(cfg, dataset, seed: int):
    if not cfg.augment.enabled:
        return None
    from .augment.pipeline import AugmentConfig, Augmenter
    a = cfg.augment
    rir_cache = str(Path(cfg.data.train).resolve().parent / "rir_cache") if a.rir_cache == "auto" else a.rir_cache
    ac = AugmentConfig(vtlp=a.vtlp, vtlp_range=tuple(a.vtlp_range), sim_prob=a.sim_prob, t60=tuple(a.t60),
                       snr_db=tuple(a.snr_db), noise_sources=tuple(a.noise_sources), pool_size=a.pool_size,
                       rir_cache=rir_cache or None, specaugment=a.specaugment, features=a.compression)
    return Augmenter(ac, seed=seed, babble=Babble(dataset))


class _Run:
    """The state of a run that is not elastic: plain attributes; commits do nothing."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def save(self) -> None:
        pass

    def check_host_updates(self) -> None:
        pass

    def commit(self) -> None:
        pass


EPOCH_COUNTS = ("loss", "att_loss", "ctc_loss", "acc", "batches", "utterances", "skipped_utterances")


def main(argv=None) -> int:
    import horovod.torch as hvd
    import horovod_ext as hx
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    from .checkpoint import atomic_save
    from .config import ConfigError, load_config
    from .decode import ctc_greedy, greedy
    from .loader import BucketBatchSampler, Normalizer, SpeechDataset, Tokenizer, collate, eval_batches
    from .models.bfa import BFA, BFAConfig, parameter_count

    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"asr.train: {e}", file=sys.stderr)
        return 2
    if cfg.train.commit_every < 1:
        print(f"asr.train: train.commit_every must be >= 1, got {cfg.train.commit_every}", file=sys.stderr)
        return 2
    # Elastic (hvd.elastic.run): asked for in the config, or launched by horovodrun --host-discovery-script
    # (or --min-np/--max-np), which sets HOROVOD_ELASTIC=1 for its workers.
    elastic = cfg.train.elastic or os.environ.get("HOROVOD_ELASTIC") == "1"
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(cfg.train.threads)
    device = torch.device(f"cuda:{hvd.local_rank()}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    out = Path(cfg.train.out_dir)
    log_path = out / "train_log.jsonl"

    def log(rec: dict, echo: bool = True) -> None:
        if hvd.rank() != 0:          # elastic: rank 0 after the last reset
            return
        out.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if echo:
            tqdm.write("[train] " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in rec.items() if not isinstance(v, dict)))

    tok = Tokenizer(cfg.data.tokenizer)
    norm = Normalizer(cfg.data.stats, cfg.data.cmvn)
    train_set = SpeechDataset(cfg.data.train, tok, norm, max_duration=cfg.data.max_duration)
    train_set.augmenter = build_augmenter(cfg, train_set, cfg.train.seed)
    dev_set = SpeechDataset(cfg.data.dev, tok, norm)
    if cfg.data.dev_subset:
        dev_set.entries = dev_set.entries[:cfg.data.dev_subset]
    sampler = BucketBatchSampler(train_set.durations, cfg.train.batch_seconds, cfg.train.max_batch, size, rank,
                                 seed=cfg.train.seed, pad=elastic)
    loader = DataLoader(train_set, batch_sampler=sampler, collate_fn=collate, num_workers=cfg.train.loader_workers,
                        persistent_workers=cfg.train.loader_workers > 0)

    model_cfg = BFAConfig(vocab_size=tok.vocab_size, **dataclasses.asdict(cfg.model))
    torch.manual_seed(cfg.train.seed)
    model = BFA(model_cfg).to(device)
    base = torch.optim.Adam(model.parameters(), lr=cfg.train.lr * size, weight_decay=cfg.train.weight_decay)
    opt = hx.DistributedOptimizer(base, model.named_parameters(),
                                  compression=hx.Compression.from_spec(cfg.train.compression),
                                  backward_passes_per_step=cfg.train.backward_passes_per_step,
                                  pipeline=cfg.train.pipeline, warmup_steps=cfg.train.comm_warmup_steps,
                                  nonfinite=cfg.train.nonfinite)
    start_epoch, step, fatal = 0, 0, ""
    last = out / "checkpoints" / "last.pt"
    if elastic:
        # No collective before hvd.elastic.run: a worker that joins later runs this code while the
        # others wait in the state's sync. Rank 0 reads last.pt and the sync hands its model,
        # optimizer state, position and the replicated codec state to every worker (the others'
        # error-feedback residuals start at zero); a checkpoint that cannot be read stops every worker.
        if rank == 0 and args.resume and last.exists():
            ckpt = load_resume_checkpoint(last)
            if isinstance(ckpt, str):
                fatal = ckpt
            else:
                model.load_state_dict(ckpt["model"])
                opt.load_state_dict(ckpt["optimizer"])
                start_epoch, step = ckpt["epoch"] + 1, ckpt["step"]
                log({"event": "resume", "from": str(last), "epoch": start_epoch, "step": step,
                     "codec_state_workers": ckpt["optimizer"].get("horovod_ext", {}).get("world_size")})
                del ckpt
        trained_s = _trained_seconds(log_path) if rank == 0 else 0.0
    else:
        resume = bool(hvd.broadcast_object(args.resume and last.exists() if rank == 0 else None, 0,
                                           name="resume.exists"))
        if resume:
            ckpt = load_resume_checkpoint(last) if rank == 0 else None
            # Rank 0 reads the file (other hosts need not see it); every rank gets the same model and
            # optimizer state and picks its own share of the codec state (error-feedback residuals, RNG).
            ckpt = hvd.broadcast_object(ckpt, 0, name="resume")
            if isinstance(ckpt, str):
                print(f"asr.train: {ckpt}", file=sys.stderr)
                return 2
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            start_epoch, step = ckpt["epoch"] + 1, ckpt["step"]
            log({"event": "resume", "from": str(last), "epoch": start_epoch, "step": step,
                 "codec_state_workers": ckpt["optimizer"].get("horovod_ext", {}).get("world_size")})
            del ckpt
        else:
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        trained_s = hvd.broadcast_object(_trained_seconds(log_path) if rank == 0 else None, 0, name="trained_s")
    if start_epoch == 0 and not fatal:
        log({"event": "start", "workers": size, "device": str(device), "parameters": parameter_count(model),
             "vocab": tok.vocab_size, "train_utts": len(train_set), "dev_utts": len(dev_set),
             "batches_per_epoch": len(sampler), "compression": cfg.train.compression,
             "pipeline": cfg.train.pipeline, "peak_lr": cfg.train.lr * size, "config": cfg.to_dict(),
             **({"elastic": True, "commit_every": cfg.train.commit_every} if elastic else {})})
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.amp)
    if amp_dtype is not None and device.type != "cuda":
        log({"event": "note", "message": f"train.amp={cfg.train.amp} is for GPU hosts; training in fp32 on the CPU"})
        amp_dtype = None
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    budget_s = cfg.train.max_minutes * 60
    trace = None
    if cfg.train.trace_utterances:
        (out / "trace").mkdir(parents=True, exist_ok=True)
        trace = open(out / "trace" / f"utts.{os.environ.get('HOROVOD_HOSTNAME', 'local')}.{rank}.{os.getpid()}.jsonl",
                     "a")

    # What a commit keeps (elastic: the TorchState's attributes, synced from rank 0 after a reset):
    # position (epoch, step, batches of the epoch consumed by all workers), the epoch's counts summed
    # over the workers at each commit, and the time figures of the budget.
    values = dict(epoch=start_epoch, step=step, batch=0, counts=(0.0,) * len(EPOCH_COUNTS), train_s=0.0,
                  trained_s=trained_s, epoch_s=0.0, epochs_done=start_epoch, fatal=fatal)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, **values) if elastic else _Run(**values)
    comm_before = {"wait_s": 0.0, "skipped_steps": 0}   # comm_stats() counts from process start; the log wants each epoch's share
    # This process's last completed step (elastic: rolled-back ones too) and the time its last
    # commit was counted up to (so the time lost to a reset counts as training time).
    progress = {"step": step, "mark": time.time()}

    def on_reset():
        log({"event": "reset", "workers": hvd.size(), "epoch": state.epoch, "step": state.step, "batch": state.batch,
             "rolled_back_steps": max(progress["step"] - state.step, 0), "peak_lr": cfg.train.lr * hvd.size()})
        progress["step"] = state.step

    if elastic:
        state.register_reset_callbacks([on_reset])

    def train_epochs(state) -> int:
        if state.fatal:
            print(f"asr.train: {state.fatal}", file=sys.stderr)
            return 2
        rank, size = hvd.rank(), hvd.size()
        sampler.set_world(size, rank)
        peak_lr = cfg.train.lr * size
        pending = [0.0] * len(EPOCH_COUNTS)      # elastic: this worker's counts since the last commit

        def fold() -> None:
            """Elastic: add every worker's counts and time since the last commit to the state."""
            total = hvd.allreduce(torch.tensor(pending, dtype=torch.float64), op=hvd.Sum, name="elastic.counts")
            state.counts = tuple(a + b for a, b in zip(state.counts, total.tolist()))
            pending[:] = [0.0] * len(EPOCH_COUNTS)
            now = time.time()
            state.train_s += now - progress["mark"]
            progress["mark"] = now

        while state.epoch < cfg.train.epochs:
            epoch = state.epoch
            trained_s, epoch_s = state.trained_s, state.epoch_s
            if budget_s and (trained_s >= budget_s or epoch_s > 0 and trained_s + epoch_s > budget_s):
                # Stop before an epoch that would not end within the budget (all ranks decide alike: the
                # figures come from allreduced/broadcast values).
                log({"event": "budget", "message": f"stopping before epoch {epoch}: {trained_s / 60:.1f} of "
                     f"train.max_minutes={cfg.train.max_minutes:g} used"
                     + (f", an epoch takes {epoch_s / 60:.1f}" if epoch_s > 0 else "")})
                break
            torch.manual_seed(cfg.train.seed * 1000 + epoch * 10 + rank)   # dropout: reproducible per epoch
            sampler.set_epoch(epoch, start=state.batch)
            train_set.set_epoch(epoch)
            model.train()
            t0 = time.time()
            sums = {"loss": 0.0, "att_loss": 0.0, "ctc_loss": 0.0, "acc": 0.0}
            n = skipped_utts = 0
            # A live bar on a terminal; under horovodrun (output piped, prefixed per line) a line every 30 s.
            interactive = rank == 0 and sys.stderr.isatty()
            bar = tqdm(loader, desc=f"epoch {epoch}", disable=not interactive, leave=False, dynamic_ncols=True)
            last_note = time.time()
            steps_left = len(sampler)
            for batch in bar:
                for g in opt.param_groups:
                    g["lr"] = peak_lr * lr_factor(state.step, epoch, cfg.train.warmup_steps, cfg.train.decay)
                opt.zero_grad(set_to_none=True)
                for utt_id, reason in batch.skipped:       # the loader could not use a file: say which, go on
                    skipped_utts += 1
                    print(f"[train] rank {rank} epoch {epoch} step {state.step}: skipped utterance {utt_id}: {reason}",
                          file=sys.stderr, flush=True)
                stats = None
                if batch.ids:
                    feats, toks, tlen = batch.feats.to(device), batch.toks.to(device), batch.tlen.to(device)
                    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                        loss, stats = model(feats, batch.flen, toks, tlen)
                    (scaler.scale(loss) if scaler else loss).backward()
                # A batch whose every file was unreadable (or, elastic, the padding of the epoch's last
                # step) still takes part in the step (zero gradients): every worker runs the same collectives.
                opt.synchronize()
                if scaler:
                    scaler.unscale_(opt)
                gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip))
                with opt.skip_synchronize():
                    if scaler:
                        scaler.step(opt)
                        scaler.update()
                    else:
                        opt.step()
                state.step += 1
                progress["step"] = state.step
                steps_left -= 1
                if trace is not None:
                    trace.write(json.dumps({"epoch": epoch, "step": state.step, "workers": size, "rank": rank,
                                            "ids": batch.ids, "skipped": [u for u, _ in batch.skipped]}) + "\n")
                    trace.flush()
                if elastic:
                    state.batch += size
                    pending[4:] = [pending[4] + (stats is not None), pending[5] + len(batch.ids),
                                   pending[6] + len(batch.skipped)]
                    if stats is not None:
                        for i, k in enumerate(sums):
                            pending[i] += stats.get(k, 0.0)
                    if state.step % cfg.train.commit_every == 0 and steps_left > 0:
                        fold()
                        state.commit()
                if stats is None:
                    continue
                for k in sums:
                    sums[k] += stats.get(k, 0.0)
                n += 1
                bar.set_postfix(loss=f"{stats['loss']:.3f}", acc=f"{stats['acc']:.2f}")
                if rank == 0 and not interactive and time.time() - last_note > 30:
                    last_note = time.time()
                    per = (last_note - t0) / max(n, 1)
                    print(f"[train] epoch {epoch} batch {n}/{len(sampler)} loss {stats['loss']:.3f} "
                          f"acc {stats['acc']:.2f} ({per:.2f} s/step, epoch eta {per * steps_left:.0f} s)", flush=True)
                if state.step % cfg.train.log_every == 0:
                    log({"event": "step", "epoch": epoch, "step": state.step, "lr": opt.param_groups[0]["lr"],
                         "grad_norm": gnorm, **stats}, echo=False)
            opt.flush()
            bar.close()
            if elastic:
                # The epoch's training is committed before evaluating: a worker lost from here on
                # repeats the evaluation, not the steps.
                fold()
                state.commit()
                train_s = state.train_s
            else:
                train_s = time.time() - t0
            t_eval = time.time()
            # Greedy WER on the dev set, each worker decoding its share.
            model.eval()
            errs = ctc_errs = words = 0
            batches = eval_batches(dev_set.durations, cfg.decode.batch_seconds)
            with torch.no_grad():
                for b in batches[rank::size]:
                    dev = collate([dev_set[i] for i in b])
                    unreadable = dict(dev.skipped)         # counted as all words wrong, as asr-eval does
                    lost = sum(len(dev_set.entries[i]["text"].split()) for i in b
                               if dev_set.entries[i]["id"] in unreadable)
                    errs, ctc_errs, words = errs + lost, ctc_errs + lost, words + lost
                    if not dev.ids:
                        continue
                    feats, flen, texts = dev.feats.to(device), dev.flen, dev.texts
                    encoded = model.encode(feats, flen)                 # once, for both decoders
                    hyps = greedy(model, feats, flen, encoded=encoded)
                    ctc_hyps = ctc_greedy(model, feats, flen, encoded=encoded) if model.ctc_head is not None else hyps
                    for hyp, ctc_hyp, ref in zip(hyps, ctc_hyps, texts):
                        e, w = word_errors(ref, tok.decode(hyp))
                        errs, words = errs + e, words + w
                        ctc_errs += word_errors(ref, tok.decode(ctc_hyp))[0]
            if elastic:
                counts = dict(zip(EPOCH_COUNTS, state.counts))
                tot = hvd.allreduce(torch.tensor([errs, words, ctc_errs, 0], dtype=torch.float64), op=hvd.Sum,
                                    name=f"devwer.{epoch}")
                tot[3] = counts["skipped_utterances"]
                mean = torch.tensor([counts[k] / max(counts["batches"], 1) for k in sums], dtype=torch.float64)
            else:
                tot = hvd.allreduce(torch.tensor([errs, words, ctc_errs, skipped_utts], dtype=torch.float64),
                                    op=hvd.Sum, name=f"devwer.{epoch}")
                mean = hvd.allreduce(torch.tensor([sums[k] / max(n, 1) for k in sums], dtype=torch.float64),
                                     op=hvd.Average, name=f"trainloss.{epoch}")
            dev_wer = float(tot[0] / max(tot[1], 1))
            comm = opt.comm_stats()["total"]
            rec = {"event": "epoch", "epoch": epoch, "step": state.step, "train_loss": float(mean[0]),
                   "train_att_loss": float(mean[1]), "train_ctc_loss": float(mean[2]), "train_acc": float(mean[3]),
                   "dev_wer_greedy": dev_wer,
                   **({"dev_wer_ctc": float(tot[2] / max(tot[1], 1))} if model.ctc_head is not None else {}),
                   "train_s": train_s, "eval_s": time.time() - t_eval,
                   "lr": opt.param_groups[0]["lr"], "bits_per_element": comm["bits_per_element"],
                   "comm_wait_s": comm["wait_s"] - comm_before["wait_s"],
                   "skipped_utterances": int(tot[3]),                      # unreadable files, all workers
                   "skipped_steps": comm["skipped_steps"] - comm_before["skipped_steps"]}  # NaN/Inf averaged gradients
            if elastic:   # utterances trained in committed steps, all workers: the epoch's, each once
                rec.update(workers=size, utterances=int(counts["utterances"]))
            comm_before.update(wait_s=comm["wait_s"], skipped_steps=comm["skipped_steps"])
            opt_state = opt.gather_state_dict(root_rank=0)     # collective: every worker's codec state
            if rank == 0:
                ckpt = {"model": model.state_dict(), "optimizer": opt_state, "epoch": epoch, "step": state.step,
                        "model_config": dataclasses.asdict(model_cfg), "config": cfg.to_dict(),
                        "tokenizer": str(Path(cfg.data.tokenizer).resolve()),
                        "stats": str(Path(cfg.data.stats).resolve()), "dev_wer_greedy": dev_wer}
                atomic_save(ckpt, out / "checkpoints" / f"epoch{epoch:03d}.pt")
                atomic_save(ckpt, last)
                if cfg.train.keep_epochs:
                    for old in sorted((out / "checkpoints").glob("epoch*.pt"))[:-cfg.train.keep_epochs]:
                        old.unlink()
            # The allreduce also makes everyone wait for the checkpoint.
            epoch_s = (train_s + rec["eval_s"]) if elastic else time.time() - t0
            epoch_s = float(hvd.allreduce(torch.tensor(epoch_s, dtype=torch.float64), op=hvd.Max,
                                          name=f"epoch_s.{epoch}"))
            state.trained_s += epoch_s
            state.epoch_s = epoch_s
            state.epochs_done = epoch + 1
            state.epoch, state.batch = epoch + 1, 0
            state.counts, state.train_s = (0.0,) * len(EPOCH_COUNTS), 0.0
            progress["mark"] = time.time()
            # Elastic: commit (save, log, then look for host changes: a HostsUpdatedInterrupt raised
            # by the check comes after the saved state already holds this epoch and its record).
            state.save()
            log(rec)
            state.check_host_updates()
        return 0

    rc = hvd.elastic.run(train_epochs)(state) if elastic else train_epochs(state)
    if trace is not None:
        trace.close()
    if rc:
        return rc
    if hvd.rank() == 0:
        (out / "DONE").write_text(json.dumps({"epochs": state.epochs_done, "step": state.step,
                                              "train_minutes": round(state.trained_s / 60, 2)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
