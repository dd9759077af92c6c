r"""One object for how a process's aggregations and dense maps run.

:class:`KernelConfig` holds the compute choices that the Lightning strategy, the Fabric helper
and the command line share: the aggregation backend, the huge-page allocator (an opt-in: it
swaps torch's CPU allocator for the whole process) and torch's thread count::

    FullGraphStrategy(kernels="cpp")                                  # the backend alone
    FullGraphStrategy(kernels=KernelConfig(huge_pages=True, num_threads=4))
    setup_fullgraph(fabric, model, data, kernels=KernelConfig(backend="triton"))
"""
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from .._config import from_mapping
from .backend import BACKENDS

__all__ = ["KernelConfig"]


@dataclass(frozen=True)
class KernelConfig:
    r"""How aggregations and dense maps run in each process.

    Args:
        backend (str, optional): Aggregation backend of the attached model: ``"auto"``
            (default: C++ on CPU, Triton on CUDA where installed, else PyTorch), ``"cpp"``,
            ``"triton"``, ``"torch"``; ``None`` keeps PyG's own path
            (:func:`lightning_fullgraph.kernels.use`).
        huge_pages (bool, optional): With the CPU kernels, large CPU tensors in transparent
            huge pages for the run (:mod:`lightning_fullgraph.kernels.huge_pages`).  It swaps
            torch's CPU allocator for every tensor of the process, so it is off unless asked:
            ``True`` on (a warning says why not where the machine cannot), ``False`` torch's
            4 KiB pages, ``None`` (default) the process's mode
            (:func:`~lightning_fullgraph.kernels.set_huge_pages`, off unless set).  What was in
            effect before comes back at teardown.
        num_threads (int, optional): Torch intra-op threads per process, set for the run and
            restored at teardown.  Default: left as the launcher set it (``torchrun`` and
            Lightning's launchers set ``$OMP_NUM_THREADS``).

    Raises:
        ValueError: An unknown backend, a ``huge_pages`` other than ``None``/``True``/
            ``False``, or fewer than one thread.
    """
    backend: Optional[str] = "auto"
    huge_pages: Optional[bool] = None
    num_threads: Optional[int] = None

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"unknown aggregation backend {self.backend!r}; expected one of "
                             f"{BACKENDS} or None (PyG's own path)")
        if self.huge_pages not in (None, True, False):
            raise ValueError(f"huge_pages must be None, True or False, got {self.huge_pages!r}")
        if self.num_threads is not None and (isinstance(self.num_threads, bool)
                                             or int(self.num_threads) < 1):
            raise ValueError(f"num_threads must be at least 1 (or None), got "
                             f"{self.num_threads!r}")

    @classmethod
    def of(cls, value: Union[None, str, "KernelConfig", Mapping[str, Any]]) -> "KernelConfig":
        r"""A config from a config, a backend name (``None``: PyG's own path) or a mapping of
        its fields."""
        if value is None or isinstance(value, str):
            return cls(backend=value)
        if isinstance(value, KernelConfig):
            return value
        if isinstance(value, Mapping):
            return from_mapping(cls, value)
        raise TypeError(f"kernels must be a backend name, None, a KernelConfig or a mapping, "
                        f"got {type(value).__name__}")
