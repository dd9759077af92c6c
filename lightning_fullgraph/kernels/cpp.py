"""JIT build and loading of the C++/OpenMP CPU aggregation kernels.

The extension is compiled on first use with :func:`torch.utils.cpp_extension.load`
into a persistent build directory keyed by a hash of the source, the torch version
and the host CPU, so later processes only ``dlopen`` the cached library; the sources are
compiled from a copy inside that directory, so every location of the package (a checkout,
an installed wheel) with the same sources shares one build; the key also holds torch's include
paths, so two environments never rebuild each other's library. An actual compilation (not a
cached load) prints one line to stderr on local rank 0, and its duration when done. Building
never touches CUDA (``with_cuda=False``). When the sources are missing, no compiler
is available, or ``LIGHTNING_FULLGRAPH_NO_EXT=1`` is set, :func:`load` returns
``None`` after a single warning and callers use the pure-PyTorch reference.

The extension also carries a huge-page CPU allocator for large tensors, installed only when
asked (:mod:`.huge_pages`: ``use_huge_pages()``; loading the extension installs it only in
mode ``"auto"``). Large outputs come
from a small pool of recycled, huge-page-advised buffers inside the extension (first-touch
page faults of a fresh 512 MiB output otherwise cost as much as the aggregation).
``LIGHTNING_FULLGRAPH_POOL_MB`` caps the idle pooled memory (default 2048,
``0`` disables pooling); :func:`lightning_fullgraph.kernels.clear_memos` releases it.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Sequence

import torch

from .._paths import cache_home

__all__ = ["load", "is_available", "build_extension", "source_dir", "build_dir",
           "disabled_by_env"]

_ENV_NO_EXT = "LIGHTNING_FULLGRAPH_NO_EXT"
_SOURCES = ("aggregate.cpp", "huge_pages.cpp")
_NAME = "lightning_fullgraph_cpu_aggr"

_lock = threading.Lock()
_module: Optional[ModuleType] = None
_failed = False


def disabled_by_env() -> bool:
    """Whether ``LIGHTNING_FULLGRAPH_NO_EXT`` forces the pure-PyTorch fallback."""
    return os.environ.get(_ENV_NO_EXT, "0").lower() not in ("", "0", "false", "no")


def source_dir(sources: Sequence[str] = _SOURCES) -> Optional[Path]:
    """Directory holding the C++ sources, or ``None`` when they cannot be found.

    The sources live in the top-level ``csrc/`` of a source/editable checkout
    (``<repo>/lightning_fullgraph/kernels/cpp.py`` -> ``<repo>/csrc``, recognized by the
    ``pyproject.toml`` beside it); an installed wheel carries a copy in
    ``lightning_fullgraph/kernels/csrc`` (put there by ``setup.py``'s ``build_py``).
    """
    here = Path(__file__).resolve()
    repo = here.parents[2]
    candidates = [here.parent / "csrc"]
    if (repo / "pyproject.toml").is_file():
        candidates.insert(0, repo / "csrc")
    for cand in candidates:
        if all((cand / s).is_file() for s in sources):
            return cand
    return None


def _cpu_tag() -> str:
    # -march=native code is only valid on the CPU it was built for; a shared home
    # directory across machines must not reuse it.
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    return platform.machine() + hashlib.sha1(flags.encode()).hexdigest()[:8]


def _include_tag() -> str:
    # The compile command names torch's include directories as the interpreter found torch
    # (a virtual environment's path, unresolved symlinks included); ninja rebuilds when the
    # command changes, so two environments sharing one build directory would rebuild each
    # other's library on every alternation. Each gets its own directory instead.
    from torch.utils import cpp_extension
    return "\0".join(cpp_extension.include_paths()) + "\0" + sysconfig.get_paths()["include"]


def _files(src: Path, sources: Sequence[str] = _SOURCES) -> List[str]:
    """Names of the files compiled (``sources``) or included (``*.h``) from ``src``."""
    return list(sources) + sorted(p.name for p in src.glob("*.h") if p.is_file())


def build_dir(src: Path, sources: Sequence[str] = _SOURCES) -> Path:
    """Persistent build directory for the given source directory (and compiled sources:
    other extensions, e.g. :mod:`.cpp_quantize`, pass theirs)."""
    h = hashlib.sha256()
    for s in _files(src, sources):
        h.update(s.encode() + b"\0")
        h.update((src / s).read_bytes())
    h.update(torch.__version__.encode())
    h.update(_cpu_tag().encode())
    h.update(_include_tag().encode())
    return ext_root() / h.hexdigest()[:16]


def ext_root() -> Path:
    """Where compiled kernels live: ``$LIGHTNING_FULLGRAPH_EXT_DIR`` if set (e.g. a node-local
    disk while partitions go to shared storage), else ``ext/`` in the library's cache
    (``$LIGHTNING_FULLGRAPH_CACHE``, default ``~/.cache/lightning_fullgraph``)."""
    explicit = os.environ.get("LIGHTNING_FULLGRAPH_EXT_DIR")
    if explicit:
        return Path(explicit)
    return cache_home() / "ext"


def _stage_sources(src: Path, bdir: Path, sources: Sequence[str] = _SOURCES) -> List[Path]:
    """Copy the sources into ``bdir/src`` and return the paths to compile.

    ninja rebuilds when a compile command changes, and the command names the source path:
    compiling from the package's own location would make a source checkout and an installed
    wheel (or two checkouts) with identical sources rebuild each other's cached library.
    Compiling the copy inside the build directory, which is keyed by the source contents,
    makes the command identical for every location. Files are replaced atomically, and only
    when their contents differ, so concurrent ranks never see a partial file and an unchanged
    copy keeps its timestamp.
    """
    staged = bdir / "src"
    staged.mkdir(parents=True, exist_ok=True)
    for name in _files(src, sources):
        data = (src / name).read_bytes()
        dst = staged / name
        if dst.is_file() and dst.read_bytes() == data:
            continue
        tmp = staged / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, dst)
    return [staged / s for s in sources]


def _cflags() -> List[str]:
    flags = ["-O3", "-fopenmp", "-ffp-contract=fast"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags += ["-march=native", "-mprefer-vector-width=512"]
    elif platform.machine() in ("aarch64", "arm64"):
        flags += ["-mcpu=native"]
    return flags


def _is_local_rank_zero() -> bool:
    # One line per machine, not one per process: launchers set LOCAL_RANK for every rank.
    return os.environ.get("LOCAL_RANK", "0") in ("", "0")


def _note(message: str) -> None:
    print(f"lightning-fullgraph: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _build_lock(bdir: Path, announce_wait: bool = True):
    """Hold this machine's build lock of ``bdir`` (an ``flock``, released by the kernel when
    its holder dies) and clear a stale torch lock file under it.

    ``announce_wait``: say so when another process holds the lock (it is compiling); without
    it (the library is already built, the holder only loads it, for a second at most) the
    wait is silent, so that every run on several processes does not print it.

    :func:`torch.utils.cpp_extension.load` serializes builds with a plain ``lock`` file that
    it deletes when done; a process killed mid-compile (Ctrl-C, a job scheduler, a failing
    rank) leaves it behind and every later load waits on it forever. Only a process holding
    the ``flock`` calls into torch, so a ``lock`` file seen while holding it is stale.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock file only
        yield
        return
    with open(bdir / ".build.flock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if announce_wait and _is_local_rank_zero():
                _note(f"waiting for another process building in {bdir} ...")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            stale = bdir / "lock"
            if stale.exists():
                _note(f"removing a stale build lock left by a killed build: {stale}")
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_extension(name: str, sources: Sequence[str], cflags: Sequence[str],
                    what: str, verbose: bool = False, expected: str = "") -> ModuleType:
    """Build (or load the cached build of) the extension ``name`` from ``csrc/<sources>``.

    Args:
        name: Module name of the extension (also the name of its shared library).
        sources: File names in the C++ source directory to compile.
        cflags: Compiler flags.
        what: What the extension holds, for the one line printed while compiling.
        verbose: Print the compiler output.
        expected: How long a compile takes, for that line (e.g. ``"about a minute"``).

    Raises whatever prevents the build (sources missing, no compiler, a compile error);
    callers turn it into one warning and the pure-PyTorch fallback.
    """
    src = source_dir(sources)
    if src is None:
        raise FileNotFoundError(f"C++ sources ({', '.join('csrc/' + s for s in sources)}) not "
                                "found next to the package")
    bdir = build_dir(src, sources)
    bdir.mkdir(parents=True, exist_ok=True)
    staged = _stage_sources(src, bdir, sources)
    from torch.utils import cpp_extension

    with _build_lock(bdir, announce_wait=not (bdir / f"{name}.so").is_file()):
        # The build directory is keyed by the source hash, so a library already there is
        # loaded as is; otherwise this process compiles while the others wait on the lock.
        compiling = not (bdir / f"{name}.so").is_file()
        announce = compiling and _is_local_rank_zero()
        if announce:
            when = f"first use, {expected}" if expected else "first use"
            _note(f"compiling the C++ {what} for this CPU ({when}) into {bdir} ...")
        start = time.perf_counter()
        module = cpp_extension.load(
            name=name,
            sources=[str(s) for s in staged],
            extra_cflags=list(cflags),
            extra_ldflags=["-fopenmp"],
            build_directory=str(bdir),
            with_cuda=False,
            verbose=verbose,
        )
        if announce:
            _note(f"C++ {what} compiled in {time.perf_counter() - start:.0f} s (cached for "
                  "later runs)")
    return module


def unavailable(what: str, exc: BaseException) -> None:
    """The single warning of an extension that cannot be built."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    warnings.warn(f"lightning_fullgraph: C++ {what} unavailable ({type(exc).__name__}: "
                  f"{first}); using the pure-PyTorch fallback.", RuntimeWarning, stacklevel=3)


def load(verbose: bool = False) -> Optional[ModuleType]:
    """Return the compiled extension module, building it if needed; ``None`` if unavailable.

    Args:
        verbose: Print the compiler output.
    """
    global _module, _failed
    if _module is not None:
        return _module
    if _failed:
        return None
    if disabled_by_env():
        _failed = True
        warnings.warn(f"lightning_fullgraph: {_ENV_NO_EXT}=1 - C++ aggregation kernels disabled; "
                      "using the pure-PyTorch fallback.", RuntimeWarning, stacklevel=2)
        return None
    with _lock:
        if _module is not None or _failed:
            return _module
        try:
            module = build_extension(_NAME, _SOURCES, _cflags(), "aggregation kernels",
                                     verbose, expected="about a minute")
        except Exception as exc:  # compiler missing, ninja missing, build error, ...
            _failed = True
            unavailable("aggregation kernels", exc)
            return None
        from . import huge_pages

        _module = module  # before the allocator is installed: huge_pages asks cpp._module
        huge_pages._on_kernels_loaded(module)
    return _module


def is_available() -> bool:
    """Whether the C++ extension can be (or has been) loaded."""
    return load() is not None
