import os
import os.path as osp
import shutil

import torch
from torch_geometric.datasets import Planetoid

from lightning_fullgraph.data import load_cora, validate_graph
from lightning_fullgraph.data.cora import CORA_RAW_DIR

PACKAGE_CORA = osp.dirname(CORA_RAW_DIR)


def _snapshot(root):
    return sorted((dirpath, tuple(sorted(files)))
                  for dirpath, _, files in os.walk(root)
                  if "__pycache__" not in dirpath)


def test_load_cora_equals_planetoid(tmp_path):
    before = _snapshot(PACKAGE_CORA)
    # Planetoid finds the raw files in place and skips the download.
    shutil.copytree(CORA_RAW_DIR, tmp_path / "Cora" / "raw")
    expected = Planetoid(str(tmp_path), "Cora")[0]
    data = load_cora()

    assert sorted(data.keys()) == sorted(expected.keys())
    for key in expected.keys():
        assert data[key].dtype == expected[key].dtype, key
        assert torch.equal(data[key], expected[key]), key
    assert data.num_nodes == 2708
    assert data.edge_index.size(1) == 10556
    assert data.x.size(1) == 1433
    assert int(data.y.max()) + 1 == 7
    assert [int(data[m].sum()) for m in ("train_mask", "val_mask",
                                         "test_mask")] == [140, 500, 1000]
    # Loading never writes into the package (no processed/ directory).
    assert _snapshot(PACKAGE_CORA) == before


def test_load_cora_returns_independent_copies():
    data = load_cora()
    data.x.zero_()
    data.train_mask.fill_(True)
    fresh = load_cora()
    assert fresh.x.sum() > 0
    assert int(fresh.train_mask.sum()) == 140


def test_cora_is_valid_without_warnings(recwarn):
    report = validate_graph(load_cora(), num_classes=7, strict=True)
    assert not report.is_directed and report.num_isolated_nodes == 0
    assert report.mask_counts == {"train_mask": 140, "val_mask": 500,
                                  "test_mask": 1000}


def test_cora_ships_licence_and_attribution():
    assert "MIT License" in open(osp.join(PACKAGE_CORA, "LICENSE")).read()
    readme = open(osp.join(PACKAGE_CORA, "README.md")).read()
    for needle in ("Yang", "2016", "Sen", "2008", "LICENSE"):
        assert needle in readme
    assert sorted(os.listdir(CORA_RAW_DIR)) == sorted(
        f"ind.cora.{n}"
        for n in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"))
