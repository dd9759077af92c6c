import pytest
import torch

import lightning_fullgraph.data as data_module
from lightning_fullgraph.data import load_cora, load_dataset, synthetic_graph


def test_public_api():
    assert set(data_module.__all__) >= {
        "load_cora", "synthetic_graph", "validate_graph", "GraphReport",
        "GraphValidationError", "GraphWarning", "check_num_parts",
        "load_dataset"
    }
    for name in data_module.__all__:
        assert hasattr(data_module, name)


def assert_same(a, b):
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a.keys():
        assert torch.equal(a[key], b[key]), key


def test_cora_by_name():
    # By name, Cora's features are row-normalized (as PyG's Planetoid examples load it);
    # load_cora() is the raw Planetoid data.
    import torch_geometric.transforms as T
    assert_same(load_dataset(" Cora "), T.NormalizeFeatures()(load_cora()))
    assert_same(load_dataset("cora", normalize_features=False), load_cora())
    assert torch.allclose(load_dataset("cora").x.sum(-1), torch.ones(2708))
    assert not torch.equal(load_dataset("cora").x, load_cora().x)
    spec = "synthetic:nodes=300,degree=4,seed=0"
    assert_same(load_dataset(spec), load_dataset(spec, normalize_features=False))
    with pytest.raises(ValueError, match="normalize_features must be 'auto', True or False"):
        load_dataset("cora", normalize_features="yes")


def test_every_entry_point_loads_the_same_cora():
    # `lightning-fullgraph train` (and the demo), FullGraphDataModule("cora") (the LightningCLI
    # YAML), the Fabric helpers and examples/gcn_cora.py all load Cora by name: one graph,
    # one partition cache key.
    import yaml
    from pathlib import Path

    from lightning_fullgraph import FullGraphDataModule
    from lightning_fullgraph.cli import _load, build_parser
    from lightning_fullgraph.partition import graph_fingerprint
    root = Path(__file__).resolve().parents[2]
    cli = _load(build_parser().parse_args(["train"]))
    config = yaml.safe_load((root / "examples/cli/config.yaml").read_text())["data"]
    module = FullGraphDataModule(**config["init_args"])
    expected = graph_fingerprint(load_dataset("cora"))
    assert graph_fingerprint(cli) == graph_fingerprint(module._global_graph()) == expected
    assert graph_fingerprint(FullGraphDataModule("cora")._global_graph()) == expected
    assert 'load_dataset("cora")' in (root / "examples/gcn_cora.py").read_text()
    raw = FullGraphDataModule("cora", normalize_features=False)._global_graph()
    cli_raw = _load(build_parser().parse_args(["train", "--normalize-features", "no"]))
    assert graph_fingerprint(raw) == graph_fingerprint(cli_raw) == graph_fingerprint(load_cora())


def test_synthetic_spec():
    data = load_dataset("synthetic:nodes=1e3,degree=4,features=8,classes=3,"
                        "communities=6,exponent=2.2,homophily=0.7,noise=0.5,"
                        "train=0.5,val=0.1,seed=7")
    expected = synthetic_graph(1000, avg_degree=4, num_features=8,
                               num_classes=3, num_communities=6,
                               power_law_exponent=2.2, homophily=0.7,
                               feature_noise=0.5, train_ratio=0.5,
                               val_ratio=0.1, seed=7)
    assert_same(data, expected)


def test_synthetic_spec_aliases_and_none():
    data = load_dataset("SYNTHETIC: num_nodes=500, avg_degree=4, "
                        "power_law_exponent=none")
    assert_same(data, synthetic_graph(500, avg_degree=4,
                                      power_law_exponent=None))


@pytest.mark.parametrize("spec, match", [
    ("citeseer", r"unknown dataset 'citeseer'; known datasets: cora, "
     r"synthetic"),
    ("synthetic:nodes=100,colour=3", r"invalid option 'colour=3'.*'degree'"),
    ("synthetic:nodes=100,degree", r"invalid option 'degree'"),
    ("synthetic:nodes=100.5", r"invalid value '100.5' for 'nodes'.*int"),
    ("synthetic:nodes=100,degree=high", r"invalid value 'high' for 'degree'"),
    ("synthetic:degree=10", r"needs the number of nodes"),
    ("synthetic", r"needs the number of nodes"),
    ("cora:seed=1", r"dataset 'cora' takes no options"),
])
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        load_dataset(spec)


def test_non_string():
    with pytest.raises(TypeError, match="dataset must be a str"):
        load_dataset(3)
