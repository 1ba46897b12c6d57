"""asr-eval: WER evaluation (placeholder until the BFA recipe issue lands)."""
import sys


def main(argv=None) -> int:
    print("asr-eval: not built yet (it arrives with the BFA recipe)", file=sys.stderr)
    return 2
