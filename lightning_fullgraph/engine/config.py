r"""One object for how the halo exchange runs, shared by every entry point.

:class:`ExchangeConfig` holds the choices that change what crosses the wire and when: the
aggregation mode, the codec, the halo cache, the asynchronous pipeline, boundary sampling,
overlap, stepping aside, and the link the choices are predicted on.  The Lightning strategy,
the Fabric helper, the engine and the command line take the same object::

    exchange = ExchangeConfig(codec="int2", cache="adaptive")
    Trainer(strategy=FullGraphStrategy(exchange=exchange))
    setup_fullgraph(fabric, model, data, exchange=exchange)
    FullGraphEngine(part, exchange=exchange)

It is checked when made (an unknown codec name, a combination that cannot work), not at setup
on every rank.
"""
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from .._config import from_mapping
from .aggregation import MODES
from .cache import HaloCache
from .codecs import Codec
from .pipeline import AsyncPipeline
from .policy import ExchangePolicy
from .sampling import BoundarySampling
from .step_aside import StepAside

__all__ = ["ExchangeConfig", "AGGREGATIONS", "refuse_moved_arguments"]

#: The values of :attr:`ExchangeConfig.aggregation`: the lossless modes and ``"auto"``.
AGGREGATIONS = MODES + ("auto", )


@dataclass
class ExchangeConfig:
    r"""How halo rows cross the wire.

    Args:
        aggregation (str): How cut edges of sum/mean layers with scalar edge messages
            (``GCNConv``, ``SAGEConv``, ``GINConv``, ...) are aggregated: ``"hybrid"``
            (default; SuperGCN's minimum-vertex-cover mix, never more rows than either pure
            scheme; rows and partials in one collective unless a per-node codec, the cache,
            the pipeline or sampling treats them apart),
            ``"post"`` (send source rows), ``"pre"`` (send partial aggregates), or
            ``"auto"``: per layer, the one of the three the planner predicts fastest on
            :obj:`link` for the width the layer exchanges (rows, bytes and collectives per
            step, from figures all-reduced over the ranks, so every rank picks the same).
            Lossless in every mode; other layers always post-aggregate.
        codec (str, Codec or ExchangePolicy, optional): How rows cross the wire, for every
            exchange point or per point and direction: a name (``"fp32"``, ``"bf16"``,
            ``"int8"``, ``"int4"``, ``"int2"``, ``"int1"``; see
            :mod:`lightning_fullgraph.engine.codecs.registry`), a codec or a policy
            (default: exact).
        cache (str, float or HaloCache, optional): Adaptive halo cache of training
            exchanges (CDFGNN): rows and gradients are sent again only when they moved by
            more than a relative threshold :math:`\epsilon` (``"adaptive"``: the defaults of
            :class:`~.cache.HaloCache`; ``"budgeted"``: one collective per exchange,
            :class:`~.cache.HaloCache` ``(budgeted=True)``; a number: that
            :math:`\epsilon`; ``0`` is exact).  Default none.
        pipeline (str or AsyncPipeline, optional): Asynchronous halo pipeline (PipeGCN):
            ``"async"`` trains on halo rows one step stale while this step's are in flight;
            ``"adaptive"`` lets :class:`~lightning_fullgraph.callbacks.PipelineAdaptor`
            switch between sync and async (SYLVIE).  Default none (synchronous, exact).
        sampling (float or BoundarySampling, optional): Boundary node sampling (BNS-GCN):
            each training step keeps this fraction :math:`p` of the halo rows, scaled by
            :math:`1/p`; ``1`` is exact.  Default none.
        overlap (bool): Run the aggregation of the edges whose sources are local while the
            halo rows travel, forward and backward (sum and mean aggregations on the
            kernels).  Exact to floating-point rounding.  Default on.
        step_aside (bool or StepAside): After a few training steps, time the configured
            reductions (the pre/hybrid/auto aggregation, sampling, cache, lossy codec,
            pipeline, duplex) against the step with each left out and keep only those that
            shorten it (:class:`~.step_aside.StepAside`; every rank decides the same, the
            decision is checkpointed).  Default on; nothing to try with exact post
            aggregation without duplex.  The
            decision depends on measured times: ``False`` keeps the configured policy
            throughout.
        duplex (bool): On gloo, send every exchange's two directions at once, on two process
            groups of the same ranks: gloo carries one direction of a pair's connection at a
            time, and a bulk exchange between two machines got half their links' rate, both
            directions at once 1.99x that (four machines: 1.27x; ``python -m benchmarks
            link_sizes``).  Exact (the same bytes into the same places); two collectives per
            exchange instead of one, and a second group's sockets.  Other backends ignore
            it.  With :obj:`step_aside`, tried against one collective per exchange and kept
            only where it shortens the step (a latency-bound model can get slower: GCN's
            step took 1.05x).  Default off.
        link (str or LinkModel, optional): The link :obj:`aggregation` ``"auto"`` predicts
            on: a :class:`~lightning_fullgraph.planner.LinkModel`, a JSON file written by
            ``lightning-fullgraph train --save-link`` or ``plan --save-link``, or
            ``"calibrate"`` (measure the training group at the first exchange, a few
            seconds).  Default: ``"calibrate"`` where ``"auto"`` needs one.

    Example::

        ExchangeConfig(aggregation="auto", codec="int2", cache="budgeted")
    """

    aggregation: str = "hybrid"
    codec: Union[None, str, Codec, ExchangePolicy] = None
    cache: Union[None, float, str, HaloCache] = None
    pipeline: Union[None, str, AsyncPipeline] = None
    sampling: Union[None, float, BoundarySampling] = None
    overlap: bool = True
    step_aside: Union[bool, StepAside] = True
    duplex: bool = False
    link: Union[None, str, Any] = None

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"ExchangeConfig(aggregation={self.aggregation!r}): choose one of "
                             f"{AGGREGATIONS}")
        for name in ("overlap", "duplex"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"ExchangeConfig({name}=...) takes a bool, got "
                                f"{type(getattr(self, name)).__name__}")
        # Checked, not converted: the fields keep what the user wrote (a config compares,
        # prints and saves as written); each engine makes its own stage objects from them.
        StepAside.of(self.step_aside)
        self._check_link()
        self.policy()  # an unknown codec or name, a combination that cannot work: fails here

    def _check_link(self) -> None:
        from ..planner.link import LinkModel

        link = self.link
        if link is None or isinstance(link, LinkModel) or link == "calibrate":
            return
        if isinstance(link, (str, Path)) and Path(link).suffix == ".json":
            if not Path(link).is_file():
                raise FileNotFoundError(
                    f"ExchangeConfig(link={str(link)!r}): no such file; write one with "
                    "'lightning-fullgraph train --save-link FILE.json' or pass 'calibrate'")
            self.link = LinkModel.load(link)
            return
        raise ValueError(f"ExchangeConfig(link={link!r}): pass a LinkModel, a .json file "
                         "written by --save-link, or 'calibrate'")

    @classmethod
    def of(cls, value: Union[None, "ExchangeConfig", Mapping[str, Any]]) -> "ExchangeConfig":
        r"""A config from a config, a mapping of its fields, or ``None`` (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, ExchangeConfig):
            return value
        if isinstance(value, Mapping):
            return from_mapping(cls, value)
        raise TypeError(f"expected an ExchangeConfig, a mapping or None, got "
                        f"{type(value).__name__}")

    def replace(self, **changes: Any) -> "ExchangeConfig":
        r"""A copy with :obj:`changes` (checked again)."""
        return replace(self, **changes)

    def policy(self) -> ExchangePolicy:
        r"""The :class:`~.policy.ExchangePolicy` of the codec, cache, pipeline and sampling
        (stages a policy passed as :obj:`codec` already has are kept unless set here)."""
        policy = ExchangePolicy.of(self.codec)
        if HaloCache.of(self.cache) is not None:
            policy = policy.with_cache(self.cache)
        if self.pipeline is not None:
            policy = policy.with_pipeline(self.pipeline)
        if self.sampling is not None:
            policy = policy.with_sampling(self.sampling)
        return policy

    @property
    def lossless(self) -> bool:
        r"""Whether training is exact (every stage lossless)."""
        return self.policy().lossless

    def describe(self) -> str:
        r"""The config in words, e.g. ``"hybrid aggregation, int2, overlap"``."""
        parts = [f"{self.aggregation} aggregation", self.policy().describe()]
        if self.overlap:
            parts.append("overlap")
        if self.step_aside:
            parts.append("step aside")
        if self.duplex:
            parts.append("duplex")
        return ", ".join(parts)


#: Arguments the entry points took before :class:`ExchangeConfig` held them: old name -> field.
_MOVED = {"aggregation": "aggregation", "codec": "codec", "cache": "cache",
          "pipeline": "pipeline", "boundary_sampling": "sampling", "sampling": "sampling",
          "overlap": "overlap", "step_aside": "step_aside"}


def refuse_moved_arguments(owner: str, kwargs: Mapping[str, Any]) -> None:
    r"""Refuses, with the fix, an exchange option passed to :obj:`owner` directly.

    Raises:
        TypeError: Naming each such argument and the :class:`ExchangeConfig` field it became.
    """
    moved = [k for k in kwargs if k in _MOVED]
    if moved:
        fields_ = ", ".join(f"{_MOVED[k]}={kwargs[k]!r}" for k in moved)
        raise TypeError(f"{owner} takes the exchange options in one ExchangeConfig: pass "
                        f"exchange=ExchangeConfig({fields_}) instead of {', '.join(moved)}=...")
