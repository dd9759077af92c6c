"""ValidationTrace: training seconds and the validation metric at every validation."""
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_fullgraph.callbacks import ValidationTrace


class _Scripted(pl.LightningModule):
    r"""Logs ``val_acc = (epoch + 1) / 10``: a known trace."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, _):
        return self.lin(batch[0]).pow(2).mean()

    def validation_step(self, batch, _):
        self.log("val_acc", (self.current_epoch + 1) / 10, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader():
    return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)


def _fit(trace, epochs, every, ckpt_path=None, tmp_path=None):
    trainer = pl.Trainer(max_epochs=epochs, check_val_every_n_epoch=every, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=1, callbacks=[trace],
                         enable_checkpointing=tmp_path is not None,
                         default_root_dir=tmp_path)
    trainer.fit(_Scripted(), _loader(), _loader(), ckpt_path=ckpt_path)
    return trainer


def test_records_every_validation_but_not_the_sanity_check():
    trace = ValidationTrace()
    _fit(trace, epochs=6, every=2)
    assert [p["epoch"] for p in trace.points] == [1, 3, 5]
    assert [round(p["val_acc"], 6) for p in trace.points] == [0.2, 0.4, 0.6]
    seconds = [p["train_s"] for p in trace.points]
    assert 0 < seconds[0] <= seconds[1] <= seconds[2] <= trace.train_seconds
    assert trace.time_to(0.35) == seconds[1] and trace.time_to(0.1) == seconds[0]
    assert trace.time_to(0.9) is None
    assert abs(trace.best() - 0.6) < 1e-6


def test_resume_continues_the_trace(tmp_path):
    first = ValidationTrace()
    trainer = _fit(first, epochs=2, every=1, tmp_path=tmp_path)
    ckpt = trainer.checkpoint_callback.best_model_path
    resumed = ValidationTrace()
    _fit(resumed, epochs=4, every=1, ckpt_path=ckpt, tmp_path=tmp_path)
    assert [p["epoch"] for p in resumed.points] == [0, 1, 2, 3]
    assert resumed.points[:2] == first.points
    assert resumed.points[2]["train_s"] >= first.train_seconds
