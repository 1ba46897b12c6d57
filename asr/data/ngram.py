"""The word n-gram LM (``asr-prep ngram``) that the lexicon decoder (``asr-eval --method lexicon``) searches with:
KenLM's ``lmplz`` (modified Kneser-Ney) over the LM text, then ``build_binary`` for a file that loads in
milliseconds.

KenLM's estimator has no binary wheel on PyPI; ``make setup`` builds ``lmplz`` and ``build_binary`` from KenLM's
PyPI source distribution into its cache and links them into the venv's ``bin/``. They are found on PATH, next to
the running Python, or through ``HX_KENLM_BIN`` (a folder).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


class NgramError(RuntimeError):
    pass


def kenlm_tool(name: str) -> str:
    """The path of KenLM's ``lmplz`` or ``build_binary``, with an error that says how to get it."""
    folders = [os.environ.get("HX_KENLM_BIN", ""), str(Path(sys.executable).parent)]
    for folder in folders:
        if folder and (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    found = shutil.which(name)
    if found:
        return found
    raise NgramError(f"KenLM's {name} was not found (looked in $HX_KENLM_BIN, {folders[1]} and PATH); "
                     f"make setup builds it, or set HX_KENLM_BIN to a folder that holds it")


def build_ngram(text, out, order: int = 4) -> Path:
    """Estimate an ``order``-gram over ``text`` (one sentence per line) and write KenLM's binary format to ``out``."""
    text, out = Path(text), Path(out)
    if not text.is_file() or text.stat().st_size == 0:
        raise NgramError(f"{text}: no LM text (expected one sentence per line, from asr-prep lm-text)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ngram_", dir=out.parent) as work:
        arpa = Path(work) / "lm.arpa"
        with open(text) as src, open(arpa, "w") as dst:
            # --discount_fallback: small texts lack the counts-of-counts Kneser-Ney's discounts are estimated from
            res = subprocess.run([kenlm_tool("lmplz"), "-o", str(order), "--discount_fallback", "-S", "20%",
                                  "-T", work], stdin=src, stdout=dst, stderr=subprocess.PIPE, text=True)
        if res.returncode != 0:
            raise NgramError(f"lmplz -o {order} failed on {text}: {res.stderr.strip()[-400:]}")
        tmp = Path(work) / "lm.bin"
        res = subprocess.run([kenlm_tool("build_binary"), str(arpa), str(tmp)], capture_output=True, text=True)
        if res.returncode != 0:
            raise NgramError(f"build_binary failed on the {order}-gram of {text}: {res.stderr.strip()[-400:]}")
        os.replace(tmp, out)          # atomic: a crash leaves no half-written LM
    return out
