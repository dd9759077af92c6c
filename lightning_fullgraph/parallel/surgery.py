r"""Model surgery for 4-D training: the splittable models inside a module replaced by their
grid splits (:meth:`GridSplit.apply`) and put back (:meth:`GridSplit.revert`), gradients
reduced over the grid and the replicas, and the whole model's ``state_dict`` in and out.

Shared by :class:`~lightning_fullgraph.strategies.FourDStrategy` (Lightning) and
:func:`~lightning_fullgraph.fabric.setup_fourd` (Fabric and plain ``torch.distributed``).
"""
import math
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .gcn3d import Grid3DGCN, check_convertible
from .grid3d import Grid3DScaleGNN
from .grid_module import GridModule
from .grid_rows import GridRowsModel, check_rows_convertible
from .mesh import FourDMesh
from .pmm import summed
from .scalegnn import ScaleGNN

__all__ = ["GridSplit", "splittable_children", "grid_steps", "load_grid_steps"]


def splittable_children(module: torch.nn.Module) -> List[Tuple[torch.nn.Module, str,
                                                               torch.nn.Module, str]]:
    r"""``(parent, attribute, child, kind)`` of every model in :obj:`module` a grid splits:
    ``"scalegnn"`` (a :class:`~.scalegnn.ScaleGNN`: :class:`~.grid3d.Grid3DScaleGNN`),
    ``"gcn"`` (a PyG :class:`~torch_geometric.nn.models.GCN` that
    :class:`~.gcn3d.Grid3DGCN` splits, its layouts rotating from layer to layer) and
    ``"rows"`` (the outermost other module holding PyG convolutions:
    :class:`~.grid_rows.GridRowsModel`, whole rows between its layers).  Modules holding no
    convolution are not split (they run whole, on every process alike).  What cannot be
    split is refused by name (:func:`~.grid_rows.check_rows_convertible`)."""
    from torch_geometric.nn.conv import MessagePassing
    from torch_geometric.nn.models import GCN

    def holds(child: torch.nn.Module, kind) -> bool:
        return any(isinstance(m, kind) for m in child.modules())

    found = []

    def visit(parent: torch.nn.Module, prefix: str) -> None:
        for name, child in parent.named_children():
            path = prefix + name
            if isinstance(child, ScaleGNN):
                found.append((parent, name, child, "scalegnn"))
            elif isinstance(child, GCN) and _grid3d_convertible(child, path):
                found.append((parent, name, child, "gcn"))
            elif holds(child, (ScaleGNN, GCN)) and not isinstance(child, GCN):
                visit(child, path + ".")
            elif holds(child, MessagePassing):
                check_rows_convertible(child, path)
                found.append((parent, name, child, "rows"))

    visit(module, "")
    return found


def _grid3d_convertible(model: torch.nn.Module, name: str) -> bool:
    # Grid3DGCN where it applies (its layouts rotate: no reshard between layers), else the
    # split by rows, which names what it cannot split either.
    try:
        check_convertible(model, name)
        return True
    except TypeError:
        return False


def _owning_layers(module: torch.nn.Module, names: List[str]) -> List[str]:
    r"""``"name (Class)"`` of the layer holding each parameter of :obj:`names`: its outermost
    PyG message-passing ancestor, else the module that owns it; each layer once."""
    from torch_geometric.nn.conv import MessagePassing

    modules = dict(module.named_modules())
    out: List[str] = []
    for name in names:
        parts = name.split(".")[:-1]
        owner = ".".join(parts)
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if isinstance(modules.get(prefix), MessagePassing):
                owner = prefix
                break
        label = f"{owner or '(the model itself)'} ({type(modules[owner]).__name__})"
        if label not in out:
            out.append(label)
    return out


#: Attribute of a model put back by :meth:`GridSplit.revert`: its split's dropout step counter.
STEP_ATTR = "_grid_dropout_step"


def grid_steps(module: torch.nn.Module) -> Dict[str, int]:
    r"""The dropout step counter (:attr:`GridModule.step`, the same on every process) of
    every split model inside :obj:`module` -- or of the model it was split from, once put
    back -- by its name there: checkpoint state, not part of the single-process
    ``state_dict``."""
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, GridModule):
            out[name] = int(m.step)
        elif hasattr(m, STEP_ATTR):
            out[name] = int(getattr(m, STEP_ATTR))
    return out


def load_grid_steps(module: torch.nn.Module, steps: Dict[str, int]) -> None:
    r"""Sets the counters of :func:`grid_steps` again, so that a resumed run draws the dropout
    masks the uninterrupted run would: on the split models, or on the models not split yet
    (their split starts from it, :meth:`GridSplit.apply`).

    Raises:
        ValueError: If a counter names no model of :obj:`module` (another model).
    """
    found = dict(module.named_modules())
    unknown = sorted(set(steps) - set(found))
    if unknown:
        raise ValueError(f"the checkpoint holds dropout step counters of split models "
                         f"{unknown} that this model does not have: resume with the same "
                         "model")
    for name, step in steps.items():
        target = found[name]
        if isinstance(target, GridModule):
            target.step = int(step)
        else:
            setattr(target, STEP_ATTR, int(step))


@torch.no_grad()
def broadcast_parameters(module: torch.nn.Module) -> None:
    r"""Rank 0's parameters and buffers on every process (one initial model)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)


class GridSplit:
    r"""The 4-D surgery of one module.

    Args:
        module (torch.nn.Module): The model (e.g. a LightningModule holding a ScaleGNN, a PyG
            GCN or GraphSAGE); modified in place by :meth:`apply`, restored by
            :meth:`revert`.
        mesh (FourDMesh): This rank's groups.
        seed (int): Seed of the split layers' dropout masks.
        bf16_comm (bool): bfloat16 partial sums on the wire (lossy).
    """

    def __init__(self, module: torch.nn.Module, mesh: FourDMesh, seed: int = 0,
                 bf16_comm: bool = False) -> None:
        self.module, self.mesh = module, mesh
        self.seed, self.bf16_comm = int(seed), bool(bf16_comm)
        # (parent module, attribute, the original model, its split), for revert.
        self.splits: List[Tuple[torch.nn.Module, str, torch.nn.Module, GridModule]] = []
        self.applied = False

    @property
    def grid(self) -> Tuple[int, int, int]:
        return tuple(self.mesh.size(a) for a in ("x", "y", "z"))

    def apply(self, device: Any = None) -> "GridSplit":
        r"""Broadcasts rank 0's weights, then (on a grid larger than one process) replaces
        every splittable model by its split (:func:`splittable_children`); refuses, by name,
        what cannot be split, parameters outside a ScaleGNN or Grid3DGCN split, and a module
        with nothing to split."""
        if self.applied:
            return self
        broadcast_parameters(self.module)
        self.applied = True
        if math.prod(self.grid) == 1:
            return self  # data parallel only: every model runs whole
        for parent, name, child, kind in splittable_children(self.module):
            if kind == "scalegnn":
                split = Grid3DScaleGNN(child, self.mesh, seed=self.seed, gather_output=True,
                                       bf16_comm=self.bf16_comm)
            elif kind == "gcn":
                split = Grid3DGCN(child, self.mesh, seed=self.seed, bf16_comm=self.bf16_comm)
            else:
                split = GridRowsModel(child, self.mesh, seed=self.seed,
                                      bf16_comm=self.bf16_comm)
            if device is not None:
                split = split.to(device)
            # Split again (a later fit): its masks continue where the last split's stopped.
            split.step = int(getattr(child, STEP_ATTR, 0))
            setattr(parent, name, split)
            self.splits.append((parent, name, child, split))
        held = {id(p) for *_, split in self.splits for p in split.parameters()}
        others = [n for n, p in self.module.named_parameters() if id(p) not in held]
        rotating = [type(split).__name__ for *_, split in self.splits
                    if not isinstance(split, GridRowsModel)]
        if others and rotating:
            # Grid3DScaleGNN and Grid3DGCN cut their input without summing its gradient over
            # the grid: a layer before them would get a part of its gradient.  (Layers around
            # a GridRowsModel, which does, run whole on every process and are right.)
            self.revert(gather=False)
            layers = _owning_layers(self.module, others)
            raise TypeError(
                f"a grid of {self.grid} splits {', '.join(sorted(set(rotating)))} with layouts "
                f"that rotate, and these layers are outside them: "
                f"{', '.join(layers[:8])}{' ...' if len(layers) > 8 else ''}. Their gradients "
                "would be wrong on a grid: put every layer inside the split model, or train "
                "it data parallel with grid=(1, 1, 1)")
        if not self.splits:
            raise TypeError(f"a grid of {self.grid} found nothing to split in "
                            f"{type(self.module).__name__}: no ScaleGNN and no PyG "
                            "convolution; train it data parallel with grid=(1, 1, 1)")
        return self

    def revert(self, gather: bool = True) -> None:
        r"""Puts the original models back, with the trained weights when :obj:`gather`
        (a collective over the grid; skip it while an error unwinds)."""
        for parent, name, child, split in reversed(self.splits):
            if gather:
                child.load_state_dict(split.full_state_dict())
            # A checkpoint saved after training (Lightning's teardown puts the models back
            # before trainer.save_checkpoint) still holds the dropout step counter.
            setattr(child, STEP_ATTR, int(split.step))
            setattr(parent, name, child)
        self.splits = []
        self.applied = False

    def reduce_gradients(self, params: List[Tensor]) -> None:
        r"""After backward: the split blocks' gradients summed over their grid axes and
        averaged over the replicas, every other gradient in :obj:`params` averaged over the
        replicas."""
        held = set()
        for *_, split in self.splits:
            split.reduce_gradients()
            held.update(id(p) for p in split.parameters())
        replicas = self.mesh.size("dp")
        rest = [p for p in params if id(p) not in held and p.grad is not None]
        if replicas == 1 or not rest:
            return
        # One all-reduce for all of them (DDP buckets them too), not one per parameter.
        mean = summed(torch.cat([p.grad.reshape(-1) for p in rest]),
                      self.mesh.group("dp"), self.bf16_comm) / replicas
        offset = 0
        for p in rest:
            n = p.grad.numel()
            p.grad.copy_(mean[offset:offset + n].view_as(p.grad))
            offset += n

    def backward(self, params: List[Tensor], run_backward: Callable[[], Any]) -> None:
        r"""Runs :obj:`run_backward` and reduces only the gradients it adds (a second
        backward before the optimizer step must not reduce the first one's again)."""
        earlier = [p.grad for p in params]
        for p in params:
            p.grad = None
        run_backward()
        self.reduce_gradients(params)
        for p, old in zip(params, earlier):
            if old is not None:
                p.grad = old if p.grad is None else old + p.grad

    def _prefixes(self) -> List[Tuple[str, GridModule]]:
        names = {id(m): n for n, m in self.module.named_modules()}
        return [(names[id(split)] + ".", split) for *_, split in self.splits]

    def state_dict(self) -> Dict[str, Tensor]:
        r"""The module's ``state_dict`` as one process holds it (split parts gathered: a
        collective over the grid)."""
        state = self.module.state_dict()
        for prefix, split in self._prefixes():
            state = {k: v for k, v in state.items() if not k.startswith(prefix)}
            state.update({prefix + k: v for k, v in split.full_state_dict().items()})
        return state

    def load_state_dict(self, state: Dict[str, Tensor], strict: bool = True) -> None:
        r"""Loads a single-process ``state_dict`` into the split module (no communication)."""
        state = dict(state)
        prefixes = self._prefixes()
        for prefix, split in prefixes:
            split.load_full_state_dict({k[len(prefix):]: v for k, v in state.items()
                                        if k.startswith(prefix)})
            state = {k: v for k, v in state.items() if not k.startswith(prefix)}
        missing, unexpected = self.module.load_state_dict(state, strict=False)
        missing = [k for k in missing if not any(k.startswith(p) for p, _ in prefixes)]
        if strict and (missing or unexpected):
            raise RuntimeError(f"the state_dict does not match the model: missing {missing}, "
                               f"unexpected {unexpected}")
