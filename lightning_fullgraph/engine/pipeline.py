r"""Asynchronous halo pipeline with bounded staleness (PipeGCN; SYLVIE's execution dimension).

In an asynchronous training step every exchange point *starts* sending this step's rows
(forward) or gradients (backward) and, instead of waiting for them, hands the layer what it
received during the previous step: halo rows and halo gradients are stale by exactly one step
(one epoch in full-graph training), and the transfer overlaps everything the rank computes
until the next step needs it.  The first training exchange of a point is synchronous (there is
nothing older), and so is every exchange after :obj:`max_async_epochs` consecutive asynchronous
ones (the design spec's bound, §B1: SYLVIE leaves the number of async epochs unbounded), after
which the chain restarts from the fresh rows.  A synchronous step first completes the transfer
still in flight, so switching modes never loses or reorders a collective: each exchange point
issues exactly one ``all_to_all`` per call in either mode, on every rank.  The asynchronous
transfers run on a process group of their own (the transport's background group, created with
the engine): on the engine's group the step's gradient all-reduce and the evaluation's
exchanges, issued after them, would wait for them to finish, and the transfer would overlap
only the rest of the backward pass.

Evaluation and prediction always exchange fresh rows synchronously.  Nothing of the pipeline
is checkpointed: the first step after a resume is synchronous, as the first step of a run is.
"""
from dataclasses import dataclass
from typing import Any, Callable, Optional

from torch import Tensor

__all__ = ["AsyncPipeline", "PipeState", "PIPELINE_MODES"]

PIPELINE_MODES = ("sync", "async")


class AsyncPipeline:
    r"""Settings of the asynchronous halo pipeline of an :class:`~.policy.ExchangePolicy`.

    Args:
        mode (str): ``"async"`` (one-step-stale rows and gradients) or ``"sync"``; a callback
            (:class:`~lightning_fullgraph.callbacks.PipelineAdaptor`) may switch it between
            epochs, the same on every rank.
        max_async_epochs (int): Consecutive asynchronous exchanges of a point after which one
            is synchronous (bounded staleness); ``0`` for no bound.
    """

    def __init__(self, mode: str = "async", max_async_epochs: int = 10) -> None:
        self.mode = mode
        if int(max_async_epochs) < 0:
            raise ValueError(f"AsyncPipeline: max_async_epochs must be >= 0, got "
                             f"{max_async_epochs}")
        self.max_async_epochs = int(max_async_epochs)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in PIPELINE_MODES:
            raise ValueError(f"AsyncPipeline: mode must be one of {PIPELINE_MODES}, got "
                             f"{value!r}")
        self._mode = value

    @classmethod
    def of(cls, value: Any) -> Optional["AsyncPipeline"]:
        r"""A pipeline from ``None``/``"sync"`` (none), ``"async"``, ``"adaptive"`` (async
        settings whose mode a :class:`~lightning_fullgraph.callbacks.PipelineAdaptor` drives;
        it starts synchronous) or an :class:`AsyncPipeline`."""
        if value is None or isinstance(value, AsyncPipeline):
            return value
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("sync", "none"):
                return None
            if text == "async":
                return cls("async")
            if text == "adaptive":
                return cls("sync")
        raise ValueError(f"unknown pipeline {value!r}: expected 'sync', 'async', 'adaptive' "
                         "or an AsyncPipeline")

    @property
    def lossless(self) -> bool:
        return False  # stale rows: not the single-process computation

    def describe(self) -> str:
        r"""The pipeline in words, e.g. for the warning that training is not exact."""
        if self.max_async_epochs == 0:
            # 0 is no bound (SYLVIE's setting), not "no async epoch".
            return f"{self.mode} pipeline (no bound on the async epochs in a row: " \
                   "max_async_epochs=0)"
        return f"{self.mode} pipeline (at most {self.max_async_epochs} async epochs in a row)"

    def __repr__(self) -> str:
        return f"AsyncPipeline(mode={self.mode!r}, max_async_epochs={self.max_async_epochs})"


@dataclass
class PipeState:
    r"""One exchange point's pipeline on one rank, for one direction: the rows received
    during the previous step, the transfer in flight, and the asynchronous run so far."""

    last: Tensor
    inflight: Optional[Callable[[], Tensor]] = None  # completes and decodes the transfer
    run: int = 0  # consecutive asynchronous exchanges

    def drain(self) -> None:
        r"""Completes the transfer in flight (its rows become :attr:`last`)."""
        if self.inflight is not None:
            finish, self.inflight = self.inflight, None
            self.last = finish()
