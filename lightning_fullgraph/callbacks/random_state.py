"""Every rank's random state in the checkpoint, so a resumed run draws what the original drew."""
import warnings
from typing import Any, Dict

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from .. import compat

__all__ = ["RandomStateCheckpoint"]

_KEY = "lightning_fullgraph_random_states"


class RandomStateCheckpoint(Callback):
    r"""Saves the random states of *every* rank in checkpoints and restores them on resume.

    Lightning writes checkpoints from rank 0 only, and a resumed run otherwise continues
    every rank from whatever state seeding left it in: dropout masks (and anything else
    drawn at random) then differ from the uninterrupted run.  This callback gathers the
    torch (CPU and CUDA), numpy and Python random states of all ranks into the checkpoint
    and gives each rank its own back when training resumes, so that resuming equals the
    uninterrupted run bit for bit.  :class:`~lightning_fullgraph.FullGraphStrategy` adds it
    automatically.

    A checkpoint made with another number of processes restores nothing (with a warning):
    the partitions, and so what each rank draws, differ anyway.
    """

    def on_save_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           checkpoint: Dict[str, Any]) -> None:
        # Runs on every rank (Lightning dumps the checkpoint everywhere, rank 0 writes it).
        states = _plain(compat.collect_rng_states())
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, states)
        else:
            gathered = [states]
        checkpoint[_KEY] = {"world_size": len(gathered), "states": gathered}

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
