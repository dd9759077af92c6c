r"""The partitioned execution engine, usable from plain ``torch.distributed``.

The Lightning strategy and the Fabric helpers are thin adapters over
:class:`FullGraphEngine`.
"""
from .batchnorm import DistributedBatchNorm, convert_batchnorm, revert_batchnorm
from .codec import Codec, IdentityCodec
from .engine import FullGraphEngine
from .exchange import HaloExchange
from .gather import gather_nodes
from .gradients import all_reduce_gradients, broadcast_parameters, loss_weight
from .norm import distributed_gcn_norm
from .partitioned import PartitionedModel, partition_model
from .stats import CommStats, ExchangeCounter
from .support import EXACT_LAYERS, UnsupportedLayerError, check_model

__all__ = [
    "FullGraphEngine", "HaloExchange", "Codec", "IdentityCodec", "CommStats",
    "ExchangeCounter", "PartitionedModel", "partition_model", "DistributedBatchNorm",
    "convert_batchnorm", "revert_batchnorm", "distributed_gcn_norm", "gather_nodes",
    "all_reduce_gradients", "broadcast_parameters", "loss_weight", "EXACT_LAYERS",
    "UnsupportedLayerError", "check_model",
]
