"""Issue 15: joint CTC/attention beam search that cannot loop, and asr-eval's per-domain WER.

The CTC prefix scorer is checked against torch's CTC forward algorithm (full hypotheses) and against
enumerating every alignment (prefixes); the search against its output bound, with CTC alone, attention
alone and an attention decoder that never emits eos. Tiny random models, no training.
"""
import dataclasses
import itertools
import json
import math
import time

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F

from asr.decode import CTCPrefixScorer, joint_beam_search, joint_search
from asr.models.bfa import BFA, BFAConfig


def tiny(**kw):
    base = dict(vocab_size=6, enc_hidden=8, enc_layers=1, pool_after=[], dec_hidden=8, emb_dim=4, att_dim=8,
                loc_channels=2, loc_kernel=3, dropout=0.0, ctc_weight=0.3)
    base.update(kw)
    torch.manual_seed(0)
    return BFA(BFAConfig(**base)).eval()


def prefix_scores(logp, blank, hyps):
    """Feed equal-length ``hyps`` through the scorer as one beam, each step's candidates being the hypothesis'
    next piece among distractors; return each hypothesis' eos score and its last prefix score."""
    scorer = CTCPrefixScorer(logp, blank)
    r, last = scorer.initial_state().expand(-1, -1, len(hyps)), torch.full((len(hyps),), -1)
    n = len(hyps[0])
    for i in range(n):
        tok = torch.tensor([h[i] for h in hyps])
        cands = torch.stack([(tok + 1) % blank, tok, torch.full_like(tok, blank), (tok + 2) % blank], dim=1)
        psi, r_all = scorer.score(r, last, i, cands)
        r, last = r_all[:, :, torch.arange(len(hyps)), 1], tok
    eos, _ = scorer.score(r, last, n, torch.full((len(hyps), 1), blank))
    return eos[:, 0], psi[:, 1] if n else torch.zeros(len(hyps))


@pytest.mark.parametrize("hyps", [[[]], [[2], [0]], [[1, 1, 3], [0, 2, 0], [4, 4, 4]], [[3, 0, 3, 0, 1, 1, 2]]])
def test_eos_prefix_score_is_the_ctc_forward_log_likelihood(hyps):
    torch.manual_seed(len(hyps[0]))
    T, blank = 11, 5
    logp = F.log_softmax(3 * torch.randn(T, blank + 1), dim=-1)
    eos, _ = prefix_scores(logp, blank, hyps)
    for h, got in zip(hyps, eos.tolist()):
        nll = F.ctc_loss(logp[:, None], torch.tensor([h or [0]]), torch.tensor([T]), torch.tensor([len(h)]),
                         blank=blank, reduction="sum")
        assert got == pytest.approx(-float(nll), abs=1e-4), h


def test_prefix_score_sums_every_sequence_that_starts_with_the_prefix():
    torch.manual_seed(1)
    T, blank = 4, 2
    logp = F.log_softmax(2 * torch.randn(T, blank + 1), dim=-1)
    full = {}                                         # P(output == seq), by enumerating every alignment
    for path in itertools.product(range(blank + 1), repeat=T):
        out = tuple(k for j, k in enumerate(path) if k != blank and (j == 0 or path[j - 1] != k))
        full[out] = full.get(out, 0.0) + math.exp(sum(float(logp[t, k]) for t, k in enumerate(path)))
    for g in ([0], [1], [0, 1], [1, 1], [0, 0, 1]):
        want = math.log(sum(p for seq, p in full.items() if list(seq[:len(g)]) == g))
        _, psi = prefix_scores(logp, blank, [g])
        assert float(psi[0]) == pytest.approx(want, abs=1e-5), g


def encode(model, lengths):
    torch.manual_seed(2)
    feats = torch.randn(len(lengths), max(lengths), 40)
    return model.encode(feats, torch.tensor(lengths))


@pytest.mark.parametrize("ctc_weight,max_ratio", [(1.0, 1.0), (0.0, 1.0), (0.0, 0.5), (0.3, 1.0)])
def test_output_never_outgrows_the_encoder(ctc_weight, max_ratio):
    model = tiny()
    enc, enc_len = encode(model, (3, 9, 17))
    for b, T in enumerate(enc_len.tolist()):
        finals = joint_search(model, enc[b:b + 1], T, beam=4, ctc_weight=ctc_weight, max_ratio=max_ratio)
        assert finals and all(len(h) <= max(1, int(T * max_ratio)) for h, _ in finals)
        assert [s for _, s in finals] == sorted((s for _, s in finals), reverse=True)
        if ctc_weight == 1.0:   # CTC alone: a hypothesis the frames cannot emit has (practically) no probability
            assert all(s > -1e9 for _, s in finals)


def looping_model():
    """Its attention decoder always says piece 3, never eos; its CTC head reads "3" in any input."""
    model = tiny()
    eos = model.config.eos
    with torch.no_grad():
        model.decoder.out.weight.zero_()
        model.decoder.out.bias.fill_(-5.0)
        model.decoder.out.bias[3] = 5.0
        model.decoder.out.bias[eos] = -30.0

    class ReadsThree(torch.nn.Module):
        def forward(self, enc):
            logits = torch.full((*enc.shape[:-1], eos + 1), -60.0)
            logits[..., eos] = 10.0
            logits[..., :2, 3] = 12.0                      # "3 3 blank blank ..." collapses to [3]
            return logits
    model.ctc_head = ReadsThree()
    return model


def test_a_looping_attention_decoder_is_stopped_by_the_bound_and_reined_in_by_ctc():
    model = looping_model()
    feats = torch.randn(2, 40, 40)
    flen = torch.tensor([40, 25])
    t0 = time.perf_counter()
    att_only = joint_beam_search(model, feats, flen, beam=4, ctc_weight=0.0)
    assert [len(h) for h in att_only] == [39, 24]      # the loop runs into the bound: T - 1 pieces, then eos
    assert joint_beam_search(model, feats, flen, beam=4, ctc_weight=0.5) == [[3], [3]]
    assert time.perf_counter() - t0 < 10


def test_joint_search_refuses_what_it_cannot_do():
    model = tiny(ctc_weight=0.0)                       # no CTC head
    enc, enc_len = encode(model, (5,))
    with pytest.raises(ValueError, match="CTC head"):
        joint_search(model, enc, int(enc_len[0]), ctc_weight=0.3)
    assert joint_search(model, enc, int(enc_len[0]), ctc_weight=0.0)        # attention alone still works
    with pytest.raises(ValueError, match=r"ctc_weight must be in \[0, 1\]"):
        joint_search(tiny(), enc, int(enc_len[0]), ctc_weight=1.5)


# ------------------------------------------------------------------ asr-eval: per-domain WER, default method

WORDS = "set an alarm for seven play some music turn off the lights call my mother".split()


@pytest.fixture
def corpus(tmp_path):
    """6 FLACs with speaker and domain, a char tokenizer, feature statistics and a random BFA checkpoint."""
    import sentencepiece as spm

    from asr.checkpoint import atomic_save
    from asr.data.manifest import write_manifest
    rng = np.random.default_rng(0)
    (tmp_path / "audio").mkdir()
    entries = []
    for i in range(6):
        sec = 0.5 + 0.1 * i
        t = np.arange(int(sec * 16000)) / 16000
        x = 0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.02 * rng.standard_normal(t.size)
        sf.write(tmp_path / "audio" / f"u{i}.flac", x.astype(np.float32), 16000)
        entries.append({"id": f"u{i}", "audio_filepath": f"audio/u{i}.flac", "duration": sec,
                        "text": " ".join(rng.choice(WORDS, 2 + i % 3)), "speaker": f"spk{i % 2}",
                        "domain": "command" if i < 4 else "open"})
    write_manifest(tmp_path / "test.jsonl", entries)
    write_manifest(tmp_path / "old.jsonl", [{k: v for k, v in e.items() if k != "domain"} for e in entries])
    (tmp_path / "stats.json").write_text(json.dumps({"mean": [0.5] * 40, "std": [1.0] * 40}))
    spm.SentencePieceTrainer.train(sentence_iterator=iter(WORDS * 5), model_prefix=str(tmp_path / "tok"),
                                   vocab_size=30, model_type="char", minloglevel=2)
    vocab = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok.model")).get_piece_size()
    for name, ctc in (("ctc.pt", 0.3), ("noctc.pt", 0.0)):
        cfg = BFAConfig(vocab_size=vocab, enc_hidden=8, enc_layers=1, pool_after=[], frame_stack=4, dec_hidden=8,
                        emb_dim=8, att_dim=8, loc_channels=2, loc_kernel=3, ctc_weight=ctc)
        torch.manual_seed(0)
        atomic_save({"model": BFA(cfg).state_dict(), "model_config": dataclasses.asdict(cfg),
                     "tokenizer": tmp_path / "tok.model", "stats": tmp_path / "stats.json",
                     "config": {"data": {"cmvn": "utterance"}}}, tmp_path / name)
    return tmp_path


def asr_eval(corpus, *args):
    from asr.evaluate import main
    out = corpus / "eval.json"
    assert main(["--manifest", str(corpus / "test.jsonl"), "--json", str(out), "--threads", "1", *map(str, args)]) == 0
    return json.loads(out.read_text())


def test_asr_eval_reports_wer_per_domain_and_per_speaker(corpus, capsys):
    from asr.metrics import corpus_errors
    res = asr_eval(corpus, "--checkpoint", corpus / "ctc.pt", "--method", "joint", "--ctc-weight", "0.5", "--beam", "3")
    assert res["method"] == "joint" and res["ctc_weight"] == 0.5 and res["beam"] == 3
    assert set(res["per_domain"]) == {"command", "open"} and set(res["per_speaker"]) == {"spk0", "spk1"}
    rows = {r["id"]: r for r in res["hypotheses"]}
    for domain, ids in (("command", ["u0", "u1", "u2", "u3"]), ("open", ["u4", "u5"])):
        want = corpus_errors([rows[i]["ref"] for i in ids], [rows[i]["hyp"] for i in ids])
        got = res["per_domain"][domain]
        assert got["utterances"] == len(ids) and got["ref_words"] == want.ref_words
        assert got["wer"] == pytest.approx(want.wer)
    assert sum(x["ref_words"] for x in res["per_speaker"].values()) == res["ref_words"]
    assert res["seconds_per_utterance"] > 0
    printed = capsys.readouterr().out
    assert "domain  command" in printed and "domain  open" in printed and "speaker spk0" in printed


def test_asr_eval_defaults_to_joint_and_skips_the_domain_breakdown_without_domains(corpus):
    res = asr_eval(corpus, "--checkpoint", corpus / "ctc.pt", "--manifest", corpus / "old.jsonl")
    assert isinstance(res, list) and [r["method"] for r in res] == ["joint", "joint"]
    assert "per_domain" in res[0] and "per_domain" not in res[1] and res[1]["per_speaker"]
    # a model without a CTC head: the default falls back to the attention decoder; asking for joint is refused
    assert asr_eval(corpus, "--checkpoint", corpus / "noctc.pt")["method"] == "attention"
    with pytest.raises(SystemExit, match="CTC head"):
        asr_eval(corpus, "--checkpoint", corpus / "noctc.pt", "--method", "joint")
    assert asr_eval(corpus, "--checkpoint", corpus / "noctc.pt", "--method", "joint", "--ctc-weight", "0")["wer"] >= 0


def test_run_dir_summary_leads_with_the_joint_curve(corpus):
    from asr.evaluate import main
    run = corpus / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "epoch000.pt").write_bytes((corpus / "ctc.pt").read_bytes())
    assert main(["--run-dir", str(run), "--manifest", str(corpus / "test.jsonl"), "--threads", "1"]) == 0
    table = json.loads((run / "wer_per_epoch.json").read_text())
    assert list(table) == ["test.joint", "test.ctc", "test"]          # best first; greedy references after
    assert set(table["test.joint"][0]["per_domain"]) == {"command", "open"}
    assert (run / "wer_per_epoch.png").stat().st_size > 1000


def test_run_dir_jobs_spread_the_epochs_over_processes_with_the_serial_results(corpus):
    """asr-eval --run-dir --jobs 2 decodes each epoch checkpoint in one of two processes; the cached results and the
    summary are those of one process decoding them in turn (each epoch its own weights, so a mix-up would show)."""
    from asr.checkpoint import atomic_save
    from asr.evaluate import main
    base = torch.load(corpus / "ctc.pt", weights_only=False)
    results = {}
    for jobs in (1, 2):
        run = corpus / f"run_jobs{jobs}"
        (run / "checkpoints").mkdir(parents=True)
        for epoch in range(3):
            torch.manual_seed(epoch)
            model = {k: v + 0.3 * torch.randn_like(v) if v.is_floating_point() else v for k, v in base["model"].items()}
            atomic_save({**base, "model": model}, run / "checkpoints" / f"epoch{epoch:03d}.pt")
        assert main(["--run-dir", str(run), "--manifest", str(corpus / "test.jsonl"), "--method", "joint",
                     "--beam", "2", "--threads", "1", "--jobs", str(jobs)]) == 0
        results[jobs] = {f.name: json.loads(f.read_text()) for f in sorted((run / "eval").glob("*.json"))}
        table = json.loads((run / "wer_per_epoch.json").read_text())
        assert [r["epoch"] for r in table["test.joint"]] == [0, 1, 2]
    assert list(results[1]) == [f"test.joint.epoch00{e}.json" for e in range(3)] and list(results[2]) == list(results[1])
    for name, serial in results[1].items():
        assert results[2][name]["epoch"] == serial["epoch"]
        assert [h["hyp"] for h in results[2][name]["hypotheses"]] == [h["hyp"] for h in serial["hypotheses"]]
    assert len({tuple(h["hyp"] for h in r["hypotheses"]) for r in results[1].values()}) > 1   # the epochs differ


def test_run_dir_method_list_reads_one_encoding_per_utterance_for_every_method(corpus, monkeypatch):
    """asr-eval --run-dir --method joint,ctc (stage 3's per-epoch curves): the same results as one method per call,
    with the encoder run once per batch, not once per method; the first method leads the summary."""
    import asr.decode
    from asr.evaluate import main
    calls = []
    real_encode = asr.decode.encode
    monkeypatch.setattr(asr.decode, "encode", lambda *a, **k: calls.append(1) or real_encode(*a, **k))
    runs = {}
    for name, method_args in (("together", [["joint,ctc"]]), ("apart", [["joint"], ["ctc"]])):
        run = corpus / f"run_{name}"
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "epoch000.pt").write_bytes((corpus / "ctc.pt").read_bytes())
        calls.clear()
        for m in method_args:
            assert main(["--run-dir", str(run), "--manifest", str(corpus / "test.jsonl"), "--method", *m,
                         "--threads", "1"]) == 0
        runs[name] = (len(calls), {f.name: [h["hyp"] for h in json.loads(f.read_text())["hypotheses"]]
                                   for f in sorted((run / "eval").glob("*.json"))})
        assert list(json.loads((run / "wer_per_epoch.json").read_text()))[0] == "test.joint"
    (n_together, together), (n_apart, apart) = runs["together"], runs["apart"]
    assert together == apart and set(together) == {"test.joint.epoch000.json", "test.ctc.epoch000.json"}
    assert n_together > 0 and n_apart == 2 * n_together


def test_method_list_is_for_run_dir_and_names_what_is_wrong(corpus, capsys):
    from asr.evaluate import main
    for argv, says in ((["--checkpoint", str(corpus / "ctc.pt"), "--method", "joint,ctc"], "more than one method"),
                       (["--run-dir", str(corpus), "--method", "joint,beam"], "unknown method 'beam'"),
                       (["--run-dir", str(corpus), "--method", "ctc,ctc"], "names a method twice")):
        with pytest.raises(SystemExit):
            main([*argv, "--manifest", str(corpus / "test.jsonl")])
        assert says in capsys.readouterr().err


def test_run_dir_jobs_refuses_watch(corpus):
    from asr.evaluate import main
    with pytest.raises(SystemExit):
        main(["--run-dir", str(corpus), "--manifest", str(corpus / "test.jsonl"), "--jobs", "2", "--watch"])


def _random_lm(corpus):
    """A random word-piece LM of the fixture's tokenizer (no tokenizer digest: asr-eval then checks the size only)."""
    from asr.models.rnnlm import LMConfig, PieceLM, save_lm
    import sentencepiece as spm
    vocab = spm.SentencePieceProcessor(model_file=str(corpus / "tok.model")).get_piece_size()
    torch.manual_seed(1)
    save_lm(PieceLM(LMConfig(vocab_size=vocab, emb_dim=4, hidden=8, dropout=0.0)), corpus / "lm.pt")
    return corpus / "lm.pt"


def test_tune_on_dev_decodes_the_test_set_with_the_lowest_dev_wer_setting(corpus):
    """--tune-on: the CTC weights without the LM, then LM weight x length bonus at the best CTC weight; the setting
    with the lowest dev WER (the first of equals) decodes the test set, exactly as if given by flags. Spread over
    two processes (--jobs 2) the grid is the one a single process computes."""
    import shutil
    from asr.config import DecodeConfig
    lm = _random_lm(corpus)
    shutil.copy(corpus / "test.jsonl", corpus / "dev.jsonl")      # dev = test's utterances: dev WER = test WER
    grids = []
    for jobs in ("1", "2"):
        res = asr_eval(corpus, "--checkpoint", corpus / "ctc.pt", "--lm", lm, "--tune-on", corpus / "dev.jsonl",
                       "--tune-limit", "6", "--beam", "2", "--jobs", jobs)
        grids.append(res["tuned_on"]["grid"])
    assert grids[0] == grids[1]
    grid, dec = grids[0], DecodeConfig()
    n = len(dec.tune_ctc_weights)
    assert [r["ctc_weight"] for r in grid[:n]] == dec.tune_ctc_weights and all(r["lm_weight"] == 0 for r in grid[:n])
    best_c = min(grid[:n], key=lambda r: r["wer"])["ctc_weight"]
    assert [(r["ctc_weight"], r["lm_weight"], r["length_bonus"]) for r in grid[n:]] == \
        [(best_c, w, b) for w in dec.tune_lm_weights for b in dec.tune_length_bonuses]
    chosen = min(grid, key=lambda r: r["wer"])
    assert res["tuned_on"]["chosen"] == {k: chosen[k] for k in ("ctc_weight", "lm_weight", "length_bonus")}
    assert (res["ctc_weight"], res["lm_weight"], res["length_bonus"]) == (chosen["ctc_weight"], chosen["lm_weight"],
                                                                          chosen["length_bonus"])
    assert res["wer"] == chosen["wer"] and res["utterances"] == 6
    flags = ["--ctc-weight", chosen["ctc_weight"], "--lm-weight", chosen["lm_weight"], "--length-bonus",
             chosen["length_bonus"]] + (["--lm", lm] if chosen["lm_weight"] > 0 else [])
    again = asr_eval(corpus, "--checkpoint", corpus / "ctc.pt", "--method", "joint", "--beam", "2", *flags)
    assert [h["hyp"] for h in again["hypotheses"]] == [h["hyp"] for h in res["hypotheses"]]


def test_shared_pool_serves_every_map_inside_it_and_closes_after(monkeypatch):
    """asr-eval --tune-on decodes dev at setting after setting: inside shared_pool(n) every _map(..., n) runs in one
    pool (its processes keep the loaded model and the memoized encodings), with the results of a pool per call."""
    import multiprocessing as mp
    from asr import evaluate
    ctx, made = mp.get_context("spawn"), []
    real = ctx.Pool

    def counting(*a, **k):
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(ctx, "Pool", counting)
    with evaluate.shared_pool(2):
        assert evaluate._map(abs, [-1, -2, -3], 2) == [1, 2, 3]
        assert evaluate._map(abs, [-4, 5], 2) == [4, 5]
        assert evaluate._map(abs, [-6], 2) == [6]          # one job: in this process, as without the pool
    assert len(made) == 1 and evaluate._SHARED_POOL is None
    assert evaluate._map(abs, [-1, -2], 2) == [1, 2] and len(made) == 2    # outside it: a pool per call


def test_asr_eval_with_two_processes_ends_without_leaked_semaphores(corpus):
    """The CLI, as run.sh calls it: --jobs 2 spreads the manifests over two spawned processes, whose pool is
    closed and joined (terminated workers left semaphores that Python's resource tracker warned about at exit)."""
    import subprocess
    import sys
    from pathlib import Path
    import shutil
    shutil.copy(corpus / "test.jsonl", corpus / "dev.jsonl")
    asr_eval_cli = Path(sys.executable).parent / "asr-eval"
    proc = subprocess.run([str(asr_eval_cli), "--checkpoint", str(corpus / "ctc.pt"), "--manifest", str(corpus / "test.jsonl"),
                           "--manifest", str(corpus / "test.jsonl"), "--method", "joint", "--beam", "2",
                           "--lm", str(_random_lm(corpus)), "--tune-on", str(corpus / "dev.jsonl"), "--threads", "1",
                           "--jobs", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "leaked semaphore" not in proc.stderr and "resource_tracker" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.count("test.jsonl: WER") == 2


def test_tune_on_keeps_explicit_flags_and_refuses_the_reported_set(corpus):
    import shutil
    from asr.evaluate import main
    shutil.copy(corpus / "test.jsonl", corpus / "dev.jsonl")
    res = asr_eval(corpus, "--checkpoint", corpus / "ctc.pt", "--tune-on", corpus / "dev.jsonl", "--beam", "2",
                   "--ctc-weight", "0.5")
    assert [r["ctc_weight"] for r in res["tuned_on"]["grid"]] == [0.5] and res["lm_weight"] == 0    # no --lm
    with pytest.raises(SystemExit, match="also a --manifest"):
        asr_eval(corpus, "--checkpoint", corpus / "ctc.pt", "--tune-on", corpus / "test.jsonl")
    with pytest.raises(SystemExit, match="--method joint"):
        asr_eval(corpus, "--checkpoint", corpus / "ctc.pt", "--tune-on", corpus / "dev.jsonl", "--method", "ctc")
    with pytest.raises(SystemExit):    # argparse: --tune-on needs --checkpoint
        main(["--run-dir", str(corpus), "--manifest", str(corpus / "test.jsonl"), "--tune-on", str(corpus / "dev.jsonl")])


def test_json_once_per_manifest(corpus):
    from asr.evaluate import main
    outs = [corpus / "a.json", corpus / "b.json"]
    assert main(["--checkpoint", str(corpus / "ctc.pt"), "--manifest", str(corpus / "test.jsonl"), "--manifest",
                 str(corpus / "old.jsonl"), "--json", str(outs[0]), "--json", str(outs[1]), "--method", "ctc",
                 "--threads", "1", "--jobs", "2"]) == 0
    a, b = (json.loads(o.read_text()) for o in outs)
    assert a["manifest"].endswith("test.jsonl") and b["manifest"].endswith("old.jsonl") and a["wer"] == b["wer"]
