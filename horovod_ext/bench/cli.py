"""hx-bench: communication benchmarks.

Built so far: ``hx-bench convergence`` (final loss of every codec against fp32). The
network-emulated step-time benchmark (namespaces + tc, against Horovod and DDP) is not built yet.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "convergence":
        from .convergence import main as convergence
        return convergence(argv[1:])
    p = argparse.ArgumentParser(prog="hx-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=["convergence"], help="which benchmark to run")
    args, _ = p.parse_known_args(argv)
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
