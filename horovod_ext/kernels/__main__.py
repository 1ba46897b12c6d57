"""``python -m horovod_ext.kernels``: build the native kernels now (make setup), so no run waits for the compiler."""
import sys

from . import build

try:
    print(f"[setup] native codec kernels: {build(verbose='-v' in sys.argv)}")
except RuntimeError as err:
    print(f"[setup] WARNING: native codec kernels not built; codecs use the torch reference path: {err}")
