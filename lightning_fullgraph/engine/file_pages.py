r"""Giving back the pages of a memory-mapped tensor that nothing will read again.

A rank loads its partition with ``torch.load(mmap=True)``: its features are a private mapping
of the partition file, and every page read once stays in the rank's resident set. When the
static-input memo (:mod:`.static`) keeps the first layer's aggregation of those features, no later
step reads them (a reuse is decided from the tensor's storage and version, not its values),
yet their pages -- as large as the kept aggregation itself -- stay resident through every
step's peak. :func:`release_file_pages` asks the kernel to reclaim them
(``madvise(MADV_PAGEOUT)``, Linux 5.4+). Nothing changes for the program:

* a clean page of the file is dropped and read again from the file if it is touched (the
  page cache may keep it meanwhile, as reclaimable memory); a page still waiting to be
  written to the file (one just saved) stays;
* a page the user modified in place is anonymous memory (copy on write of a private
  mapping): the kernel swaps it out or, without swap, keeps it -- it is never discarded;
* tensors not in a private file mapping (anonymous memory, shared mappings) are left alone.

So the call is safe for any tensor; at worst a later read costs the page faults of reading the
file again.

The static-input memo gives an input back as early as it can: while it computes a result it will
keep (:func:`releasing`), the halo exchange gives back the owned rows it was handed as soon as
it has copied them into its ``[owned; halo]`` buffer (:func:`release_consumed`), so the
features and that buffer are not resident together at the first step's peak.
"""
import contextlib
import ctypes
import os
import sys
import threading
from typing import Iterator, Optional, Set

import torch
from torch import Tensor

__all__ = ["release_file_pages", "releasing", "release_consumed", "Released", "MADV_PAGEOUT"]

#: ``madvise`` advice "reclaim these pages" (``<linux/mman.h>``).
MADV_PAGEOUT = 21

_state = {"libc": None, "broken": False}
_scope = threading.local()  # the records of the enclosing releasing() scopes


def _madvise():
    if _state["broken"] or not sys.platform.startswith("linux"):
        return None
    if _state["libc"] is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            _state["broken"] = True
            return None
        _state["libc"] = libc
    return _state["libc"].madvise


def _private_file_mapping(address: int) -> Optional[range]:
    r"""The address range of the private file mapping that holds :obj:`address`, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                start, end = (int(a, 16) for a in fields[0].split("-"))
                if not start <= address < end:
                    continue
                perms, inode = fields[1], fields[4]
                path = fields[5].strip() if len(fields) > 5 else ""
                if perms.endswith("p") and inode != "0" and path.startswith("/") \
                        and not path.endswith(" (deleted)"):
                    return range(start, end)
                return None
    except OSError:
        return None
    return None


def release_file_pages(tensor: Tensor) -> int:
    r"""Advises the kernel to reclaim :obj:`tensor`'s pages when its storage lies in a
    private file mapping (see the module docstring).

    Args:
        tensor (torch.Tensor): A CPU tensor; any other is left alone.

    Returns:
        The bytes advised (the whole pages inside the bytes it spans), 0 where nothing was
        done: not a file mapping, not Linux, a kernel without ``MADV_PAGEOUT``.
    """
    if not isinstance(tensor, Tensor) or tensor.device.type != "cpu" or tensor.is_sparse \
            or tensor.layout != torch.strided or tensor.numel() == 0:
        return 0
    # The bytes this tensor spans (a view: not the rest of its storage).
    address = tensor.data_ptr()
    size = (1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))) \
        * tensor.element_size()
    madvise = _madvise()
    if madvise is None or address == 0:
        return 0
    mapping = _private_file_mapping(address)
    if mapping is None:
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    # Whole pages of this tensor only: a page it shares with a neighbour is left as it is.
    lo = -(-address // page) * page
    hi = min(address + size, mapping.stop) // page * page
    if hi <= lo:
        return 0
    if madvise(lo, hi - lo, MADV_PAGEOUT) != 0:
        return 0  # e.g. EINVAL: a kernel before 5.4, or a mapping it cannot page out
    return hi - lo


class Released:
    r"""What a :func:`releasing` scope gave back: :attr:`bytes`, and the start addresses of
    the tensors (:attr:`addresses`)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.addresses: Set[int] = set()


@contextlib.contextmanager
def releasing(enabled: bool = True) -> Iterator[Released]:
    r"""A scope in which :func:`release_consumed` gives tensors back (this thread only).

    Yields:
        :class:`Released`, filled as the scope runs.
    """
    stack = getattr(_scope, "stack", None)
    if stack is None:
        stack = _scope.stack = []
    record = Released()
    stack.append(record if enabled else None)
    try:
        yield record
    finally:
        stack.pop()


def release_consumed(tensor: Tensor) -> int:
    r""":func:`release_file_pages` of a tensor whose values the caller has just copied, inside
    a :func:`releasing` scope; nothing outside one."""
    stack = getattr(_scope, "stack", None)
    if not stack or stack[-1] is None:
        return 0
    released = release_file_pages(tensor)
    if released:
        stack[-1].bytes += released
        stack[-1].addresses.add(tensor.data_ptr())
    return released
