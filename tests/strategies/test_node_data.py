"""PyG's ``LightningNodeData(data, loader="full")`` under ``strategy="fullgraph"``.

This file is also the script under test: a training script written for one device with PyG's
data module, run as users run it (``python test_node_data.py ...``; Lightning re-runs it once
per extra rank).  The only difference between the single-device run and the partitioned one
is ``--strategy fullgraph --devices 2``, and the two must train to the same parameters,
logits and accuracies.  The second half checks that data which would give every rank the
whole graph is refused with a message naming the fix.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from torch_geometric.data.lightning import LightningNodeData
from torch_geometric.nn import GCNConv

import lightning_fullgraph.strategies  # noqa: F401  strategy="fullgraph" (see below)
from lightning_fullgraph.data import load_cora
from lightning_fullgraph.testing import run_distributed

# Importing lightning_fullgraph after Lightning registers strategy="fullgraph" by itself, but
# the ranks of run_distributed import lightning_fullgraph.testing first: hence the import above.

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 20
RTOL = 1e-5  # fp32, per tensor, relative to the tensor's largest magnitude


# -- the user's script, written for one device ---------------------------------------------
class Classifier(pl.LightningModule):
    r"""Two GCN layers, no dropout (deterministic), the split picked as PyG examples do."""

    def __init__(self, num_features: int, num_classes: int, split: str = "mask"):
        super().__init__()
        self.conv1 = GCNConv(num_features, 16)
        self.conv2 = GCNConv(16, num_classes)
        self.split = split
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def _nodes(self, batch, name):
        # OGB-style data carries index tensors (data.train_idx), Planetoid masks.
        return batch[f"{name}_idx"] if self.split == "index" else batch[f"{name}_mask"]

    def training_step(self, batch, _):
        nodes = self._nodes(batch, "train")
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[nodes], batch.y[nodes])
        self.log("train_loss", loss, batch_size=1)
        return loss

    def validation_step(self, batch, _):
        nodes = self._nodes(batch, "val")
        self.val_acc(self(batch.x, batch.edge_index)[nodes].argmax(-1), batch.y[nodes])
        self.log("val_acc", self.val_acc, batch_size=1)

    def test_step(self, batch, _):
        nodes = self._nodes(batch, "test")
        self.test_acc(self(batch.x, batch.edge_index)[nodes].argmax(-1), batch.y[nodes])
        self.log("test_acc", self.test_acc, batch_size=1)

    def predict_step(self, batch, _):
        return self(batch.x, batch.edge_index)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01, weight_decay=5e-4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--split", choices=["mask", "index"], default="mask")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    pl.seed_everything(0, verbose=False)
    data = load_cora()
    if args.split == "index":
        for name in ("train", "val", "test"):
            data[f"{name}_idx"] = data[f"{name}_mask"].nonzero().view(-1)
            del data[f"{name}_mask"]
    datamodule = LightningNodeData(data, loader="full")
    module = Classifier(data.num_features, int(data.y.max()) + 1, args.split)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=args.strategy,
                         max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=datamodule)
    val_acc = float(trainer.callback_metrics["val_acc"])
    test_acc = trainer.test(module, datamodule=datamodule, verbose=False)[0]["test_acc"]
    logits = torch.cat(trainer.predict(module, datamodule=datamodule))
    if trainer.is_global_zero:
        torch.save(dict(params={k: v.detach().clone() for k, v in module.state_dict().items()},
                        logits=logits, val_acc=val_acc, test_acc=test_acc,
                        world_size=trainer.world_size,
                        datamodule=type(trainer.datamodule).__name__), args.out)


# -- tests ---------------------------------------------------------------------------------
def _run_script(tmp_path, *args):
    out = tmp_path / f"result-{time.monotonic_ns()}.pt"
    # The default caches: partitions are keyed by the graph's fingerprint, and a fresh one
    # would also recompile the C++ kernels (a minute).
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with open(tmp_path / f"log-{out.stem}.txt", "w+") as log:  # a file: a full pipe would block
        proc = subprocess.run([sys.executable, __file__, "--out", str(out), *args],
                              cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=300)
        log.seek(0)
        assert proc.returncode == 0, log.read()[-4000:]
    return torch.load(out, weights_only=False)


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.multiprocess
@pytest.mark.parametrize("split", ["mask", "index"])
def test_single_device_script_trains_partitioned_with_one_line_changed(tmp_path, split):
    single = _run_script(tmp_path, "--split", split)
    parted = _run_script(tmp_path, "--split", split, "--strategy", "fullgraph", "--devices", "2")
    assert (single["world_size"], parted["world_size"]) == (1, 2)
    assert single["datamodule"] == "LightningNodeData"
    assert parted["datamodule"] == "FullGraphNodeData"  # taken over by the strategy
    errors = {name: _relative(parted["params"][name], p) for name, p in single["params"].items()}
    errors["logits"] = _relative(parted["logits"], single["logits"])
    print(f"max relative error vs one device ({split}):",
          {k: f"{v:.1e}" for k, v in errors.items()})
    assert max(errors.values()) < RTOL, errors
    assert parted["logits"].shape == single["logits"].shape == (2708, 7)  # global node order
    assert parted["val_acc"] == pytest.approx(single["val_acc"], abs=1e-12)
    assert parted["test_acc"] == pytest.approx(single["test_acc"], abs=1e-12)
    assert single["test_acc"] > 0.6  # it did learn


def _refusals(rank, world_size, tmp):
    r"""Each refused set-up on 2 processes; returns what each raised."""
    from torch.utils.data import DataLoader
    from torch_geometric.data import HeteroData
    from torch_geometric.data.lightning import LightningLinkData

    from lightning_fullgraph import FullGraphDataModule

    data = load_cora()
    loader = DataLoader([data], batch_size=None)

    class PlainData(pl.LightningDataModule):
        def train_dataloader(self):
            return loader

    class OwnLoader(Classifier):
        def train_dataloader(self):
            return loader

    hetero = HeteroData()
    hetero["paper"].x, hetero["paper"].train_mask = data.x, data.train_mask
    hetero["paper", "cites", "paper"].edge_index = data.edge_index

    def trainer():
        return pl.Trainer(accelerator="cpu", devices=world_size, strategy="fullgraph",
                          max_epochs=1, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          default_root_dir=tmp, num_sanity_val_steps=0)

    module = Classifier(data.num_features, 7)
    cases = {
        "neighbor": lambda: trainer().fit(module, datamodule=LightningNodeData(
            data, loader="neighbor", num_neighbors=[5, 5], batch_size=64)),
        "plain datamodule": lambda: trainer().fit(module, datamodule=PlainData()),
        "dataloaders to fit": lambda: trainer().fit(module, train_dataloaders=loader),
        "module's dataloader": lambda: trainer().fit(OwnLoader(data.num_features, 7)),
        "hetero": lambda: trainer().fit(module, datamodule=LightningNodeData(
            hetero, loader="full")),
        "link": lambda: trainer().fit(module, datamodule=LightningLinkData(
            data, input_train_edges=data.edge_index, loader="full")),
    }
    raised = {}
    for name, case in cases.items():
        try:
            case()
            raised[name] = "nothing raised"
        except Exception as error:  # noqa: BLE001 - the message is what is checked
            raised[name] = f"{type(error).__name__}: {error}"
    # After a good fit, the trainer still holds the data module: dataloaders passed to
    # predict must not slip through to the model (every rank would get the whole graph).
    fitted = trainer()
    fitted.fit(module, datamodule=FullGraphDataModule(data, cache_dir=tmp + "/cache"))
    try:
        fitted.predict(module, dataloaders=loader)
        raised["dataloaders to predict"] = "nothing raised"
    except Exception as error:  # noqa: BLE001
        raised["dataloaders to predict"] = f"{type(error).__name__}: {error}"
    return raised


@pytest.mark.multiprocess
def test_data_that_would_give_every_rank_the_whole_graph_is_refused_with_the_fix(tmp_path):
    expected = {
        "neighbor": ["LightningNodeData(loader='neighbor') samples neighbourhood mini-batches",
                     "use LightningNodeData(data, loader='full')", "strategy='ddp'"],
        "plain datamodule": ["PlainData would give every rank the whole graph",
                             "datamodule=FullGraphDataModule(data)", "loader='full'"],
        "dataloaders to fit": ["train dataloaders were passed to trainer.fit() directly",
                               "trainer.fit(module, datamodule=FullGraphDataModule(data))"],
        "module's dataloader": ["the LightningModule defines train_dataloader()",
                                "remove it", "datamodule=FullGraphDataModule(data)"],
        "hetero": ["its data is a HeteroData", "homogeneous", "to_homogeneous()"],
        "link": ["LightningLinkData serves edges as training examples", "strategy='ddp'"],
        "dataloaders to predict": ["predict dataloaders were passed to trainer.predict()",
                                   "trainer.predict(module, datamodule=FullGraphDataModule"],
    }
    for raised in run_distributed(_refusals, 2, str(tmp_path), timeout_s=240):
        for name, parts in expected.items():
            assert "needs its data from FullGraphDataModule" in raised[name] \
                or name == "hetero", (name, raised[name])
            for part in parts:
                assert part in raised[name], (name, part, raised[name])


def test_split_inputs_become_masks_and_index_attributes_local_indices(tmp_path):
    # One process, no Trainer: what a rank's batch holds, against the graph it came from.
    from lightning_fullgraph import FullGraphDataModule

    data = load_cora()
    data.valid_idx = data.val_mask.nonzero().view(-1).flip(0)  # OGB's name, any order
    del data.val_mask
    data.class_weight, data.note = torch.ones(7), "graph-level"
    train = data.train_mask.nonzero().view(-1)
    del data.train_mask
    node_data = LightningNodeData(data, input_train_nodes=train, loader="full")
    before = sorted(data.keys())
    dm = FullGraphDataModule.from_node_data(node_data, cache_dir=str(tmp_path))
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert sorted(data.keys()) == before  # the user's Data is not changed
    assert torch.equal(batch.train_mask.nonzero().view(-1), train)  # from input_train_nodes
    assert torch.equal(batch.valid_idx, data.valid_idx.sort().values)  # one rank: all nodes
    assert torch.equal(batch.val_mask.nonzero().view(-1), batch.valid_idx)
    assert batch.note == "graph-level" and torch.equal(batch.class_weight, data.class_weight)
    assert dm.data is data and dm.node_data is node_data
    assert dm.test_dataloader is not None and dm.num_classes == 7

    without_val = load_cora()
    del without_val.val_mask
    no_val = LightningNodeData(without_val, loader="full")  # PyG: no validation loop
    assert no_val.val_dataloader is None
    assert FullGraphDataModule.from_node_data(no_val).val_dataloader is None

    with pytest.raises(ValueError, match="loader='neighbor' samples mini-batches"):
        FullGraphDataModule.from_node_data(LightningNodeData(data, loader="neighbor",
                                                             num_neighbors=[2]))
    with pytest.raises(ValueError, match=r"input_test_nodes holds node indices outside"):
        FullGraphDataModule.from_node_data(LightningNodeData(
            data, input_test_nodes=torch.tensor([5000]), loader="full"))


def test_full_loader_refuses_sampling_arguments_and_sparse_adjacency():
    # PyG's own full loader fails on num_neighbors (a TypeError from torch's DataLoader) and
    # resets batch_size/num_workers with its own warning; the partitioned replacement never
    # builds that loader, so it refuses the sampling arguments itself, naming them and the fix.
    import warnings

    import torch_geometric.transforms as T

    from lightning_fullgraph import FullGraphDataModule
    from lightning_fullgraph.engine import SparseAdjacencyError

    data = load_cora()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyG's "Re-setting 'batch_size' to 1"
        node_data = LightningNodeData(data, loader="full", num_neighbors=[10, 5],
                                      batch_size=32, num_workers=2)
        eval_only = LightningNodeData(data, loader="full",
                                      eval_loader_kwargs={"subgraph_type": "induced"})
    with pytest.raises(ValueError, match=r"'LightningNodeData' with loader='full' does not "
                                         r"sample mini-batches, so it does not take "
                                         r"'num_neighbors'.*remove it from LightningNodeData"
                                         r".*loader='neighbor' with strategy='ddp'"):
        FullGraphDataModule.from_node_data(node_data)
    with pytest.raises(ValueError, match="does not take 'subgraph_type'"):
        FullGraphDataModule.from_node_data(eval_only)
    # What PyG's full loader takes stays accepted.
    FullGraphDataModule.from_node_data(LightningNodeData(data, loader="full", timeout=5))
    # gcn2_cora.py's T.ToSparseTensor(): the documented error, before anything is partitioned.
    sparse = LightningNodeData(T.ToSparseTensor()(load_cora()), loader="full")
    with pytest.raises(SparseAdjacencyError, match=r"data.adj_t is a sparse adjacency"):
        FullGraphDataModule.from_node_data(sparse)


if __name__ == "__main__":
    main()
