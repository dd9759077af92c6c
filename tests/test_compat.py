"""The compatibility module: version checks, and the internals it reaches still exist."""
import re
from pathlib import Path

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv

from lightning_fullgraph import compat

ROOT = Path(__file__).resolve().parents[1]


def test_the_declared_lower_bounds_are_the_lowest_tested_versions():
    # pyproject.toml requires the lowest tested release; a newer one installs and warns.
    text = (ROOT / "pyproject.toml").read_text()
    for package, (low, _high) in compat.TESTED_VERSIONS.items():
        assert re.search(rf'"{package}>={re.escape(low)}"', text), package


def test_installed_versions_pass_silently():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", compat.UntestedVersionWarning)
        for package in compat.TESTED_VERSIONS:
            compat._checked.discard(package)
            compat.require(package)


@pytest.mark.parametrize("version", ["2.7.0", "2.7.1", "2.8.1", "2.8.9.dev20270101"])
def test_a_version_inside_the_range_emits_nothing(monkeypatch, version):
    import warnings
    monkeypatch.setattr(compat, "installed_version", lambda package: version)
    compat._checked.discard("torch_geometric")
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            compat.require("torch_geometric")
        assert record == []
    finally:
        compat._checked.discard("torch_geometric")


@pytest.mark.parametrize("version", ["2.9.0", "2.6.1"])
def test_an_untested_version_warns_once_and_does_not_fail(monkeypatch, version):
    monkeypatch.setattr(compat, "installed_version", lambda package: version)
    compat._checked.discard("torch_geometric")
    try:
        with pytest.warns(compat.UntestedVersionWarning) as record:
            compat.require("torch_geometric")
            compat.require("torch_geometric")  # once per package
        assert len(record) == 1
        message = str(record[0].message)
        low, high = compat.TESTED_VERSIONS["torch_geometric"]
        assert f"torch_geometric>={low},<{high}" in message
        assert f"{version} is installed" in message and "issue tracker" in message
    finally:
        compat._checked.discard("torch_geometric")


def test_a_missing_internal_fails_where_it_is_used_naming_the_version(monkeypatch):
    import lightning.fabric.utilities.seed as seed
    monkeypatch.setattr(compat, "installed_version", lambda package: "9.1.0")
    monkeypatch.setattr(compat, "_checked", set(compat.TESTED_VERSIONS))  # no warning here
    monkeypatch.delattr(seed, "_collect_rng_states")
    with pytest.raises(compat.UntestedVersionError, match=r"_collect_rng_states is missing "
                       r"from lightning 9\.1\.0.*tested with lightning>=") as info:
        compat.collect_rng_states()
    assert "issue tracker" in str(info.value)
    assert isinstance(info.value.__cause__, AttributeError)
    # An attribute of PyG's layers (an object without them stands for a PyG that dropped them).
    with pytest.raises(compat.UntestedVersionError, match=r"MessagePassing\._user_args is "
                       r"missing from torch_geometric 9\.1\.0"):
        compat.propagate_source_args(torch.nn.Linear(2, 2))
    with pytest.raises(compat.UntestedVersionError, match=r"_propagate_forward_hooks.*9\.1\.0"):
        compat.hook_dicts(torch.nn.Linear(2, 2), "propagate")


def test_the_version_check_reads_no_environment_variable():
    source = Path(compat.__file__).read_text()
    assert "environ" not in source and "getenv" not in source


def test_pyg_internals_are_where_the_engine_expects_them():
    assert compat.propagate_source_args(GCNConv(4, 4)) == ("x", )
    gat = GATConv(4, 4)
    assert compat.propagate_source_args(gat) == ("x", )
    assert compat.edge_update_source_args(gat) == ("alpha", )
    # Sorted, not a set: ranks must exchange several source tensors in the same order (a
    # set of strings iterates in a per-process order, which silently swapped AGNNConv's
    # x and x_norm between ranks).
    from torch_geometric.nn import AGNNConv, TransformerConv
    assert compat.propagate_source_args(AGNNConv()) == ("x", "x_norm")
    assert compat.propagate_source_args(TransformerConv(4, 4)) == ("key", "value")
    for kind in ("propagate_pre", "propagate", "message_pre", "aggregate",
                 "message_and_aggregate_pre", "edge_update_pre"):
        assert len(compat.hook_dicts(gat, kind)) == 0
    from torch_geometric.nn.conv import sg_conv
    assert sg_conv in list(compat.modules_binding(sg_conv.gcn_norm))


def test_gcn_norm_routing_priority_counting_and_restore(monkeypatch):
    from torch_geometric.nn.conv import appnp, gcn_conv, sg_conv
    pyg = compat.pyg_gcn_norm()
    seen = []

    def first(*args, **kwargs):
        seen.append("first")
        return NotImplemented

    def second(*args, **kwargs):
        seen.append("second")
        return "second's"

    mine = lambda *a, **k: "mine"  # noqa: E731 -- a user's own replacement, left alone
    monkeypatch.setattr(appnp, "gcn_norm", mine)
    compat.route_gcn_norm(second, priority=10)
    compat.route_gcn_norm(first, priority=0)  # routed later, asked first
    try:
        assert sg_conv.gcn_norm is compat.gcn_norm_router() is gcn_conv.gcn_norm
        assert appnp.gcn_norm is mine
        assert sg_conv.gcn_norm(None) == "second's" and seen == ["first", "second"]
        compat.unroute_gcn_norm(second)
        assert sg_conv.gcn_norm is compat.gcn_norm_router()  # first is still routed
        ei = torch.tensor([[0, 1], [1, 0]])
        assert torch.equal(sg_conv.gcn_norm(ei, num_nodes=2)[0], pyg(ei, num_nodes=2)[0])
    finally:
        compat.unroute_gcn_norm(first)
    assert sg_conv.gcn_norm is pyg and gcn_conv.gcn_norm is pyg and appnp.gcn_norm is mine


def test_lightning_and_pymetis_internals_exist():
    assert Path(compat.pymetis_extension_path()).is_file()
    assert hasattr(compat.pymetis_option_indices(), "SEED")
    states = compat.collect_rng_states()
    assert {"torch", "numpy", "python"} <= set(states)
    compat.set_rng_states(states)
    assert compat.fabric_is_using_cli() in (True, False)
