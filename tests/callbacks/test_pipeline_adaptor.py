"""SYLVIE's pipeline adaptor: the sync/async rule, rank agreement, checkpoints."""
import os

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.callbacks import PipelineAdaptor, PipelineController
from lightning_fullgraph.testing import run_distributed
from lightning_fullgraph.engine import ExchangeConfig


def _modes(controller, losses):
    return [controller.mode] + [controller.update(loss) for loss in losses]


def test_steady_descent_goes_async_after_the_first_epoch():
    c = PipelineController(delta=2, ldr_time="epochs")
    assert _modes(c, [10 - 0.5 * t for t in range(8)]) == ["sync"] + ["async"] * 8


def test_a_stalling_descent_forces_synchronous_epochs():
    c = PipelineController(delta=2, ldr_time="epochs", smoothing=0.5)
    losses = [10, 9, 8, 7, 7, 7, 7, 7]
    modes = _modes(c, losses)
    assert modes[:5] == ["sync", "async", "async", "async", "async"]
    # From epoch 4 the loss is flat: the smoothed descent falls below its value two epochs
    # earlier, so the next epochs are synchronous.
    assert modes[5:] == ["sync"] * 4, modes
    assert [h["next_mode"] for h in c.history] == modes[1:]


def test_non_finite_loss_changes_nothing_and_state_round_trips():
    c = PipelineController(delta=1, ldr_time="epochs")
    c.update(5.0)
    assert c.update(float("nan")) == "async"
    trace = [4.0, 3.9, 3.9, 3.0, 2.9, 2.9, 2.9]
    straight = PipelineController(delta=1, ldr_time="epochs")
    expected = _modes(straight, trace)
    first = PipelineController(delta=1, ldr_time="epochs")
    _modes(first, trace[:3])
    resumed = PipelineController(delta=1, ldr_time="epochs")
    resumed.load_state_dict(first.state_dict())
    assert [resumed.update(v) for v in trace[3:]] == expected[4:]
    assert resumed.history == straight.history
    with pytest.raises(ValueError, match="delta"):
        PipelineController(delta=0)


# -- under a real Trainer ----------------------------------------------------------------------
LOSSES = [2.0, 1.8, 1.6, 1.5, 1.5, 1.5, 1.2, 1.0, 0.9, 0.9, 0.9, 0.9]


def _module(seed):
    import lightning.pytorch as pl

    from ..engine.models import Net

    class Scripted(pl.LightningModule):
        r"""Trains a GCN; the loss it reports is scripted per epoch (its gradient is the real
        one), so that the schedule of a resumed run can be compared exactly."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.model = Net("gcn", 8, 4)
            self.modes = []

        def on_train_epoch_start(self):
            self.modes.append(self.trainer.strategy.engine.policy.pipeline.mode)

        def training_step(self, batch, _):
            out = self.model(batch.x, batch.edge_index)
            loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
            return loss - loss.detach() + LOSSES[self.current_epoch]

        def validation_step(self, batch, _):
            self.model(batch.x, batch.edge_index)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.05)

    return Scripted()


def _trainer(tmp, epochs, callbacks):
    import lightning.pytorch as pl

    from lightning_fullgraph import FullGraphStrategy
    return pl.Trainer(accelerator="cpu", devices=2, precision="32-true", max_epochs=epochs,
                      # The adaptor's own decisions, without a step-aside trial beside them.
                      strategy=FullGraphStrategy(exchange=ExchangeConfig(pipeline="adaptive",
                                                                         step_aside=False),
                                                 kernels=None, timeout=60),
                      callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp, num_sanity_val_steps=0)


def _fit(rank, world_size, tmp):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_fullgraph import FullGraphDataModule
    from lightning_fullgraph.callbacks import AdaptiveBitWidth

    from ..engine.models import skewed_graph
    data = skewed_graph()

    def datamodule():
        return FullGraphDataModule(data, cache_dir=os.path.join(tmp, "cache"))

    def adaptor():
        return PipelineAdaptor(delta=1, ldr_time="epochs")

    straight, module = adaptor(), _module(0)
    # Beside AdaptiveBitWidth and the CommunicationMonitor: no metric logged twice.
    trainer = _trainer(tmp + "/a", len(LOSSES), [straight, AdaptiveBitWidth()])
    trainer.fit(module, datamodule=datamodule())
    logged = float(trainer.callback_metrics["comm/async"])
    # Teardown released the pipeline's group; the next stage builds an engine (and a group)
    # of its own, and releases it in turn.
    fit_engine = trainer.strategy.engine
    released = [fit_engine.transport.background_group is None]
    trainer.validate(module, datamodule=datamodule(), verbose=False)
    released += [trainer.strategy.engine is not fit_engine,
                 trainer.strategy.engine.transport.background_group is None]
    ckpt = ModelCheckpoint(dirpath=tmp + "/ckpt", save_last=True)
    _trainer(tmp + "/b", 6, [adaptor(), ckpt]).fit(_module(0), datamodule=datamodule())
    resumed, resumed_module = adaptor(), _module(1)
    _trainer(tmp + "/b", len(LOSSES), [resumed]).fit(resumed_module, datamodule=datamodule(),
                                                     ckpt_path=tmp + "/ckpt/last.ckpt")
    return dict(modes=module.modes, resumed=resumed_module.modes, logged=logged,
                released=released,
                history=straight.controller.history,
                resumed_history=resumed.controller.history)


@pytest.mark.multiprocess
def test_trainer_modes_follow_the_rule_on_every_rank_and_resume(tmp_path):
    results = run_distributed(_fit, 2, str(tmp_path), timeout_s=240)
    r0 = results[0]
    reference = PipelineController(delta=1, ldr_time="epochs")
    expected = _modes(reference, LOSSES)[:len(LOSSES)]
    assert r0["modes"] == expected and {"sync", "async"} <= set(expected), r0["modes"]
    assert r0["logged"] == float(expected[-1] == "async")
    assert all(r["released"] == [True, True, True] for r in results), results
    assert r0["resumed"] == expected[6:], r0
    assert r0["resumed_history"] == r0["history"][:len(r0["resumed_history"])]
    for r in results[1:]:
        assert r["modes"] == r0["modes"] and r["resumed"] == r0["resumed"]
