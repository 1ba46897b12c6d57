"""A job where rank 1 fails: the harness must show both ranks' output."""
import sys

import horovod.torch as hvd

hvd.init()
print(f"rank {hvd.rank()} started", flush=True)
if hvd.rank() == 1:
    sys.exit("deliberate failure on rank 1")
