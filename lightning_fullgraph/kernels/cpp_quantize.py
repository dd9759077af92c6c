"""JIT build and loading of the C++/OpenMP quantization kernels (``csrc/quantize.cpp``).

The same mechanism as :mod:`.cpp` (:func:`.cpp.build_extension`: one persistent build
directory keyed by the source, the torch version and the host CPU; sources staged into it;
``with_cuda=False``; a build lock that survives killed builds; one line on stderr while
compiling), for a separate, small extension: the codec kernels build in a few
seconds and never force a rebuild of the aggregation kernels.  It differs in two flags:
``-fno-trapping-math`` (so that the rounding loop vectorizes) and ``-ffp-contract=off``,
because the wire bytes and decoded rows must equal the pure-PyTorch reference bit for bit,
and a fused multiply-add rounds once where the reference rounds twice.

When the source is missing, no compiler is available, or ``LIGHTNING_FULLGRAPH_NO_EXT=1`` is
set, :func:`load` returns ``None`` after a single warning and the codec uses the reference
(:mod:`lightning_fullgraph.engine.codecs.quantize`).
"""
from __future__ import annotations

import threading
import warnings
from types import ModuleType
from typing import List, Optional

from . import cpp

__all__ = ["load", "is_available"]

_SOURCES = ("quantize.cpp",)
_NAME = "lightning_fullgraph_cpu_quantize"

_lock = threading.Lock()
_module: Optional[ModuleType] = None
_failed = False


def _cflags() -> List[str]:
    # The aggregation flags (-O3, OpenMP, -march=native), but no FMA contraction.  Without
    # -fno-trapping-math GCC keeps the comparisons of the rounding loop as branches (a
    # comparison may raise an FP exception), and that loop runs scalar: 4-5x slower.  It
    # changes no value: nothing here reads the FP exception flags.
    return [f for f in cpp._cflags() if not f.startswith("-ffp-contract")] + \
        ["-ffp-contract=off", "-fno-trapping-math"]


def load(verbose: bool = False) -> Optional[ModuleType]:
    """Return the compiled quantization extension, building it if needed; ``None`` if
    unavailable (after one warning per process).

    Args:
        verbose: Print the compiler output.
    """
    global _module, _failed
    if _module is not None:
        return _module
    if _failed:
        return None
    if cpp.disabled_by_env():
        _failed = True
        warnings.warn(f"lightning_fullgraph: {cpp._ENV_NO_EXT}=1 - C++ quantization kernels "
                      "disabled; using the pure-PyTorch fallback.", RuntimeWarning, stacklevel=2)
        return None
    with _lock:
        if _module is not None or _failed:
            return _module
        try:
            _module = cpp.build_extension(_NAME, _SOURCES, _cflags(), "quantization kernels",
                                          verbose)
        except Exception as exc:  # compiler missing, ninja missing, build error, ...
            _failed = True
            cpp.unavailable("quantization kernels", exc)
            return None
    return _module


def is_available() -> bool:
    """Whether the C++ quantization extension can be (or has been) loaded."""
    return load() is not None
