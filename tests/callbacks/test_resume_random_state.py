"""RandomStateCheckpoint carries the counters the library's own draws follow: the grid's
dropout step counters and the static-input memo's decisions, restored on resume also when
the engine only exists after Lightning restored the checkpoint."""
from types import SimpleNamespace

import pytest
import torch

from lightning_fullgraph.callbacks import RandomStateCheckpoint
from lightning_fullgraph.engine.static import StaticInputs
from lightning_fullgraph.parallel.surgery import STEP_ATTR


def _trainer(static):
    engine = SimpleNamespace(static=static) if static is not None else None
    return SimpleNamespace(strategy=SimpleNamespace(engine=engine), world_size=1, global_rank=0)


def _holder(step=None):
    holder = torch.nn.Module()
    holder.model = torch.nn.Linear(2, 2)  # stands for a split model put back after training
    if step is not None:
        setattr(holder.model, STEP_ATTR, step)
    return holder


def test_counters_are_saved_and_restored():
    static = StaticInputs()
    static._streaks = {"conv1.propagate0.train": 2, "conv1.propagate0.eval": 0}
    static._given_up = {"conv2.propagate0.train"}
    checkpoint = {}
    RandomStateCheckpoint().on_save_checkpoint(_trainer(static), _holder(7), checkpoint)

    # Lightning restores before the strategy's setup: no engine yet, then on_fit_start.
    callback, restored, module = RandomStateCheckpoint(), StaticInputs(), _holder()
    callback.on_load_checkpoint(_trainer(None), module, checkpoint)
    assert getattr(module.model, STEP_ATTR) == 7  # picked up when the model is split
    callback.on_fit_start(_trainer(restored), module)
    assert restored.state_dict() == static.state_dict()
    assert restored.gave_up("conv2.propagate0.train")

    with pytest.raises(ValueError, match="'model'"):  # another model: refused by name
        RandomStateCheckpoint().on_load_checkpoint(_trainer(None), torch.nn.Module(),
                                                   checkpoint)


class _Engine(SimpleNamespace):
    r"""The engine's step-aside interface: what it saves, what it was given back."""

    def step_aside_state(self):
        return self.saved

    def load_step_aside_state(self, state):
        self.loaded = state


def test_step_aside_decision_is_saved_and_restored():
    decision = {"decision": {"stages": ["codec"], "arms": [["codec"], []],
                             "seconds": [0.5, 1.0]}}
    saving = _Engine(static=StaticInputs(), saved=decision, loaded=None)
    checkpoint = {}
    trainer = SimpleNamespace(strategy=SimpleNamespace(engine=saving), world_size=1,
                              global_rank=0)
    RandomStateCheckpoint().on_save_checkpoint(trainer, _holder(), checkpoint)

    callback, module = RandomStateCheckpoint(), _holder()
    callback.on_load_checkpoint(_trainer(None), module, checkpoint)  # no engine yet
    loading = _Engine(static=StaticInputs(), saved=None, loaded=None)
    callback.on_fit_start(SimpleNamespace(strategy=SimpleNamespace(engine=loading),
                                          world_size=1, global_rank=0), module)
    assert loading.loaded == decision
