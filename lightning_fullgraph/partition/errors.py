"""Exceptions raised by the partitioning pipeline.

They subclass the built-in exception a caller would naturally catch
(:class:`ValueError` for bad arguments, :class:`RuntimeError` for bad files,
:class:`OSError` for directories that cannot be written), so code that predates
them keeps working.
"""

__all__ = [
    "PartitionError",
    "EmptyPartitionError",
    "PartitionFormatError",
    "PartitionMismatchError",
    "StalePartitionError",
    "PartitionWriteError",
    "ExportTargetError",
]


class PartitionError(Exception):
    r"""Base class of every partitioning error."""


class EmptyPartitionError(PartitionError, ValueError):
    r"""METIS produced a part without nodes.

    A rank without owned nodes would have nothing to train on, so we refuse the
    partition instead of silently falling back to another method.

    Args:
        part (int): The empty part.
        num_parts (int): Requested number of parts.
        num_nodes (int): Number of nodes in the graph.
    """
    def __init__(self, part: int, num_parts: int, num_nodes: int):
        self.part, self.num_parts, self.num_nodes = part, num_parts, num_nodes
        suggestion = max(1, num_parts // 2)
        super().__init__(
            f"METIS returned an empty part {part} when splitting {num_nodes} nodes "
            f"into {num_parts} parts; every rank needs at least one node. Use fewer "
            f"parts (e.g. --parts {suggestion}) or a larger graph.")

    def __reduce__(self):  # keep the exception picklable across processes
        return (type(self), (self.part, self.num_parts, self.num_nodes))


class PartitionFormatError(PartitionError, RuntimeError):
    r"""A partition file or manifest is missing, truncated, corrupted or has an
    unsupported format version."""


class PartitionMismatchError(PartitionError, ValueError):
    r"""A partition exists but was made for another world size."""


class StalePartitionError(PartitionMismatchError):
    r"""A partition exists but was made for a different graph."""


class PartitionWriteError(PartitionError, OSError):
    r"""A partition (or cache) directory cannot be written: no permission, a
    read-only file system, no space left, ...

    The message names the directory and how to choose another one; the
    underlying error is its ``__cause__``. It is an :class:`OSError`, so code
    that caught the raw :class:`PermissionError` / :class:`OSError` keeps
    working.
    """


class ExportTargetError(PartitionError, FileExistsError):
    r"""The target of :func:`~.export_partition` holds something the library did
    not write (a file, or a directory with foreign content), so it is left
    untouched instead of being replaced."""
