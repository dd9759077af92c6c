"""FullGraphStrategy under a real Trainer equals single-process training."""
import copy
import os

import pytest
import torch
import torch.nn.functional as F
import torchmetrics

from lightning_fullgraph.testing import run_distributed

from ..engine.models import skewed_graph
from .modules import NodeClassifier

EPOCHS = 8


def _trainer(world_size, tmp, kernels, precision="64-true", **kwargs):
    import lightning.pytorch as pl
    from lightning_fullgraph import FullGraphStrategy
    kwargs.setdefault("max_epochs", EPOCHS)
    return pl.Trainer(accelerator="cpu", devices=world_size, precision=precision,
                      strategy=FullGraphStrategy(kernels=kernels, timeout=30),
                      logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp, num_sanity_val_steps=0, **kwargs)


def _reference(data, epochs):
    torch.manual_seed(0)
    module = NodeClassifier(data.num_features, 4).double()
    opt = module.configure_optimizers()
    x = data.x.double()
    accs = []
    for _ in range(epochs):
        module.train()
        opt.zero_grad()
        out = module(x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        module.eval()
        with torch.no_grad():
            out = module(x, data.edge_index)
        accs.append(torchmetrics.functional.accuracy(
            out[data.val_mask].argmax(-1), data.y[data.val_mask], "multiclass", num_classes=4))
    return module, float(accs[-1]), out


def _fit_and_compare(rank, world_size, tmp, kernels):
    from lightning_fullgraph import FullGraphDataModule
    data = skewed_graph()
    ref, ref_acc, ref_logits = _reference(data, EPOCHS)

    torch.manual_seed(0)
    module = NodeClassifier(data.num_features, 4)
    dm = FullGraphDataModule(data, cache_dir=os.path.join(tmp, "cache"))
    trainer = _trainer(world_size, tmp, kernels)
    trainer.fit(module, datamodule=dm)
    params = max(float((p - q).abs().max()) for p, q in
                 zip(module.parameters(), ref.parameters()))
    val_acc = float(trainer.callback_metrics["val_acc"])
    comm = trainer.callback_metrics.get("comm/sent_MB")
    logits = torch.cat(trainer.predict(module, datamodule=dm))
    return dict(params=params, val_acc=val_acc, ref_acc=ref_acc,
                logits=float((logits - ref_logits).abs().max()),
                logits_shape=tuple(logits.shape), owned=dm.partition.num_owned,
                comm=None if comm is None else float(comm))


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size,kernels", [(2, None), (3, "auto")])
def test_trainer_matches_single_process(tmp_path, world_size, kernels):
    results = run_distributed(_fit_and_compare, world_size, str(tmp_path), kernels)
    data = skewed_graph()
    for r in results:
        assert r["params"] < 1e-9, r
        assert r["val_acc"] == pytest.approx(r["ref_acc"], abs=1e-12), r
        assert r["logits_shape"] == (data.num_nodes, 4)  # global order, every node
        assert r["logits"] < 1e-9, r
        assert r["comm"] is not None and r["comm"] > 0
    assert sum(r["owned"] for r in results) == data.num_nodes


def _resume(rank, world_size, tmp):
    # fp32: under "64-true" Lightning itself does not resume bit-exactly (Adam's step
    # counter comes back as float32; measured 5e-8 with single-device PyG too).
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning_fullgraph import FullGraphDataModule
    data = skewed_graph()
    torch.manual_seed(0)
    straight = NodeClassifier(data.num_features, 4)
    _trainer(world_size, tmp + "/a", None, "32-true").fit(
        straight, datamodule=FullGraphDataModule(data, cache_dir=tmp + "/cache"))

    torch.manual_seed(0)
    first = NodeClassifier(data.num_features, 4)
    ckpt = ModelCheckpoint(dirpath=tmp + "/ckpt", save_last=True)
    _trainer(world_size, tmp + "/b", None, "32-true", max_epochs=EPOCHS // 2,
             callbacks=[ckpt]).fit(first, datamodule=FullGraphDataModule(data, cache_dir=tmp + "/cache"))
    torch.manual_seed(123)  # a different init: everything must come from the checkpoint
    resumed = NodeClassifier(data.num_features, 4)
    _trainer(world_size, tmp + "/b", None, "32-true").fit(
        resumed, datamodule=FullGraphDataModule(data, cache_dir=tmp + "/cache"),
        ckpt_path=tmp + "/ckpt/last.ckpt")
    files = sorted(os.listdir(tmp + "/ckpt"))
    return dict(diff=max(float((p - q).abs().max()) for p, q in
                         zip(straight.parameters(), resumed.parameters())), files=files)


@pytest.mark.multiprocess
def test_checkpoint_resume_equals_uninterrupted(tmp_path):
    results = run_distributed(_resume, 2, str(tmp_path))
    for r in results:
        assert r["diff"] == 0.0, r
        assert "last.ckpt" in r["files"]


def _killed(rank, world_size, tmp):
    from lightning_fullgraph import FullGraphDataModule
    data = skewed_graph()
    module = NodeClassifier(data.num_features, 4, die_at_epoch=2, die_rank=1)
    _trainer(world_size, tmp, None).fit(
        module, datamodule=FullGraphDataModule(data, cache_dir=tmp + "/cache"))
    return "finished"


@pytest.mark.multiprocess
def test_killed_rank_does_not_hang_the_others(tmp_path):
    import time
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        run_distributed(_killed, 3, str(tmp_path), timeout_s=30)
    elapsed = time.monotonic() - start
    # The survivors raise (connection closed or collective timeout); nobody finishes.
    assert "failed" in str(info.value) or "exited" in str(info.value)
    assert elapsed < 90, elapsed
