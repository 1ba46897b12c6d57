"""Train the word-piece model (``asr-prep tokenizer``): sentencepiece unigram over the training transcripts, or
(what the recipe does) over the language model's text, which holds them plus far more sentences from the same
generators, so the pieces also cover words no training utterance speaks.

Deterministic: one thread, input in file order, no sampling of input sentences, so the same input gives
byte-identical tokenizer.model files. ids: 0 <unk>, 1 <s>, 2 </s> (sentencepiece's defaults; no pad piece).
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

import sentencepiece as spm

from .manifest import read_manifest


class TokenizerError(RuntimeError):
    pass


def read_text_lines(path) -> list[str]:
    """Non-empty lines of a UTF-8 text file (one sentence per line), with an error naming the file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read text (expected UTF-8, one sentence per line): {e}") from e
    return [ln.strip() for ln in lines if ln.strip()]


def train_tokenizer(manifest, vocab_size: int, out_dir, text=None) -> Path:
    """Write out_dir/tokenizer.model and .vocab (and the training text, transcripts.txt); return the model path.

    The input is a manifest's transcripts, or with ``text`` (manifest None) a file of one sentence per line."""
    if (manifest is None) == (text is None):
        raise TokenizerError("train_tokenizer: give a manifest or a text file, not both")
    source = manifest if text is None else text
    if text is None:
        entries = read_manifest(manifest, required=("text",))
        texts = [e["text"] for e in entries if e["text"].strip()]
    else:
        texts = read_text_lines(text)
    if not texts:
        raise TokenizerError(f"{source}: no transcripts to train on")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "transcripts.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="unigram",
            character_coverage=1.0, num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
            max_sentence_length=1 << 16, minloglevel=2)
    except RuntimeError as e:
        raise TokenizerError(f"sentencepiece could not train a {vocab_size}-piece model on {len(texts)} transcripts "
                             f"of {source}: {e}") from e
    path = out / "tokenizer.model"
    path.write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    (out / "tokenizer.vocab").write_text("".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n"
                                                 for i in range(sp.get_piece_size())), encoding="utf-8")
    n_tokens = sum(len(sp.encode(t)) for t in texts)
    n_words = sum(len(t.split()) for t in texts)
    print(f"asr-prep tokenizer: {sp.get_piece_size()} pieces -> {path} ({n_tokens / max(n_words, 1):.2f} pieces "
          "per word on the training text)", file=sys.stderr)
    return path
