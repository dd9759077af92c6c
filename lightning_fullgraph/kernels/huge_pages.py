"""Transparent huge pages for large CPU tensors.

In 4 KiB pages every large tensor costs a page fault per 4 KiB the first time it is written
(each step: glibc maps such tensors afresh), and an aggregation over a graph without locality,
which reads one random source row per edge, can miss the TLB on most rows (not measured with
counters). Measured on this project's 2-core machine (README, ``python -m benchmarks huge_pages``):
an unmodified ``GCNConv(128, 128)`` step on 0.5M nodes / 8M edges takes 1.35 s in 4 KiB pages
and 1.17 s in huge pages on our kernels (PyG's own path 8.96 and 4.93 s), the C++ sum over a
uniform 1M nodes / 16M edges graph 0.65 and 0.53 s forward. torch allocates large tensors in
huge pages itself only when ``THP_MEM_ALLOC_ENABLE=1`` is set before its first allocation,
i.e. before ``import torch``, which a library cannot arrange. So the C++ extension carries a
CPU allocator that does the same at run time (``csrc/huge_pages.cpp``): an allocation of at
least 2 MiB is a 2 MiB-aligned mapping of its own, advised ``MADV_HUGEPAGE`` and unmapped when
freed (glibc keeps freed blocks below its mmap threshold, up to 32 MiB, in its heap: resident
memory no tensor uses); smaller ones stay with torch's default allocator. A tensor allocated
while it is installed may outlive it. Values, dtypes, devices and autograd are untouched: only
where the bytes sit changes.

**Off by default**: the allocator becomes torch's CPU allocator for every tensor of the
process, so nothing installs it unless asked.  Ask for it for a block of code::

    import lightning_fullgraph.kernels as K

    with K.use_huge_pages():      # installed now; what was in effect comes back at exit
        ...

or for a run, ``FullGraphStrategy(huge_pages=True)`` (reverted at teardown; ``train
--huge-pages on``), or for the process, :func:`set_huge_pages` or the environment variable
``LIGHTNING_FULLGRAPH_HUGE_PAGES`` (read once, at import).  The modes:

* ``"off"`` (default): torch's default allocator (restored if ours was installed).
* ``"on"``: installed now (building the C++ kernels if needed); a warning says why not when
  it cannot be.
* ``"auto"``: installed when the C++ kernels load in this process, and by
  :class:`~lightning_fullgraph.FullGraphStrategy` with CPU kernels before the data is set up
  (so the partition's features are in huge pages too).

Where the platform has no transparent huge pages, where torch already does it
(``THP_MEM_ALLOC_ENABLE=1``), or where another CPU allocator was installed, nothing is
installed (with ``"on"``, a warning says why).  Tensors allocated *before* the allocator is
installed stay where they are: to have a dataset's features in huge pages without the
strategy, load it inside ``use_huge_pages()``.

**Block cache (on with the allocator).** Without it every large block is unmapped when freed, so
the tensor that takes its place in the next training step starts in fresh pages: a page
fault per 2 MiB and the kernel zeroing it, which on this project's 2-core virtual machine
cost 0.43-1.12 s of system time per step over four GCN ranks (``python -m benchmarks rank_profile
--block-cache 0``).  The cache keeps the whole huge
pages of freed blocks, resident, and fills each new large block with them: ``mremap()``
moves the page tables, not the data, so any freed pages can fill a block of any length (the
kernels' outputs included: their own pool steps aside while the cache is on).  Only an empty
cache leaves fresh pages in a new block, so the bytes held, live and cached, never exceed the
most the live ones ever took (plus the tails below 2 MiB of the blocks live now): the cache
does not raise a process's peak, it keeps the memory of that peak between steps, as torch's
CUDA caching allocator does.  :func:`~.csr.clear_memos` and turning the allocator off give
the cached pages back; :func:`set_block_cache` (or the environment variable
``LIGHTNING_FULLGRAPH_HUGE_PAGES_CACHE``, bytes with an optional ``K``/``M``/``G`` suffix,
read at import) caps it, ``0`` turns it off.  The default cap is the machine's memory: the
live-peak rule is the bound.  Measured (README; ``python -m benchmarks fullgraph --parts 4
--block-cache-ab``): a 2-layer GCN at P = 4 on 1M nodes / 10M edges 1.36x per epoch
(GraphSAGE 1.62x), the ranks' peaks not raised.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Union

__all__ = ["MODES", "ENV", "CACHE_ENV", "THRESHOLD", "set_huge_pages", "get_huge_pages",
           "is_active", "set_block_cache", "get_block_cache", "default_block_cache", "thp_mode",
           "huge_pages_info", "HugePagesHandle", "enable_for_kernels", "use_huge_pages"]

MODES = ("auto", "on", "off")
#: Environment variable selecting the mode at import (``off``/``0``, the default; ``on``/``1``;
#: ``auto``).
ENV = "LIGHTNING_FULLGRAPH_HUGE_PAGES"
#: Environment variable with the block cache's limit in bytes (see :func:`set_block_cache`).
CACHE_ENV = "LIGHTNING_FULLGRAPH_HUGE_PAGES_CACHE"
#: Smallest allocation placed in huge pages (torch's own threshold for THP allocations).
THRESHOLD = 2 << 20

_SYSFS = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_ALIASES = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off",
            "": "off"}


def _normalize(mode: str) -> str:
    m = _ALIASES.get(str(mode).strip().lower(), str(mode).strip().lower())
    if m not in MODES:
        raise ValueError(f"unknown huge-page mode {mode!r}; expected one of {MODES}")
    return m


def _mode_from_env() -> str:
    value = os.environ.get(ENV, "off")
    try:
        return _normalize(value)
    except ValueError:
        warnings.warn(f"lightning_fullgraph: {ENV}={value!r} is not one of {MODES}; using "
                      "'off'", RuntimeWarning, stacklevel=2)
        return "off"


_SUFFIXES = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
             "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def _parse_bytes(value: Union[int, str]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), 1
    else:
        text = str(value).strip().lower()
        digits = text.rstrip("abgikm ")
        unit = _SUFFIXES.get(text[len(digits):].strip())
        try:
            number = float(digits)
        except ValueError:
            number = float("nan")
        if unit is None or number != number:
            raise ValueError(f"block cache limit {value!r}: expected a number of bytes with an "
                             "optional K/M/G suffix, e.g. 2G or 536870912")
    if number < 0:
        raise ValueError(f"block cache limit {value!r} is negative; 0 turns the cache off")
    return int(number * unit)


def default_block_cache() -> int:
    """The block cache's default limit: the machine's physical memory in bytes (so the
    live-peak rule is the bound), ``0`` (off) where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 0


def _cache_from_env() -> int:
    value = os.environ.get(CACHE_ENV)
    if value is None:
        return default_block_cache()
    try:
        return _parse_bytes(value)
    except ValueError as exc:
        warnings.warn(f"lightning_fullgraph: {CACHE_ENV}: {exc}; the block cache is off",
                      RuntimeWarning, stacklevel=2)
        return 0


_state: Dict[str, Any] = {"mode": _mode_from_env(), "cache": _cache_from_env()}


def thp_mode(path: Optional[Path] = None) -> Optional[str]:
    """The kernel's transparent-huge-page setting (``"always"``, ``"madvise"``, ``"never"``),
    or ``None`` where there is none (not Linux, or a kernel without THP).

    Args:
        path (Path, optional): The setting's file (default: the kernel's, in ``/sys``).
    """
    try:
        text = (path or _SYSFS).read_text()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _torch_does_it() -> bool:
    # torch read THP_MEM_ALLOC_ENABLE at its first allocation; the variable is the only trace.
    return os.environ.get("THP_MEM_ALLOC_ENABLE", "0").strip().lower() in ("1", "true", "yes",
                                                                           "on")


def _why_not() -> Optional[str]:
    """Why the allocator is not installed on this platform, or ``None`` if it can be."""
    if not sys.platform.startswith("linux"):
        return f"transparent huge pages are a Linux feature (platform {sys.platform})"
    mode = thp_mode()
    if mode is None:
        return f"this kernel has no transparent huge pages ({_SYSFS} missing)"
    if mode == "never":
        return (f"transparent huge pages are off on this machine ({_SYSFS} is 'never'; "
                "an administrator can set it to 'madvise')")
    return None


def _with_allocator(ext: Any) -> Any:
    # A build of the extension without the allocator (a stand-in module in tests) has none.
    return ext if ext is not None and hasattr(ext, "install_huge_pages") else None


def _extension():
    from . import cpp

    return _with_allocator(cpp.load())


def _install(explicit: bool, ext: Any = None) -> bool:
    if _torch_does_it():
        return False  # torch's own allocator already places large tensors in huge pages
    reason = _why_not()
    if reason is None:
        ext = _with_allocator(ext) if ext is not None else _extension()
        if ext is None:
            reason = "the C++ kernels (with their allocator) are unavailable"
        elif ext.install_huge_pages(THRESHOLD):
            return True
        else:
            reason = "another CPU allocator is installed and was left in place"
    if explicit:
        warnings.warn(f"lightning_fullgraph: huge pages not enabled: {reason}.",
                      RuntimeWarning, stacklevel=3)
    return False


def _loaded_extension():
    from . import cpp

    return _with_allocator(cpp._module)  # only if loaded: never build to answer a query


def is_active() -> bool:
    """Whether this package's huge-page allocator is torch's CPU allocator now."""
    ext = _loaded_extension()
    return bool(ext is not None and ext.huge_pages_installed())


def set_huge_pages(mode: str = "on") -> bool:
    """Selects the huge-page mode (see the module docstring) and applies it now.

    Args:
        mode (str): ``"auto"``, ``"on"`` or ``"off"`` (also ``"1"``/``"0"``).

    Returns:
        bool: whether the huge-page allocator is installed after the call.
    """
    mode = _normalize(mode)
    _state["mode"] = mode
    if mode == "off":
        ext = _loaded_extension()
        if ext is not None:
            ext.uninstall_huge_pages()
        return False
    if mode == "on":
        return _install(explicit=True)
    return is_active()


def get_huge_pages() -> str:
    """The selected mode: ``"auto"``, ``"on"`` or ``"off"``."""
    return _state["mode"]


def set_block_cache(limit: Union[int, str]) -> int:
    """Keeps the pages of freed large blocks of the huge-page allocator for reuse, up to
    :obj:`limit` bytes (see the module docstring; default: :func:`default_block_cache`);
    ``0`` turns the cache off and unmaps what it holds.

    Args:
        limit (int or str): Bytes, or a string with a ``K``/``M``/``G`` suffix (``"2G"``).

    Returns:
        int: The limit in bytes (applied now if the C++ kernels are loaded, else when they
        load).
    """
    _state["cache"] = _parse_bytes(limit)
    ext = _loaded_extension()
    if ext is not None and hasattr(ext, "huge_pages_set_cache_limit"):
        ext.huge_pages_set_cache_limit(_state["cache"])
        if _state["cache"]:
            ext.clear_pool()  # the cache now reuses the kernels' outputs too: one rule for all
    return _state["cache"]


def get_block_cache() -> int:
    """The block cache's limit in bytes (``0``: off)."""
    return _state["cache"]


def huge_pages_info() -> Dict[str, Any]:
    """What is in effect, for logs: the mode, whether the allocator is installed, the
    kernel's THP setting, whether torch does it itself, the large allocations served, and the
    block cache (its limit; allocations and bytes filled from it; bytes and ranges in it)."""
    ext = _loaded_extension()
    stats = list(ext.huge_pages_stats()) if ext is not None else []
    stats += [0] * (8 - len(stats))
    count, nbytes, reused, live_peak, _held_peak, cached, blocks, reused_bytes = stats[:8]
    return {"mode": get_huge_pages(), "active": is_active(), "thp": thp_mode(),
            "torch_thp": _torch_does_it(), "allocations": int(count), "bytes": int(nbytes),
            "cache_limit": get_block_cache(), "reused": int(reused),
            "reused_bytes": int(reused_bytes),
            "cached_bytes": int(cached), "cached_blocks": int(blocks),
            "live_peak_bytes": int(live_peak)}


class HugePagesHandle:
    """What :func:`enable_for_kernels` (or :func:`use_huge_pages`) changed, undone by
    :meth:`revert` or at the end of a ``with`` block: the mode and whether the allocator was
    installed before the call come back.

    Attributes:
        installed (bool): Whether the call installed the allocator (it was not before).
    """

    def __init__(self, previous_mode: str, was_active: bool) -> None:
        self.previous_mode = previous_mode
        self.was_active = was_active
        self.installed = is_active() and not was_active
        self._reverted = False

    def revert(self) -> None:
        if self._reverted:
            return
        self._reverted = True
        _state["mode"] = self.previous_mode
        ext = _loaded_extension()
        if ext is None:
            return
        if self.was_active and not is_active():
            ext.install_huge_pages(THRESHOLD)
        elif not self.was_active and is_active():
            ext.uninstall_huge_pages()

    def __enter__(self) -> "HugePagesHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.revert()

    def __repr__(self) -> str:
        return (f"HugePagesHandle(installed={self.installed}, "
                f"previous_mode={self.previous_mode!r})")


def enable_for_kernels(setting: Optional[bool] = None) -> HugePagesHandle:
    """Applies the allocator for a run on the CPU kernels; :meth:`HugePagesHandle.revert`
    restores what was in effect before.

    Args:
        setting (bool, optional): ``None`` follows the mode (``"auto"`` and ``"on"`` install,
            building the C++ kernels if needed: the run uses them anyway; ``"off"`` does
            nothing); ``True`` installs it (mode ``"on"``: a warning says why not where it
            cannot be); ``False`` keeps torch's allocator for the run (mode ``"off"``, so the
            kernels loading later do not install it either).
    """
    handle_args = (get_huge_pages(), is_active())
    if setting is False:
        set_huge_pages("off")
    elif setting is True:
        set_huge_pages("on")
    elif get_huge_pages() != "off" and not is_active():
        _install(explicit=get_huge_pages() == "on")
    return HugePagesHandle(*handle_args)


def use_huge_pages(enabled: bool = True) -> HugePagesHandle:
    """Large CPU tensors in transparent huge pages from now on (``enabled=False``: torch's
    4 KiB pages), until the returned handle is reverted; as a context manager, for the block::

        with K.use_huge_pages():
            trainer.fit(...)

    A warning says why not where the machine cannot (see the module docstring).
    """
    return enable_for_kernels(bool(enabled))


def _on_kernels_loaded(ext: Any) -> None:
    """Called once by :func:`.cpp.load` with the freshly loaded extension: modes ``"auto"``
    and ``"on"`` install the allocator there (``"auto"`` silently where it cannot)."""
    if get_huge_pages() != "off":
        _install(explicit=get_huge_pages() == "on", ext=ext)
    if _state["cache"] and hasattr(ext, "huge_pages_set_cache_limit"):
        ext.huge_pages_set_cache_limit(_state["cache"])
