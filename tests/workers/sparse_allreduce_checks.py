"""Top-k's sparse allreduce transport under real horovodrun: every rank reduces gradients whose
top-k positions overlap by a known amount, with the allgather and the sparse-allreduce transports,
and reports its inputs, results and the bytes it handed to Horovod; tests/test_sparse_allreduce.py
checks the results against the sum of every rank's selection and compares the bytes."""
import torch
import horovod.torch as hvd

import horovod_ext as hx
from horovod_ext.communicator import Communicator
from horovod_ext.compression import ReduceContext
from horovod_ext.reduction import Reduction, complete
from tests.workers.common import emit

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.set_num_threads(1)
NUMEL = 4000


def gradient(overlap: float, step: int, dtype=torch.float32) -> torch.Tensor:
    """Small noise plus large entries: a share ``overlap`` of the k = 1% large positions is the same
    on every rank, the rest is this rank's own."""
    g = torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 * step + R), dtype=torch.float64) * 1e-3
    k = NUMEL // 100
    shared = int(round(overlap * k))
    common = torch.arange(shared) * 7 % NUMEL
    own = 1000 + R * 500 + torch.arange(k - shared) * 3
    g[torch.cat([common, own])] = torch.linspace(1.0, 2.0, k, dtype=torch.float64) * (1 + R)
    return g.to(dtype)


def run(spec: str, overlap: float, steps: int = 2, dtype=torch.float32, ratio_spec=None):
    comm = Communicator()
    codec = hx.Compression.from_spec(spec)
    state, rows = {}, []
    for t in range(steps):
        g = gradient(overlap, t, dtype)
        before = state.get("residual")
        acc = g.double() + (before.double() if before is not None else 0)
        ctx = ReduceContext(name=f"{spec}.{overlap}", state=state, comm=comm, op=hvd.Sum)
        red = Reduction(codec, g.clone(), ctx)
        complete([red])
        sent = acc - state["residual"].double()                 # what this rank contributed (error feedback)
        rows.append({"sent": sent.tolist(), "out": red.result.double().reshape(-1).tolist()})
    total = comm.stats
    return {"rows": rows, "wire": total.wire_bytes(N), "alltoall": total.alltoall_calls,
            "allgather": total.allgather_calls}


report = {"rank": R, "size": N, "runs": {}}
for overlap in (1.0, 0.5, 0.0):
    for spec in ("topk0.01", "topk0.01-sar"):
        report["runs"][f"{spec}@{overlap}"] = run(spec, overlap)
report["runs"]["topk0.01-sar@float64"] = run("topk0.01-sar", 0.5, dtype=torch.float64)
# Dense switch: 30% per rank on disjoint positions: the union passes half the tensor at 4 workers.
report["runs"]["topk0.3-sar@0.0"] = run("topk0.3-sar", 0.0, steps=1)
report["runs"]["topk0.3@0.0"] = run("topk0.3", 0.0, steps=1)
emit(report)
