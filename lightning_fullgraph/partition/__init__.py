r"""Graph partitioning: METIS parts, per-rank halo plans, hybrid pre/post
aggregation plans (exact minimum vertex cover per rank pair), on-disk cache.

Typical use (once, on one process or via the CLI)::

    path = partition_graph(data, num_parts=4)          # cached, atomic
    part = load_partition(path, rank, num_parts=world)  # on every rank
    export_partition(path, "shared/partitions")         # copy elsewhere, verified
"""
from .errors import (
    EmptyPartitionError,
    ExportTargetError,
    PartitionError,
    PartitionFormatError,
    PartitionMismatchError,
    PartitionWriteError,
    StalePartitionError,
)
from .cover import MODES, CutCover, VertexCover, cut_cover, min_vertex_cover
from .export import export_partition
from .fingerprint import graph_fingerprint, options_hash
from .local import (
    LOCAL_FORMAT_VERSION,
    LocalPartition,
    build_local_partitions,
    iter_local_partitions,
    split_attr_keys,
)
from .metis import combine_constraints, metis_partition, node_weights_for, symmetric_csr
from .plan import AggregationPlan, ChannelPlan, build_plan
from .stats import PartitionStats, partition_stats
from .store import (
    CACHE_ENV,
    FORMAT_VERSION,
    MANIFEST_NAME,
    check_partition,
    default_cache_root,
    load_partition,
    part_file_name,
    partition_cache_dir,
    partition_graph,
    read_manifest,
    save_partitions,
)

# The public API: partitioning a graph, the per-rank views the engine consumes, the on-disk
# store and its errors. Plans, covers and hashing helpers imported above are the engine's
# building blocks, documented in their modules, not promised as API.
__all__ = [
    "PartitionError", "EmptyPartitionError", "PartitionFormatError", "PartitionMismatchError",
    "StalePartitionError", "PartitionWriteError", "ExportTargetError",
    "metis_partition", "partition_graph", "export_partition", "load_partition",
    "check_partition", "read_manifest", "default_cache_root", "CACHE_ENV",
    "LocalPartition", "build_local_partitions", "iter_local_partitions",
    "PartitionStats", "partition_stats",
]
