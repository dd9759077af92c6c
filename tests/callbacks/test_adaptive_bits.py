"""SYLVIE's time-adaptive bit width: the controller (Eq. 5), rank agreement, checkpoints."""
import math
import os

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_fullgraph.callbacks import (AdaptiveBitWidth, BitWidthController, apply_bit_width,
                                           exchange_codecs)
from lightning_fullgraph.engine import ExchangeConfig, ExchangePolicy, IdentityCodec
from lightning_fullgraph.testing import run_distributed


def _run(controller, losses, seconds=None):
    r"""The width of every epoch (epoch 0's, then what each update returned)."""
    widths = [controller.bits]
    for t, loss in enumerate(losses):
        widths.append(controller.update(loss, 1.0 if seconds is None else seconds[t]))
    return widths


# -- Eq. 5 on scripted loss curves -------------------------------------------------------------
def test_steady_descent_lowers_the_width_to_the_minimum():
    c = BitWidthController(initial_bits=8, delta=2, ldr_time="epochs")
    widths = _run(c, [10 - 0.1 * t for t in range(10)])
    # No decision before t > delta; then one halving per epoch down to b_min, where it stays.
    assert widths == [8, 8, 8, 8, 4, 2, 1, 1, 1, 1, 1]
    assert all(h["ldr"] is None or h["ldr"] > 0 for h in c.history)  # falling loss: LDR > 0


def test_stall_raises_the_width_to_the_maximum():
    c = BitWidthController(delta=2, ldr_time="epochs")  # starts at b_min = 1, as the paper
    losses = [10 - 0.1 * min(t, 8) for t in range(16)]  # descends, then stalls at epoch 8
    widths = _run(c, losses)
    assert widths[:10] == [1] * 10
    assert widths[10:] == [2, 4, 8, 8, 8, 8, 8]
    # Converging (exponential) loss: the descent rate falls, so the width rises (§V-A).
    c = BitWidthController(delta=2, ldr_time="epochs")
    assert _run(c, [2 * math.exp(-0.3 * t) for t in range(16)])[-1] == 8


def test_widths_stay_within_the_allowed_set():
    c = BitWidthController(widths=(8, 2, 4), initial_bits=4, delta=1, ldr_time="epochs")
    gen = torch.Generator().manual_seed(0)
    losses = (torch.rand(200, generator=gen) + torch.linspace(3, 0, 200)).tolist()
    widths = _run(c, losses)
    assert set(widths) <= {2, 4, 8} and {2, 8} <= set(widths)
    # Moves are one step of the sorted set at a time.
    order = [2, 4, 8]
    assert all(abs(order.index(a) - order.index(b)) <= 1 for a, b in zip(widths, widths[1:]))
    with pytest.raises(ValueError):
        BitWidthController(widths=(1, 2), initial_bits=4)
    with pytest.raises(ValueError):
        BitWidthController(ldr_time="minutes")


def test_descent_rate_per_second_rewards_faster_epochs():
    # The same loss drop per epoch: epochs that get faster raise the rate (keep lowering),
    # epochs that get slower lower it (raise the width).
    losses = [10 - 0.1 * t for t in range(12)]
    faster = _run(BitWidthController(initial_bits=8, delta=1), losses,
                  [1.0 / (1 + t) for t in range(12)])
    slower = _run(BitWidthController(initial_bits=1, delta=1), losses,
                  [(1 + t) ** 2 for t in range(12)])
    assert faster[-1] == 1 and slower[-1] == 8


def test_patience_cooldown_and_warmup():
    losses = [10 - 0.1 * t for t in range(14)]
    assert _run(BitWidthController(initial_bits=8, delta=1, patience=2, ldr_time="epochs"),
                losses) == [8, 8, 8, 8, 4, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    assert _run(BitWidthController(initial_bits=8, delta=1, cooldown=1, ldr_time="epochs"),
                losses) == [8, 8, 8, 4, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    assert _run(BitWidthController(initial_bits=8, delta=1, min_epochs=6, ldr_time="epochs"),
                losses) == [8, 8, 8, 8, 8, 8, 8, 4, 2, 1, 1, 1, 1, 1, 1]


def test_non_finite_loss_changes_nothing():
    c = BitWidthController(initial_bits=8, delta=1, ldr_time="epochs")
    _run(c, [5.0, 4.0, 3.0])
    state = c.state_dict()
    c.update(float("nan"))
    assert c.bits == state["bits"] and c.smoothed == state["smoothed"] and c.ldr == state["ldr"]


def _noisy(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (2 * torch.exp(-torch.arange(n) / 15.0) + 0.05 * torch.rand(n, generator=gen)).tolist()


def test_state_dict_round_trip_continues_the_schedule(tmp_path):
    losses = _noisy(60)
    kwargs = dict(initial_bits=4, delta=3, patience=2, cooldown=1, ldr_time="epochs")
    straight = BitWidthController(**kwargs)
    expected = _run(straight, losses)
    assert len(set(expected)) > 2  # the schedule moves, so the comparison can fail

    first = BitWidthController(**kwargs)
    head = _run(first, losses[:23])
    # Through a file loaded as Lightning loads checkpoints (weights_only=True).
    torch.save(first.state_dict(), tmp_path / "state.pt")
    resumed = BitWidthController(**kwargs)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert head + _run(resumed, losses[23:])[1:] == expected
    assert resumed.history == straight.history


# -- the codecs --------------------------------------------------------------------------------
class BitsCodec(IdentityCodec):
    r"""An exact codec with a settable width that records the width of every exchange."""

    lossless = False

    def __init__(self, bits: int = 32) -> None:
        self.bits = bits
        self.used = []

    def encode(self, rows, ctx):
        self.used.append((ctx.step, ctx.direction, self.bits))
        return rows


def test_apply_bit_width_reaches_every_codec_with_bits():
    shared, forward_only, exact = BitsCodec(), BitsCodec(), IdentityCodec()
    policy = ExchangePolicy(shared, points={"conv1.*": ExchangePolicy(forward=forward_only,
                                                                      backward=exact),
                                            "conv2.*": shared})
    assert {id(c) for c in exchange_codecs(policy)} == {id(shared), id(forward_only), id(exact)}
    assert apply_bit_width(policy, 2) == 2
    assert shared.bits == forward_only.bits == 2 and not hasattr(exact, "bits")

    class Engine:  # anything with a policy, or a strategy with an engine
        pass
    engine, strategy = Engine(), Engine()
    engine.policy, strategy.engine = policy, engine
    assert apply_bit_width(strategy, 4) == 2 and shared.bits == 4
    assert apply_bit_width(ExchangePolicy(), 4) == 0
    with pytest.raises(ValueError):
        apply_bit_width(policy, 0)


# -- every rank takes the same decision --------------------------------------------------------
def _ranks_agree(rank, world_size):
    # Each rank sees its own loss curve: rank 0 keeps descending, rank 1 stalls early, and
    # their epoch times differ.  Fed only local values, the controllers would disagree.
    epochs = 30
    curve = [(10 - 0.1 * t) if rank == 0 else (10 - 0.1 * min(t, 6)) * 0.5 for t in range(epochs)]
    weight = [0.7, 0.3][rank]
    shared = BitWidthController(initial_bits=4, delta=2)
    local = BitWidthController(initial_bits=4, delta=2)
    for t in range(epochs):
        seconds = 1.0 + 0.01 * t * (rank + 1)
        loss, slowest = BitWidthController.reduce(curve[t] * weight, seconds)
        shared.update(loss, slowest)
        local.update(curve[t], seconds)
    return dict(shared=[h["next_bits"] for h in shared.history],
                local=[h["next_bits"] for h in local.history], state=shared.state_dict())


@pytest.mark.multiprocess
def test_every_rank_takes_the_same_decision():
    r0, r1 = run_distributed(_ranks_agree, 2)
    assert r0["local"] != r1["local"]  # local decisions would diverge (and hang a codec)
    assert r0["shared"] == r1["shared"] and r0["state"] == r1["state"]
    # And they equal one process fed the global loss (the weighted sum) and the slowest time.
    single = BitWidthController(initial_bits=4, delta=2)
    for t in range(30):
        loss = 0.7 * (10 - 0.1 * t) + 0.3 * (10 - 0.1 * min(t, 6)) * 0.5
        single.update(loss, max(1.0 + 0.01 * t, 1.0 + 0.02 * t))
    assert r0["shared"] == [h["next_bits"] for h in single.history]
    assert len(set(r0["shared"])) > 1


# -- under a real Trainer, through a checkpoint ------------------------------------------------
class _Record(Callback):
    r"""The width of every epoch, and the widths its exchanges (training, validation) used."""

    def __init__(self):
        self.widths, self.used, self._start = [], [], 0

    @staticmethod
    def _codec(trainer):
        return trainer.strategy.engine.policy.codec("any", "forward")

    def on_train_epoch_start(self, trainer, pl_module):
        self.widths.append(self._codec(trainer).bits)
        self._start = len(self._codec(trainer).used)

    def on_train_epoch_end(self, trainer, pl_module):
        self.used.append(sorted({b for _, _, b in self._codec(trainer).used[self._start:]}))


def _trainer(tmp, epochs, callbacks):
    import lightning.pytorch as pl
    from lightning_fullgraph import FullGraphStrategy
    return pl.Trainer(accelerator="cpu", devices=2, precision="32-true", max_epochs=epochs,
                      strategy=FullGraphStrategy(exchange=ExchangeConfig(codec=BitsCodec(),
                                                                         step_aside=False),
                                                 kernels=None, timeout=60, log_communication=False),
                      callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp, num_sanity_val_steps=0)


def _fit_resume(rank, world_size, tmp):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning_fullgraph import FullGraphDataModule

    from ..engine.models import skewed_graph
    from ..strategies.modules import NodeClassifier
    data = skewed_graph()
    epochs = 10

    def bits():
        return AdaptiveBitWidth(initial_bits=8, delta=1, ldr_time="epochs")

    def module(seed):
        # Dropout: the static-input memo then stays off (with it on, a resumed run's loss differs
        # from the uninterrupted one's by an ulp, which would blur the comparison below).
        torch.manual_seed(seed)
        return NodeClassifier(data.num_features, 4, lr=0.05, dropout=0.5)

    def datamodule():
        return FullGraphDataModule(data, cache_dir=os.path.join(tmp, "cache"))

    straight, record = bits(), _Record()
    trainer = _trainer(tmp + "/a", epochs, [straight, record])
    trainer.fit(module(0), datamodule=datamodule())
    logged = float(trainer.callback_metrics["comm/bits"])

    # Half the epochs, a checkpoint at the end of validation (before on_train_epoch_end),
    # then a fresh Trainer and callback resume from it.
    ckpt = ModelCheckpoint(dirpath=tmp + "/ckpt", save_last=True)
    _trainer(tmp + "/b", epochs // 2, [bits(), _Record(), ckpt]).fit(module(0),
                                                                      datamodule=datamodule())
    resumed, resumed_record = bits(), _Record()
    _trainer(tmp + "/b", epochs, [resumed, resumed_record]).fit(
        module(123), datamodule=datamodule(), ckpt_path=tmp + "/ckpt/last.ckpt")
    return dict(widths=record.widths, resumed=resumed_record.widths,
                history=straight.controller.history, resumed_history=resumed.controller.history,
                used=record.used, logged=logged)


@pytest.mark.multiprocess
def test_trainer_resume_continues_the_same_widths(tmp_path):
    results = run_distributed(_fit_resume, 2, str(tmp_path), timeout_s=180)
    r0 = results[0]
    assert len(set(r0["widths"])) > 1, r0["widths"]  # the schedule moves
    assert r0["resumed"] == r0["widths"][5:], r0
    assert r0["resumed_history"] == r0["history"][:len(r0["resumed_history"])]
    assert len(r0["resumed_history"]) == 9  # epochs 0..8 decided (epoch 9's is pending)
    for r in results[1:]:
        assert r["widths"] == r0["widths"] and r["resumed"] == r0["resumed"]
    # Every exchange of an epoch (forward, backward, validation) used that epoch's width.
    assert r0["used"] == [[w] for w in r0["widths"]], r0
    assert r0["logged"] == r0["widths"][-1]
