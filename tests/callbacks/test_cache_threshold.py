"""CDFGNN's cache threshold schedule: the rule, rank agreement, logging beside the other
callbacks, and checkpoints."""
import os

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.callbacks import AdaptiveCacheThreshold, CacheThresholdController
from lightning_fullgraph.testing import run_distributed
from lightning_fullgraph.engine import ExchangeConfig


def _trace(controller, accuracies):
    return [controller.update(a) for a in accuracies]


# -- the rule on scripted accuracy traces ------------------------------------------------------
def test_clear_gains_relax_the_cache_up_to_its_bound():
    c = CacheThresholdController(epsilon=0.01)
    eps = _trace(c, [0.1 + 0.1 * t for t in range(40)])
    # Epoch 0 sets the running mean; every later epoch gains > mu2 over it: epsilon grows by
    # min(x1.05, +0.01) per epoch, never past nu1 = 0.3.
    assert eps[0] == 0.01
    assert eps[1] == pytest.approx(0.0105)
    assert all(b >= a for a, b in zip(eps, eps[1:]))
    assert max(eps) <= 0.3 and eps[-1] == pytest.approx(min(0.3, eps[-2] * 1.05))
    assert all(b - a <= 0.01 + 1e-12 for a, b in zip(eps, eps[1:]))


def test_any_drop_tightens_the_cache_down_to_its_floor():
    c = CacheThresholdController(epsilon=0.2)
    eps = _trace(c, [0.9] + [0.9 - 0.01 * t for t in range(1, 60)])
    assert eps[1] == pytest.approx(max(0.2 * 0.9, 0.2 - 0.01))
    assert all(b <= a for a, b in zip(eps, eps[1:]))
    assert eps[-1] == pytest.approx(0.001)  # nu2


def test_a_plateau_and_noise_within_the_margins_change_nothing():
    c = CacheThresholdController(epsilon=0.05)
    assert _trace(c, [0.8, 0.8, 0.8005, 0.8008, 0.8, 0.815]) == [0.05] * 6
    assert c.update(float("nan")) == 0.05 and c.history[-1]["accuracy"] != c.history[-1]["accuracy"]


def test_the_printed_eq6_direction_is_not_used():
    # Eq. 6 as printed would raise epsilon after a drop; the prose (followed here) lowers it.
    c = CacheThresholdController(epsilon=0.1)
    c.update(0.9)
    assert c.update(0.5) < 0.1


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="within"):
        CacheThresholdController(epsilon=0.5)
    with pytest.raises(ValueError, match="nu2"):
        CacheThresholdController(nu1=0.001, nu2=0.01)


def test_state_dict_round_trip_continues_the_schedule():
    trace = [0.2, 0.35, 0.5, 0.52, 0.4, 0.6, 0.61, 0.3, 0.8, 0.81]
    straight = CacheThresholdController()
    expected = _trace(straight, trace)
    first = CacheThresholdController()
    _trace(first, trace[:4])
    resumed = CacheThresholdController(epsilon=0.2)
    resumed.load_state_dict(first.state_dict())
    assert _trace(resumed, trace[4:]) == expected[4:]
    assert resumed.history == straight.history


# -- under a real Trainer: every rank the same, logged beside the other callbacks, resumed -----
SCRIPT = [0.2, 0.3, 0.45, 0.5, 0.5, 0.2, 0.7, 0.75, 0.1, 0.8]


def _module_class():
    import lightning.pytorch as pl

    from ..engine.models import Net

    class Scripted(pl.LightningModule):
        r"""Logs this rank's training accuracy (rank-local, as a plain float) and a scripted
        accuracy per epoch, so that the schedule of a resumed run can be compared exactly."""

        def __init__(self, seed):
            super().__init__()
            torch.manual_seed(seed)
            self.model = Net("gcn", 8, 4)

        def training_step(self, batch, _):
            out = self.model(batch.x, batch.edge_index)
            mask = batch.train_mask
            loss = F.cross_entropy(out[mask], batch.y[mask])
            acc = (out[mask].argmax(-1) == batch.y[mask]).float().mean() if mask.any() \
                else torch.tensor(0.0)
            self.log("train_acc", acc, batch_size=1)
            self.log("scripted_acc", SCRIPT[self.current_epoch], batch_size=1)
            return loss

        def validation_step(self, batch, _):
            self.model(batch.x, batch.edge_index)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.05)

    return Scripted


def _trainer(tmp, epochs, callbacks):
    import lightning.pytorch as pl

    from lightning_fullgraph import FullGraphStrategy
    return pl.Trainer(accelerator="cpu", devices=2, precision="32-true", max_epochs=epochs,
                      strategy=FullGraphStrategy(exchange=ExchangeConfig(codec="int2",
                                                                         cache="adaptive",
                                                                         step_aside=False),
                                                 kernels=None, timeout=60),
                      callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp, num_sanity_val_steps=0)


def _fit(rank, world_size, tmp):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_fullgraph import FullGraphDataModule
    from lightning_fullgraph.callbacks import AdaptiveBitWidth, CommunicationMonitor

    from ..engine.models import skewed_graph
    data = skewed_graph()
    module = _module_class()

    def datamodule():
        return FullGraphDataModule(data, cache_dir=os.path.join(tmp, "cache"))

    # The real accuracy, with every adaptive callback at once (they log beside each other).
    real = AdaptiveCacheThreshold()
    monitor = CommunicationMonitor()
    trainer = _trainer(tmp + "/a", 6, [real, monitor, AdaptiveBitWidth(ldr_time="epochs")])
    trainer.fit(module(0), datamodule=datamodule())
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
               if k.startswith(("cache/", "comm/bits", "comm/rows_skipped"))}
    epsilons = [c.epsilon for c in trainer.strategy.engine.policy.caches()]

    def scripted():
        return AdaptiveCacheThreshold(monitor="scripted_acc")

    ckpt = ModelCheckpoint(dirpath=tmp + "/ckpt", save_last=True)
    _trainer(tmp + "/c", 5, [scripted(), ckpt]).fit(module(0), datamodule=datamodule())
    resumed = scripted()
    _trainer(tmp + "/c", len(SCRIPT), [resumed]).fit(module(1), datamodule=datamodule(),
                                                      ckpt_path=tmp + "/ckpt/last.ckpt")
    skipped = [h.get("comm/rows_skipped_frac") for h in monitor.history]
    by_direction = [(h.get("comm/rows_skipped_frac_forward"),
                     h.get("comm/rows_skipped_frac_backward")) for h in monitor.history]
    return dict(real=real.controller.history, metrics=metrics, epsilons=epsilons,
                skipped=skipped, by_direction=by_direction, resumed=resumed.controller.history)


@pytest.mark.multiprocess
def test_trainer_schedule_is_shared_logged_and_resumed(tmp_path):
    results = run_distributed(_fit, 2, str(tmp_path), timeout_s=240)
    r0 = results[0]
    assert len(r0["real"]) == 6
    for r in results[1:]:
        assert r["real"] == r0["real"]  # the same global accuracy and decisions on every rank
        assert r["resumed"] == r0["resumed"]
    # The global accuracy is the share-weighted sum of the ranks' own accuracies: a valid
    # accuracy. An epoch logs the threshold the engine uses in it and the accuracy of the
    # epoch before, which decided it (the ranks combine their accuracies when the next epoch
    # starts, not in on_train_epoch_end; the last epoch's is combined when training ends).
    assert all(0.0 <= h["accuracy"] <= 1.0 for h in r0["real"])
    assert r0["metrics"]["cache/train_acc"] == pytest.approx(r0["real"][-2]["accuracy"])
    assert r0["metrics"]["cache/epsilon"] == pytest.approx(r0["real"][-1]["epsilon"])
    assert r0["metrics"]["comm/bits"] in (1.0, 2.0, 4.0, 8.0)
    assert r0["epsilons"] == [r0["real"][-1]["epsilon"]]
    # The first epoch sends every row; later ones skip some.
    assert r0["skipped"][0] == 0.0 and max(r0["skipped"][1:]) > 0.0, r0["skipped"]
    # Per direction too (halo rows, gradients): the first epoch sends both whole.
    assert r0["by_direction"][0] == (0.0, 0.0)
    assert all(0.0 <= f <= 1.0 for pair in r0["by_direction"] for f in pair)
    assert max(f + b for f, b in r0["by_direction"][1:]) > 0.0
    # The scripted schedule moves, and the resumed run continues it exactly: its history is
    # what one uninterrupted controller makes of the script.
    # (The logged accuracy is a float32, weighted by the ranks' shares: equal to a few ulps.)
    straight = CacheThresholdController()
    for acc in SCRIPT:
        straight.update(acc)
    assert len({h["epsilon"] for h in straight.history}) > 2
    for key in ("accuracy", "epsilon", "next"):
        assert [h[key] for h in r0["resumed"]] == \
            pytest.approx([h[key] for h in straight.history], rel=1e-6), key
