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
    assert_same(load_dataset(" Cora "), load_cora())


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
