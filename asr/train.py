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
import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from .ema import ema_state, load_ema_state, make_ema


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m asr.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config (recipes/bfa/conf/*.yaml)")
    p.add_argument("--resume", action="store_true", help="continue from OUT_DIR/checkpoints/last.pt if it exists")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.epochs=3")
    return p.parse_args(argv)


def load_resume_checkpoint(path: Path):
    """The checkpoint to resume from (a TrainingCheckpoint), or the error message (a string) to show on every rank."""
    from .checkpoint import CheckpointError, TrainingCheckpoint
    try:
        ckpt = TrainingCheckpoint.load(path)
    except CheckpointError as e:
        return f"cannot resume: {e}"
    if ckpt.optimizer is None:
        return f"cannot resume: {path} holds no optimizer state"
    return ckpt


def lr_factor(step: int, epoch: int, warmup: int, decay: float, schedule: str = "epoch", progress: float = 0.0,
              final: float = 0.05) -> float:
    """The learning rate as a fraction of the peak: a linear warm-up over ``warmup`` steps, then
    ``decay ** epoch`` (schedule ``epoch``), or a cosine or linear fall to ``final`` at ``progress`` 1
    (the end of the time budget, or of the last epoch)."""
    warm = min(1.0, (step + 1) / max(warmup, 1))
    if schedule == "epoch":
        return warm * decay ** epoch
    p = min(max(progress, 0.0), 1.0)
    shape = 0.5 * (1.0 + math.cos(math.pi * p)) if schedule == "cosine" else 1.0 - p
    return warm * (final + (1.0 - final) * shape)


def model_config(model, vocab_size: int, n_mels: int, phone_vocab: int = 0):
    """The config's model section completed by the tokenizer's pieces, the features' mel bands and the lexicon's
    phones. A value the config sets (other than the default) that disagrees with them is an error naming both."""
    defaults = type(model)()
    for key, actual, what in (("vocab_size", vocab_size, "the tokenizer has"), ("feat_dim", n_mels, "the features have"),
                              ("phone_vocab", phone_vocab, "the lexicon (data.lexicon) has")):
        asked = getattr(model, key)
        if asked not in (getattr(defaults, key), actual):
            raise ValueError(f"model.{key}={asked} but {what} {actual}; leave model.{key} out of the config")
    return dataclasses.replace(model, vocab_size=vocab_size, feat_dim=n_mels, phone_vocab=phone_vocab)


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


def babble_talkers(dataset, sample_rate: int, pool: int = 64):
    """Babble for the simulator: a fixed subset of ``pool`` training utterances, spread over the manifest."""
    from .augment.noise import TalkerPool
    from .data.manifest import audio_path
    step = max(1, len(dataset.entries) // pool)
    return TalkerPool([str(audio_path(e, dataset.manifest)) for e in dataset.entries[::step][:pool]], sample_rate)


def build_augmenter(cfg, dataset, seed: int):
    """The augmenter of the config's augment section, computing the statistics file's features."""
    if not cfg.augment.enabled:
        return None
    from .augment.pipeline import Augmenter
    return Augmenter(dataclasses.replace(cfg.augment, rir_cache=cfg.rir_cache_dir(),
                                         features=dataset.normalizer.settings),
                     seed=seed, babble=babble_talkers(dataset, dataset.normalizer.settings.sample_rate))


FUSED_ADAM_DEVICES = ("cpu", "cuda")   # where torch.optim.Adam(fused=True) has a kernel


def make_adam(params, lr: float, weight_decay: float, fused: bool) -> torch.optim.Adam:
    """The trainer's Adam. ``fused``: one kernel over all the weights instead of a dozen tensor ops per weight; on
    a CPU thread the per-weight ops of a 2.9M-weight model cost about 10 ms a step, the fused kernel 2.5 ms."""
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True if fused else None)


def keep_fused(opt, fused: list) -> None:
    """After ``opt.load_state_dict``: each group's ``fused`` as this run built it, not as the checkpoint had it (a
    checkpoint from before fused Adam would turn it off), with the step counters where the fused kernel wants
    them (float32 on the weight's device)."""
    for group, was in zip(opt.param_groups, fused):
        group["fused"] = was
        if was:
            for p in group["params"]:
                st = opt.state.get(p)
                if st and torch.is_tensor(st.get("step")):
                    st["step"] = st["step"].to(device=p.device, dtype=torch.float32)


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


EPOCH_COUNTS = ("loss", "att_loss", "ctc_loss", "acc", "phone_ctc_loss", "batches", "utterances", "skipped_utterances",
                "audio_s")


def cores_in_use(cfg, size: int, local_size: int) -> int:
    """CPU cores the run occupies: per host, its workers' threads and loader processes, at most the
    host's cores; times the hosts (for the audio seconds per core-second figure)."""
    host = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_host = min(host, local_size * (cfg.train.threads + cfg.train.loader_workers))
    return per_host * max(1, size // max(local_size, 1))
LOSSES = EPOCH_COUNTS[:5]


class Trainer:
    """One worker's training run, in the order it happens: :meth:`__init__` (set-up: data, model,
    optimizer), :meth:`resume`, then per epoch :meth:`train_epoch`, :meth:`evaluate` and
    :meth:`finish_epoch` (record, checkpoint). :meth:`run` is the epoch loop; elastic runs wrap it
    in ``hvd.elastic.run`` and keep the position in a ``TorchState``."""

    def __init__(self, cfg, elastic: bool):
        import horovod.torch as hvd
        import horovod_ext as hx
        from torch.utils.data import DataLoader

        from .loader import BucketBatchSampler, Normalizer, SpeechDataset, Tokenizer, collate
        from .models.bfa import BFA

        self.cfg, self.elastic, self.hvd = cfg, elastic, hvd
        self.rank, size = hvd.rank(), hvd.size()
        torch.set_num_threads(cfg.train.threads)
        self.device = torch.device(f"cuda:{hvd.local_rank()}" if torch.cuda.is_available() else "cpu")
        self.flush_denormal = self.device.type == "cpu" and flush_subnormals(cfg.train.flush_denormal)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.out = Path(cfg.train.out_dir)
        self.log_path = self.out / "train_log.jsonl"
        self.last = self.out / "checkpoints" / "last.pt"

        self.tok = Tokenizer(cfg.data.tokenizer)
        norm = Normalizer(cfg.data.stats, cfg.data.cmvn, expect=cfg.features)
        self.train_set = SpeechDataset(cfg.data.train, self.tok, norm, max_duration=cfg.data.max_duration,
                                       feature_cache=cfg.data.feature_cache)
        self.train_set.augmenter = build_augmenter(cfg, self.train_set, cfg.train.seed)
        self.dev_set = SpeechDataset(cfg.data.dev, self.tok, norm, feature_cache=cfg.data.feature_cache)
        if cfg.data.dev_subset:
            self.dev_set.entries = self.dev_set.entries[:cfg.data.dev_subset]
        self.sampler = BucketBatchSampler(self.train_set.durations, cfg.train.batch_seconds, cfg.train.max_batch,
                                          size, self.rank, seed=cfg.train.seed, pad=elastic,
                                          match_lengths=cfg.train.match_lengths,
                                          short_first_epochs=cfg.train.short_first_epochs)
        # The loader draws its workers' base seed from its own generator, never from torch's global one: that
        # one drives dropout, seeded per epoch (train_epoch), and a persistent-worker loader draws only when it
        # starts its workers, so a resumed run (workers started at its first epoch) would see other dropout
        # masks than the uninterrupted run (workers started at epoch 0) and not resume exactly.
        self.lexicon = None
        if cfg.model.phone_ctc_weight > 0:
            from .data.lexicon import Lexicon
            if not cfg.data.lexicon:
                raise ValueError("model.phone_ctc_weight > 0 needs data.lexicon (a folder from asr-prep lexicon)")
            self.lexicon = Lexicon(cfg.data.lexicon)
        self.loader = DataLoader(self.train_set, batch_sampler=self.sampler,
                                 collate_fn=functools.partial(collate, lexicon=self.lexicon,
                                                              pad_frames=cfg.train.pad_frames),
                                 num_workers=cfg.train.loader_workers, persistent_workers=cfg.train.loader_workers > 0,
                                 generator=torch.Generator().manual_seed(cfg.train.seed * 1000 + 7 + self.rank))

        self.model_cfg = model_config(cfg.model, self.tok.vocab_size, norm.settings.n_mels,
                                      len(self.lexicon) if self.lexicon else 0)
        torch.manual_seed(cfg.train.seed)
        self.model = BFA(self.model_cfg).to(self.device)
        # The weights decoded (dev pass, checkpoints' ``model``): an EMA of the trained ones, or those themselves
        self.ema = make_ema(self.model, cfg.train.ema_decay) if cfg.train.ema_decay else None
        base = make_adam(self.model.parameters(), lr=cfg.train.lr * size, weight_decay=cfg.train.weight_decay,
                         fused=cfg.train.fused_adam and self.device.type in FUSED_ADAM_DEVICES)
        if cfg.train.slowmo or cfg.train.gossip:
            self.opt = self._averaging_optimizer(base)
        else:
            self.opt = hx.DistributedOptimizer(base, self.model.named_parameters(),
                                               compression=hx.Compression.from_spec(cfg.train.compression),
                                               backward_passes_per_step=cfg.train.backward_passes_per_step,
                                               pipeline=cfg.train.pipeline, warmup_steps=cfg.train.comm_warmup_steps,
                                               nonfinite=cfg.train.nonfinite,
                                               predict_weights=cfg.train.predict_weights and cfg.train.pipeline)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.amp)
        if self.amp_dtype is not None and self.device.type != "cuda" and not (
                self.amp_dtype == torch.bfloat16 and cpu_has_native_bf16()):
            why = ("is for GPU hosts and, as bf16, CPUs with native bf16 (AVX512-BF16 or AMX); this CPU has none"
                   if self.amp_dtype == torch.bfloat16 else "is for GPU hosts")
            self.log({"event": "note", "message": f"train.amp={cfg.train.amp} {why}: training in fp32"})
            self.amp_dtype = None
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.trace = None
        if cfg.train.trace_utterances:
            (self.out / "trace").mkdir(parents=True, exist_ok=True)
            host = os.environ.get("HOROVOD_HOSTNAME", "local")
            self.trace = open(self.out / "trace" / f"utts.{host}.{self.rank}.{os.getpid()}.jsonl", "a")
        self.cores = cores_in_use(cfg, size, hvd.local_size())
        self.features = norm.settings
        self.frames_per_second = self.features.sample_rate / self.features.hop_length
        from .train_lm import tokenizer_digest
        self.tokenizer_digest = tokenizer_digest(cfg.data.tokenizer)
        self.agreed_s, self.stopped_early = 0.0, False           # training time agreed by all workers
        self.data_wait_s = 0.0                                   # this worker's wait for batches this epoch
        self.comm_before = {"wait_s": 0.0, "skipped_steps": 0}   # comm_stats() counts from process start
        self.progress = {"step": 0, "mark": time.time()}         # last completed step; time counted up to

    def _averaging_optimizer(self, base):
        """train.slowmo (local or codec-averaged steps, an exact average and a slow momentum every tau) or
        train.gossip (models mixed with one or two peers per step); the settings were checked with the config."""
        import horovod_ext as hx
        from horovod_ext.slowmo import parse_spec
        cfg = self.cfg.train
        if self.elastic:
            raise ValueError(f"train.{'slowmo' if cfg.slowmo else 'gossip'} is not supported in elastic runs (a worker "
                             f"lost between averages would take its local steps with it)")
        if cfg.gossip:
            return hx.Gossip.from_spec(base, self.model.named_parameters(), cfg.gossip)
        spec = parse_spec(cfg.slowmo)
        inner = dict(backward_passes_per_step=cfg.backward_passes_per_step, pipeline=cfg.pipeline,
                     warmup_steps=cfg.comm_warmup_steps, nonfinite=cfg.nonfinite) if spec["inner"] else {}
        return hx.SlowMo(base, self.model.named_parameters(), **spec, **inner)

    # ------------------------------------------------------------------ logging
    def log(self, rec: dict, echo: bool = True) -> None:
        """Append to train_log.jsonl (rank 0; elastic: rank 0 after the last reset) and print."""
        from tqdm import tqdm
        if self.hvd.rank() != 0:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if echo:
            tqdm.write("[train] " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in rec.items() if not isinstance(v, dict)))

    def log_start(self) -> None:
        from .models.bfa import parameter_count
        cfg = self.cfg
        self.log({"event": "start", "workers": self.hvd.size(), "device": str(self.device),
                  "parameters": parameter_count(self.model), "vocab": self.tok.vocab_size,
                  "train_utts": len(self.train_set), "dev_utts": len(self.dev_set),
                  "batches_per_epoch": len(self.sampler), "compression": cfg.train.compression,
                  **({"slowmo": cfg.train.slowmo} if cfg.train.slowmo else {}),
                  **({"gossip": cfg.train.gossip} if cfg.train.gossip else {}),
                  "pipeline": cfg.train.pipeline,
                  **({"predict_weights": True} if cfg.train.predict_weights and cfg.train.pipeline else {}),
                  "peak_lr": cfg.train.lr * self.hvd.size(), "cores": self.cores,
                  **({"flush_denormal": True} if self.flush_denormal else {}),
                  **({"amp": cfg.train.amp} if self.amp_dtype is not None else {}),
                  **({"pad_frames": cfg.train.pad_frames} if cfg.train.pad_frames > 1 else {}),
                  "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME") or 1.0),   # what hvd.init() read
                  "config": cfg.to_dict(),
                  **({"elastic": True, "commit_every": cfg.train.commit_every} if self.elastic else {})})

    # ------------------------------------------------------------------ resume
    def _load(self, ckpt) -> tuple[int, int, str]:
        """Puts ``ckpt``'s weights and optimizer state into this run: (start epoch, step, ""), or (0, 0, the error to
        show) for a checkpoint of another model shape, naming the model settings that differ (PyTorch's message lists
        tensors, not settings)."""
        try:
            self.model.load_state_dict(ckpt.model if ckpt.train_model is None else ckpt.train_model)
        except RuntimeError:
            ours, theirs = dataclasses.asdict(self.model_cfg), ckpt.model_config or {}
            differ = ", ".join(f"model.{k}: {theirs[k]!r} there, {v!r} here" for k, v in ours.items()
                               if k in theirs and theirs[k] != v)
            return 0, 0, (f"cannot resume: {self.last} holds a model of another shape than this run's config builds "
                          f"({differ or 'the weights differ'}); resume with its settings or start a new train.out_dir")
        if self.ema is not None:   # goes on where it stopped (after a run without one, ema_updates 0: from the weights)
            load_ema_state(self.ema, ckpt.model, ckpt.ema_updates)
        fused = [g.get("fused") for g in self.opt.param_groups]
        self.opt.load_state_dict(ckpt.optimizer)
        keep_fused(self.opt, fused)
        start_epoch, step = ckpt.epoch + 1, ckpt.step
        self.log({"event": "resume", "from": str(self.last), "epoch": start_epoch, "step": step,
                  "codec_state_workers": ckpt.optimizer.get("horovod_ext", {}).get("world_size")})
        return start_epoch, step, ""

    def resume(self, resume: bool) -> dict:
        """The run's starting position: {epoch, step, trained_s, fatal} from ``last.pt`` (``resume``)
        or fresh, with every worker's model and optimizer state equal."""
        hvd, rank = self.hvd, self.rank
        start_epoch, step, fatal = 0, 0, ""
        if self.elastic:
            # No collective before hvd.elastic.run: a worker that joins later runs this code while the
            # others wait in the state's sync. Rank 0 reads last.pt and the sync hands its model,
            # optimizer state, position and the replicated codec state to every worker (the others'
            # error-feedback residuals start at zero); a checkpoint that cannot be read stops every worker.
            if rank == 0 and resume and self.last.exists():
                ckpt = load_resume_checkpoint(self.last)
                if isinstance(ckpt, str):
                    fatal = ckpt
                else:
                    start_epoch, step, fatal = self._load(ckpt)
            trained_s = _trained_seconds(self.log_path) if rank == 0 else 0.0
        else:
            if hvd.broadcast_object(resume and self.last.exists() if rank == 0 else None, 0, name="resume.exists"):
                # Rank 0 reads the file (other hosts need not see it); every rank gets the same model and
                # optimizer state and picks its own share of the codec state (error-feedback residuals, RNG).
                ckpt = hvd.broadcast_object(load_resume_checkpoint(self.last) if rank == 0 else None, 0,
                                            name="resume")
                if isinstance(ckpt, str):
                    fatal = ckpt
                else:
                    start_epoch, step, fatal = self._load(ckpt)
            else:
                hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
                averaging = self.cfg.train.slowmo or self.cfg.train.gossip
                hvd.broadcast_optimizer_state(self.opt.optimizer if averaging else self.opt, root_rank=0)
            trained_s = hvd.broadcast_object(_trained_seconds(self.log_path) if rank == 0 else None, 0,
                                             name="trained_s")
        self.progress["step"] = step
        return dict(epoch=start_epoch, step=step, trained_s=trained_s, fatal=fatal)

    # ------------------------------------------------------------------ the epoch loop
    def run(self, state) -> int:
        """Epochs until ``train.epochs`` or the time budget; returns the exit code."""
        hvd = self.hvd
        if state.fatal:
            print(f"asr.train: {state.fatal}", file=sys.stderr)
            return 2
        self.rank = hvd.rank()
        self.sampler.set_world(hvd.size(), self.rank)
        self.cores = cores_in_use(self.cfg, hvd.size(), hvd.local_size())
        budget_s = self.cfg.train.max_minutes * 60
        max_steps = self.cfg.train.max_steps
        while state.epoch < self.cfg.train.epochs:
            if budget_s and state.trained_s >= budget_s:
                # All ranks decide alike: the figure comes from allreduced values.
                self.log({"event": "budget", "message": f"stopping before epoch {state.epoch}: "
                          f"{state.trained_s / 60:.1f} of train.max_minutes={self.cfg.train.max_minutes:g} used"})
                break
            if max_steps and state.step >= max_steps:      # every rank has taken the same steps
                self.log({"event": "budget", "message": f"stopping before epoch {state.epoch}: "
                          f"{state.step} of train.max_steps={max_steps} taken"})
                break
            self.note_unbuilt_rooms(state.epoch)
            t0 = time.time()
            counts = self.train_epoch(state)
            train_s = state.train_s if self.elastic else time.time() - t0
            t_eval = time.time()
            last = state.epoch == self.cfg.train.epochs - 1 or self.stopped_early
            dev = self.evaluate() if last or (state.epoch + 1) % self.cfg.train.dev_every == 0 else {}
            self.finish_epoch(state, counts, dev, train_s, time.time() - t_eval, t0)
        return 0

    def note_unbuilt_rooms(self, epoch: int) -> None:
        """Log the simulated rooms this epoch draws that nobody built ahead: the loader workers build them while the
        trainers wait (7-10 s an epoch on the demo; e.g. epochs past run.sh's --room-epochs, or another
        train.seed than stage 1's)."""
        aug = self.train_set.augmenter
        if self.rank != 0 or aug is None or not aug.config.rir_cache or aug.config.sim_prob * aug.strength(epoch) <= 0:
            return
        missing = aug.pool.unbuilt(epoch)
        if missing:
            self.log({"event": "note", "message": f"epoch {epoch}: {missing} of its {aug.pool.size} simulated rooms "
                      f"are not in {aug.config.rir_cache}, so the loader workers build them while the trainers wait; "
                      f"asr-prep rooms --config CONFIG --epochs {epoch + 1} with this run's overrides (run.sh: "
                      f"--room-epochs {epoch + 1}) builds them ahead"})

    def train_epoch(self, state) -> dict:
        """One epoch of training steps (elastic: from the committed position); returns the epoch's
        counts, summed over the workers (see EPOCH_COUNTS)."""
        from tqdm import tqdm
        hvd, cfg, opt, model = self.hvd, self.cfg, self.opt, self.model
        rank, size, epoch = self.rank, hvd.size(), state.epoch
        peak_lr = cfg.train.lr * size
        torch.manual_seed(cfg.train.seed * 1000 + epoch * 10 + rank)   # dropout: reproducible per epoch
        self.sampler.set_epoch(epoch, start=state.batch)
        self.train_set.set_epoch(epoch)
        model.train()
        t0 = time.time()
        local = dict.fromkeys(EPOCH_COUNTS, 0.0)       # this worker's counts (elastic: since the last commit)
        # A live bar on a terminal; under horovodrun (output piped, prefixed per line) a line every 30 s.
        interactive = rank == 0 and sys.stderr.isatty()
        bar = tqdm(self.loader, desc=f"epoch {epoch}", disable=not interactive, leave=False, dynamic_ncols=True)
        last_note = time.time()
        steps_left = len(self.sampler)
        self.stopped_early = False
        ready = time.perf_counter()
        for batch in bar:
            self.data_wait_s += time.perf_counter() - ready     # the trainer idle, waiting for its loader
            factor = lr_factor(state.step, epoch, cfg.train.warmup_steps, cfg.train.decay, cfg.train.schedule,
                               self.progress_fraction(state), cfg.train.final_lr)
            for g in opt.param_groups:
                g["lr"] = peak_lr * factor
            stats, gnorm = self.train_step(batch, epoch, state.step)
            state.step += 1
            self.progress["step"] = state.step
            steps_left -= 1
            if self.trace is not None:
                self.trace.write(json.dumps({"epoch": epoch, "step": state.step, "workers": size, "rank": rank,
                                             "ids": batch.ids, "skipped": [u for u, _ in batch.skipped]}) + "\n")
                self.trace.flush()
            local["batches"] += stats is not None
            local["utterances"] += len(batch.ids)
            local["skipped_utterances"] += len(batch.skipped)
            local["audio_s"] += float(batch.flen.sum()) / self.frames_per_second
            for k in LOSSES:
                local[k] += stats.get(k, 0.0) if stats is not None else 0.0
            if self.elastic:
                state.batch += size
                if state.step % cfg.train.commit_every == 0 and steps_left > 0:
                    self._fold(state, local)
                    with opt.true_parameters():      # not the predicted weights (train.predict_weights)
                        state.commit()
            if stats is not None:
                bar.set_postfix(loss=f"{stats['loss']:.3f}", acc=f"{stats['acc']:.2f}")
                if rank == 0 and not interactive and time.time() - last_note > 30:
                    last_note = time.time()
                    per = (last_note - t0) / max(local["batches"], 1)
                    print(f"[train] epoch {epoch} step {state.step} ({len(self.sampler) - steps_left}/"
                          f"{len(self.sampler)}) loss {stats['loss']:.3f} acc {stats['acc']:.2f} ({per:.2f} s/step, "
                          f"epoch eta {per * steps_left:.0f} s)", flush=True)
                if state.step % cfg.train.log_every == 0:
                    self.log({"event": "step", "epoch": epoch, "step": state.step, "lr": opt.param_groups[0]["lr"],
                              "grad_norm": gnorm, **stats}, echo=False)
            # The budgets (checked after the step is logged, so the last step is in the log too)
            if state.step % self.CLOCK_EVERY == 0 and self.budget_used(state, t0):
                self.stopped_early = steps_left > 0
                break
            if cfg.train.max_steps and state.step >= cfg.train.max_steps:
                self.stopped_early = steps_left > 0
                break
            ready = time.perf_counter()
        opt.flush()
        bar.close()
        if self.elastic:
            # The epoch's training is committed before evaluating: a worker lost from here on
            # repeats the evaluation, not the steps.
            self._fold(state, local)
            state.commit()
            return dict(zip(EPOCH_COUNTS, state.counts))
        # Not elastic: the mean of the workers' per-batch means (each worker's batches count alike).
        means = torch.tensor([local[k] / max(local["batches"], 1) for k in LOSSES], dtype=torch.float64)
        means = self._agree(means, op=hvd.Average, name=f"trainloss.{epoch}")
        summed = self._agree(torch.tensor([local["skipped_utterances"], local["audio_s"]], dtype=torch.float64),
                               op=hvd.Sum, name=f"epoch_sums.{epoch}")
        return {**dict(zip(LOSSES, means.tolist())), "batches": 1.0, "skipped_utterances": float(summed[0]),
                "audio_s": float(summed[1])}

    @staticmethod
    def _agree(tensor: torch.Tensor, op, name: str) -> torch.Tensor:
        """A blocking allreduce of a small tensor (in place) through horovod_ext's pinned collectives:
        the driver thread may be enqueueing pipelined gradients' ops meanwhile, and a plain
        ``hvd.allreduce`` there can deadlock Horovod's shutdown after a lost worker (see
        horovod_ext/communicator.py)."""
        from horovod_ext.communicator import allreduce
        return allreduce(tensor, name, op)

    CLOCK_EVERY = 10          # steps between agreements on the training time (one tiny allreduce)

    def budget_used(self, state, epoch_t0: float) -> bool:
        """Agree on the training time so far (the slowest worker's); True when train.max_minutes is used
        up. The agreed time also drives a cosine/linear schedule, so every worker sets the same lr."""
        hvd = self.hvd
        if self.elastic:
            local = state.trained_s + state.train_s + (time.time() - self.progress["mark"])
        else:
            local = state.trained_s + (time.time() - epoch_t0)
        self.agreed_s = float(self._agree(torch.tensor(local, dtype=torch.float64), op=hvd.Max, name="clock"))
        budget_s = self.cfg.train.max_minutes * 60
        return bool(budget_s) and self.agreed_s >= budget_s

    def progress_fraction(self, state) -> float:
        """How far through the run: the agreed training time over the budget, or (no budget) the step
        over the epochs' steps."""
        if self.cfg.train.max_steps:
            return state.step / self.cfg.train.max_steps
        if self.cfg.train.max_minutes:
            return max(self.agreed_s, state.trained_s) / (self.cfg.train.max_minutes * 60)
        return state.step / max(1, self.cfg.train.epochs * len(self.sampler))

    def train_step(self, batch, epoch: int, step: int):
        """One optimizer step on one batch; returns (the model's stats or None for an empty batch, grad norm)."""
        opt, scaler, device = self.opt, self.scaler, self.device
        opt.zero_grad(set_to_none=True)
        for utt_id, reason in batch.skipped:       # the loader could not use a file: say which, go on
            print(f"[train] rank {self.rank} epoch {epoch} step {step}: skipped utterance {utt_id}: {reason}",
                  file=sys.stderr, flush=True)
        stats = None
        if batch.ids:
            feats, toks, tlen = batch.feats.to(device), batch.toks.to(device), batch.tlen.to(device)
            with torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                phones = (batch.phones.to(device), batch.plen.to(device)) if batch.phones is not None else ()
                loss, stats = self.model(feats, batch.flen, toks, tlen, *phones)
            (scaler.scale(loss) if scaler else loss).backward()
        # A batch whose every file was unreadable (or, elastic, the padding of the epoch's last
        # step) still takes part in the step (zero gradients): every worker runs the same collectives.
        opt.synchronize()
        if scaler:
            scaler.unscale_(opt)
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.clip))
        with opt.skip_synchronize():
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
        if self.ema is not None:
            # the true weights, not the predicted ones (train.predict_weights; SlowMo and gossip predict none)
            with getattr(opt, "true_parameters", contextlib.nullcontext)():
                self.ema.update_parameters(self.model)
        return stats, gnorm

    def _fold(self, state, local: dict) -> None:
        """Elastic: add every worker's counts and time since the last commit to the state."""
        hvd = self.hvd
        total = self._agree(torch.tensor([local[k] for k in EPOCH_COUNTS], dtype=torch.float64), op=hvd.Sum,
                              name="elastic.counts")
        state.counts = tuple(a + b for a, b in zip(state.counts, total.tolist()))
        local.update(dict.fromkeys(EPOCH_COUNTS, 0.0))
        now = time.time()
        state.train_s += now - self.progress["mark"]
        self.progress["mark"] = now

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict:
        """CTC best-path WER on the dev set (and greedy attention with train.dev_attention, or without a CTC
        head), each worker decoding its share (unreadable utterances count as all words wrong, as in
        asr-eval). CTC first: it is the better of the two greedy readings while the decoder still loops, and
        it costs one argmax per frame where the looping decoder runs to its length limit."""
        from .decode import decode_manifest
        from .metrics import ErrorCounts, utterance_errors
        hvd = self.hvd
        if self.model.ctc_head is None:
            methods = ("attention",)
        else:
            methods = ("ctc", "attention") if self.cfg.train.dev_attention else ("ctc",)
        model = self.model if self.ema is None else self.ema.module
        rows = decode_manifest(model, self.tok, self.dev_set, methods, batch_seconds=self.cfg.decode.batch_seconds,
                               shard=(self.rank, hvd.size()), device=self.device)
        out = {}
        for m in methods:
            local = sum(utterance_errors([r["ref"] for r in rows[m]], [r["hyp"] for r in rows[m]]), ErrorCounts())
            total = ErrorCounts.from_list(self._agree(torch.tensor(local.to_list(), dtype=torch.float64),
                                                        op=hvd.Sum, name=f"devwer.{m}"))
            out["dev_wer_greedy" if m == "attention" else "dev_wer_ctc"] = total.wer
        return out

    # ------------------------------------------------------------------ record and checkpoint
    def finish_epoch(self, state, counts: dict, dev: dict, train_s: float, eval_s: float, t0: float) -> None:
        """Log the epoch's record, write the checkpoint, advance the position (and commit it)."""
        from .checkpoint import TrainingCheckpoint
        hvd, opt, epoch = self.hvd, self.opt, state.epoch
        comm = opt.comm_stats()["total"]
        rec = {"event": "epoch", "epoch": epoch, "step": state.step, **dev,
               **{f"train_{k}": counts[k] / max(counts["batches"], 1) for k in LOSSES
                  if k != "phone_ctc_loss" or self.lexicon is not None},
               "train_s": train_s, "eval_s": eval_s, "lr": opt.param_groups[0]["lr"],
               "bits_per_element": comm["bits_per_element"],
               "comm_wait_s": comm["wait_s"] - self.comm_before["wait_s"],
               # the slowest-fed worker's seconds waiting for its loader (augmentation that cannot keep up)
               "data_wait_s": float(self._agree(torch.tensor(self.data_wait_s, dtype=torch.float64), op=hvd.Max,
                                                  name=f"data_wait.{epoch}")),
               "skipped_utterances": int(counts["skipped_utterances"]),          # unreadable files, all workers
               "audio_s": counts["audio_s"],                                     # audio trained on, all workers
               "audio_per_core_s": counts["audio_s"] / max(train_s, 1e-9) / self.cores,
               "skipped_steps": comm["skipped_steps"] - self.comm_before["skipped_steps"]}  # NaN/Inf averaged
        if self.elastic:   # utterances trained in committed steps, all workers: the epoch's, each once
            rec.update(workers=hvd.size(), utterances=int(counts["utterances"]))
        if self.stopped_early:   # train.max_minutes or max_steps ran out mid-epoch: the rest of this epoch was not trained
            rec["stopped_at_budget"] = True
        self.comm_before.update(wait_s=comm["wait_s"], skipped_steps=comm["skipped_steps"])
        self.data_wait_s = 0.0
        opt_state = opt.gather_state_dict(root_rank=0)     # collective: every worker's codec state
        if self.rank == 0:
            cfg = self.cfg
            weights, train_weights, ema_updates = self.model.state_dict(), None, 0
            if self.ema is not None:
                (weights, ema_updates), train_weights = ema_state(self.ema), weights
            ckpt = TrainingCheckpoint(model=weights, train_model=train_weights, ema_updates=ema_updates,
                                      optimizer=opt_state, epoch=epoch, step=state.step,
                                      model_config=dataclasses.asdict(self.model_cfg), config=cfg.to_dict(),
                                      tokenizer=cfg.data.tokenizer, stats=cfg.data.stats,
                                      tokenizer_digest=self.tokenizer_digest, features=self.features.to_dict(),
                                      dev_wer_greedy=dev.get("dev_wer_greedy"))
            ckpt.save(self.out / "checkpoints" / f"epoch{epoch:03d}.pt")
            ckpt.save(self.last)
            if cfg.train.keep_epochs:
                for old in sorted((self.out / "checkpoints").glob("epoch*.pt"))[:-cfg.train.keep_epochs]:
                    old.unlink()
        # The allreduce also makes everyone wait for the checkpoint.
        epoch_s = (train_s + eval_s) if self.elastic else time.time() - t0
        epoch_s = float(self._agree(torch.tensor(epoch_s, dtype=torch.float64), op=hvd.Max, name=f"epoch_s.{epoch}"))
        state.trained_s += epoch_s
        state.epochs_done = epoch + 1
        state.epoch, state.batch = epoch + 1, 0
        state.counts, state.train_s = (0.0,) * len(EPOCH_COUNTS), 0.0
        self.progress["mark"] = time.time()
        # Elastic: commit (save, log, then look for host changes: a HostsUpdatedInterrupt raised
        # by the check comes after the saved state already holds this epoch and its record).
        state.save()
        self.log(rec)
        state.check_host_updates()


def flush_subnormals(on: bool) -> bool:
    """Have this thread's CPU float arithmetic read and write subnormal values (below 1.2e-38 in fp32) as zero, or
    not; True if it now does. Why: x86 cores take many times longer on an operation with a subnormal operand, and
    a trained model meets them (Adam's moments, saturated gates, attention tails). One thread, the 60-minute
    model's step: 184 ms at epoch 7 and 152 ms at epoch 0, 155 and 148 ms flushed (scripts/denormal_probe.py). The
    setting is per thread: torch's other intra-op threads (train.threads > 1) keep theirs."""
    return bool(torch.set_flush_denormal(on)) and on


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (AVX512-BF16 or AMX). Elsewhere it emulates bf16, slower
    than fp32, so ``train.amp=bf16`` trains in fp32 there."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def size_onednn_cache(capacity: int = 4096) -> None:
    """oneDNN keeps the kernels it builds for each tensor shape in a cache of 1,024 by default. A bf16 LSTM on the
    CPU needs several per batch shape (layer, direction, forward and backward), so the recipe's few hundred shapes
    overflow it and steps rebuild kernels (one thread, a bf16 BiLSTM pass: 11.9 ms rebuilding, 8.5 cached). Read once,
    when oneDNN builds its first kernel: call before the model runs. ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` wins."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))


def set_cycle_time(ms: float) -> str:
    """Horovod's cycle time for this process, read by ``hvd.init()``: ``ms`` (train.cycle_time_ms) unless
    the environment already names one (``horovodrun --cycle-time-ms``, or HOROVOD_CYCLE_TIME exported), which
    wins as it does for every Horovod knob. Returns the value in force ("" for Horovod's default).

    Why: Horovod's background thread runs a cycle every HOROVOD_CYCLE_TIME ms (default 1), and each cycle
    exchanges the response-cache bits with every worker even when no tensor is ready. On a 2-core host with
    2 trainers that was a quarter of the CPU in system time (RESULTS.md, 2026-12-02 cycle-time pair)."""
    if ms and "HOROVOD_CYCLE_TIME" not in os.environ:
        os.environ["HOROVOD_CYCLE_TIME"] = f"{ms:g}"
    return os.environ.get("HOROVOD_CYCLE_TIME", "")


def main(argv=None) -> int:
    import horovod.torch as hvd

    from .config import ConfigError, load_config

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
    set_cycle_time(cfg.train.cycle_time_ms)
    size_onednn_cache()
    hvd.init()
    trainer = Trainer(cfg, elastic)
    start = trainer.resume(args.resume)
    if start["epoch"] == 0 and not start["fatal"]:
        trainer.log_start()
    # What a commit keeps (elastic: the TorchState's attributes, synced from rank 0 after a reset):
    # position (epoch, step, batches of the epoch consumed by all workers), the epoch's counts summed
    # over the workers at each commit, and the time figures of the budget.
    values = dict(epoch=start["epoch"], step=start["step"], batch=0, counts=(0.0,) * len(EPOCH_COUNTS),
                  train_s=0.0, trained_s=start["trained_s"], epochs_done=start["epoch"],
                  fatal=start["fatal"])
    if elastic:
        extra = {} if trainer.ema is None else {"ema": trainer.ema}    # synced, committed and rolled back alike
        state = hvd.elastic.TorchState(model=trainer.model, optimizer=trainer.opt, **extra, **values)

        def on_reset():
            trainer.log({"event": "reset", "workers": hvd.size(), "epoch": state.epoch, "step": state.step,
                         "batch": state.batch, "rolled_back_steps": max(trainer.progress["step"] - state.step, 0),
                         "peak_lr": cfg.train.lr * hvd.size()})
            trainer.progress["step"] = state.step

        state.register_reset_callbacks([on_reset])
        rc = hvd.elastic.run(trainer.run)(state)
    else:
        state = _Run(**values)
        rc = trainer.run(state)
    if trainer.trace is not None:
        trainer.trace.close()
    if rc:
        return rc
    if hvd.rank() == 0:
        (trainer.out / "DONE").write_text(json.dumps({"epochs": state.epochs_done, "step": state.step,
                                                      "train_minutes": round(state.trained_s / 60, 2)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
