r"""The partitioned execution engine, usable from plain ``torch.distributed``.

The Lightning strategy and the Fabric helpers are thin adapters over
:class:`FullGraphEngine`.
"""
from .. import compat

compat.require("torch_geometric")  # before the modules that reach into PyG

from .agreement import Agreement, all_agree  # noqa: E402
from .aggregation import MODES, PRE_LAYERS, AggregationRouter, pre_eligible  # noqa: E402
from .cache import HaloCache  # noqa: E402
from .pipeline import AsyncPipeline  # noqa: E402
from .sampling import BoundarySampling  # noqa: E402
from .batchnorm import DistributedBatchNorm, convert_batchnorm, revert_batchnorm  # noqa: E402
from .codecs import Codec, IdentityCodec, WireContext  # noqa: E402
from .config import ExchangeConfig  # noqa: E402
from .engine import FullGraphEngine  # noqa: E402
from .errors import CollectiveError  # noqa: E402
from .exchange import HaloExchange  # noqa: E402
from .gather import gather_nodes  # noqa: E402
from .gradients import (BackwardHooks, UnreducedBackwardError,  # noqa: E402
                        all_reduce_gradients, broadcast_parameters, loss_weight,
                        reduce_backward)
from .norm import distributed_gcn_norm  # noqa: E402
from .partitioned import PartitionedModel, SparseAdjacencyError, partition_model  # noqa: E402
from .policy import ExchangePolicy  # noqa: E402
from .static import StaticInputs  # noqa: E402
from .step_aside import StepAside  # noqa: E402
from .stats import CommStats, ExchangeCounter  # noqa: E402
from .graphnorm import (MultipleGraphsError, convert_cross_node_norms,  # noqa: E402
                        revert_cross_node_norms)
from .laplacian import distributed_laplacian  # noqa: E402
from .support import (EXACT_LAYERS, REFUSED_LAYERS, TRAINING_REFUSED_LAYERS,  # noqa: E402
                      UnsupportedLayerError, check_model)
from .transport import PendingExchange, Transport  # noqa: E402

__all__ = [
    "FullGraphEngine", "HaloExchange", "BackwardHooks", "UnreducedBackwardError", "Codec", "IdentityCodec", "WireContext", "CommStats",
    "ExchangeConfig", "ExchangePolicy", "HaloCache", "AsyncPipeline", "BoundarySampling", "Transport",
    "PendingExchange",
    "AggregationRouter", "MODES", "PRE_LAYERS", "pre_eligible", "StaticInputs", "Agreement",
    "all_agree",
    "ExchangeCounter", "PartitionedModel", "partition_model", "DistributedBatchNorm",
    "convert_batchnorm", "revert_batchnorm", "distributed_gcn_norm", "gather_nodes",
    "all_reduce_gradients", "reduce_backward", "broadcast_parameters", "loss_weight",
    "CollectiveError", "SparseAdjacencyError", "EXACT_LAYERS", "REFUSED_LAYERS",
    "TRAINING_REFUSED_LAYERS", "UnsupportedLayerError", "check_model",
    "convert_cross_node_norms", "revert_cross_node_norms", "MultipleGraphsError",
    "distributed_laplacian", "StepAside",
]
