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

# The public API: what a plain torch.distributed or Fabric script uses, what custom codecs
# and caches subclass, and the errors it may catch. The other names imported above are the
# library's own building blocks (imported from here by the strategies, the planner and the
# benchmarks); they are documented in their modules, not promised as API.
__all__ = [
    "FullGraphEngine", "ExchangeConfig", "HaloExchange", "HaloCache", "Codec", "IdentityCodec",
    "WireContext", "CommStats", "PartitionedModel", "partition_model", "gather_nodes",
    "check_model", "EXACT_LAYERS", "REFUSED_LAYERS", "TRAINING_REFUSED_LAYERS",
    "CollectiveError", "SparseAdjacencyError", "UnreducedBackwardError",
    "UnsupportedLayerError", "MultipleGraphsError",
]
