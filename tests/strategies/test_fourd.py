"""FourDStrategy under a real Trainer: data parallel on sampled mini-batches (any PyG model,
grid (1,1,1)) and ScaleGNN split over a 3-D grid equal the single-process steps on the same
batches; a resumed run continues the same batches and optimizer, and with dropout draws the
uninterrupted run's masks."""
import os

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.testing import run_distributed

from ..engine.models import skewed_graph

STEPS, EPOCHS, BATCH = 3, 2, 40


def _module(kind, in_channels, classes, dropout=0.0):
    import lightning.pytorch as pl
    from torch_geometric.nn import GATConv, GCNConv
    from torch_geometric.nn.models import GCN

    from lightning_fullgraph.parallel import ScaleGNN

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            if kind == "scalegnn":
                self.model = ScaleGNN(in_channels, 8, 3, classes, dropout=dropout)
            elif kind == "pyg_gcn":
                self.model = GCN(in_channels, 8, 2, classes, normalize=False)
            else:  # bare layers of the LightningModule: each split by rows, "gat" refused
                self.conv1 = GATConv(in_channels, 8) if kind == "gat" else \
                    GCNConv(in_channels, 8, normalize=False)
                self.conv2 = GCNConv(8, classes, normalize=False)

        def forward(self, x, edge_index, edge_weight):
            # Input dropout draws from torch's generator; the split model's own masks do not.
            x = F.dropout(x, dropout, self.training)
            if kind in ("scalegnn", "pyg_gcn"):
                return self.model(x, edge_index, edge_weight)
            return self.conv2(self.conv1(x, edge_index, edge_weight).relu(), edge_index,
                              edge_weight)

        def training_step(self, batch, batch_idx):
            out = self(batch.x, batch.edge_index, batch.edge_weight)
            return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    return Classifier()


def _reference(kind, data, dp, epochs, strata=1):
    from lightning_fullgraph.data.sampled import SampledNodeDataModule
    torch.manual_seed(0)
    module = _module(kind, data.num_features, 4).double()
    opt = module.configure_optimizers()
    dm = SampledNodeDataModule(data, BATCH, steps_per_epoch=STEPS, seed=5, strata=strata)
    for step in range(epochs * STEPS):
        opt.zero_grad()
        grads = None
        for replica in range(dp):
            batch = dm.batch(dm.sampler.sample(step, replica))
            module.zero_grad()
            loss = module.training_step(batch.apply(
                lambda t: t.double() if t.is_floating_point() else t), 0)
            loss.backward()
            g = [p.grad.clone() for p in module.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(module.parameters(), grads):
            p.grad = g / dp
        opt.step()
    return module


def _trainer(tmp, world, dp, grid, epochs, **kwargs):
    import lightning.pytorch as pl

    from lightning_fullgraph import FourDStrategy
    kwargs.setdefault("limit_val_batches", 0)
    return pl.Trainer(accelerator="cpu", devices=world, precision="64-true", max_epochs=epochs,
                      strategy=FourDStrategy(dp=dp, grid=grid, timeout=60), logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp, **kwargs)


def _fit(rank, world_size, tmp, kind, dp, grid, resume, sharded=False):
    from lightning_fullgraph.data.sampled import SampledNodeDataModule, ShardedNodeDataModule
    data = skewed_graph()
    torch.manual_seed(0)
    module = _module(kind, data.num_features, 4)
    strata = grid[0] * grid[1] * grid[2] if sharded else 1

    def dm():
        if sharded:  # each process loads only its tiles (written by local rank 0)
            return ShardedNodeDataModule(os.path.join(tmp, "shards"), data, BATCH,
                                         steps_per_epoch=STEPS, seed=5)
        return SampledNodeDataModule(data, BATCH, steps_per_epoch=STEPS, seed=5)

    if resume:
        first = _trainer(tmp, world_size, dp, grid, 1)
        first.fit(module, datamodule=dm())
        ckpt = os.path.join(tmp, "one.ckpt")
        first.save_checkpoint(ckpt)
        # The checkpoint holds the whole model, as one process would save it.
        saved = torch.load(ckpt, weights_only=False)["state_dict"]
        fresh = _module(kind, data.num_features, 4).state_dict()
        assert {k: tuple(v.shape) for k, v in saved.items()} == \
            {k: tuple(v.shape) for k, v in fresh.items()}
        torch.manual_seed(123)  # another initialization: the checkpoint must win
        module = _module(kind, data.num_features, 4)
        _trainer(tmp, world_size, dp, grid, EPOCHS).fit(module, datamodule=dm(),
                                                        ckpt_path=ckpt)
    else:
        _trainer(tmp, world_size, dp, grid, EPOCHS).fit(module, datamodule=dm())
    ref = _reference(kind, data, dp, EPOCHS, strata)
    got, want = module.state_dict(), ref.state_dict()
    assert set(got) == set(want), (sorted(got), sorted(want))
    error = max(float((got[k].double() - v).abs().max() / v.abs().max().clamp_min(1e-12))
                for k, v in want.items())
    return error, _dropout_resume(world_size, tmp, kind, dp, grid, data, dm) if resume else None


def _dropout_resume(world_size, tmp, kind, dp, grid, data, dm):
    # With dropout (the grid's masks and torch's input dropout): the run resumed from the
    # checkpoint of its first epoch equals the uninterrupted one bit for bit (no
    # single-process reference draws those masks).
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fitted(epochs, ckpt_path=None, seed=0, **kwargs):
        torch.manual_seed(seed)
        module = _module(kind, data.num_features, 4, dropout=0.5)
        _trainer(tmp + "/dropout", world_size, dp, grid, epochs, **kwargs).fit(
            module, datamodule=dm(), ckpt_path=ckpt_path)
        return module

    every = ModelCheckpoint(dirpath=tmp + "/dropout", filename="{epoch}", save_top_k=-1)
    straight = fitted(EPOCHS, callbacks=[every])
    ckpt = os.path.join(tmp, "dropout", "epoch=0.ckpt")
    resumed = fitted(EPOCHS, ckpt_path=ckpt, seed=123)
    want, got = straight.state_dict(), resumed.state_dict()
    halfway = torch.load(ckpt, weights_only=False)["state_dict"]
    return dict(diff=max(float((got[k] - v).abs().max()) for k, v in want.items()),
                moved=max(float((halfway[k] - v).abs().max()) for k, v in want.items()))


@pytest.mark.parametrize("kind, dp, grid, resume", [
    ("gcn", 2, (1, 1, 1), False),        # data parallel, any PyG model
    ("scalegnn", 1, (2, 1, 1), False),   # 3-D split
    ("scalegnn", 2, (1, 2, 1), True),    # both, resumed from a checkpoint after one epoch
    ("pyg_gcn", 1, (2, 1, 1), False),    # PyG's GCN model split over the grid
    ("gcn", 1, (2, 1, 1), True),         # the LightningModule's own GCNConv layers, by rows
    ("gcn", 2, (2, 1, 1), False),        # ... and two replicas of them
])
def test_fourd_equals_single_process(tmp_path, kind, dp, grid, resume):
    world = dp * grid[0] * grid[1] * grid[2]
    for error, dropout in run_distributed(_fit, world, str(tmp_path), kind, dp, grid, resume,
                                          timeout_s=300):
        assert error <= 1e-10
        if resume:
            assert dropout["diff"] == 0.0 and dropout["moved"] > 0, dropout


@pytest.mark.parametrize("kind, dp, grid, resume", [
    ("pyg_gcn", 1, (2, 2, 1), False),    # its input block and two adjacency blocks
    ("scalegnn", 2, (1, 2, 1), True),    # replicas, resumed from a checkpoint
    ("gcn", 1, (2, 1, 1), False),        # whole rows in (a GridRowsModel), adjacency cut
])
def test_fourd_on_shards_equals_single_process(tmp_path, kind, dp, grid, resume):
    # ShardedNodeDataModule: every process holds only its tiles; the trajectory is one
    # process's on the same (stratified) batches.
    world = dp * grid[0] * grid[1] * grid[2]
    for error, dropout in run_distributed(_fit, world, str(tmp_path), kind, dp, grid, resume,
                                          True, timeout_s=300):
        assert error <= 1e-10
        if resume:
            assert dropout["diff"] == 0.0 and dropout["moved"] > 0, dropout


def test_bad_dims_are_refused():
    from lightning_fullgraph import FourDStrategy
    with pytest.raises(ValueError, match="positive int"):
        FourDStrategy(dp=0)
    with pytest.raises(ValueError, match="grid must be"):
        FourDStrategy(grid=(2, 2))


def _refused(rank, world_size, tmp):
    from lightning_fullgraph.data.sampled import SampledNodeDataModule
    data = skewed_graph()
    module = _module("gat", data.num_features, 4)  # a GATConv: not splittable
    try:
        _trainer(tmp, world_size, 1, (2, 1, 1), 1).fit(
            module, datamodule=SampledNodeDataModule(data, BATCH, STEPS, seed=5))
    except TypeError as error:
        return str(error)
    return None


def test_layers_outside_a_split_model_are_refused_by_name(tmp_path):
    for message in run_distributed(_refused, 2, str(tmp_path), timeout_s=120):
        # The layer, by name and class (not its parameters one by one), and what to do.
        assert message is not None and "'conv1' is a GATConv" in message, message
        assert "grid=(1, 1, 1)" in message and "lin.weight" not in message, message


def _evaluated(rank, world_size, tmp, kind, grid):
    # Fit, then validate and predict with the same trainer: each stage splits the model again
    # (after Lightning's broadcast of rank 0's parameters outside fitting, which must not
    # reach the split blocks), and must compute what the fitted model computes on one process.
    from lightning_fullgraph.data.sampled import SampledNodeDataModule
    data = skewed_graph()
    torch.manual_seed(0)
    module = _module(kind, data.num_features, 4)
    seen = []
    module.validation_step = lambda batch, *_: seen.append(
        module(batch.x, batch.edge_index, batch.edge_weight).detach().clone())
    module.predict_step = lambda batch, *_: module(batch.x, batch.edge_index, batch.edge_weight)
    dm = SampledNodeDataModule(data, BATCH, steps_per_epoch=STEPS, seed=5)
    trainer = _trainer(tmp, world_size, 1, grid, 1, limit_val_batches=1,
                       num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    fitted = {k: v.clone() for k, v in module.state_dict().items()}
    trainer.validate(module, datamodule=dm, verbose=False)
    (predicted,) = trainer.predict(module, datamodule=dm)
    full = dm.batch(dm.sampler.full())
    module.eval()
    with torch.no_grad():  # the fitted model, whole, on this process
        want = module(full.x.double(), full.edge_index, full.edge_weight.double())
    unchanged = all(torch.equal(fitted[k], v) for k, v in module.state_dict().items())
    return (unchanged, float((seen[-1] - want).abs().max()),
            float((predicted - want).abs().max()))


@pytest.mark.parametrize("kind", ["pyg_gcn", "scalegnn"])
def test_validate_and_predict_after_fit_on_a_grid_equal_one_process(tmp_path, kind):
    for unchanged, validated, predicted in run_distributed(_evaluated, 2, str(tmp_path), kind,
                                                           (2, 1, 1), timeout_s=300):
        assert unchanged  # evaluation does not change the weights
        assert validated <= 1e-10 and predicted <= 1e-10, (validated, predicted)
