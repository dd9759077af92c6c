r"""The partitioned execution engine, usable from plain ``torch.distributed``.

The Lightning strategy and the Fabric helpers are thin adapters over
:class:`FullGraphEngine`.
"""
from .. import compat

compat.require("torch_geometric")  # before the modules that reach into PyG

from .batchnorm import DistributedBatchNorm, convert_batchnorm, revert_batchnorm  # noqa: E402
from .codec import Codec, IdentityCodec  # noqa: E402
from .engine import FullGraphEngine  # noqa: E402
from .errors import CollectiveError  # noqa: E402
from .exchange import HaloExchange  # noqa: E402
from .gather import gather_nodes  # noqa: E402
from .gradients import all_reduce_gradients, broadcast_parameters, loss_weight, reduce_backward  # noqa: E402
from .norm import distributed_gcn_norm  # noqa: E402
from .partitioned import PartitionedModel, SparseAdjacencyError, partition_model  # noqa: E402
from .stats import CommStats, ExchangeCounter  # noqa: E402
from .support import EXACT_LAYERS, UnsupportedLayerError, check_model  # noqa: E402

__all__ = [
    "FullGraphEngine", "HaloExchange", "Codec", "IdentityCodec", "CommStats",
    "ExchangeCounter", "PartitionedModel", "partition_model", "DistributedBatchNorm",
    "convert_batchnorm", "revert_batchnorm", "distributed_gcn_norm", "gather_nodes",
    "all_reduce_gradients", "reduce_backward", "broadcast_parameters", "loss_weight",
    "CollectiveError", "SparseAdjacencyError", "EXACT_LAYERS",
    "UnsupportedLayerError", "check_model",
]
