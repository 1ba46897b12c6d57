"""asr-prep: data preparation (placeholder until the corpus issue lands)."""
import sys


def main(argv=None) -> int:
    print("asr-prep: not built yet (corpus synthesis, import, tokenizer and stats are the corpus issue)",
          file=sys.stderr)
    return 2
