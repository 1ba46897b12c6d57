"""Corpus preparation: manifests, offline synthesis, importers, tokenizer, statistics.

Everything is driven by ``asr-prep`` (``asr.data.cli``). The small versioned inputs (templates, slot word lists,
open-domain text sources, voice lists) live in the repository's ``data/`` folder, so a corpus is a function of the
code, those files, the Debian packages that provide text and voices, and a seed.
"""
import os
from pathlib import Path

#: The repository's ``data/`` folder (templates, slots, voices). ``ASR_DATA_DIR`` overrides it, e.g. for an
#: installed (non-editable) copy of the package.
DATA_DIR = Path(os.environ.get("ASR_DATA_DIR", Path(__file__).resolve().parents[2] / "data"))
