r"""What each exchange point does, per direction.

An exchange point is one tensor a layer exchanges in one call, named
``"<layer>.<propagate|edge_update><call>.<argument>"`` (e.g. ``"conv1.propagate0.x"``,
``"conv2.degree"``) for halo rows, with ``".pre"`` appended for partial aggregates.  A policy
maps points and directions (``"forward"`` rows, ``"backward"`` gradients) to how they cross the
wire: a codec (exact by default) and, for training exchanges, an adaptive halo cache
(:class:`~.cache.HaloCache`, none by default).

Example::

    policy = ExchangePolicy(points={"conv1.*": ExchangePolicy(backward=MyCodec())})
"""
from fnmatch import fnmatchcase
from typing import Any, Iterator, Mapping, Optional, Tuple, Union

from .cache import HaloCache
from .pipeline import AsyncPipeline
from .sampling import BoundarySampling
from .codecs import Codec, IdentityCodec

__all__ = ["ExchangePolicy", "DIRECTIONS", "STAGES"]

DIRECTIONS = ("forward", "backward")
#: The stages a policy may add to an exchange, in the order they apply to the rows.
STAGES = ("sampling", "cache", "codec", "pipeline")


class ExchangePolicy:
    r"""How exchange points send their rows.

    Args:
        codec (Codec, optional): Codec of both directions (default: exact).
        forward (Codec, optional): Codec of forward rows (overrides :obj:`codec`).
        backward (Codec, optional): Codec of backward gradients (overrides :obj:`codec`).
        points (Mapping[str, ExchangePolicy or Codec], optional): Policies of the exchange
            points whose key matches a glob pattern; the first matching pattern wins.
        cache (HaloCache, float or str, optional): Adaptive halo cache of training exchanges
            (:class:`~.cache.HaloCache`, a threshold :math:`\epsilon`, or ``"adaptive"``);
            default none.
        pipeline (AsyncPipeline or str, optional): Asynchronous pipeline of training
            exchanges (:class:`~.pipeline.AsyncPipeline`, ``"async"`` or ``"adaptive"``);
            default none (synchronous).  With a cache, the pipeline carries the cache's rows:
            the receiver's copy takes them in one step later (a budgeted cache then sends its
            bitmask apart, two collectives).
        sampling (BoundarySampling or float, optional): Boundary node sampling of training
            exchanges (:class:`~.sampling.BoundarySampling` or its rate :math:`p`); default
            none.  With a cache, the cache chooses among each step's kept rows; with a
            pipeline, a step receives the rows of the previous step's sample.
    """

    def __init__(self, codec: Optional[Codec] = None, *, forward: Optional[Codec] = None,
                 backward: Optional[Codec] = None,
                 points: Optional[Mapping[str, Union["ExchangePolicy", Codec]]] = None,
                 cache: Union[None, float, str, HaloCache] = None,
                 pipeline: Union[None, str, AsyncPipeline] = None,
                 sampling: Union[None, float, BoundarySampling] = None) -> None:
        for name, value in (("codec", codec), ("forward", forward), ("backward", backward)):
            if value is not None and not isinstance(value, Codec):
                raise TypeError(f"ExchangePolicy({name}=...) takes a Codec, got "
                                f"{type(value).__name__}")
        self._codecs = {"forward": forward or codec, "backward": backward or codec}
        self.points = {pattern: (rule if isinstance(rule, ExchangePolicy) else
                                 ExchangePolicy(rule)) for pattern, rule in (points or {}).items()}
        self._identity = IdentityCodec()
        self._cache = HaloCache.of(cache)
        self.pipeline = AsyncPipeline.of(pipeline)
        self.sampling = BoundarySampling.of(sampling)
        self._check()

    def _check(self) -> None:
        cache = any(True for _ in self.caches())
        if self.pipeline is not None and cache and self.sampling is not None:
            raise ValueError("an asynchronous pipeline, a halo cache and boundary sampling "
                             "cannot be combined yet (the cache would choose among this step's "
                             "sample and the receiver serve it a step later, from rows drawn "
                             "for another sample); choose two of them")

    def _replace(self, **attrs: Any) -> "ExchangePolicy":
        copy = ExchangePolicy.__new__(ExchangePolicy)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(attrs)
        copy._check()
        return copy

    def with_cache(self, cache: Union[None, bool, float, str, HaloCache]) -> "ExchangePolicy":
        r"""A copy of this policy whose exchange points (those without a cache of their own)
        use :obj:`cache`."""
        return self._replace(_cache=HaloCache.of(cache))

    def with_pipeline(self, pipeline: Union[None, str, AsyncPipeline]) -> "ExchangePolicy":
        r"""A copy of this policy with the asynchronous :obj:`pipeline`."""
        return self._replace(pipeline=AsyncPipeline.of(pipeline))

    def with_sampling(self, sampling: Union[None, float, BoundarySampling]) -> "ExchangePolicy":
        r"""A copy of this policy with boundary node :obj:`sampling`."""
        return self._replace(sampling=BoundarySampling.of(sampling))

    def stages(self) -> Tuple[str, ...]:
        r"""The stages of this policy that change what crosses the wire, in the order they
        apply (:data:`STAGES`): ``"sampling"`` (rate below 1), ``"cache"``, ``"codec"`` (a
        lossy codec) and ``"pipeline"``."""
        present = {
            "sampling": self.sampling is not None and self.sampling.rate < 1.0,
            "cache": any(True for _ in self.caches()),
            "codec": any(not c.lossless for c in self.codecs()),
            "pipeline": self.pipeline is not None,
        }
        return tuple(stage for stage in STAGES if present[stage])

    def without(self, *stages: str) -> "ExchangePolicy":
        r"""A copy of this policy without :obj:`stages` (names of :data:`STAGES`): their
        exchanges then send every row, exactly, synchronously.  The stages kept are the same
        objects (a callback that tunes them tunes the copy too)."""
        unknown = set(stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stage(s) {sorted(unknown)}; stages are {STAGES}")
        attrs: dict = {"points": {pattern: rule.without(*stages)
                                  for pattern, rule in self.points.items()}}
        if "codec" in stages:
            attrs["_codecs"] = {d: (c if c is None or c.lossless else None)
                                for d, c in self._codecs.items()}
        if "cache" in stages:
            attrs["_cache"] = None
        if "pipeline" in stages:
            attrs["pipeline"] = None
        if "sampling" in stages:
            attrs["sampling"] = None
        return self._replace(**attrs)

    @classmethod
    def of(cls, value: Union[None, str, "ExchangePolicy", Codec]) -> "ExchangePolicy":
        r"""A policy from a policy, a codec (both directions), a codec's name (``"int2"``,
        ``"bf16"``, ...: :mod:`~.codecs.registry`) or :obj:`None` (exact)."""
        if value is None:
            return cls()
        if isinstance(value, str):
            from .codecs.registry import codec_from_name
            return cls(codec_from_name(value))
        if isinstance(value, ExchangePolicy):
            return value
        if isinstance(value, Codec):
            return cls(value)
        raise TypeError(f"expected an ExchangePolicy, a Codec or a codec name, got "
                        f"{type(value).__name__}")

    def codec(self, key: str, direction: str) -> Codec:
        r"""The codec of exchange point :obj:`key` in :obj:`direction`."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        for pattern, rule in self.points.items():
            if fnmatchcase(key, pattern):
                return rule.codec(key, direction)
        return self._codecs[direction] or self._identity

    def cache(self, key: str, direction: str) -> Optional[HaloCache]:
        r"""The halo cache of exchange point :obj:`key` in :obj:`direction` (``None``: every
        training exchange sends all rows)."""
        for pattern, rule in self.points.items():
            if fnmatchcase(key, pattern):
                found = rule.cache(key, direction)
                if found is not None:
                    return found
                break
        return self._cache if self._cache is not None and self._cache.applies(direction) \
            else None

    def caches(self) -> Iterator[HaloCache]:
        r"""Every halo cache this policy can return, once each."""
        seen = set()
        for cache in [self._cache] + [c for p in self.points.values() for c in p.caches()]:
            if cache is not None and id(cache) not in seen:
                seen.add(id(cache))
                yield cache

    @property
    def lossless(self) -> bool:
        r"""Whether every codec this policy can return is lossless and no cache serves rows
        that changed (:math:`\epsilon > 0`)."""
        codecs = [c for c in self._codecs.values() if c is not None]
        return all(c.lossless for c in codecs) and all(p.lossless for p in self.points.values()) \
            and all(c.lossless for c in self.caches()) and self.pipeline is None \
            and (self.sampling is None or self.sampling.lossless)

    def codecs(self) -> Iterator[Codec]:
        r"""Every codec this policy can return, once each (not the exact default)."""
        seen = set()
        for codec in list(self._codecs.values()) + [c for p in self.points.values()
                                                   for c in p.codecs()]:
            if codec is not None and id(codec) not in seen:
                seen.add(id(codec))
                yield codec

    def describe(self) -> str:
        r"""The codecs in words, e.g. ``"int2"`` or ``"forward int2, backward fp32"``."""
        def name(codec: Optional[Codec]) -> str:
            if codec is None or codec.lossless:
                return "fp32" if codec is None else type(codec).__name__
            bits = getattr(codec, "bits", None)
            compact = " with bfloat16 headers" \
                if getattr(codec, "header", "float32") == "bfloat16" else ""
            if getattr(codec, "per_node", False):
                return f"adaptive (per-node widths, base {bits} bits{compact})"
            if bits is not None:
                return f"int{bits}" + ("-compact" if compact else "")
            return "bf16" if type(codec).__name__ == "BFloat16Codec" else type(codec).__name__
        forward, backward = (name(self._codecs[d]) for d in DIRECTIONS)
        text = forward if forward == backward else f"forward {forward}, backward {backward}"
        if self.sampling is not None:
            text += f", boundary sampling p={self.sampling.rate:g}"
            if not self.sampling.pre:
                text += " (source rows only)"
        if self.pipeline is not None:
            text += f", {self.pipeline.describe()}"
        if self._cache is not None:
            text += f", adaptive cache (epsilon {self._cache.epsilon:g}, max age " \
                    f"{self._cache.max_age})"
        if self.points:
            text += " (" + ", ".join(f"{k}: {p.describe()}" for k, p in self.points.items()) \
                + ")"
        return text
