"""Text for the language model (``asr-prep lm-text``): the training transcripts plus more sentences from the
same generators, never a dev or test sentence.

The corpus speaks only a few thousand sentences, but its text comes from sources with far more: the command
grammar (data/text/templates.yaml) and the open-domain pool (Debian text packages). An LM trained on text alone
is how the paper's system (and LibriSpeech's LM corpus) uses such text. Every sentence of every held-out
manifest in the corpus folder (dev, test, test_far, ...) is excluded, so the LM never sees what is scored.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from . import DATA_DIR
from ..atomic import atomic_write_text
from .manifest import read_manifest
from .synth import COMMAND_FRACTION
from .text import CommandGrammar, generate_commands, load_sources, open_domain_pool


def build_lm_text(corpus_dir, out, extra: int = 60000, data_dir=DATA_DIR) -> dict:
    """Write OUT (one sentence per line) and OUT.json (counts, what was excluded); return the summary."""
    corpus = Path(corpus_dir)
    train = corpus / "train.jsonl"
    if not train.exists():
        raise FileNotFoundError(f"{train}: no training manifest (is {corpus} a corpus folder from asr-prep synth?)")
    info_path = corpus / "corpus.json"
    seed = json.loads(info_path.read_text())["seed"] if info_path.exists() else 0
    held_out_files = sorted(p for p in corpus.glob("*.jsonl") if p.name not in ("train.jsonl", "rejected.jsonl"))
    held_out = {e["text"] for p in held_out_files for e in read_manifest(p, required=("text",))}
    train_texts = [e["text"] for e in read_manifest(train, required=("text",))]
    held_out -= set(train_texts)          # a manifest made from training utterances (a subset) holds nothing new
    n_cmd = round(extra * COMMAND_FRACTION)
    seen = held_out | set(train_texts)
    cmds = generate_commands(n_cmd, random.Random(f"{seed}:lm-commands"), CommandGrammar.load(data_dir), exclude=seen)
    seen |= set(cmds)
    opens = open_domain_pool(load_sources(data_dir), random.Random(f"{seed}:lm-open"), exclude=seen)
    opens = opens[:extra - n_cmd]
    lines = train_texts + cmds + opens
    out = Path(out)
    atomic_write_text(out, "".join(t + "\n" for t in lines))
    summary = {"sentences": len(lines), "train_transcripts": len(train_texts), "extra_commands": len(cmds),
               "extra_open_domain": len(opens), "excluded_held_out": len(held_out),
               "held_out_manifests": [p.name for p in held_out_files], "seed": seed}
    out.with_name(out.name + ".json").write_text(json.dumps(summary, indent=1))
    print(f"asr-prep lm-text: {len(lines)} sentences -> {out} ({len(train_texts)} training transcripts, "
          f"{len(cmds)} more commands, {len(opens)} more open-domain; {len(held_out)} held-out sentences excluded)",
          file=sys.stderr)
    return summary
