"""One object that runs a model on one partition with plain ``torch.distributed``.

:class:`FullGraphEngine` is what the Lightning strategy and the Fabric helpers
wrap; it can equally be used in a hand-written training loop::

    dist.init_process_group("gloo")
    part = load_partition(path, dist.get_rank())
    engine = FullGraphEngine(part)
    engine.attach(model)                       # hooks, BatchNorm sync, same init
    data = engine.data                         # rank-local Data
    out = model(data.x, data.edge_index)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    loss.backward()                            # exact global gradient on every rank
    optimizer.step()

A plain ``loss.backward()`` (or ``fabric.backward(loss)``) gives the single-process gradient
through gradient hooks (:class:`~.gradients.BackwardHooks`, as DDP's): the gradient of the
attached model's output is weighted by the rank's share of the loss and the parameter
gradients are averaged over the ranks when the pass completes.  ``engine.backward(loss)`` does
the same by weighting the loss itself, and also covers loss terms that depend on the rank's
nodes without coming from the model's output.  A training-mode backward that reaches the
model's parameters without passing through its output (a submodule called directly) is
refused on every rank (:class:`~.gradients.UnreducedBackwardError`); eval mode and
``torch.autograd.grad`` are left alone.
"""
from typing import Any, Iterable, Mapping, Optional, Tuple, Type, Union

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from .aggregation import MODES, AggregationRouter
from .config import ExchangeConfig
from .exchange import HaloExchange
from .gather import gather_nodes
from .gradients import (BackwardHooks, all_reduce_gradients, broadcast_parameters, loss_weight,
                        reduce_backward)
from .partitioned import PartitionedModel, partition_model
from .policy import ExchangePolicy
from .step_aside import StepAside, policy_with
from .static import StaticInputs
from .transport import Transport

__all__ = ["FullGraphEngine", "plan_levels"]


def plan_levels(partition, plan) -> Optional[Tuple[Tensor, Tensor]]:
    r"""Importance levels of a plan's post-channel rows: ``(rows sent, halo rows)``, from
    the partition's boundary levels (``None`` for partitions without them)."""
    if getattr(partition, "owned_level", None) is None:
        return None
    send = partition.owned_level[plan.post.send_index.cpu()]
    n = partition.num_nodes
    owners = torch.arange(partition.num_parts)
    part_key = torch.repeat_interleave(owners, partition.halo_counts) * n + partition.halo_ids
    plan_key = torch.repeat_interleave(owners, plan.post.recv_counts.cpu()) * n + plan.halo_ids
    halo = partition.halo_level[torch.searchsorted(part_key, plan_key)]
    return send, halo


def _modes(aggregation: str) -> Tuple[str, ...]:
    r"""The plans an engine needs: post always, the configured mode, all three for auto."""
    return MODES if aggregation == "auto" else tuple(dict.fromkeys(("post", aggregation)))


class FullGraphEngine:
    r"""Partitioned full-graph execution for one rank.

    Args:
        partition (LocalPartition): This rank's partition.
        group (ProcessGroup, optional): Process group (default: the world).
        exchange (ExchangeConfig or dict, optional): How halo rows cross the wire
            (aggregation mode, codec, cache, pipeline, sampling, overlap, step aside; see
            :class:`~.config.ExchangeConfig`; default: exact hybrid aggregation with
            overlap).
        loss_mask (str): Node mask whose mean the training loss is
            (``"train_mask"``); ranks weight their loss by their share of it.
        loss_reduction (str): ``"mean"`` (default: the loss is a mean over :obj:`loss_mask`,
            weighted by the rank's share) or ``"sum"`` (a sum over the rank's nodes, not
            weighted), for :meth:`backward` and a plain ``loss.backward()``.
        timeout (float or timedelta, optional): The collective timeout of
            :obj:`group`, named in error messages (the group enforces it: create it
            with ``dist.new_group(timeout=...)`` or ``init_process_group(timeout=...)``).
        seed (int): Seed shared by the ranks, for stochastic codecs.
        static_inputs (bool): Compute ``gcn_norm`` once per graph and reuse the aggregation
            of inputs that are the same unchanged tensor as last step (e.g. the raw features
            into ``SAGEConv``/``GINConv``), without exchanging them again; exact, also
            under the halo cache, the pipeline and sampling, which then apply to the rows
            that change (see :mod:`lightning_fullgraph.engine.static`). Default on.
        ranks_per_host (int, optional): Processes per machine (ranks host-major, as Lightning
            numbers them): inter-host bytes are counted apart in :attr:`stats`.
    """

    def __init__(self, partition, group: Optional[Any] = None,
                 exchange: Union[None, ExchangeConfig, Mapping[str, Any]] = None, *,
                 loss_mask: str = "train_mask", loss_reduction: str = "mean",
                 timeout: Optional[Any] = None, seed: int = 0, static_inputs: bool = True,
                 ranks_per_host: Optional[int] = None) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        if isinstance(group, (ExchangeConfig, Mapping)):
            raise TypeError("FullGraphEngine's second argument is the process group: pass "
                            "the exchange options as exchange=ExchangeConfig(...)")
        config = ExchangeConfig.of(exchange)
        self.config = config
        self.partition = partition
        self.group = group
        self.timeout = timeout
        self.aggregation = config.aggregation
        self.policy = config.policy()
        # The pipeline's transfers, in flight from one step into the next, run on a second
        # group of the same ranks, so that the step's gradient all-reduce, evaluation and
        # the agreements do not queue behind them (see transport.py).  Created here, where
        # every rank constructs its engine.
        self.transport = Transport(group, timeout=timeout, ranks_per_host=ranks_per_host,
                                   background=self.policy.pipeline is not None,
                                   duplex=config.duplex)
        self.exchanges = {mode: HaloExchange(partition.plan(mode), self.transport, self.policy,
                                             seed)
                          for mode in _modes(config.aggregation)}
        self.exchange = self.exchanges["post"]
        self.overlap = config.overlap
        for exchange in self.exchanges.values():
            exchange.overlap = self.overlap
            levels = plan_levels(partition, exchange.plan)
            if levels is not None:
                exchange.set_levels(*levels)
            exchange.set_node_ids(partition.owned_ids[exchange.plan.post.send_index.cpu()],
                                  partition.owned_ids)
        self.router = AggregationRouter(partition, self.exchanges, config.aggregation, group,
                                        timeout, link=config.link, policy=self.policy)
        self.static = StaticInputs(group, enabled=static_inputs, timeout=timeout)
        self.static.mark_loaded(*partition.node_attrs.values())
        self.loss_mask = loss_mask
        self.loss_reduction = loss_reduction
        # Times run_stages changed the exchanges' stages (step aside's arms and decision): a
        # planner that recorded the exchange calls records them again.
        self.stages_changed = 0
        self.step_aside = StepAside.of(config.step_aside)
        if self.step_aside is not None and not self.step_aside.bind(self._trial_stages()):
            self.step_aside = None  # exact post, one collective: nothing to step aside
        self._model: Optional[PartitionedModel] = None
        self._hooks: Optional[BackwardHooks] = None
        self._data: Optional[Data] = None
        self._device: Optional[torch.device] = None
        self._kernel_handle = None

    @property
    def data(self) -> Data:
        r"""The rank-local graph as a PyG :class:`~torch_geometric.data.Data`."""
        if self._data is None:
            self._data = self.partition.to_data()
            if self._device is not None:
                self._data = self._data.to(self._device)
        return self._data

    @property
    def attached(self) -> bool:
        r"""Whether a model is attached."""
        return self._model is not None and self._model.attached

    def to(self, device) -> "FullGraphEngine":
        r"""Moves the exchange plans (send and receive indices) to :obj:`device`, where the
        rows live, and the rank-local graph (now if already built, else when first asked
        for)."""
        self._device = torch.device(device)
        if self._data is not None:
            self._data = self._data.to(self._device)
        for exchange in self.exchanges.values():
            exchange.to(self._device)
        return self

    def next_step(self) -> int:
        r"""Advances the step counter the codecs see (:meth:`backward` does it after each
        backward, so a plain training loop needs no call)."""
        return self.set_step(self.exchange.step + 1)

    def set_step(self, step: int) -> int:
        r"""Sets the step counter the codecs see, e.g. to the Trainer's ``global_step`` (the
        same on every rank), so that stochastic rounding draws anew every step and a resumed
        run draws what the uninterrupted one would."""
        changed = int(step) != self.exchange.step
        for exchange in self._all_exchanges():
            exchange.step = int(step)
        if changed and self.step_aside is not None:  # a training step starts
            stages = self.step_aside.tick(self.group, self.timeout)
            if stages is not None:
                self.run_stages(stages)
        return int(step)

    def _trial_stages(self, pre_layers: bool = True) -> Tuple[str, ...]:
        r"""What step aside tries leaving out: the aggregation mode (named as configured:
        ``"pre"``, ``"hybrid"`` or ``"auto"``; left out, every layer runs post) where a
        layer may use it, then the policy's stages, then ``"duplex"`` where the transport
        has a duplex group (left out, each exchange is one collective again)."""
        mode = (self.aggregation, ) if self.aggregation != "post" and pre_layers else ()
        duplex = ("duplex", ) if self.transport.duplex_group is not None else ()
        return mode + tuple(self.policy.stages()) + duplex

    def run_stages(self, stages) -> None:
        r"""From now on, exchanges run only :obj:`stages` of the engine's policy (names of
        :data:`~.policy.STAGES`; the others send every row, exactly, synchronously), the
        configured aggregation mode only if its name is among them (else every layer runs
        post-aggregated, :meth:`~.aggregation.AggregationRouter.hold_post`) and each exchange
        as two collectives only if ``"duplex"`` is (:attr:`.Transport.duplex`).  Every rank
        must call it at the same point of training."""
        stages = tuple(stages)
        self.transport.duplex = "duplex" in stages
        policy = policy_with(self.policy, stages)
        for exchange in self._all_exchanges():
            exchange.set_policy(policy)
        post = self.aggregation != "post" and self.aggregation not in stages
        if post != self.router.post_held:
            self.router.hold_post(post)
            # The layers' rows now go through another exchange: rows pipelined in either
            # would be staler than one step when they come back.
            for exchange in self._all_exchanges():
                exchange.restart_pipeline()
        self.stages_changed += 1

    def step_aside_state(self) -> Optional[dict]:
        r"""The step-aside decision, for a checkpoint (``None`` when off)."""
        return self.step_aside.state_dict() if self.step_aside is not None else None

    def load_step_aside_state(self, state: Optional[dict]) -> None:
        r"""Restores a checkpointed step-aside decision or trial and runs its stages at
        once."""
        if self.step_aside is None or not state:
            return
        stages = self.step_aside.load_state_dict(state)
        if stages is None:
            return
        decision = state.get("decision")
        arms = decision["arms"] if decision is not None else self.step_aside.arms
        tried = {s for arm in arms for s in arm}
        if self.aggregation != "post" and self.aggregation not in tried:
            # A decision that did not try the mode (saved before it was an arm) keeps it.
            stages = (self.aggregation, ) + tuple(stages)
        if "duplex" not in tried:  # nor duplex (saved before it was one, or without it)
            stages = tuple(stages) + ("duplex", )
        self.run_stages(stages)

    def _all_exchanges(self):
        yield from self.exchanges.values()
        reverse = getattr(self._model, "_reverse", None) if self._model is not None else None
        if reverse is not None:  # DirGNNConv's reversed graph
            yield reverse

    @property
    def stats(self):
        return self.exchange.stats

    def attach(self, model: torch.nn.Module,
               trusted_layers: Iterable[Type[torch.nn.Module]] = (),
               sync_batchnorm: bool = True, broadcast: bool = True) -> PartitionedModel:
        r"""Attaches :obj:`model` (see :func:`partition_model`) and, by default,
        broadcasts rank 0's parameters so all replicas start equal.  With several ranks, a
        plain ``loss.backward()`` of the model's output is then weighted and reduced as
        :meth:`backward` would (:class:`~.gradients.BackwardHooks`)."""
        if self.attached:
            raise RuntimeError("a model is already attached; call detach() first")
        self.static.clear()
        self.router.reset()  # another model: its layers decide anew (names may repeat)
        self._model = partition_model(model, self.exchange, trusted_layers, sync_batchnorm,
                                      self.router, self.static)
        if self.step_aside is not None and not self.step_aside.started:
            # Nothing to try in the aggregation mode when no layer can run it (GAT, max).
            pre = any(s.candidate != "post" for s in self._model.states.values())
            self.step_aside.bind(self._trial_stages(pre))
        if broadcast:
            broadcast_parameters(model, group=self.group)
        if dist.is_available() and dist.is_initialized() \
                and dist.get_world_size(self.group) > 1:
            self._hooks = BackwardHooks(model, self._output_scale, self.group, self.timeout,
                                        on_reduced=self.next_step, stats=self.stats)
        return self._model

    def _output_scale(self) -> float:
        r"""Factor of the output gradient in a plain backward: :math:`P` times the weight
        :meth:`backward` gives the loss (the gradients are then averaged, not summed)."""
        world = dist.get_world_size(self.group)
        return world * (self.loss_weight() if self.loss_reduction == "mean" else 1.0)

    def use_kernels(self, backend: Optional[str] = "auto") -> None:
        r"""Runs the attached model's aggregations on a
        :mod:`lightning_fullgraph.kernels` backend (``None``: PyG's own path)."""
        if self._model is None:
            raise RuntimeError("attach a model before choosing kernels")
        self._model.unwrap_static()  # the static-input memo stays the outermost wrapper
        if self._kernel_handle is not None:
            self._kernel_handle.revert()
            self._kernel_handle = None
        partials = None
        if backend is not None:
            from .. import kernels
            self._kernel_handle = kernels.accelerate(self._model.model, backend=backend)
            partials = backend
        for exchange in self._all_exchanges():
            # The one-buffer exchange's partial aggregates: on the same backend (chosen once
            # here, so every step of a run sums in the same order).
            exchange.partials_backend = partials
        self._model.wrap_static()

    def drain(self) -> None:
        r"""Completes the asynchronous pipeline's transfers still in flight (all ranks call
        it at the same point: at the end of training, before tearing the group down)."""
        for exchange in self._all_exchanges():
            exchange.drain()

    def clear_cache(self) -> None:
        r"""Forgets the halo cache and the pipeline's rows: the next training exchange of
        every point sends all rows, synchronously (all ranks at the same point)."""
        for exchange in self._all_exchanges():
            exchange.clear_cache()

    def detach(self) -> Optional[torch.nn.Module]:
        r"""Reverts the attached model to its original form (kernels included)."""
        self.drain()
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        if self._model is not None:
            self._model.unwrap_static()
        if self._kernel_handle is not None:
            self._kernel_handle.revert()
            self._kernel_handle = None
        if self._model is None:
            return None
        model = self._model.revert()
        self._model = None
        return model

    def close(self) -> Optional[torch.nn.Module]:
        r""":meth:`detach`, then releases the process group the engine made for the
        asynchronous pipeline's transfers in flight (every rank at the same point, as
        :meth:`detach`; the strategy's teardown calls it, for each stage builds an engine of
        its own).  An engine attached again afterwards runs those transfers on its group."""
        model = self.detach()
        self.transport.close()
        for exchange in self.exchanges.values():
            if exchange.transport is not self.transport:
                exchange.transport.close()
        return model

    def loss_weight(self, mask: Optional[str] = None) -> float:
        r"""This rank's share of the nodes of :obj:`mask` (default: the loss mask)."""
        mask = mask or self.loss_mask
        local = self.partition.node_attrs.get(mask)
        if local is None:
            raise KeyError(f"partition has no node mask '{mask}'")
        return loss_weight(int(local.sum()), int(self.partition.global_counts[mask]))

    def scale_loss(self, loss: Tensor, mask: Optional[str] = None) -> Tensor:
        r"""Rank-local mean loss → this rank's term of the global mean loss.

        A rank without nodes of the mask contributes zero (not NaN).  A plain
        ``backward()`` of the result is left to the caller (no gradient hooks): reduce with
        :meth:`all_reduce_gradients` afterwards.
        """
        w = self.loss_weight(mask)
        scaled = loss.nan_to_num(0.0) * 0.0 if w == 0.0 else loss * w
        if self._hooks is not None and scaled.requires_grad:
            scaled.register_hook(self._hooks.mark_manual)
        return scaled

    def all_reduce_gradients(self, params: Iterable[Tensor]) -> None:
        r"""Sums the ``.grad`` of :obj:`params` over ranks (see
        :func:`~lightning_fullgraph.engine.all_reduce_gradients`)."""
        all_reduce_gradients(params, group=self.group, timeout=self.timeout, stats=self.stats)

    def reduce_backward(self, run_backward, params: Optional[Iterable[Tensor]] = None):
        r"""Runs :obj:`run_backward` and sums over ranks only the gradients it added
        (see :func:`~lightning_fullgraph.engine.reduce_backward`); the gradient hooks of a
        plain backward stand aside meanwhile."""
        if self._hooks is not None:
            self._hooks.drop_stale()
        return reduce_backward(run_backward, self._params(params), group=self.group,
                               timeout=self.timeout, stats=self.stats)

    def backward(self, loss: Tensor, params: Optional[Iterable[Tensor]] = None) -> None:
        r"""Scales :obj:`loss`, back-propagates, and sums the new gradients over ranks.

        Calling it several times before an optimizer step accumulates gradients as
        repeated ``loss.backward()`` calls do on one process.  Advances the codecs' step
        counter (:meth:`next_step`).  A plain ``loss.backward()`` gives the same gradients
        when the loss comes from the attached model's output (see the module docstring);
        this call also weights loss terms that do not.
        """
        scaled = self.scale_loss(loss) if self.loss_reduction == "mean" else loss
        self.reduce_backward(scaled.backward, params)
        self.next_step()

    def _params(self, params: Optional[Iterable[Tensor]]) -> Iterable[Tensor]:
        if params is not None:
            return params
        if self._model is None:
            raise RuntimeError("backward() needs params or an attached model")
        return self._model.model.parameters()

    def gather(self, local: Tensor) -> Tensor:
        r"""Per-rank node rows → global node order (on every rank)."""
        return gather_nodes(local, self.partition.owned_ids, self.partition.num_nodes,
                            self.group)
