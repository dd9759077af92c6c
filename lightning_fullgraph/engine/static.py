r"""What does not change is neither recomputed nor resent.

Full-graph training runs on a static graph, yet an unmodified PyG model recomputes
``gcn_norm`` (and exchanges halo degrees for it) every step, and aggregates -- and exchanges
-- its raw input features every step although they are the very same tensor.
:class:`StaticInputs` keeps both:

* **normalizations**: the result of ``gcn_norm`` for the partition's own edge list and edge
  values (``None`` or a partition edge attribute, recognized by content) is computed once per
  layer, call, options, dtype and device;
* **aggregations of unchanged inputs**: a ``propagate`` call of a layer whose message is a
  source row times an edge scalar and whose aggregation is a sum or mean
  (:data:`~.aggregation.PRE_LAYERS`: ``SAGEConv``, ``GINConv``, ``GraphConv``, ``TAGConv``'s
  hops, ...) is a function of its inputs only.  When none of them needs a gradient and each is
  the *same tensor, unmodified* as in the previous call -- same storage, offset, shape,
  strides, dtype and version counter, while the tensor seen then is still alive (so its
  memory cannot have been reused) -- the previous output is returned without exchanging
  anything.  Input dropout makes a new tensor every step, so nothing is reused then.

What the memo holds is held only while it can be reused: an entry refers to its input
tensors (or the bases they view) *weakly* and is dropped (with its output) as soon as one of
them is freed, so the activations a validation pass feeds to later layers (which need no
gradient there, but change every epoch) are not kept alive until the next validation.

An aggregation that may be kept is computed with the exchanges evaluation uses (``fresh``:
every row, current, through the codec), also in a training step: the halo cache, the
asynchronous pipeline and boundary sampling reduce what crosses the wire every step, and a
static input crosses it once.  So under boundary sampling the raw features' aggregate is the
exact one, not one step's sample kept for every later step, and the later layers' rows are
sampled anew every step.  Training and evaluation then share an entry when the same input
comes back in the other phase (the raw features aggregated in the training step, then by
the validation forward): one copy of the aggregate, not two.

Skipping an exchange must happen on all ranks or none.  A normalization point is agreed static
on its first call (:class:`~.agreement.Agreement`) and then costs nothing; other edge values
passed there later are refused with a clear error.  An aggregation point agreed eligible on its
first call checks on every call, in one small all-reduce that replaces the exchange, whether all
ranks can reuse their result (a rank whose input changed makes every rank recompute); after
:data:`GIVE_UP` agreed misses in a row (a new input every step, e.g. dropout) it stops
checking.  Decisions are kept apart for training and evaluation, so a validation pass without
dropout does not decide for training steps with it.

The results are the same tensors the uncached computation returns, bit for bit.  With a
stochastic codec, an aggregation that may be kept is exchanged with the draws of a fixed step
(:func:`~.exchange.static_draws`), not of the step that happens to compute it first: a run
resumed from a checkpoint recomputes it at a later step, and must keep the very aggregate the
uninterrupted run kept.  The decisions above are state a resumed run continues from
(:meth:`StaticInputs.state_dict`; the strategies' checkpoints hold them): which calls still
check, and so which draws they use, then follows the uninterrupted run's.
``FullGraphEngine(static_inputs=False)`` turns it off.

Once an aggregation is kept, its inputs' pages are given back to the kernel where they are a
private file mapping (:func:`~.file_pages.release_file_pages`): a partition loaded with
``torch.load(mmap=True)`` keeps its features resident after the first read, though the kept
aggregation means no later step reads them. Their values do not change; a later read (e.g. a
root term ``lin_r(x)``) maps them again from the file.
"""
from contextlib import nullcontext
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from ..memo import TensorMemo, signature
from .agreement import Agreement, all_agree_each
from .exchange import static_draws
from .file_pages import Released, release_file_pages, releasing

__all__ = ["StaticInputs", "GIVE_UP"]

#: Agreed misses in a row after which a point stops checking for reuse.
GIVE_UP = 3


_PLAIN = (type(None), bool, int, float, str)


def _compact(output: Tensor) -> Tensor:
    r""":obj:`output` on a storage of its own size: a kept aggregation may be the owned rows
    of a larger buffer (the pre channel adds into the aggregation output in place), whose
    other rows would otherwise stay allocated as long as the entry."""
    if output.untyped_storage().nbytes() > output.numel() * output.element_size():
        return output.clone(memory_format=torch.contiguous_format)
    return output


def _leaves(value: Any) -> Optional[Tuple[Any, ...]]:
    r"""Flattens tuples/lists/dicts into tensors and plain values; :obj:`None` if anything
    else (e.g. a ``SparseTensor``) appears, which is then never treated as static."""
    if isinstance(value, Tensor) or isinstance(value, _PLAIN):
        return (value, )
    if isinstance(value, dict):
        value = tuple(value[k] for k in sorted(value))
    if isinstance(value, (tuple, list)):
        out = []
        for v in value:
            sub = _leaves(v)
            if sub is None:
                return None
            out.extend(sub)
        return tuple(out)
    return None


PHASES = ("train", "eval")

def _place(t: Tensor) -> tuple:
    r"""Where :obj:`t` lies: its storage and its geometry within it (not its version; a
    detached alias lies where the tensor does)."""
    return signature(t)[:-1]


def twin_point(point: str, phase: str) -> str:
    r"""The name :obj:`point` (ending in ``.<phase>``) has in the other phase."""
    other = PHASES[1 - PHASES.index(phase)]
    return point[:len(point) - len(phase)] + other


class StaticInputs:
    r"""Per-rank memo of static normalizations and aggregations (see the module docstring).

    Args:
        group (ProcessGroup, optional): Group of the agreement all-reduces.
        enabled (bool): Off: every call recomputes and exchanges.
        timeout (float or timedelta, optional): The group's timeout, named in errors.
        release_inputs (bool): Give back the file pages of a kept aggregation's inputs
            (see the module docstring; :attr:`released_bytes` counts them).
    """

    def __init__(self, group: Optional[Any] = None, enabled: bool = True,
                 timeout: Optional[Any] = None, release_inputs: bool = True) -> None:
        self.group = group
        self.enabled = bool(enabled)
        self.timeout = timeout
        self.release_inputs = bool(release_inputs)
        self.released_bytes = 0
        self._loaded = TensorMemo()  # the tensors the rank loaded (value: True)
        self._eligible = Agreement(group, "static-input memo", timeout)
        self._norm_points = Agreement(group, "static normalization", timeout)
        self._streaks: Dict[str, int] = {}
        self._given_up: set = set()
        self._norms: Dict[tuple, Any] = {}
        # Per call point (finitely many): the kept output, following its inputs.
        self._aggregations = TensorMemo()
        self.hits = 0
        self.misses = 0

    def kept(self) -> Dict[str, Tensor]:
        r"""The aggregations kept now, by call point."""
        return {point: output for point, output, *_ in self._aggregations.items()}

    def clear(self) -> None:
        r"""Forgets every cached result (decisions too)."""
        self._norms.clear()
        self._aggregations.clear()
        self._eligible.clear()
        self._norm_points.clear()
        self._streaks.clear()
        self._given_up.clear()

    def state_dict(self) -> Dict[str, Any]:
        r"""The decisions a resumed run must continue from: each point's streak of agreed
        misses and the points that gave up checking (they choose which exchanges, and which
        codec draws, a call uses).  Agreed, so the same on every rank.  Not the kept results:
        a resumed run recomputes them, bit for bit (:func:`~.exchange.static_draws`)."""
        return {"streaks": dict(self._streaks), "given_up": sorted(self._given_up)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        r"""Continues from the decisions of :meth:`state_dict` (kept results are dropped)."""
        self._aggregations.clear()
        self._streaks = {str(k): int(v) for k, v in state.get("streaks", {}).items()}
        self._given_up = {str(p) for p in state.get("given_up", ())}

    def mark_loaded(self, *tensors: Any) -> None:
        r"""Records tensors the rank loaded and nothing computed (the partition's node
        attributes): as long as one lives unmodified, :meth:`is_loaded` recognizes it.  Kept
        by :meth:`clear`."""
        for t in tensors:
            if isinstance(t, Tensor) and t.layout == torch.strided:
                self._loaded.put(_place(t), (t,), True)

    def is_loaded(self, t: Any) -> bool:
        r"""Whether :obj:`t` is, unmodified, a tensor :meth:`mark_loaded` recorded: an input
        that is the same in every step from the first one (``GCNConv`` then aggregates it
        first at once, :mod:`.reorder`)."""
        if not isinstance(t, Tensor) or t.requires_grad or t.layout != torch.strided:
            return False
        return self._loaded.get(_place(t), (t,), count=False) is not None

    # -- normalizations -------------------------------------------------------------------
    def normalization(self, point: str, key: tuple, local_ok: bool,
                      compute: Callable[[], Any]) -> Any:
        r"""``compute()`` once per :obj:`key` if every rank's inputs are the partition's
        (:obj:`local_ok`) on the first call at :obj:`point` (agreed then, in one all-reduce),
        else every time.

        Raises:
            RuntimeError: If the point was agreed static and this rank's inputs no longer are
                (its peers skip the exchange this call would need).
        """
        if not self.enabled or not self._norm_points.decide(point, local_ok):
            return compute()
        if not local_ok:
            raise RuntimeError(
                f"'{point}': the normalization is computed once for the partition's edge list "
                "and edge values (they were passed on the first call here), but this call "
                "passes other ones; pass batch.edge_index and its edge attributes unchanged, "
                "or create the engine with static_inputs=False (FullGraphEngine) / use "
                "aggregation='post' with static_inputs=False")
        found = self._norms.get(key)
        if found is None:
            found = self._norms[key] = compute()
        else:
            self.hits += 1
        return found

    def gave_up(self, point: str) -> bool:
        r"""Whether :obj:`point` stopped checking for reuse (see :meth:`agreed_reuse`)."""
        return point in self._given_up

    def agreed_reuse(self, point: str, local_hit: bool) -> bool:
        r"""Whether every rank can reuse its result at :obj:`point` (one all-reduce).

        After :data:`GIVE_UP` agreed misses in a row the point is no longer checked (no more
        all-reduces; e.g. an input made anew by dropout every step). The streak is counted from
        agreed results only, so every rank gives up at the same call.
        """
        return self._agreed(point, local_hit, True)[0]

    def _agreed(self, point: str, local_hit: bool, local_static: bool) -> Tuple[bool, bool]:
        r""":meth:`agreed_reuse`, and in the same all-reduce whether every rank's inputs are
        static (which exchanges a miss then runs: they must be the same on every rank)."""
        if point in self._given_up:
            return False, False
        ok, static = all_agree_each((local_hit, local_static), self.group,
                                    f"static-input memo check for '{point}'", self.timeout)
        streak = 0 if ok else self._streaks.get(point, 0) + 1
        self._streaks[point] = streak
        if streak >= GIVE_UP:
            self._given_up.add(point)
            self._aggregations.pop(point)
        return ok, static

    # -- aggregations of unchanged inputs -------------------------------------------------
    def aggregation(self, point: str, inputs: Tuple[Any, ...],
                    compute: Callable[[], Any], phase: str = "train",
                    fresh: Optional[Callable[[], Any]] = None) -> Any:
        r"""The output of a ``propagate`` call of an eligible layer, reused while its
        inputs are unchanged.

        Args:
            point (str): The call's name (layer, call index, ending in ``.<phase>``).
            inputs (tuple): Every argument of the call; tensors (also inside tuples and
                lists) are compared by storage and version, other values by equality.
            compute: Runs the call (with its exchanges).
            phase (str): ``"train"`` or ``"eval"`` (the layer's mode).
            fresh: Runs the call with the exchanges of evaluation (no halo cache, pipeline
                or sampling); used for every result that may be kept (default:
                :obj:`compute`).
        """
        if not self.enabled:
            return compute()
        leaves = _leaves(inputs)
        static = leaves is not None and not any(
            isinstance(v, Tensor) and v.requires_grad for v in leaves)
        if not self._eligible.decide(point, static):
            return compute()
        if point in self._given_up:
            return compute()
        kept = self._aggregations.get(point, leaves, count=False) if static else None
        if static and kept is None:  # the same input in the other phase
            kept = self._aggregations.get(twin_point(point, phase), leaves, count=False)
        reuse, all_static = self._agreed(point, kept is not None, static)
        if reuse:
            self.hits += 1
            return kept
        self.misses += 1
        # Fresh exchanges only where every rank runs them: a rank whose input needs a
        # gradient this call runs the training ones (halo cache, sampling: other collectives).
        if all_static:  # a result that may be kept: its inputs can go as soon as consumed
            # Drawn as for a fixed step: the kept result must not depend on the step that
            # computes it (a resumed run computes it at a later step than the original did).
            draws = static_draws() if point not in self._given_up else nullcontext()
            with releasing(self.release_inputs) as released, draws:
                output = (fresh or compute)()
            self.released_bytes += released.bytes
        else:
            released, output = None, compute()
        if all_static and isinstance(output, Tensor) and not output.requires_grad \
                and point not in self._given_up:
            output = _compact(output)
            self._remember(point, leaves, output, released)
        else:
            self._aggregations.pop(point)
        return output

    def _remember(self, point: str, leaves: Tuple[Any, ...], output: Tensor,
                  released: Optional[Released] = None) -> None:
        self._aggregations.put(point, leaves, output)
        if self.release_inputs:  # those the exchange did not give back already
            done = released.addresses if released is not None else ()
            self.released_bytes += sum(release_file_pages(v) for v in leaves
                                       if isinstance(v, Tensor) and v.data_ptr() not in done)
