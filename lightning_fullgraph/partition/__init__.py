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

__all__ = [
    # errors
    "PartitionError",
    "EmptyPartitionError",
    "PartitionFormatError",
    "PartitionMismatchError",
    "StalePartitionError",
    "PartitionWriteError",
    "ExportTargetError",
    # METIS
    "metis_partition",
    "node_weights_for",
    "combine_constraints",
    "symmetric_csr",
    # per-rank views
    "LocalPartition",
    "build_local_partitions",
    "iter_local_partitions",
    "split_attr_keys",
    "LOCAL_FORMAT_VERSION",
    # aggregation modes and plans
    "MODES",
    "AggregationPlan",
    "ChannelPlan",
    "build_plan",
    "min_vertex_cover",
    "VertexCover",
    "cut_cover",
    "CutCover",
    # stats
    "PartitionStats",
    "partition_stats",
    # storage / cache
    "graph_fingerprint",
    "options_hash",
    "save_partitions",
    "load_partition",
    "check_partition",
    "read_manifest",
    "partition_cache_dir",
    "default_cache_root",
    "partition_graph",
    "export_partition",
    "part_file_name",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "CACHE_ENV",
]
