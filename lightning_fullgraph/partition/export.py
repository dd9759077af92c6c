"""Copying a partition directory somewhere else without ever deleting a user's files.

``lightning-fullgraph partition --out DIR`` used to remove ``DIR`` and everything in it
before copying.  :func:`export_partition` writes a new directory, fills an empty one, or
replaces an earlier partition directory (only when every file in it is one the library
writes), and refuses anything else with :class:`~.errors.ExportTargetError`.
"""
import ctypes
import errno
import hashlib
import json
import os
import re
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

from .errors import ExportTargetError, PartitionError, PartitionFormatError, PartitionWriteError
from .store import (
    MANIFEST_NAME,
    PathLike,
    _atomic_write_bytes,
    _describe_os_error,
    _digest_mismatch_error,
    _file_sha256,
    _is_no_space,
    _read_part,
    part_file_name,
    read_manifest,
)

__all__ = ["export_partition"]

_PART_FILE = re.compile(r"part-(\d+)-of-(\d+)\.pt")
# Left behind by an interrupted _atomic_write_bytes / _copy_verified.
_OUR_TEMP_FILE = re.compile(r"\.(manifest\.json|part-\d+-of-\d+\.pt)\.tmp-\d+-[0-9a-f]{8}")
_MANIFEST_KEYS = ("format_version", "num_parts", "fingerprint", "files")


def export_partition(source_dir: PathLike, out_dir: PathLike) -> Path:
    r"""Copies the partition in :obj:`source_dir` (e.g. a cache directory
    returned by :func:`partition_graph`) to :obj:`out_dir`, verified, without
    ever removing anything the library did not write.

    * :obj:`out_dir` does not exist: the copy is written to a hidden temporary
      sibling and renamed into place (parent directories are created).
    * :obj:`out_dir` is an empty directory: it is filled (part files first,
      ``manifest.json`` last).
    * :obj:`out_dir` is a partition directory holding nothing but
      ``manifest.json`` and ``part-*-of-*.pt`` files: the new copy is written
      completely to a hidden sibling first, then swapped in (an atomic
      exchange where the file system supports it, otherwise two renames), and
      only then is the old partition deleted, file by file.
    * Anything else (a file, a directory holding any file the library did not
      write, a directory that is not a partition directory) is refused with
      :class:`ExportTargetError`, and nothing is changed.

    Every copied file is checked against the sha256 of the manifest and
    deserialized once (as by :func:`load_partition`), so the export loads on
    every rank.

    Args:
        source_dir (str or Path): A partition directory.
        out_dir (str or Path): Where to put the copy.

    Returns:
        Path: The absolute path of :obj:`out_dir`.

    Raises:
        ExportTargetError: If :obj:`out_dir` holds something the library did
            not write (a :class:`FileExistsError`).
        PartitionWriteError: If :obj:`out_dir` (or, for a new or replaced
            directory, its parent) cannot be written (an :class:`OSError`).
        PartitionFormatError: If :obj:`source_dir` is not a complete, intact
            partition.
    """
    source = Path(source_dir)
    manifest = read_manifest(source)
    names = _manifest_part_names(source, manifest)
    result = Path(os.path.abspath(os.fspath(out_dir)))
    # A symbolic link stays as it is; the directory it points to is written.
    out = result.resolve() if result.is_symlink() else result

    if out.exists() and not out.is_dir():
        raise ExportTargetError(
            f"cannot export the partition to {out}: it is an existing file, not a "
            f"directory; choose an empty or new directory (nothing was changed)")
    real_source, real_out = source.resolve(), out.resolve()
    if real_out == real_source:
        _verify_partition_dir(out, manifest, names)
        return result
    if real_source in real_out.parents:
        raise ExportTargetError(
            f"cannot export the partition to {out}: it is inside the partition "
            f"directory {source} itself; choose an empty or new directory elsewhere "
            f"(nothing was changed)")

    if not out.exists():
        mode = "new"
    elif _is_empty_dir(out):
        mode = "fill"
    else:
        _check_replaceable(out)
        mode = "replace"
    try:
        if mode == "fill":
            written: List[Path] = []
            try:
                _copy_partition(source, manifest, names, out, written)
            except BaseException:
                for path in reversed(written):  # only files this call created
                    path.unlink(missing_ok=True)
                raise
            return result
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.export-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        swapped = False
        try:
            tmp.mkdir()
            _copy_partition(source, manifest, names, tmp, [])
            if mode == "new":
                try:
                    os.rename(tmp, out)  # also fine if an empty directory appeared
                except OSError as e:
                    if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                        raise ExportTargetError(
                            f"cannot export the partition to {out}: something was "
                            f"created there while exporting; choose an empty or new "
                            f"directory (nothing was changed)") from None
                    raise
                return result
            _check_replaceable(out)  # unchanged since the first check?
            old = _swap_dirs(tmp, out)
            swapped = True
            try:
                _remove_our_partition(old)  # the previous partition, only now
            except OSError as e:  # the export itself is complete
                warnings.warn(f"exported the partition to {out}, but its previous "
                              f"content, moved to {old}, could not be deleted: {e}",
                              RuntimeWarning, stacklevel=2)
            return result
        finally:
            if not swapped and tmp.exists():
                try:  # our own incomplete copy
                    _remove_our_partition(tmp)
                except OSError:
                    pass  # best effort; the original error matters
    except PartitionError:
        raise
    except OSError as e:
        where = out if mode == "fill" else out.parent
        why = "" if mode == "fill" else (
            " (a new or replaced directory is written next to it first, then "
            "renamed into place)")
        fix = ("free space there or choose an empty or new directory on another disk"
               if _is_no_space(e) else "choose a writable, empty or new directory")
        raise PartitionWriteError(
            f"cannot export the partition to {out}: writing in {where} failed: "
            f"{_describe_os_error(e)}{why}; {fix}") from e


def _is_empty_dir(path: Path) -> bool:
    with os.scandir(path) as entries:
        return next(entries, None) is None


def _manifest_part_names(directory: Path, manifest: Dict[str, Any]) -> List[str]:
    P = int(manifest["num_parts"])
    names = [part_file_name(r, P) for r in range(P)]
    files = manifest["files"]
    if not isinstance(files, dict) or sorted(files) != sorted(names):
        raise PartitionFormatError(
            f"partition manifest {directory / MANIFEST_NAME} does not list exactly the "
            f"files part-0-of-{P}.pt .. part-{P - 1}-of-{P}.pt; re-create the "
            f"partition with `lightning-fullgraph partition`")
    return names


def _copy_verified(src: Path, dst: Path, manifest: Dict[str, Any], written: List[Path],
                   chunk: int = 16 * 2**20) -> None:
    r"""Copies ``src`` to ``dst`` (through a hidden temporary file), checking
    the bytes against the sha256 in ``manifest`` on the way."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    h = hashlib.sha256()
    try:
        fin = open(src, "rb")
    except FileNotFoundError:
        raise PartitionFormatError(f"partition file {src} is missing") from None
    with fin:
        written.append(tmp)
        with open(tmp, "wb") as fout:
            for block in iter(lambda: fin.read(chunk), b""):
                h.update(block)
                fout.write(block)
            fout.flush()
            os.fsync(fout.fileno())
    if h.hexdigest() != manifest["files"][src.name]:
        raise _digest_mismatch_error(src, manifest)
    written.append(dst)
    os.replace(tmp, dst)


def _copy_partition(source: Path, manifest: Dict[str, Any], names: List[str],
                    dest: Path, written: List[Path]) -> None:
    for name in names:
        _copy_verified(source / name, dest / name, manifest, written)
    for rank, name in enumerate(names):  # structure and fingerprint of the copy
        _read_part(dest / name, rank, manifest)
    blob = json.dumps(manifest, indent=1).encode()
    written.append(dest / MANIFEST_NAME)
    _atomic_write_bytes(dest / MANIFEST_NAME, blob)  # last, as in save_partitions


def _verify_partition_dir(directory: Path, manifest: Dict[str, Any],
                          names: List[str]) -> None:
    for rank, name in enumerate(names):
        path = directory / name
        try:
            digest = _file_sha256(path)
        except FileNotFoundError:
            raise PartitionFormatError(f"partition file {path} is missing") from None
        if digest != manifest["files"][name]:
            raise _digest_mismatch_error(path, manifest)
        _read_part(path, rank, manifest)


def _foreign_entry(directory: Path) -> Optional[str]:
    r"""Name of one entry of ``directory`` the library did not write, or
    :obj:`None` if it is a partition directory of ours."""
    with os.scandir(directory) as it:
        entries = sorted(it, key=lambda e: e.name)
    ours = {MANIFEST_NAME}
    manifest = None
    if any(e.name == MANIFEST_NAME and e.is_file(follow_symlinks=False) for e in entries):
        try:
            manifest = json.loads((directory / MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            manifest = None
    if not (isinstance(manifest, dict) and all(k in manifest for k in _MANIFEST_KEYS)):
        # No manifest of ours: not a partition directory; name a file in it.
        first = next((e.name for e in entries if e.name != MANIFEST_NAME), None)
        return first or MANIFEST_NAME
    for entry in entries:
        name = entry.name
        if not entry.is_file(follow_symlinks=False):
            return name  # directories, symbolic links, sockets, ... are never ours
        match = _PART_FILE.fullmatch(name)
        if name in ours or _OUR_TEMP_FILE.fullmatch(name) or (
                match and int(match.group(1)) < int(match.group(2))):
            continue
        return name
    return None


def _check_replaceable(out: Path) -> None:
    foreign = _foreign_entry(out)
    if foreign is not None:
        with os.scandir(out) as entries:
            others = sum(1 for _ in entries) - 1
        plus = f" (besides {others} other entr{'y' if others == 1 else 'ies'})" \
            if others else ""
        raise ExportTargetError(
            f"cannot export the partition to {out}: the directory is not empty and "
            f"holds {foreign!r}{plus}, which lightning-fullgraph did not write; only a "
            f"directory holding nothing but a partition (manifest.json and "
            f"part-*-of-*.pt files) is replaced; choose an empty or new directory "
            f"(nothing was changed)")


def _rename_exchange(a: Path, b: Path) -> bool:
    r"""Atomically swaps two paths (Linux ``renameat2(RENAME_EXCHANGE)``).
    Returns :obj:`False` where that is not available (other systems, old
    kernels, file systems without support)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_uint]
    fn.restype = ctypes.c_int
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_dirs(new: Path, target: Path) -> Path:
    r"""Puts directory ``new`` at ``target``; returns where the previous
    ``target`` now is (to be deleted by the caller)."""
    if _rename_exchange(new, target):
        return new
    old = target.with_name(f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)  # put the previous partition back
        raise
    return old


def _remove_our_partition(directory: Path) -> None:
    r"""Deletes a partition directory written by this library: only entries
    named like ours (manifest, part files, our temporaries) are removed, and
    the directory itself only if it is then empty."""
    with os.scandir(directory) as it:
        entries = list(it)
    for entry in entries:
        name = entry.name
        if entry.is_file(follow_symlinks=False) and (
                name == MANIFEST_NAME or _PART_FILE.fullmatch(name)
                or _OUR_TEMP_FILE.fullmatch(name)):
            os.unlink(entry.path)
    try:
        os.rmdir(directory)
    except OSError:
        warnings.warn(f"kept {directory}: it holds files lightning-fullgraph did not "
                      f"write; delete it yourself if they are not needed",
                      RuntimeWarning, stacklevel=3)
