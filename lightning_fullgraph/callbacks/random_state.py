"""Every rank's random state (and the counters the library's own draws follow) in the checkpoint,
so a resumed run draws what the original drew."""
import warnings
from typing import Any, Dict, Optional

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from .. import compat

__all__ = ["RandomStateCheckpoint"]

_KEY = "lightning_fullgraph_random_states"


class RandomStateCheckpoint(Callback):
    r"""Saves what the random draws of *every* rank depend on in checkpoints and restores it
    on resume.

    Lightning writes checkpoints from rank 0 only, and a resumed run otherwise continues
    every rank from whatever state seeding left it in: dropout masks (and anything else
    drawn at random) then differ from the uninterrupted run.  This callback gathers the
    torch (CPU and CUDA), numpy and Python random states of all ranks into the checkpoint
    and gives each rank its own back when training resumes, so that resuming equals the
    uninterrupted run bit for bit.  With them go the two counters the library's own draws
    follow, both the same on every rank:

    * the step counter of the dropout masks of every model split over a 4-D grid
      (:class:`~lightning_fullgraph.parallel.grid_module.GridModule`);
    * the decisions of the full-graph engine's static-input memo
      (:meth:`~lightning_fullgraph.engine.static.StaticInputs.state_dict`), which choose the
      exchanges, and so the codec draws, of a layer's call;
    * the engine's step-aside decision (:class:`~lightning_fullgraph.engine.step_aside.StepAside`:
      which reductions run), taken from timings, so a resumed run keeps it, or its trial's
      progress, so a resumed run tries the same stages at the same steps.

    :class:`~lightning_fullgraph.FullGraphStrategy` and
    :class:`~lightning_fullgraph.FourDStrategy` add it automatically.

    A checkpoint made with another number of processes restores nothing (with a warning):
    the partitions, and so what each rank draws, differ anyway.
    """

    def __init__(self) -> None:
        # Counters read from a checkpoint before the modules they belong to exist (Lightning
        # restores before the strategy's setup unless the strategy asks otherwise).
        self._pending: Optional[Dict[str, Any]] = None

    def on_save_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           checkpoint: Dict[str, Any]) -> None:
        # Runs on every rank (Lightning dumps the checkpoint everywhere, rank 0 writes it).
        states = _plain(compat.collect_rng_states())
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, states)
        else:
            gathered = [states]
        checkpoint[_KEY] = {"world_size": len(gathered), "states": gathered,
                            "counters": _counters(trainer, pl_module)}

    def on_load_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           checkpoint: Dict[str, Any]) -> None:
        saved = checkpoint.get(_KEY)
        if saved is None:
            return  # a checkpoint from elsewhere: nothing to restore
        if saved["world_size"] != trainer.world_size:
            warnings.warn(
                f"the checkpoint holds random states of {saved['world_size']} processes but "
                f"this run has {trainer.world_size}; they are not restored, so random draws "
                "(dropout) differ from the original run", RuntimeWarning, stacklevel=2)
            return
        compat.set_rng_states(_restored(saved["states"][trainer.global_rank]))
        self._pending = dict(saved.get("counters", {}))
        self._restore_counters(trainer, pl_module)

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # After the strategy's setup (the engine, the grid's split models exist), before the
        # sanity check's forward.
        self._restore_counters(trainer, pl_module)

    def _restore_counters(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        pending = self._pending
        if not pending:
            return
        if "grid_steps" in pending:
            from ..parallel.surgery import load_grid_steps
            load_grid_steps(pl_module, pending.pop("grid_steps"))
        static = _static_cache(trainer)
        if "static_cache" in pending and static is not None:
            static.load_state_dict(pending.pop("static_cache"))
        engine = getattr(trainer.strategy, "engine", None)
        if "step_aside" in pending and engine is not None:
            engine.load_step_aside_state(pending.pop("step_aside"))


def _static_cache(trainer: "pl.Trainer") -> Optional[Any]:
    engine = getattr(trainer.strategy, "engine", None)
    return getattr(engine, "static", None)


def _counters(trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> Dict[str, Any]:
    from ..parallel.surgery import grid_steps
    out: Dict[str, Any] = {}
    steps = grid_steps(pl_module)
    if steps:
        out["grid_steps"] = steps
    static = _static_cache(trainer)
    if static is not None:
        out["static_cache"] = static.state_dict()
    engine = getattr(trainer.strategy, "engine", None)
    aside = engine.step_aside_state() if hasattr(engine, "step_aside_state") else None
    if aside is not None:
        out["step_aside"] = aside
    return out


# Lightning loads checkpoints with ``weights_only=True``: only tensors and plain containers
# may be in them, so numpy's state tuple (it holds an ndarray) is stored as a tensor.
def _plain(states: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(states)
    if "numpy" in out:
        name, keys, pos, has_gauss, cached = out["numpy"]
        out["numpy"] = [name, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos),
                        int(has_gauss), float(cached)]
    if "python" in out:
        version, internal, gauss = out["python"]
        out["python"] = [version, list(internal), gauss]
    return out


def _restored(states: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(states)
    if "numpy" in out:
        name, keys, pos, has_gauss, cached = out["numpy"]
        out["numpy"] = (name, keys.numpy().astype(np.uint32), pos, has_gauss, cached)
    if "python" in out:
        version, internal, gauss = out["python"]
        out["python"] = (version, tuple(internal), gauss)
    return out
