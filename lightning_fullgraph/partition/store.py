"""Versioned on-disk partitions and the partition cache.

Layout of one partition directory::

    manifest.json        {format_version, num_parts, fingerprint, options,
                          files: {name: sha256}, stats}
    part-0-of-4.pt       torch.save(LocalPartition.to_dict())
    ...

The manifest is written last and directories are published with an atomic
``rename``, so a reader either sees a complete partition or none at all.
:func:`~.export.export_partition` copies a partition elsewhere.
"""
import errno
import hashlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

import torch

from .._paths import CACHE_ENV, cache_home
from .errors import (
    PartitionError,
    PartitionFormatError,
    PartitionMismatchError,
    PartitionWriteError,
    StalePartitionError,
)
from .cover import cut_cover
from .fingerprint import graph_fingerprint, options_hash
from .local import QUARTILES, LocalPartition, check_level_percentiles, iter_local_partitions
from .metis import (DEFAULT_OBJECTIVE, _check_hosts, _check_num_parts, check_objective,
                    metis_partition, node_weights_for)
from .stats import PartitionStats, partition_stats

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "CACHE_ENV",
    "part_file_name",
    "default_cache_root",
    "partition_cache_dir",
    "save_partitions",
    "read_manifest",
    "load_partition",
    "check_partition",
    "partition_graph",
    "graph_fingerprint",
]

log = logging.getLogger(__name__)

#: On-disk format version; readers refuse other versions.
#: 2: outgoing cut edges, hybrid pre/post decisions, per-mode stats.
#: 3: importance levels of boundary nodes in every rank's file.
FORMAT_VERSION = 3
MANIFEST_NAME = "manifest.json"

PathLike = Union[str, os.PathLike]


def part_file_name(rank: int, num_parts: int) -> str:
    r"""File name of rank :obj:`rank`'s partition, e.g. ``part-0-of-4.pt``."""
    return f"part-{int(rank)}-of-{int(num_parts)}.pt"


def default_cache_root() -> Path:
    r"""``partitions/`` in the library's cache directory: ``$LIGHTNING_FULLGRAPH_CACHE`` or
    ``~/.cache/lightning_fullgraph`` (the compiled kernels sit beside it, in ``ext/``)."""
    return cache_home() / "partitions"


def partition_cache_dir(root: Optional[PathLike], fingerprint: str, num_parts: int,
                        options: Dict[str, Any]) -> Path:
    r"""Cache directory of one (graph, world size, options) combination.

    Args:
        root (str or Path, optional): Cache root (default
            :func:`default_cache_root`).
        fingerprint (str): Graph fingerprint (:func:`graph_fingerprint`).
        num_parts (int): Number of parts.
        options (Dict[str, Any]): JSON-able partitioning options.

    Returns:
        Path: ``root / "<fingerprint[:16]>-p<P>-<options hash[:12]>"``.
    """
    root = default_cache_root() if root is None else Path(root).expanduser()
    return root / f"{fingerprint[:16]}-p{int(num_parts)}-{options_hash(options)[:12]}"


def _atomic_write_bytes(path: Path, blob: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_partitions(directory: PathLike, parts: Iterable[LocalPartition],
                    stats: Optional[PartitionStats] = None, *,
                    options: Optional[Dict[str, Any]] = None) -> Path:
    r"""Writes all ranks' partitions plus ``manifest.json`` to :obj:`directory`.

    Args:
        directory (str or Path): Target directory (created if needed).
        parts (Iterable[LocalPartition]): One partition per rank; may be a
            generator (e.g. :func:`iter_local_partitions`) so that only one
            rank is in memory at a time.
        stats (PartitionStats, optional): Stored in the manifest.
        options (Dict[str, Any], optional): Options for the manifest (default:
            those of the first partition).

    Returns:
        Path: :obj:`directory`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files: Dict[str, str] = {}
    num_parts, fingerprint, ranks, key = None, None, [], None
    for part in parts:
        if num_parts is None:
            num_parts, fingerprint = part.num_parts, part.fingerprint
            key = options_hash(part.options)
            if options is None:
                options = dict(part.options)
            elif options_hash(options) != key:
                # load_partition checks every file against its manifest.
                raise ValueError(
                    f"options={options!r} differ from the options stored in the "
                    f"partitions ({part.options!r}); pass options=None to store "
                    f"theirs, or build the partitions with these options")
        elif (part.num_parts != num_parts or part.fingerprint != fingerprint
              or options_hash(part.options) != key):
            raise ValueError("all partitions must share num_parts, fingerprint and options")
        buf = io.BytesIO()
        torch.save(part.to_dict(), buf)
        blob = buf.getvalue()
        name = part_file_name(part.rank, part.num_parts)
        _atomic_write_bytes(directory / name, blob)
        files[name] = hashlib.sha256(blob).hexdigest()
        ranks.append(part.rank)
        del buf, blob
    if num_parts is None:
        raise ValueError("save_partitions got no partitions")
    if sorted(ranks) != list(range(num_parts)):
        raise ValueError(f"expected ranks 0..{num_parts - 1}, got {sorted(ranks)}")
    manifest = {
        "format_version": FORMAT_VERSION,
        "num_parts": int(num_parts),
        "fingerprint": fingerprint,
        "options": options or {},
        "files": files,
        "stats": stats.to_dict() if stats is not None else None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # Written last: a directory without manifest is never considered valid.
    _atomic_write_bytes(directory / MANIFEST_NAME,
                        json.dumps(manifest, indent=1).encode())
    return directory


def read_manifest(directory: PathLike) -> Dict[str, Any]:
    r"""Reads and checks ``manifest.json`` of a partition directory.

    Raises:
        PartitionFormatError: If the manifest is missing, unreadable, has
            another format version or lacks required keys.
    """
    path = Path(directory) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise PartitionFormatError(
            f"no partition manifest {path}; partition the graph first "
            f"(or the directory is incomplete)") from None
    except (OSError, ValueError) as e:
        raise PartitionFormatError(f"partition manifest {path} is unreadable: {e}") from e
    if not isinstance(manifest, dict):
        raise PartitionFormatError(f"partition manifest {path} is not a JSON object")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise PartitionFormatError(
            f"partition manifest {path} has format version {version!r} but this "
            f"library reads version {FORMAT_VERSION}; re-partition the graph")
    for key in ("num_parts", "fingerprint", "files"):
        if key not in manifest:
            raise PartitionFormatError(f"partition manifest {path} lacks '{key}'")
    return manifest


def load_partition(directory: PathLike, rank: int, *, num_parts: Optional[int] = None,
                   fingerprint: Optional[str] = None) -> LocalPartition:
    r"""Loads one rank's partition, verifying it against the manifest.

    The file's sha256 must match the manifest, it is deserialized with
    ``torch.load(weights_only=True)`` (tensors and plain containers only), and
    the rank, number of parts, graph fingerprint and options stored in the
    file must equal those of the manifest.

    Args:
        directory (str or Path): Partition directory.
        rank (int): Rank to load.
        num_parts (int, optional): Expected number of parts (the world size).
        fingerprint (str, optional): Expected graph fingerprint.

    Returns:
        LocalPartition

    Raises:
        PartitionMismatchError: If the partition was made for another world size.
        StalePartitionError: If it was made for a different graph, or the file
            belongs to a partition of another graph than its manifest.
        PartitionFormatError: If the manifest or the rank's file is missing,
            truncated, corrupted, of another format version, holds objects
            other than tensors and plain containers, or does not match its
            manifest.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    P = int(manifest["num_parts"])
    if num_parts is not None and int(num_parts) != P:
        raise PartitionMismatchError(
            f"partition in {directory} was made for {P} parts but the world size is "
            f"{int(num_parts)}; re-partition with --parts {int(num_parts)}")
    if fingerprint is not None and fingerprint != manifest["fingerprint"]:
        raise StalePartitionError(
            f"partitions in {directory} were made for a different graph (fingerprint "
            f"{str(manifest['fingerprint'])[:12]} != {fingerprint[:12]}); delete the "
            f"directory or use a new cache dir")
    if not 0 <= int(rank) < P:
        raise ValueError(f"rank {rank} out of range for a partition into {P} parts")
    name = part_file_name(rank, P)
    path = directory / name
    expected = manifest["files"].get(name)
    if expected is None:
        raise PartitionFormatError(f"partition manifest in {directory} does not list {name}")
    try:
        digest = _file_sha256(path)
    except FileNotFoundError:
        raise PartitionFormatError(f"partition file {path} is missing") from None
    # Catches truncation and bit rot before anything is deserialized.
    if digest != expected:
        raise _digest_mismatch_error(path, manifest)
    return _read_part(path, int(rank), manifest)


def check_partition(directory: PathLike, num_parts: Optional[int] = None, *,
                    num_classes: Optional[int] = None) -> Dict[str, Any]:
    r"""Checks a whole partition directory up front, on one process.

    :func:`load_partition` verifies one rank's file, on that rank; an error there reaches
    the user from that rank only, after its peers have started waiting for it. This checks
    what can be told without reading the tensors of any rank (memory-mapped headers): the
    manifest, the number of parts, that every part file is there and was written with the
    manifest's graph and options (a part copied from another partition), and, with
    :obj:`num_classes`, that no label is ``>= num_classes``. Damage inside a file (its
    sha256) is still found by :func:`load_partition` on its rank.

    Args:
        directory (str or Path): Partition directory.
        num_parts (int, optional): Expected number of parts (the world size).
        num_classes (int, optional): Number of classes the labels (``y``) must be below.

    Returns:
        Dict[str, Any]: The manifest.

    Raises:
        PartitionMismatchError: For another number of parts.
        StalePartitionError: For a part file of another graph than its manifest.
        PartitionFormatError: For a missing manifest or part file, or one of other options.
        ~lightning_fullgraph.data.GraphValidationError: For labels ``>= num_classes``.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    P = int(manifest["num_parts"])
    if num_parts is not None and int(num_parts) != P:
        raise PartitionMismatchError(
            f"partition in {directory} was made for {P} parts but the world size is "
            f"{int(num_parts)}; re-partition with --parts {int(num_parts)}")
    labels = []
    for rank in range(P):
        name = part_file_name(rank, P)
        path = directory / name
        if name not in manifest["files"]:
            raise PartitionFormatError(f"partition manifest in {directory} does not list {name}")
        if not path.is_file():
            raise PartitionFormatError(f"partition file {path} is missing")
        state = _peek(path)  # {} if unreadable: load_partition then says how, on its rank
        fingerprint = state.get("fingerprint")
        if isinstance(fingerprint, str) and fingerprint:
            mismatch = _part_manifest_mismatch(fingerprint, state.get("options"), manifest)
            if mismatch is not None:
                raise _mixed_partition_error(path, mismatch, manifest, fingerprint)
        y = (state.get("node_attrs") or {}).get("y")
        owned = state.get("owned_ids")
        if isinstance(y, torch.Tensor) and isinstance(owned, torch.Tensor):
            labels.append((owned, y))
    if num_classes is not None:
        from ..data.validation import check_label_range
        check_label_range(labels, int(num_classes), where=f" in the partition directory "
                                                          f"{directory}")
    return manifest


_WEIGHTS_ONLY_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _torch_load(path: Path) -> Any:
    r"""``torch.load`` of a partition file, restricted to tensors and plain
    containers; never relays torch's advice to load with ``weights_only=False``."""
    try:
        # Memory-mapped: the file's bytes are never held twice (raw + tensors).
        return torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        if "weights_only" not in text and "Weights only" not in text:
            raise PartitionFormatError(f"partition file {path} could not be read: {e}") from e
        found = _WEIGHTS_ONLY_GLOBAL.search(text)
        what = f" (first such object: {found.group(1)})" if found else ""
        # `from None`: torch's text suggests weights_only=False, which would
        # run whatever code the file carries.
        raise PartitionFormatError(
            f"partition file {path} holds objects other than tensors and plain "
            f"containers (dict, list, tuple, str, int, float){what}, so it is not a "
            f"partition written by this library; it is refused because such files "
            f"can run arbitrary code when loaded. Re-create the partition with "
            f"`lightning-fullgraph partition` (or partition_graph)") from None
    except Exception as e:  # any other unpickling problem is a format problem
        raise PartitionFormatError(f"partition file {path} could not be read: {e}") from e


def _read_part(path: Path, rank: int, manifest: Dict[str, Any]) -> LocalPartition:
    r"""Deserializes a (sha256-verified) part file and checks it against its
    manifest: rank, number of parts, graph fingerprint and options."""
    state = _torch_load(path)
    if not isinstance(state, dict):
        raise PartitionFormatError(
            f"partition file {path} does not hold a partition (got a "
            f"{type(state).__name__}, expected a dict); re-create the partition with "
            f"`lightning-fullgraph partition` (or partition_graph)")
    try:
        part = LocalPartition.from_dict(state)
    except Exception as e:
        raise PartitionFormatError(f"partition file {path} could not be read: {e}") from e
    P = int(manifest["num_parts"])
    if part.rank != int(rank) or part.num_parts != P:
        raise PartitionFormatError(
            f"partition file {path} holds rank {part.rank} of {part.num_parts}, "
            f"expected rank {rank} of {P}")
    mismatch = _part_manifest_mismatch(part.fingerprint, part.options, manifest)
    if mismatch is not None:
        raise _mixed_partition_error(path, mismatch, manifest, str(part.fingerprint))
    return part


def _part_manifest_mismatch(fingerprint: Any, options: Any,
                            manifest: Dict[str, Any]) -> Optional[str]:
    if fingerprint != manifest["fingerprint"]:
        return "fingerprint"
    if isinstance(options, dict) and "options" in manifest and \
            options_hash(options) != options_hash(manifest["options"] or {}):
        return "options"
    return None


def _mixed_partition_error(path: Path, what: str, manifest: Dict[str, Any],
                           found_fingerprint: str) -> PartitionError:
    directory = path.parent
    fix = (f"the directory mixes files of two partitions; delete {directory} and "
           f"re-partition (`lightning-fullgraph partition` or partition_graph)")
    if what == "fingerprint":
        return StalePartitionError(
            f"partition file {path} was made for a different graph than its manifest "
            f"{directory / MANIFEST_NAME} (graph fingerprint {found_fingerprint[:12]} "
            f"in the file, {str(manifest['fingerprint'])[:12]} in the manifest); {fix}")
    return PartitionFormatError(
        f"partition file {path} was made with other partitioning options than its "
        f"manifest {directory / MANIFEST_NAME}; {fix}")


def _peek(path: Path) -> Dict[str, Any]:
    try:
        state = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception:
        return {}
    return state if isinstance(state, dict) else {}


def _digest_mismatch_error(path: Path, manifest: Dict[str, Any]) -> PartitionError:
    r"""Tells a part file of *another* partition (copied or moved here) from a
    damaged one, by peeking at it with the same restricted loader."""
    state = _peek(path)
    fingerprint, options = state.get("fingerprint"), state.get("options")
    if isinstance(fingerprint, str) and fingerprint:
        mismatch = _part_manifest_mismatch(fingerprint, options, manifest)
        if mismatch is not None:
            return _mixed_partition_error(path, mismatch, manifest, fingerprint)
    return PartitionFormatError(
        f"partition file {path} is corrupted or truncated (sha256 does not match "
        f"the manifest); delete {path.parent} and re-partition")


def _file_sha256(path: Path, chunk: int = 16 * 2**20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _is_complete(directory: Path, num_parts: int, fingerprint: str) -> bool:
    try:
        manifest = read_manifest(directory)
    except PartitionFormatError:
        return False
    if manifest["num_parts"] != num_parts or manifest["fingerprint"] != fingerprint:
        return False
    names = {part_file_name(r, num_parts) for r in range(num_parts)}
    return names <= set(manifest["files"]) and all((directory / n).is_file() for n in names)


def _publish(tmp: Path, target: Path, force: bool, num_parts: int, fingerprint: str) -> None:
    r"""Moves the finished ``tmp`` directory to ``target`` atomically."""
    try:
        os.rename(tmp, target)
        return
    except OSError:
        pass  # target exists (stale, incomplete, forced, or a concurrent writer won)
    if not force and _is_complete(target, num_parts, fingerprint):
        shutil.rmtree(tmp, ignore_errors=True)  # identical content already published
        return
    trash = target.with_name(f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.rename(target, trash)
    os.rename(tmp, target)
    shutil.rmtree(trash, ignore_errors=True)


def _say(*args: Any) -> None:
    # Progress goes to stderr, looked up at call time (pytest's capsys and
    # contextlib.redirect_stderr replace sys.stderr).
    print(*args, file=sys.stderr, flush=True)


def _is_no_space(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def _describe_os_error(e: OSError) -> str:
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.EROFS:
        return "read-only file system"
    if _is_no_space(e):
        return "no space left on the device (or disk quota exceeded)"
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a path component exists and is not a directory"
    return e.strerror or str(e)


def _cache_write_error(cache_dir: Path, root: Optional[PathLike],
                       e: OSError) -> PartitionWriteError:
    if root is not None:
        source = ""
    elif os.environ.get(CACHE_ENV):
        source = f" (from the {CACHE_ENV} environment variable)"
    else:
        source = " (the default cache directory)"
    what = ("free space there or choose a cache directory on another disk"
            if _is_no_space(e) else "choose a writable cache directory")
    return PartitionWriteError(
        f"cannot write partitions to the cache directory {cache_dir}{source}: "
        f"{_describe_os_error(e)}; {what}: FullGraphDataModule(cache_dir=...) or "
        f"partition_graph(..., root=...), the {CACHE_ENV} environment variable, or "
        f"--cache-dir on the command line")


def partition_graph(data, num_parts: int, *, root: Optional[PathLike] = None,
                    seed: int = 0, force: bool = False,
                    progress: Union[bool, Callable[[str], None]] = True,
                    ufactor: Optional[int] = None,
                    train_key: Optional[str] = "train_mask",
                    hosts: Optional[int] = None,
                    level_percentiles: Optional[Sequence[float]] = None,
                    objective: str = DEFAULT_OBJECTIVE) -> Path:
    r"""Partitions :obj:`data` into :obj:`num_parts` parts and writes them to disk.

    Runs :func:`metis_partition` with :func:`node_weights_for` weights, builds
    every rank with :func:`iter_local_partitions` (one rank in memory at a
    time), and publishes the directory atomically. If a complete partition for
    the same graph, world size and options already exists it is reused.

    Args:
        data (torch_geometric.data.Data): The global graph.
        num_parts (int): Number of parts (the training world size).
        root (str or Path, optional): Cache root (default
            :func:`default_cache_root`).
        seed (int): METIS seed.
        force (bool): Re-partition even if a cached partition exists.
        progress (bool or Callable[[str], None]): :obj:`True`: print timings and the
            :class:`PartitionStats` table to standard error (standard output stays free for
            results, e.g. ``lightning-fullgraph partition --json``), and the reuse of a
            cached partition. A callable (e.g. Lightning's ``rank_zero_info``, as
            :class:`~lightning_fullgraph.FullGraphDataModule` passes) gets the lines of a
            partitioning that runs; the reuse of a cached partition is only logged
            (``logging``, INFO). :obj:`False`: nothing.
        ufactor (int, optional): METIS imbalance tolerance in 1/1000.
        train_key (str, optional): Training mask balanced across ranks.
        hosts (int, optional): Number of hosts (machines) the :obj:`num_parts`
            ranks run on, ranks numbered host-major as Lightning does across
            nodes. With ``hosts > 1`` the graph is first split into one part
            per host, then every host's part into ``num_parts // hosts`` ranks
            (:func:`metis_partition`), so fewer rows cross hosts; must divide
            :obj:`num_parts`. Part of the cache key. (default: 1, flat)
        level_percentiles (Sequence[float], optional): Where the importance levels of
            boundary nodes start (per-node bit widths, ``codec="adaptive"``): three
            increasing in-degree percentiles in (0, 1), e.g. ``(0.5, 0.8, 0.95)`` for fewer
            wide rows than the default quartiles. Part of the cache key when given.
        objective (str): What METIS minimizes: ``"vol"``, the halo rows
            exchanged (communication volume), or ``"cut"``, the cut edges
            (:func:`metis_partition`). Part of the cache key. (default: ``"vol"``)

    Every partition also stores the exact minimum vertex cover of every rank
    pair's cut edges (:func:`~.cover.cut_cover`), from which each rank derives
    its post-, pre- and hybrid aggregation plans
    (:meth:`LocalPartition.plan`); the stats hold the rows of each mode.

    Returns:
        Path: The partition directory (pass it to :func:`load_partition`).

    Raises:
        PartitionWriteError: If the cache directory cannot be written (no
            permission, read-only file system, disk full); an
            :class:`OSError`.
    """
    t0 = time.perf_counter()
    from ..data.validation import check_no_sparse_adjacency
    check_no_sparse_adjacency(data)  # T.ToSparseTensor()'s adj_t: its own error and fix
    edge_index = getattr(data, "edge_index", None)
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 \
            or edge_index.size(0) != 2:
        raise ValueError("data.edge_index must be a tensor of shape [2, num_edges]")
    num_nodes = int(data.num_nodes)
    _check_num_parts(num_parts, num_nodes)
    hosts = _check_hosts(hosts, num_parts)
    objective = check_objective(objective)
    if level_percentiles is not None:
        level_percentiles = check_level_percentiles(level_percentiles)
        if level_percentiles == QUARTILES:
            level_percentiles = None
    options = {
        "method": "metis-kway",
        "objective": objective,
        "seed": int(seed),
        "ufactor": ufactor,
        "weights": "in_degree+1" + (f", {train_key}" if train_key else ""),
        "hosts": hosts,
        "format_version": FORMAT_VERSION,
    }
    if level_percentiles is not None:
        # Only then, so that the cache keys of default partitions stay what they were.
        options["level_percentiles"] = list(level_percentiles)
    fingerprint = graph_fingerprint(data)
    directory = partition_cache_dir(root, fingerprint, num_parts, options)
    say = _say if progress is True else progress if callable(progress) \
        else (lambda *a: None)
    if not force and _is_complete(directory, num_parts, fingerprint):
        # Routine on every fit/test/predict of a data module: quiet unless asked for.
        log.info("reusing partition %s", directory)
        if progress is True:
            say(f"[partition] reusing cached partition {directory}")
        return directory

    weights = node_weights_for(data, train_key=train_key)
    t1 = time.perf_counter()
    parts = metis_partition(edge_index, num_nodes, num_parts, node_weights=weights,
                            seed=seed, ufactor=ufactor, hosts=hosts, objective=objective)
    t2 = time.perf_counter()
    where = f" ({hosts} hosts x {num_parts // hosts})" if hosts > 1 else ""
    say(f"[partition] METIS ({objective}) {num_nodes:,} nodes / {edge_index.size(1):,} "
        f"edges into {num_parts} parts{where}: {t2 - t1:.1f}s")
    cover = cut_cover(edge_index, parts, num_parts)
    train_mask = getattr(data, train_key, None) if train_key else None
    if not (isinstance(train_mask, torch.Tensor) and train_mask.dtype == torch.bool
            and train_mask.size(0) == num_nodes):
        train_mask = None
    stats = partition_stats(parts, edge_index, train_mask=train_mask, num_parts=num_parts,
                            cover=cover, hosts=hosts)
    say(f"[partition] hybrid pre/post plan (exact minimum vertex cover of "
        f"{stats.edge_cut:,} cut edges over {num_parts * (num_parts - 1)} rank pairs): "
        f"{cover.seconds:.1f}s")

    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        save_partitions(tmp, iter_local_partitions(data, parts, num_parts=num_parts,
                                                   fingerprint=fingerprint,
                                                   options=options, cover=cover,
                                                   level_percentiles=level_percentiles),
                        stats, options=options)
        _publish(tmp, directory, force, num_parts, fingerprint)
    except PartitionError:
        raise
    except OSError as e:
        raise _cache_write_error(directory.parent, root, e) from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    t3 = time.perf_counter()
    log.info("partitioned into %s (%.1fs)\n%s", directory, t3 - t0, stats.format_table())
    say(f"[partition] build+write {t3 - t2:.1f}s, total {t3 - t0:.1f}s -> {directory}")
    say(stats.format_table())
    return directory
