r"""Parameter synchronization for partitioned training.

Every rank holds a full replica of the parameters.  The loss of rank ``r`` is a
mean over its ``n_r`` training nodes while the single-process loss is a mean over
all ``N`` of them, so each rank back-propagates ``n_r / N`` times its loss (the
halo exchange carries cross-rank terms in backward) and the parameter gradients
are then *summed* over ranks: the result is the single-process gradient.  Each backward
pass is reduced once (:func:`reduce_backward`), so several ``manual_backward`` calls
before one optimizer step add up as on one process.

A plain ``loss.backward()`` on an attached model gets the same result through
:class:`BackwardHooks` (as DDP does with gradient hooks): the gradient of the model's
output is scaled by :math:`P \cdot n_r / N` as it enters the backward pass, and once the pass
is complete the parameter gradients it produced are *averaged* over the :math:`P` ranks
(see the class for what is supported and what is refused).
"""
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .. import compat
from .errors import guarded

__all__ = ["broadcast_parameters", "all_reduce_gradients", "reduce_backward", "loss_weight",
           "BackwardHooks", "UnreducedBackwardError"]

_BUCKET_BYTES = 32 * 2**20
# Backward passes run by reduce_backward (engine.backward, the Lightning strategy) now: their
# caller weights and reduces the gradients, so BackwardHooks stand aside.  A counter, not a
# thread-local: on GPUs autograd runs hooks on its device threads.
_reducing = 0


def _world(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def broadcast_parameters(module: torch.nn.Module, src: int = 0,
                         group: Optional[Any] = None) -> None:
    r"""Copies parameters and buffers of rank :obj:`src` to every rank."""
    if _world(group) == 1:
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src, group=group)


def all_reduce_gradients(params: Iterable[Tensor], group: Optional[Any] = None,
                         timeout: Optional[Any] = None, *, stats: Optional[Any] = None) -> int:
    r"""Sums ``.grad`` of :obj:`params` over ranks in flat buckets.

    Reduces what single-process training would have: a parameter whose gradient is
    :obj:`None` on *every* rank (unused, frozen by the graph) keeps :obj:`None`, so
    optimizers with weight decay or momentum leave it alone as they would on one
    process; one with a gradient on some ranks only gets zeros on the others first.
    Which parameters take part is agreed with one all-reduce of a presence mask, so all
    ranks issue the same collectives whatever their local graph touched.

    Args:
        params (Iterable[torch.Tensor]): Parameters (those without ``requires_grad``
            are skipped).
        group (ProcessGroup, optional): The process group.
        timeout (float or timedelta, optional): The group's timeout, for messages.
        stats (CommStats, optional): Counts the collectives
            (:meth:`~lightning_fullgraph.engine.CommStats.record_collectives`).

    Returns:
        int: The collectives it ran (``0`` for one process).
    """
    if _world(group) == 1:
        return 0
    params = [p for p in params if p.requires_grad]
    if not params:
        return 0
    present, _ = _agree([p.grad is not None for p in params], (), params[0].device, group,
                        timeout)
    grads = []
    for p, used in zip(params, present):
        if used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    count = 1 + _reduce_tensors(grads, group, timeout)
    if stats is not None:
        stats.record_collectives(count)
    return count


def reduce_backward(run_backward: Callable[[], Any], params: Iterable[Tensor],
                    group: Optional[Any] = None, timeout: Optional[Any] = None, *,
                    stats: Optional[Any] = None) -> Any:
    r"""Runs a backward pass and sums over ranks only the gradients it produced.

    Gradients already accumulated in ``.grad`` (an earlier ``manual_backward`` of the
    same step) were reduced when they were produced; they are set aside, the new ones
    are reduced with :func:`all_reduce_gradients`, and the two are added.  Reducing the
    accumulated ``.grad`` instead would count the earlier backward once per rank.
    :class:`BackwardHooks` stand aside during the pass (the caller weights the loss).

    Args:
        run_backward (Callable): Performs the backward pass (e.g. ``loss.backward``).
        params (Iterable[torch.Tensor]): The model's parameters.
        group (ProcessGroup, optional): The process group.
        timeout (float or timedelta, optional): The group's timeout, for messages.
        stats (CommStats, optional): Counts the reduction's collectives.

    Returns:
        What :obj:`run_backward` returned.
    """
    global _reducing
    params = [p for p in params if p.requires_grad]
    earlier = [p.grad for p in params]
    for p in params:
        p.grad = None
    _reducing += 1
    try:
        result = run_backward()
    except BaseException:
        for p, old in zip(params, earlier):  # leave .grad as the caller had it
            p.grad = old
        raise
    finally:
        _reducing -= 1
    all_reduce_gradients(params, group, timeout, stats=stats)
    for p, old in zip(params, earlier):
        if old is None:
            continue
        if p.grad is not None:
            old.add_(p.grad)
        p.grad = old
    return result


def _agree(present: Sequence[bool], flags: Sequence[bool], device, group,
           timeout) -> Tuple[List[bool], List[bool]]:
    r"""One all-reduce (maximum) of a presence mask and some flags: which tensors have a
    gradient on any rank, and which flags any rank raised."""
    rank, peers = dist.get_rank(group), range(_world(group))
    mask = torch.tensor(list(present) + list(flags), dtype=torch.uint8, device=device)
    with guarded("gradient all-reduce (which parameters have gradients)", rank, peers,
                 timeout):
        dist.all_reduce(mask, op=dist.ReduceOp.MAX, group=group)
    agreed = [bool(v) for v in mask.tolist()]
    return agreed[:len(present)], agreed[len(present):]


def _reduce_tensors(tensors: List[Tensor], group, timeout, average: bool = False) -> int:
    r"""Sums (or averages) :obj:`tensors` over ranks in place, in flat buckets per dtype;
    returns the all-reduces it ran."""
    rank, peers = dist.get_rank(group), range(_world(group))
    bucket: List[Tensor] = []
    size = count = 0
    for t in tensors:
        bucket.append(t)
        size += t.numel() * t.element_size()
        if size >= _BUCKET_BYTES:
            count += _reduce_bucket(bucket, group, rank, peers, timeout, average)
            bucket, size = [], 0
    if bucket:
        count += _reduce_bucket(bucket, group, rank, peers, timeout, average)
    return count


def _reduce_bucket(tensors: List[Tensor], group, rank: int, peers, timeout,
                   average: bool) -> int:
    by_dtype: Dict[torch.dtype, List[Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for same in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in same])
        with guarded("gradient all-reduce", rank, peers, timeout):
            dist.all_reduce(flat, group=group)
        if average:
            flat.div_(_world(group))
        offset = 0
        for t in same:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n
    return len(by_dtype)


def loss_weight(local_count: int, global_count: int) -> float:
    r"""Factor turning a rank's mean loss into its share of the global mean loss."""
    if global_count <= 0:
        raise ValueError("the training mask selects no node in the whole graph")
    return float(local_count) / float(global_count)


class UnreducedBackwardError(RuntimeError):
    r"""A plain backward pass put gradients into an attached model's parameters that the
    engine could not weight and reduce (raised by that ``backward()`` on every rank)."""


class _Pass:
    r"""What :class:`BackwardHooks` know of the backward pass in progress."""

    __slots__ = ("claimed", "manual", "earlier")

    def __init__(self) -> None:
        self.claimed = False  # the gradient of a model output was scaled
        self.manual = False  # started from engine.scale_loss's loss: its caller reduces
        # id(param) -> (param, its .grad before this pass), set aside as it is accumulated
        self.earlier: Dict[int, Tuple[Tensor, Optional[Tensor]]] = {}


class BackwardHooks:
    r"""Makes a plain ``loss.backward()`` on an attached model compute what
    :meth:`~lightning_fullgraph.engine.FullGraphEngine.backward` computes (the
    single-process gradient on every rank), as DDP's gradient hooks do for data parallelism.

    While the model is in training mode:

    * a forward hook registers a hook on every output tensor that scales its gradient by
      :obj:`scale` (:math:`P \cdot n_r / N`: the rank's share of the loss mask times the
      number of ranks; :math:`P` for a summed loss), before the gradient reaches the halo
      exchange's backward;
    * each parameter's gradient is set aside as a backward pass is about to accumulate into
      it, and once the pass is complete (a callback queued on autograd's engine, as FSDP
      does) the gradients the pass produced are *averaged* over the ranks (bucketed, under
      the group's timeout) and added to what was there before, so several backward calls
      before one optimizer step accumulate as on one process.  Averaging makes a term that
      is the same on every rank and bypasses the output (a penalty on the parameters) come
      out right too;
    * the gradient leaving the model through an input that requires one (learnable
      features outside the model) is divided by :math:`P` again: it gets what
      ``engine.backward`` gives it.

    Refused, on every rank alike (one all-reduce agrees on it before any gradient moves):
    a training-mode backward pass that accumulates into the model's parameters without
    passing through one of its outputs (the loss computed from a submodule called directly,
    a separate backward of a penalty).  It raises :class:`UnreducedBackwardError`, naming
    ``engine.backward(loss)``, and leaves ``.grad`` as it was before the pass.

    Untouched: every backward pass in eval mode (explainers optimize masks there; a warning,
    once, says that the model's parameters got this rank's own gradients, in case the model
    is trained in eval mode), ``torch.autograd.grad`` (it returns this rank's unscaled
    gradients, as without the engine), passes run by
    :func:`reduce_backward` (``engine.backward``, the Lightning strategy), and passes that
    start from :meth:`~lightning_fullgraph.engine.FullGraphEngine.scale_loss`'s result
    (that caller reduces with ``all_reduce_gradients``).  Not supported: a loss term that
    depends on this rank's nodes without coming from the model's output (e.g. a penalty on
    hidden activations) and gradient penalties (``create_graph=True``) through the model:
    call ``engine.backward(loss)``, which weights the whole loss.

    Args:
        model (torch.nn.Module): The attached model.
        scale (Callable[[], float]): The output-gradient factor (evaluated at the first
            backward pass, so that a partition without a loss mask can still be attached).
        group (ProcessGroup, optional): The engine's process group.
        timeout (float or timedelta, optional): Its collective timeout, for messages.
        fix (str): The call that does it right, for the refusal's message.
        on_reduced (Callable, optional): Called after each pass whose gradients were reduced
            (the engine advances its codecs' step counter there, as ``engine.backward``
            does).
        stats (CommStats, optional): Counts the reduction's collectives.
    """

    def __init__(self, model: torch.nn.Module, scale: Callable[[], float],
                 group: Optional[Any] = None, timeout: Optional[Any] = None,
                 fix: str = "engine.backward(loss)",
                 on_reduced: Optional[Callable[[], Any]] = None,
                 stats: Optional[Any] = None) -> None:
        self.model, self.group, self.timeout, self.fix = model, group, timeout, fix
        self.on_reduced = on_reduced
        self.stats = stats
        self._warned_eval = False
        self.world = _world(group)
        self._scale_of = scale
        self._scale: Optional[float] = None
        self._pass: Optional[_Pass] = None
        self._params: Dict[int, Any] = {}  # id -> weakref of the hooked parameters
        self._order: List[Any] = []  # their weakrefs, in the model's order
        self._handles: List[Any] = [
            model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            model.register_forward_hook(self._after_forward),
        ]
        self._hook_params()

    def remove(self) -> None:
        r"""Removes every hook (a pass cut short is undone)."""
        self.drop_stale(force=True)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._params.clear()
        self._order.clear()

    # -- registration ---------------------------------------------------------------------
    def _hook_params(self) -> None:
        # Also at every training forward: lazy modules create their parameters in the first
        # one, and frozen parameters may be thawed.
        for p in self.model.parameters():
            if id(p) in self._params and self._params[id(p)]() is p:
                continue
            if not p.requires_grad or isinstance(p, torch.nn.parameter.UninitializedParameter):
                continue
            ref = weakref.ref(p)
            self._params[id(p)] = ref
            self._order.append(ref)
            self._handles.append(p.register_hook(self._accumulating(ref)))

    def _hooked(self) -> List[Tensor]:
        r"""The hooked parameters alive, in the model's order (the same on every rank)."""
        alive = {id(p) for p in self.model.parameters()}
        return [p for p in (ref() for ref in self._order) if p is not None and id(p) in alive]

    @torch.compiler.disable
    def _before_forward(self, module, args, kwargs):
        if not (module.training and torch.is_grad_enabled()):
            return None
        self.drop_stale()
        self._hook_params()
        changed = [False]

        def through(t: Tensor) -> Tensor:
            if not (t.requires_grad and t.is_floating_point()):
                return t
            changed[0] = True
            view = t.view_as(t)
            view.register_hook(self._unscale_input)
            return view
        new = _map_tensors((args, kwargs), through)
        return new if changed[0] else None

    @torch.compiler.disable
    def _after_forward(self, module, args, output):
        if module.training and torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(self._scale_output)

    # -- during backward --------------------------------------------------------------------
    def _start(self) -> _Pass:
        self._pass = _Pass()
        compat.queue_backward_callback(self._finish)
        return self._pass

    def mark_manual(self, grad: Tensor) -> None:
        r"""Tensor hook of :meth:`~lightning_fullgraph.engine.FullGraphEngine.scale_loss`'s
        result: the pass that starts there is weighted and reduced by its caller."""
        if not _reducing:
            (self._pass or self._start()).manual = True

    def _scale_output(self, grad: Tensor) -> Optional[Tensor]:
        state = self._pass
        if _reducing or (state is not None and state.manual):
            return None
        if state is None or not state.claimed:
            if not any(compat.will_accumulate(p) for p in self._hooked()):
                return None  # torch.autograd.grad (or nothing of the model's): untouched
            state = state or self._start()
            state.claimed = True
        if self._scale is None:
            self._scale = float(self._scale_of())
        # A rank without nodes of the loss mask contributes nothing, even a NaN loss.
        return grad * self._scale if self._scale != 0.0 else torch.zeros_like(grad)

    def _unscale_input(self, grad: Tensor) -> Optional[Tensor]:
        state = self._pass
        if _reducing or state is None or not state.claimed or state.manual:
            return None
        return grad / self.world

    def _accumulating(self, ref):
        def hook(grad: Tensor) -> None:
            p = ref()
            if p is None or _reducing:
                return
            state = self._pass
            if state is None and not self.model.training:
                self._eval_backward(p)  # eval mode: untouched
                return
            if state is not None and (state.manual or id(p) in state.earlier):
                return
            if not compat.will_accumulate(p):
                return  # torch.autograd.grad returns it instead
            state = state or self._start()
            state.earlier[id(p)] = (p, p.grad)  # the pass's own gradient arrives alone
            p.grad = None
        return hook

    def _eval_backward(self, p: Tensor) -> None:
        if self._warned_eval or not compat.will_accumulate(p):
            return
        self._warned_eval = True
        warnings.warn(
            "a backward pass in eval mode put gradients into the parameters of the model "
            "attached to the FullGraphEngine: they are this rank's own, neither weighted by "
            "its share of the loss nor reduced over the ranks (eval mode is left alone, e.g. "
            "for explainers). To train, call model.train() first (a plain backward is then "
            "reduced) or engine.backward(loss).", UserWarning, stacklevel=2)

    def _finish(self) -> None:
        state, self._pass = self._pass, None
        if state is None:
            return
        if state.manual:
            _restore(state, keep_new=True)
            return
        rows = []  # (parameter, gradient of this pass, gradient before it)
        for p in self._hooked():
            if id(p) in state.earlier:
                rows.append((p, p.grad, state.earlier[id(p)][1]))
            else:
                rows.append((p, None, p.grad))
        device = rows[0][0].device if rows else torch.device("cpu")
        present, (claimed, unclaimed) = _agree(
            [new is not None for _, new, _ in rows], (state.claimed, not state.claimed),
            device, self.group, self.timeout)
        if unclaimed:
            _restore(state, keep_new=False)
            raise UnreducedBackwardError(self._refusal(claimed))
        new = [g if g is not None else torch.zeros_like(p)
               for (p, g, _), used in zip(rows, present) if used]
        count = 1 + _reduce_tensors(new, self.group, self.timeout, average=True)
        if self.stats is not None:
            self.stats.record_collectives(count)
        it = iter(new)
        for (p, _, earlier), used in zip(rows, present):
            if not used:
                p.grad = earlier
                continue
            g = next(it)
            p.grad = g if earlier is None else earlier.add_(g)
        if self.on_reduced is not None:
            self.on_reduced()

    def _refusal(self, some_claimed: bool) -> str:
        where = " (on some of the ranks)" if some_claimed else ""
        return (f"rank {dist.get_rank(self.group)}: a backward pass{where} put gradients into "
                "the parameters of the model attached to the FullGraphEngine without passing "
                "through the model's output (a loss computed from a submodule called directly, "
                "or a separate backward of a term that does not use the output): they cannot "
                "be weighted by this rank's share of the loss and reduced over the ranks, and "
                "every rank would step with a different gradient. Call "
                f"{self.fix} instead of loss.backward() (it weights and reduces any loss), or "
                "compute the loss from the attached model's own output. The gradients were "
                "left as they were before this backward.")

    def drop_stale(self, force: bool = False) -> None:
        r"""Undoes a pass that never completed (its backward raised), outside any backward."""
        if self._pass is not None and (force or not compat.in_backward()):
            state, self._pass = self._pass, None
            _restore(state, keep_new=False)


def _restore(state: _Pass, keep_new: bool) -> None:
    r"""Puts back the gradients set aside in :obj:`state` (plus the pass's own if
    :obj:`keep_new`, as a backward without the hooks would have left them)."""
    for p, earlier in state.earlier.values():
        if keep_new and earlier is not None and p.grad is not None:
            p.grad = earlier.add_(p.grad)
        elif not keep_new or p.grad is None:
            p.grad = earlier


def _tensors(obj: Any) -> Iterable[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [_map_tensors(item, fn) for item in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):  # not a namedtuple
        return tuple(_map_tensors(item, fn) for item in obj)
    if type(obj) is dict:
        return {key: _map_tensors(item, fn) for key, item in obj.items()}
    return obj
