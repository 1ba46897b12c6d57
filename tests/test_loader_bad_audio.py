"""A corrupt or empty audio file in a manifest costs one utterance, not the run.

SpeechDataset returns a SkippedItem (utt_id, reason naming the file) for it, collate drops it and reports it in
Batch.skipped (a batch of only bad files comes back empty, not missing, so every rank still runs the same number
of steps), and asr-eval counts such utterances as errors and lists them in its JSON.
"""
import dataclasses
import json
import logging

import numpy as np
import pytest
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from asr.data.manifest import write_manifest
from asr.loader import Batch, BucketBatchSampler, Normalizer, SkippedItem, SpeechDataset, collate

WORDS = "set an alarm for seven play some music turn off the lights call my mother".split()
BAD = {"empty": "a 0-byte file", "cut": "the first half of a good FLAC", "nosamples": "a WAV file with no samples",
       "text": "a text file named .flac"}


class CharTokenizer:
    """Letters -> ids (enough for the dataset; picklable into loader workers)."""
    vocab_size = 27

    def encode(self, text):
        return [ord(c) - 96 if c.isalpha() else 0 for c in text]

    def decode(self, ids):
        return "".join(chr(i + 96) if i else " " for i in ids)


@pytest.fixture
def corpus(tmp_path):
    """8 good FLACs and one of each kind of bad file, in one manifest (bad ones between good ones)."""
    rng = np.random.default_rng(0)
    (tmp_path / "audio").mkdir()
    entries = []
    for i in range(8):
        sec = 0.4 + 0.1 * i
        t = np.arange(int(sec * 16000)) / 16000
        x = 0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.02 * rng.standard_normal(t.size)
        sf.write(tmp_path / "audio" / f"good{i}.flac", x.astype(np.float32), 16000)
        entries.append({"id": f"good{i}", "audio_filepath": f"audio/good{i}.flac", "duration": sec,
                        "text": " ".join(rng.choice(WORDS, 3))})
    data = (tmp_path / "audio" / "good7.flac").read_bytes()
    (tmp_path / "audio" / "cut.flac").write_bytes(data[:len(data) // 2])
    (tmp_path / "audio" / "empty.flac").write_bytes(b"")
    sf.write(tmp_path / "audio" / "nosamples.wav", np.zeros(0, dtype=np.float32), 16000)
    (tmp_path / "audio" / "text.flac").write_text("not audio\n")
    for j, name in enumerate(BAD):
        ext = "wav" if name == "nosamples" else "flac"
        entries.insert(2 * j + 1, {"id": name, "audio_filepath": f"audio/{name}.{ext}", "duration": 0.4 + 0.1 * j,
                                   "text": "call my mother"})
    write_manifest(tmp_path / "train.jsonl", entries)
    (tmp_path / "stats.json").write_text(json.dumps({"mean": [0.5] * 40, "std": [1.0] * 40}))
    return tmp_path


def dataset(corpus, **kw):
    return SpeechDataset(corpus / "train.jsonl", CharTokenizer(), Normalizer(corpus / "stats.json"), **kw)


def test_a_bad_file_comes_back_as_a_skip_marker_naming_the_file(corpus, caplog):
    ds = dataset(corpus)
    by_id = {e["id"]: i for i, e in enumerate(ds.entries)}
    with caplog.at_level(logging.WARNING, logger="asr.loader"):
        for name in BAD:
            item = ds[by_id[name]]
            assert isinstance(item, SkippedItem) and item.utt_id == name, (name, item)
            assert str(corpus / "audio" / name) + "." in item.reason, item.reason
            assert ds[by_id[name]] == item                        # again: same reason, not logged twice
    assert "no samples" in ds[by_id["nosamples"]].reason
    logged = [r.getMessage() for r in caplog.records if r.name == "asr.loader"]
    assert len(logged) == len(BAD) and all("skipping utterance" in m for m in logged)
    utt_id, feats, toks, text = ds[by_id["good3"]]
    assert utt_id == "good3" and feats.shape[1] == 40 and toks == CharTokenizer().encode(text)


def test_collate_drops_bad_items_and_reports_them(corpus):
    ds = dataset(corpus)
    items = [ds[i] for i in range(len(ds))]
    batch = collate(items)
    assert isinstance(batch, Batch) and len(batch) == 9 and batch.phones is None   # no lexicon: no phones
    assert batch.ids == [f"good{i}" for i in range(8)] and len(batch.texts) == 8
    assert [s[0] for s in batch.skipped] == list(BAD)
    assert all(f"audio/{name}." in why for name, why in batch.skipped)
    assert batch.feats.shape == (8, int(batch.flen.max()), 40) and batch.toks.shape[0] == 8
    assert batch.flen.dtype == batch.tlen.dtype == torch.long
    good_only = collate([x for x in items if not isinstance(x, SkippedItem)])
    assert good_only.skipped == [] and torch.equal(good_only.feats, batch.feats)
    assert torch.equal(good_only.toks, batch.toks) and torch.equal(good_only.flen, batch.flen)


def test_a_batch_of_only_bad_files_is_empty_but_present(corpus):
    ds = dataset(corpus)
    by_id = {e["id"]: i for i, e in enumerate(ds.entries)}
    batch = collate([ds[by_id["empty"]], ds[by_id["cut"]]])
    ids, feats, flen, toks, tlen, texts, skipped, phones, plen = batch
    assert ids == [] and texts == [] and [s[0] for s in skipped] == ["empty", "cut"] and phones is plen is None
    assert feats.shape == (0, 0, 40) and feats.dtype == torch.float32
    assert flen.shape == tlen.shape == (0,) and flen.dtype == tlen.dtype == torch.long
    assert toks.shape == (0, 1) and toks.dtype == torch.long


@pytest.mark.parametrize("workers", [0, 1])
def test_every_rank_still_runs_the_same_number_of_steps(corpus, workers):
    """Two ranks' loaders (augmentation on, as in training): each yields exactly its sampler's batches, bad files
    or not, and every utterance is either in a batch or reported as skipped."""
    from asr.augment.pipeline import AugmentConfig, Augmenter
    ds = dataset(corpus, augmenter=Augmenter(AugmentConfig(sim_prob=0.0), seed=1))
    seen, skipped, steps = [], [], []
    for rank in range(2):
        sampler = BucketBatchSampler(ds.durations, batch_seconds=1.5, max_batch=3, num_replicas=2, rank=rank, seed=2)
        sampler.set_epoch(1)
        ds.set_epoch(1)
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=workers)
        n = 0
        for batch, idx in zip(loader, sampler):
            assert isinstance(batch, Batch) and len(batch.ids) + len(batch.skipped) == len(idx)
            assert batch.feats.shape[0] == len(batch.ids) == batch.flen.shape[0] == batch.toks.shape[0]
            seen += batch.ids
            skipped += [s[0] for s in batch.skipped]
            n += 1
        steps.append(n)
        assert n == len(sampler)
    assert steps[0] == steps[1] > 0
    dealt = {ds.entries[i]["id"] for r in range(2)
             for b in BucketBatchSampler(ds.durations, 1.5, 3, 2, r, seed=2)._batches() for i in b}
    assert set(seen) | set(skipped) == dealt and not set(seen) & set(BAD)
    assert set(skipped) == set(BAD) & dealt


def test_asr_eval_counts_skipped_utterances_as_errors(corpus, tmp_path, capsys):
    import sentencepiece as spm

    from asr.checkpoint import atomic_save
    from asr.evaluate import main
    from asr.metrics import corpus_errors
    from asr.models.bfa import BFA, BFAConfig
    spm.SentencePieceTrainer.train(sentence_iterator=iter(WORDS * 5), model_prefix=str(tmp_path / "tok"),
                                   vocab_size=30, model_type="char", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok.model"))
    cfg = BFAConfig(vocab_size=sp.get_piece_size(), enc_hidden=8, enc_layers=1, pool_after=[], dec_hidden=8,
                    emb_dim=8, att_dim=8, loc_channels=2, loc_kernel=3)
    torch.manual_seed(0)
    atomic_save({"model": BFA(cfg).state_dict(), "model_config": dataclasses.asdict(cfg), "tokenizer": tmp_path / "tok.model",
                 "stats": corpus / "stats.json", "config": {"data": {"cmvn": "utterance"}}}, tmp_path / "last.pt")
    assert main(["--checkpoint", str(tmp_path / "last.pt"), "--manifest", str(corpus / "train.jsonl"),
                 "--json", str(tmp_path / "eval.json"), "--method", "ctc", "--threads", "1"]) == 0
    res = json.loads((tmp_path / "eval.json").read_text())
    assert res["utterances"] == 12 and res["skipped_utterances"] == len(BAD)
    assert {s["id"] for s in res["skipped"]} == set(BAD)
    assert all(f"audio/{s['id']}." in s["reason"] for s in res["skipped"])
    rows = {r["id"]: r for r in res["hypotheses"]}
    assert all(rows[name]["hyp"] == "" and rows[name]["skipped"] for name in BAD)
    good = [r for r in res["hypotheses"] if "skipped" not in r]
    out = corpus_errors([r["ref"] for r in good], [r["hyp"] for r in good])
    words = sum(len(r["ref"].split()) for r in res["hypotheses"])
    bad_words = sum(len(rows[name]["ref"].split()) for name in BAD)
    assert res["wer"] == pytest.approx((out.errors + bad_words) / words) and res["ref_words"] == words
    assert res["ser"] >= len(BAD) / 12
    printed = capsys.readouterr().out
    assert "4 unreadable utterance(s) skipped, counted as errors" in printed and "skipped cut:" in printed
