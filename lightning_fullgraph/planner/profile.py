r"""What a model exchanges per step: the exchange calls, their channels and row widths.

The bytes an epoch moves are a product of two things that are known in advance: *which rows*
cross the wire in one exchange (the rank's :class:`~lightning_fullgraph.partition.AggregationPlan`,
per channel and peer) and *how wide* each row is and how often the model exchanges (the
model).  An :class:`ExchangeProfile` is the second factor: the :class:`ExchangeCall` objects of
a training step (forward + backward) and of an evaluation forward -- for each of the run's
first steps until they stop changing, then the steady state -- each naming its exchange point,
direction, aggregation plan, channel, orientation and the bytes of one wire row.

:func:`profile_model` obtains it by running the unmodified model through a
:class:`~lightning_fullgraph.engine.FullGraphEngine` on a tiny one-process graph with the
same engine options (aggregation, codec, static caching) and recording every exchange: the
calls a model makes do not depend on the graph or the number of ranks (every rank calls every
exchange point, also with nothing to send), their widths do not either.  So ``GCNConv``
exchanges its ``x @ W`` rows (``out_channels``) and one degree per ``gcn_norm`` call (halo
rows, plus pre slots in pre/hybrid aggregation), ``GINConv`` its input rows (``in_channels``),
``SAGEConv``/``GraphConv`` theirs too, or their ``x @ W`` rows (``out_channels``) where those are
narrower (:mod:`~lightning_fullgraph.engine.narrow_first`), ``GATConv`` its projected rows (``heads * out_channels``) and
attention terms (``heads``); a backward exchange happens only where the exchanged tensor needs
a gradient (not for raw input features), and what the engine's static-input memo keeps (the
normalization, aggregations of unchanged inputs, also ``GCNConv`` reordered to aggregate an
unchanged input before its linear map) is exchanged in the first steps only.

:class:`ExchangeRecorder` records the calls of a live engine instead, without any collective
of its own (the :class:`~lightning_fullgraph.callbacks.CommunicationMonitor` uses it when it
was given no profile).
"""
import copy
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .record import JsonRecord

__all__ = ["ExchangeCall", "ExchangeProfile", "ExchangeRecorder", "profile_model"]

PHASES = ("train", "eval")


@dataclass(frozen=True)
class ExchangeCall(JsonRecord):
    r"""One call of the halo exchange (one ``all_to_all_single``).

    Args:
        key (str): Exchange point, as in :class:`~lightning_fullgraph.engine.CommStats`.
        direction (str): ``"forward"`` or ``"backward"``.
        mode (str): Plan of the exchange that ran it: ``"post"``, ``"pre"`` or ``"hybrid"``.
        channel (str): ``"post"`` (source rows), ``"pre"`` (partial aggregates) or
            ``"both"`` (the two in one buffer: exact pre and hybrid layers).
        reverse (bool): Rows flow against the channel (the channel's receivers send:
            gradients of halo rows, slot degrees fetched from their owners).
        width (int): Values per (decoded) row.
        value_bytes (int): Bytes per decoded value.
        row_bytes (int): Bytes per wire row (what the transport counts).
        layer (str): The message-passing layer the call belongs to.
        fraction (float): The expected share of the plan's rows the call sends: boundary
            sampling's rate :math:`p` for the rows it samples, else 1.
    """
    key: str
    direction: str
    mode: str
    channel: str
    reverse: bool
    width: int
    value_bytes: int
    row_bytes: int
    layer: str = ""
    fraction: float = 1.0

    @property
    def decoded_row_bytes(self) -> int:
        r"""Bytes of one row before encoding."""
        return self.width * self.value_bytes


def _layer_of(key: str) -> str:
    for marker in (".propagate", ".edge_update", ".degree", ".gcn_norm"):
        if marker in key:
            return key.split(marker, 1)[0]
    return key.rsplit(".", 1)[0] if "." in key else key


@dataclass
class ExchangeProfile:
    r"""The exchange calls of a model, step by step.

    The engine's static-input memo and reordering make the first steps of a run exchange more (or
    differently) than later ones: the normalization's degrees once, an unchanged input's
    aggregation once, ...  A profile therefore keeps the calls of each step until they repeat:
    ``train[i]`` are the calls of the run's training step ``i`` (forward, then backward) for
    ``i < len(train) - 1``, and ``train[-1]`` those of every later step (the steady state);
    ``eval`` likewise for forwards without gradients (validation), which the engine caches
    apart from training.

    Args:
        aggregation (str): The engine's aggregation the calls were recorded with.
        train (Tuple[Tuple[ExchangeCall, ...], ...]): Calls per training step.
        eval (Tuple[Tuple[ExchangeCall, ...], ...]): Calls per evaluation forward.
        in_channels (int): Input features per node (0 if unknown).
        feature_bytes (int): Bytes per input value.
        num_parameters (int): Parameters of the model.
        parameter_bytes (int): Bytes of the parameters.
    """
    aggregation: str
    train: Tuple[Tuple[ExchangeCall, ...], ...] = ((), )
    eval: Tuple[Tuple[ExchangeCall, ...], ...] = ((), )
    in_channels: int = 0
    feature_bytes: int = 4
    num_parameters: int = 0
    parameter_bytes: int = 0

    def __post_init__(self) -> None:
        for phase in PHASES:
            steps = tuple(tuple(step) for step in getattr(self, phase)) or ((), )
            setattr(self, phase, steps)

    @property
    def train_first(self) -> Tuple[ExchangeCall, ...]:
        r"""Calls of the run's first training step (every exchange the model makes)."""
        return self.train[0]

    @property
    def train_steady(self) -> Tuple[ExchangeCall, ...]:
        r"""Calls of a training step once nothing changes any more."""
        return self.train[-1]

    @property
    def effective_mode(self) -> str:
        r"""The aggregation the model's exchanges actually use: :attr:`aggregation` if any
        layer runs in it, else ``"post"`` (e.g. attention layers, never pre-aggregated)."""
        used = {c.mode for step in self.train + self.eval for c in step}
        return self.aggregation if self.aggregation in used else "post"

    @property
    def eval_steady(self) -> Tuple[ExchangeCall, ...]:
        r"""Calls of an evaluation forward once nothing changes any more."""
        return self.eval[-1]

    def step_calls(self, phase: str, index: int) -> Tuple[ExchangeCall, ...]:
        r"""Calls of the run's step :obj:`index` (0-based) of :obj:`phase`.

        Args:
            phase (str): ``"train"`` or ``"eval"``.
            index (int): Step of the run; beyond the recorded ones, the steady state.

        Returns:
            Tuple[ExchangeCall, ...]
        """
        steps = getattr(self, phase)
        return steps[min(int(index), len(steps) - 1)]

    def calls(self, train_steps: int = 1, eval_forwards: int = 0,
              train_offset: Optional[int] = None,
              eval_offset: Optional[int] = None) -> Counter:
        r"""The calls of an epoch with their multiplicities.

        Args:
            train_steps (int): Training steps (one per epoch in full-graph training).
            eval_forwards (int): Forwards without gradients (validation).
            train_offset (int, optional): Index in the run of the epoch's first training step
                (``0``: the run's first); :obj:`None`: steady state.
            eval_offset (int, optional): Likewise for evaluation forwards.

        Returns:
            collections.Counter: ``{ExchangeCall: times}``.
        """
        out: Counter = Counter()
        for phase, steps, offset in (("train", train_steps, train_offset),
                                     ("eval", eval_forwards, eval_offset)):
            steps = int(steps)
            if steps <= 0:
                continue
            if offset is None:
                offset = len(getattr(self, phase)) - 1
            for i in range(int(offset), int(offset) + steps):
                out.update(self.step_calls(phase, i))
        return +out

    def layers(self) -> Dict[str, Dict[str, Any]]:
        r"""Per message-passing layer: its exchange points and row widths (first training
        step, where every exchange happens).

        Returns:
            Dict[str, Dict[str, Any]]: ``{layer: {key: {direction: width}}}``.
        """
        out: Dict[str, Dict[str, Any]] = {}
        for call in self.train_first:
            out.setdefault(call.layer, {}).setdefault(call.key, {})[call.direction] = call.width
        return out

    def to_dict(self) -> Dict[str, Any]:
        r"""JSON-able dictionary.

        Returns:
            Dict[str, Any]
        """
        out: Dict[str, Any] = {k: getattr(self, k) for k in (
            "aggregation", "in_channels", "feature_bytes", "num_parameters", "parameter_bytes")}
        for phase in PHASES:
            out[phase] = [[c.to_dict() for c in step] for step in getattr(self, phase)]
        return out

    @classmethod
    def from_dict(cls, state: Dict[str, Any]) -> "ExchangeProfile":
        r"""Inverse of :meth:`to_dict`.

        Args:
            state (Dict[str, Any]): A dictionary from :meth:`to_dict`.

        Returns:
            ExchangeProfile
        """
        state = dict(state)
        for phase in PHASES:
            state[phase] = tuple(tuple(ExchangeCall.from_dict(c) for c in step)
                                 for step in state.get(phase, ((), )))
        return cls(**state)


def steps_until_steady(run_step: Callable[[], Tuple[ExchangeCall, ...]],
                       max_steps: int) -> Tuple[Tuple[ExchangeCall, ...], ...]:
    r"""Runs :obj:`run_step` until two consecutive steps make the same calls (at most
    :obj:`max_steps` times); returns the distinct leading steps and the steady one last."""
    steps = [run_step()]
    while len(steps) < max(2, int(max_steps)):
        steps.append(run_step())
        if steps[-1] == steps[-2]:
            steps.pop()
            break
    return tuple(steps)


# -- recording a live engine ------------------------------------------------------------------

_CURRENT = threading.local()


def _classify(ex: Any, send_counts: Any) -> Optional[Tuple[str, bool]]:
    r"""Channel and orientation of a transfer, from which of the exchange's count lists it
    sends by (the exchange hands its own lists to every transfer)."""
    lists = (("post", "_post_send", "_post_recv"), ("pre", "_pre_send", "_pre_recv"))
    for channel, fwd, rev in lists:
        if send_counts is getattr(ex, fwd, None):
            return channel, False
        if send_counts is getattr(ex, rev, None):
            return channel, True
    for plan in getattr(ex, "_one_buffer", {}).values():  # rows and partials in one buffer
        if send_counts is plan.send_counts:
            return "both", False
        if send_counts is plan.recv_counts:
            return "both", True
    for channel, fwd, rev in lists:  # by value, when no list matches by identity
        if send_counts == getattr(ex, fwd, None) and getattr(ex, fwd) != getattr(ex, rev):
            return channel, False
        if send_counts == getattr(ex, rev, None) and getattr(ex, fwd) != getattr(ex, rev):
            return channel, True
    return None


class ExchangeRecorder:
    r"""Records the exchange calls of a set of
    :class:`~lightning_fullgraph.engine.HaloExchange` objects (no collectives of its own).

    While installed, every transfer of the exchanges is recorded as an :class:`ExchangeCall`
    (its wire row size taken from what the transport is handed) into the current step, which
    :meth:`begin` starts and :meth:`end` closes.  Outside a step nothing is recorded.

    Args:
        exchanges (Iterable[HaloExchange] or Mapping[str, HaloExchange]): The exchanges, e.g.
            ``engine.exchanges``.

    Example::

        with ExchangeRecorder(engine.exchanges) as rec:
            rec.begin()
            loss = step()
            calls = rec.end()
    """

    def __init__(self, exchanges: Any) -> None:
        values = exchanges.values() if hasattr(exchanges, "values") else exchanges
        self.exchanges = list({id(e): e for e in values}.values())
        self._calls: Optional[List[ExchangeCall]] = None
        self._installed: List[Tuple[Any, str]] = []
        self.supported = all(hasattr(e, "_send") for e in self.exchanges) and all(
            hasattr(e, "transport") for e in self.exchanges)

    # -- install / remove ---------------------------------------------------------------------
    def install(self) -> "ExchangeRecorder":
        r"""Wraps the exchanges' transfers; idempotent."""
        if self._installed or not self.supported:
            return self
        transports = {id(e.transport): e.transport for e in self.exchanges}
        for transport in transports.values():
            transport.exchange = self._wrap_transport(transport.exchange)
            self._installed.append((transport, "exchange"))
        for ex in self.exchanges:
            ex._send = self._wrap_send(ex, ex._send)
            self._installed.append((ex, "_send"))
            if hasattr(ex, "_transfer_async"):
                # Overlapped exchanges start their transfers here, not through _send.
                ex._transfer_async = self._wrap_send(ex, ex._transfer_async, nested=False)
                self._installed.append((ex, "_transfer_async"))
            if hasattr(ex, "_transfer"):
                # The one-buffer exchange (rows and partials) transfers without _send.
                ex._transfer = self._wrap_send(ex, ex._transfer, nested=False)
                self._installed.append((ex, "_transfer"))
            if hasattr(ex, "_send_sampled"):
                # Boundary sampling sends a sample of the plan's rows, drawn per step.
                ex._send_sampled = self._wrap_sampled(ex, ex._send_sampled)
                self._installed.append((ex, "_send_sampled"))
        return self

    def remove(self) -> None:
        r"""Restores the exchanges' own methods."""
        while self._installed:
            obj, name = self._installed.pop()
            obj.__dict__.pop(name, None)

    def __enter__(self) -> "ExchangeRecorder":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.remove()

    # -- steps -----------------------------------------------------------------------------
    @property
    def recording(self) -> bool:
        return self._calls is not None

    def begin(self) -> None:
        r"""Starts recording a step (discarding an unfinished one)."""
        self._calls = []

    def end(self) -> Tuple[ExchangeCall, ...]:
        r"""Ends the step; returns its calls in order, backward calls named after the layer
        of their forward call.

        Returns:
            Tuple[ExchangeCall, ...]
        """
        calls, self._calls = self._calls or [], None
        layers = {c.key: c.layer for c in calls if c.layer}
        return tuple(c if c.layer else ExchangeCall(**{**c.to_dict(), "layer": layers.get(
            c.key, _layer_of(c.key))}) for c in calls)

    # -- wrappers --------------------------------------------------------------------------------
    def _record(self, ex: Any, run: Callable[[], Any], rows: Tensor, key: str, direction: str,
                kind: Optional[Tuple[str, bool]], fraction: float = 1.0) -> Any:
        r"""Runs one transfer (:obj:`run`) with a stack entry that the transport wrapper fills
        with its wire row size, and records it as an :class:`ExchangeCall` of channel and
        orientation :obj:`kind`."""
        stack = getattr(_CURRENT, "stack", None)
        if stack is None:
            stack = _CURRENT.stack = []
        entry = {"row_bytes": None}
        stack.append(entry)
        try:
            out = run()
        finally:
            stack.pop()
        if kind is None:
            raise RuntimeError(f"cannot tell which channel exchange point '{key}' uses; "
                               "the planner does not know this version of HaloExchange")
        if entry["row_bytes"] is not None:
            from ..engine.context import current_layer
            active = current_layer()
            width = 1
            for d in rows.shape[1:]:
                width *= int(d)
            self._calls.append(ExchangeCall(
                key=key, direction=direction, mode=str(getattr(ex, "mode", "post")),
                channel=kind[0], reverse=kind[1], width=width,
                value_bytes=rows.element_size(), row_bytes=int(entry["row_bytes"]),
                layer=active.key if (active is not None and direction == "forward") else "",
                fraction=float(fraction)))
        return out

    def _wrap_send(self, ex: Any, send: Callable, nested: bool = True) -> Callable:
        r"""Records each call of :obj:`send` as one exchange call; with :obj:`nested` false,
        only calls made outside another recorded one (an asynchronous start that a
        pipelined ``_send`` makes is that send's, not a second call)."""
        recorder = self

        def _send(rows: Tensor, send_counts, recv_counts, key: str, direction: str, *a, **kw):
            if recorder._calls is None or (not nested and getattr(_CURRENT, "stack", None)):
                return send(rows, send_counts, recv_counts, key, direction, *a, **kw)
            return recorder._record(
                ex, lambda: send(rows, send_counts, recv_counts, key, direction, *a, **kw),
                rows, key, direction, _classify(ex, send_counts))

        return _send

    def _wrap_sampled(self, ex: Any, send_sampled: Callable) -> Callable:
        r"""Records a sampled transfer as one call of its channel whose rows are the plan's
        times the sampling rate (the expected sample; the draws vary from step to step)."""
        recorder = self

        def _send_sampled(rows: Tensor, sampled: Any, key: str, direction: str,
                          channel: str = "post", *a, **kw):
            def run():
                return send_sampled(rows, sampled, key, direction, channel, *a, **kw)
            if recorder._calls is None:
                return run()
            return recorder._record(ex, run, rows, key, direction,
                                    (channel, direction == "backward"),
                                    ex.policy.sampling.rate)

        return _send_sampled

    def _wrap_transport(self, exchange: Callable) -> Callable:
        def wrapped(send: Tensor, send_counts, recv_counts, *a, **kw):
            stack = getattr(_CURRENT, "stack", None)
            if stack and stack[-1]["row_bytes"] is None and kw.get("unit", "rows") == "rows":
                row = 1
                for d in send.shape[1:]:
                    row *= int(d)
                stack[-1]["row_bytes"] = row * send.element_size()
            return exchange(send, send_counts, recv_counts, *a, **kw)

        return wrapped


# -- profiling a model -----------------------------------------------------------------------

def _probe_graph(num_nodes: int, in_channels: int, dtype: torch.dtype, seed: int):
    from torch_geometric.data import Data
    g = torch.Generator().manual_seed(seed)
    n = max(int(num_nodes), 4)
    src = torch.randint(0, n, (2 * n, ), generator=g)
    dst = torch.randint(0, n, (2 * n, ), generator=g)
    ring = torch.arange(n)
    edge_index = torch.stack([torch.cat([src, ring]), torch.cat([dst, (ring + 1) % n])])
    e = edge_index.size(1)
    return Data(x=torch.randn(n, in_channels, generator=g).to(dtype), edge_index=edge_index,
                edge_weight=(torch.rand(e, generator=g) + 0.5).to(dtype),
                y=torch.zeros(n, dtype=torch.long), train_mask=torch.ones(n, dtype=torch.bool),
                num_nodes=n)


def _default_forward(model: torch.nn.Module, data: Any) -> Tensor:
    return model(data.x, data.edge_index)


def _as_loss(out: Any) -> Tensor:
    if isinstance(out, Tensor):
        return out.float().sum()
    if isinstance(out, (tuple, list)):
        return sum(_as_loss(o) for o in out if isinstance(o, (Tensor, tuple, list)))
    raise TypeError(f"the model's forward returned {type(out).__name__}; profile_model needs "
                    "a tensor (or pass forward=... returning one)")


def _check_unattached(model: torch.nn.Module) -> None:
    from ..engine.partitioned import _EAGER_FLAG
    for name, module in model.named_modules():
        if getattr(module.__dict__.get("propagate"), _EAGER_FLAG, False):
            raise ValueError(f"layer '{name}' is attached to an engine; profile the model "
                             "before engine.attach() (or after engine.detach())")


def _infer_in_channels(model: torch.nn.Module) -> int:
    value = getattr(model, "in_channels", None)
    if isinstance(value, int) and value > 0:
        return value
    for module in model.modules():
        value = getattr(module, "in_channels", getattr(module, "in_features", None))
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError("cannot tell the model's input width; pass in_channels=...")


def profile_model(model: torch.nn.Module, in_channels: Optional[int] = None, *,
                  aggregation: str = "hybrid", codec: Any = None,
                  forward: Optional[Callable[[torch.nn.Module, Any], Any]] = None,
                  trusted_layers: Sequence[type] = (), max_steps: int = 8,
                  num_nodes: int = 8, seed: int = 0, **engine_kwargs: Any) -> ExchangeProfile:
    r"""Records the exchange calls of :obj:`model` on a tiny one-process graph.

    A deep copy of the model runs training steps (forward, ``sum`` of the output, backward;
    no optimizer) and then forwards without gradients in eval mode through a
    :class:`~lightning_fullgraph.engine.FullGraphEngine` with the given options, each until
    two consecutive steps make the same exchanges, and every exchange is recorded.  The
    model, its gradients and the global random state are left as they were.  Needs no
    process group (and refuses to run in a process whose default group has several ranks:
    the engine would take the group's size).

    Args:
        model (torch.nn.Module): The unmodified PyG model, not attached to an engine.
        in_channels (int, optional): Input features (default: ``model.in_channels`` or the
            first layer's).
        aggregation (str): Engine aggregation, ``"post"``, ``"pre"`` or ``"hybrid"``.
        codec (Codec or ExchangePolicy, optional): The engine's codec (row widths on the wire).
        forward (Callable, optional): ``forward(model, data) -> Tensor`` (default:
            ``model(data.x, data.edge_index)``); :obj:`data` also has ``edge_weight``.
        trusted_layers (Sequence[type]): As :meth:`FullGraphEngine.attach`.
        max_steps (int): At most this many steps per phase (>= 2); a model still changing its
            exchanges by then is taken as steady at its last step.
        num_nodes (int): Nodes of the probe graph.
        seed (int): Seed of the probe graph.
        **engine_kwargs: Further :class:`FullGraphEngine` options (e.g. ``static_inputs``).

    Returns:
        ExchangeProfile
    """
    import torch.distributed as dist

    from ..engine import FullGraphEngine
    from ..partition import build_local_partitions

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise RuntimeError(
            "profile_model runs the model on a one-process engine and cannot do so in a "
            f"process whose default process group has {dist.get_world_size()} ranks; call it "
            "before init_process_group or in the launching process")
    from ..engine.config import ExchangeConfig
    from ..engine.policy import ExchangePolicy
    if any(getattr(c, "per_node", False) for c in ExchangePolicy.of(codec).codecs()):
        raise ValueError("profile_model: per-node bit widths (codec 'adaptive') are not "
                         "modelled by the planner yet; profile with a fixed-width codec")
    if max_steps < 2:
        raise ValueError(f"max_steps must be >= 2, got {max_steps}")
    _check_unattached(model)
    in_channels = int(in_channels) if in_channels is not None else _infer_in_channels(model)
    params = list(model.parameters())
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    device = next((p.device for p in params), torch.device("cpu"))
    data = _probe_graph(num_nodes, in_channels, dtype, seed)
    part = build_local_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long),
                                  num_parts=1)[0]
    exchange = ExchangeConfig(aggregation=aggregation, codec=codec, step_aside=False)
    engine = FullGraphEngine(part, exchange=exchange, **engine_kwargs)
    if device.type != "cpu":
        engine.to(device)
    local = engine.data
    forward = forward or _default_forward
    probe = copy.deepcopy(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny graph: threads would only contend
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        engine.attach(probe, trusted_layers=trusted_layers, sync_batchnorm=False,
                      broadcast=False)
        try:
            with ExchangeRecorder(engine.exchanges) as rec:
                if not rec.supported:
                    raise RuntimeError("this engine's exchanges cannot be recorded")
                probe.train()

                def train_step():
                    rec.begin()
                    _as_loss(forward(probe, local)).backward()
                    calls = rec.end()
                    probe.zero_grad(set_to_none=True)
                    if hasattr(engine, "next_step"):
                        engine.next_step()
                    return calls

                def eval_step():
                    rec.begin()
                    with torch.no_grad():
                        forward(probe, local)
                    return rec.end()

                train = steps_until_steady(train_step, max_steps)
                probe.eval()
                evals = steps_until_steady(eval_step, max_steps)
        finally:
            engine.detach()
            torch.set_num_threads(threads)
    return ExchangeProfile(
        aggregation=aggregation, in_channels=in_channels,
        feature_bytes=torch.empty((), dtype=dtype).element_size(),
        num_parameters=sum(p.numel() for p in params),
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        train=train, eval=evals)

