"""horovod_ext: cheap, hidden gradient communication for Horovod on PyTorch.

    import horovod.torch as hvd
    import horovod_ext as hx

    hvd.init()
    opt = hx.DistributedOptimizer(opt, model.named_parameters(),
                                  compression=hx.Compression.global_qsgd(bits=8))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
"""
from .adaptive import Adaptive
from .compression import Compression, Compressor, NonFiniteGradientError
from . import elastic      # registers the hx optimizer's handler for hvd.elastic.TorchState
from .optimizer import DistributedOptimizer
from .reduction import allreduce
from .slowmo import SlowMo
from .gossip import Gossip
from .stats import CommStats

__all__ = ["DistributedOptimizer", "SlowMo", "Gossip", "allreduce", "Adaptive", "Compression", "Compressor", "NonFiniteGradientError", "CommStats"]
__version__ = "0.1.0"
