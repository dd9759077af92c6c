"""JIT build and loading of the C++/OpenMP CPU aggregation kernels.

The extension is compiled on first use with :func:`torch.utils.cpp_extension.load`
into a persistent build directory keyed by a hash of the source, the torch version
and the host CPU, so later processes only ``dlopen`` the cached library; the sources are
compiled from a copy inside that directory, so every location of the package (a checkout,
an installed wheel) with the same sources shares one build. An actual compilation (not a
cached load) prints one line to stderr on local rank 0, and its duration when done. Building
never touches CUDA (``with_cuda=False``). When the sources are missing, no compiler
is available, or ``LIGHTNING_FULLGRAPH_NO_EXT=1`` is set, :func:`load` returns
``None`` after a single warning and callers use the pure-PyTorch reference.

Large outputs come from a small pool of recycled, huge-page-advised buffers inside the
extension (first-touch page faults of a fresh 512 MiB output otherwise cost as much as the
aggregation). ``LIGHTNING_FULLGRAPH_POOL_MB`` caps the idle pooled memory (default 2048,
``0`` disables pooling); :func:`lightning_fullgraph.kernels.clear_cache` releases it.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Sequence

import torch

__all__ = ["load", "is_available", "source_dir", "build_dir", "disabled_by_env"]

_ENV_NO_EXT = "LIGHTNING_FULLGRAPH_NO_EXT"
_SOURCES = ("aggregate.cpp",)
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
    root = Path(os.environ.get("LIGHTNING_FULLGRAPH_CACHE", Path.home() / ".cache" / "lightning_fullgraph"))
    return root / "ext" / h.hexdigest()[:16]


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
        src = source_dir()
        try:
            if src is None:
                raise FileNotFoundError("C++ sources (csrc/aggregate.cpp) not found next to the package")
            bdir = build_dir(src)
            bdir.mkdir(parents=True, exist_ok=True)
            sources = _stage_sources(src, bdir)
            from torch.utils import cpp_extension

            # The build directory is keyed by the source hash, so a library already there
            # is loaded as is; otherwise this process compiles (or waits for the process
            # of this machine that does: torch serializes builds with a lock file).
            compiling = not (bdir / f"{_NAME}.so").is_file()
            announce = compiling and _is_local_rank_zero()
            if announce:
                _note(f"compiling the C++ aggregation kernels for this CPU (first use, about a "
                      f"minute) into {bdir} ...")
            start = time.perf_counter()
            _module = cpp_extension.load(
                name=_NAME,
                sources=[str(s) for s in sources],
                extra_cflags=_cflags(),
                extra_ldflags=["-fopenmp"],
                build_directory=str(bdir),
                with_cuda=False,
                verbose=verbose,
            )
            if announce:
                _note(f"C++ aggregation kernels compiled in {time.perf_counter() - start:.0f} s "
                      "(cached for later runs)")
        except Exception as exc:  # compiler missing, ninja missing, build error, ...
            _failed = True
            warnings.warn(
                "lightning_fullgraph: C++ aggregation kernels unavailable "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "using the pure-PyTorch fallback.",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
    return _module


def is_available() -> bool:
    """Whether the C++ extension can be (or has been) loaded."""
    return load() is not None
