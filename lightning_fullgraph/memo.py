r"""One memo for every "the same, unchanged input" shortcut of the library.

Several parts keep a value computed from tensors and answer later calls with it while those
tensors are the very same ones, unmodified: the kernels' CSR structures (:mod:`.kernels.csr`),
``GCNConv`` normalizations (:mod:`.kernels.gcn`), kept aggregations (:mod:`.kernels.kept`),
validated index ranges (:mod:`.kernels.validate`), the distributed engine's static-input memo
(:mod:`.engine.static`) and its check that an edge list is the partition's own
(:mod:`.engine.aggregation`).  They share :class:`TensorMemo`, and so one rule for what "the same,
unchanged" means (:func:`signature`) and when an entry goes.

What identifies a tensor while it lives is its storage, offset, shape, strides, dtype, device and
version counter (an in-place edit bumps it).  An entry *follows* the tensors it came from: it
refers to them (or to the bases they view, :func:`anchor`) weakly and goes as soon as one is
freed, so a memo never keeps a caller's tensor alive and a freed tensor's memory, reused by
another, is never mistaken for it.  A memo that must answer for equal tensors made anew in
every call (the CSR of an edge list a layer rebuilds per call) holds its inputs instead
(``hold=True``): then nothing can reuse their storage while the entry lives.  Tensors inside a
kept value must keep their version too: a caller that edits a kept output in place makes the
next call compute anew.  Every memo is bounded (:attr:`TensorMemo.size` entries, least recently
used first out) or keyed by something finite (a layer's call sites).

Inference tensors have no version counter: callers never key a memo by one.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator, Optional, Tuple

from torch import Tensor

__all__ = ["TensorMemo", "signature", "anchor"]


def _data(t: Tensor) -> Tensor:
    # A wrapper subclass (PyG's EdgeIndex) has no storage of its own: its data tensor's.
    return t.as_tensor() if type(t).__name__ == "EdgeIndex" and hasattr(t, "as_tensor") else t


def signature(t: Tensor) -> tuple:
    r"""What identifies :obj:`t` as *the same, unmodified* tensor while it (or its base)
    lives: its storage, offset, shape, strides, dtype, device and version counter."""
    data = _data(t)
    return (data.untyped_storage().data_ptr(), data.storage_offset(), tuple(data.shape),
            tuple(data.stride()), data.dtype, data.device, data._version)


def anchor(t: Tensor) -> Tensor:
    r"""The tensor whose life a memo entry of :obj:`t` follows: :obj:`t` itself, or the base
    it views (so a view made anew in every call, e.g. ``x[:, :]``, finds its entry)."""
    return t if t._base is None else t._base


def _value_tensors(value: Any) -> Tuple[Tensor, ...]:
    if isinstance(value, Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(t for v in value for t in _value_tensors(v))
    return ()


class _Entry:
    __slots__ = ("refs", "held", "signatures", "value", "versions", "extra", "__weakref__")

    def __init__(self, refs, held, signatures, value, extra) -> None:
        self.refs = refs  # weak references to what the entry follows (hold=False)
        self.held = held  # the tensors themselves (hold=True)
        # per input: (True, a tensor's signature) or (False, the plain value)
        self.signatures = signatures
        self.value = value
        self.versions = tuple(t._version for t in _value_tensors(value))
        self.extra = extra  # the caller's, not compared (e.g. a fingerprint)

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        r"""The held tensors (``hold=True``), else the living followed objects."""
        if self.held is not None:
            return self.held
        return tuple(o for o in (ref() for ref in self.refs) if o is not None)

    def matches(self, inputs: Tuple[Any, ...]) -> bool:
        if len(inputs) != len(self.signatures) or any(ref() is None for ref in self.refs):
            return False
        for new, (is_tensor, old) in zip(inputs, self.signatures):
            if isinstance(new, Tensor):
                if not is_tensor or signature(new) != old:
                    return False
            elif is_tensor or new != old:
                return False
        return self.versions == tuple(t._version for t in _value_tensors(self.value))


class TensorMemo:
    r"""Values computed from tensors, answered only while those tensors live unchanged.

    One entry per key (any hashable the caller chooses).  An entry records, per input, a
    tensor's :func:`signature` or a plain value's equality, and is answered by :meth:`get`
    only while every input given then matches, every object it follows lives, and the tensors
    inside its value have their versions of when it was stored.

    Args:
        size (int, optional): Entries at most; the least recently used goes first. ``None``:
            unbounded (the caller's keys are finite, e.g. a model's call sites).
        hold (bool): Hold the input tensors (strongly) instead of following them weakly.
    """

    def __init__(self, size: Optional[int] = None, hold: bool = False) -> None:
        self.size = None if size is None else max(0, int(size))
        self.hold = bool(hold)
        self.hits = 0
        self.misses = 0
        self._entries: "OrderedDict[Hashable, _Entry]" = OrderedDict()
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (f"TensorMemo(entries={len(self)}, size={self.size}, hold={self.hold}, "
                f"hits={self.hits}, misses={self.misses})")

    def get(self, key: Hashable, inputs: Tuple[Any, ...], count: bool = True) -> Optional[Any]:
        r"""The value stored under :obj:`key` if its inputs match :obj:`inputs`, else
        ``None`` (:obj:`count`: add to :attr:`hits` / :attr:`misses`)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.matches(inputs):
                self._entries.move_to_end(key)
                self.hits += count
                return entry.value
            self.misses += count
            return None

    def put(self, key: Hashable, inputs: Tuple[Any, ...], value: Any,
            follow: Tuple[Any, ...] = (), extra: Any = None) -> None:
        r"""Stores :obj:`value` under :obj:`key` (replacing what was there).

        Args:
            key: Any hashable.
            inputs (tuple): What the value was computed from: tensors (followed or held) and
                plain values (compared by equality).
            value: What :meth:`get` answers.
            follow (tuple): More objects whose life the entry follows (e.g. a layer).
            extra: Kept with the entry for the caller (:meth:`items`), never compared.
        """
        tensors = tuple(t for t in inputs if isinstance(t, Tensor))
        signatures = tuple((True, signature(v)) if isinstance(v, Tensor) else (False, v)
                           for v in inputs)
        with self._lock:
            if self.size == 0:
                return
            held = tensors if self.hold else None
            entry = _Entry((), held, signatures, value, extra)
            followed = follow + (() if self.hold else tuple(anchor(t) for t in tensors))
            entry.refs = tuple(weakref.ref(o, self._dropper(key, entry)) for o in followed)
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._trim()

    def _dropper(self, key: Hashable, entry: _Entry) -> Callable:
        # Weak: neither the memo nor the entry is kept alive by the callback (a cycle through
        # it would keep the value until the garbage collector runs).
        memo, mine = weakref.ref(self), weakref.ref(entry)

        def drop(_ref: Any) -> None:
            owner = memo()
            if owner is not None:
                with owner._lock:
                    if owner._entries.get(key) is not None and \
                            owner._entries.get(key) is mine():
                        del owner._entries[key]
        return drop

    def _trim(self) -> None:
        if self.size is not None:
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def set_size(self, size: Optional[int]) -> None:
        r"""A new bound (the least recently used entries beyond it go now)."""
        with self._lock:
            self.size = None if size is None else max(0, int(size))
            self._trim()

    def pop(self, key: Hashable) -> None:
        r"""Forgets :obj:`key`'s entry, if any."""
        with self._lock:
            self._entries.pop(key, None)

    def touch(self, key: Hashable) -> None:
        r"""Marks :obj:`key`'s entry as the most recently used."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)

    def items(self) -> Iterator[Tuple[Hashable, Any, Tuple[Tensor, ...], Any]]:
        r"""``(key, value, inputs, extra)`` of every entry, oldest first (a snapshot);
        ``inputs``: the held tensors (``hold=True``) or the living followed objects."""
        with self._lock:
            entries = list(self._entries.items())
        return iter([(k, e.value, e.inputs, e.extra) for k, e in entries])

    def matches(self, key: Hashable, inputs: Tuple[Any, ...]) -> bool:
        r"""Whether :meth:`get` would answer (counts nothing, changes no order)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry is not None and entry.matches(inputs)

    def clear(self) -> None:
        r"""Forgets every entry and resets the counts."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def nbytes(self) -> int:
        r"""Bytes of the tensors the kept values hold."""
        with self._lock:
            values = [e.value for e in self._entries.values()]
        return sum(t.numel() * t.element_size() for v in values for t in _value_tensors(v))
