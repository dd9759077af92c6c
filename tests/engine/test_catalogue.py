"""PyG's whole conv catalogue: every layer exact under partitioned execution or refused.

The catalogue is read from ``torch_geometric.nn.conv.__all__``, so a PyG version with a new
layer fails here (neither verified nor refused) instead of leaving a silent gap.  Each tested
configuration (:mod:`.catalogue`) runs Linear → conv → ReLU → conv → Linear on a skewed
graph with self-loops, duplicate edges and isolated nodes; logits and every parameter's
gradient are compared per tensor with single-process PyG (fp32, 1e-5).
"""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import conv as pyg_conv

from lightning_fullgraph.engine import (EXACT_LAYERS, REFUSED_LAYERS, TRAINING_REFUSED_LAYERS,
                                        FullGraphEngine, UnsupportedLayerError, check_model)
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .catalogue import (CatalogueNet, catalogue, catalogue_graph, coverage_table,
                        degree_histogram, graph_tensors)
from lightning_fullgraph.engine import ExchangeConfig

FP32 = 1e-5
DOCS = Path(__file__).resolve().parents[2] / "docs" / "layers.md"


def _rel(a: torch.Tensor, b: torch.Tensor, scale: float = 0.0) -> float:
    return float((a - b).abs().max() / max(float(b.abs().max()), scale, 1e-12))


def _grad_errors(model, ref, invariant) -> dict:
    r"""Per-parameter relative gradient error; softmax-invariant parameters (gradient
    mathematically zero) relative to the model's largest gradient."""
    largest = max(float(q.grad.abs().max()) for q in ref.parameters() if q.grad is not None)
    errors = {}
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is None or p.grad is None:
            errors[name] = 0.0 if p.grad is None and q.grad is None else float("inf")
            continue
        scale = largest if name.endswith(invariant) and invariant else 0.0
        errors[name] = _rel(p.grad, q.grad, scale)
    return errors


def _compare_catalogue(rank: int, world_size: int, aggregation: str) -> dict:
    torch.manual_seed(0)
    data = catalogue_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    engine = FullGraphEngine(build_local_partitions(data, parts)[rank],
                             exchange=ExchangeConfig(aggregation=aggregation))
    local = engine.data
    results = {}
    for name, entry in catalogue(degree_histogram(data)).items():
        torch.manual_seed(1)
        ref = CatalogueNet(entry, data.num_features, 4)
        model = copy.deepcopy(ref)
        engine.attach(model)
        inference_only = entry.cls.__name__ in TRAINING_REFUSED_LAYERS
        if inference_only:
            ref.eval(), model.eval()
        out_ref = ref(data.x, graph_tensors(data, torch.float32))
        F.cross_entropy(out_ref[data.train_mask], data.y[data.train_mask]).backward()
        out = model(local.x, graph_tensors(local, torch.float32))
        engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
        results[name] = dict(logits=_rel(engine.gather(out), out_ref.detach()),
                             grads=_grad_errors(model, ref, entry.invariant))
        if inference_only:
            model.train()
            try:
                model(local.x, graph_tensors(local, torch.float32))
                results[name]["training_refused"] = ""
            except UnsupportedLayerError as error:
                results[name]["training_refused"] = str(error)
        engine.detach()
    return results


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size,aggregation", [(2, "hybrid"), (3, "hybrid"), (3, "post")])
def test_catalogue_layers_equal_single_process(world_size, aggregation):
    results = run_distributed(_compare_catalogue, world_size, aggregation, timeout_s=600)
    for rank, errors in enumerate(results):
        for name, err in errors.items():
            assert err["logits"] < FP32, (rank, name, err["logits"])
            for param, value in err["grads"].items():
                assert value < FP32, (rank, name, param, value)
            if "training_refused" in err:
                assert "SuperGATConv" in err["training_refused"], (name, err)
                assert "eval" in err["training_refused"], (name, err)


def test_every_catalogue_layer_is_verified_or_refused_with_a_reason():
    tested = {entry.cls for entry in catalogue(torch.ones(1, dtype=torch.long)).values()}
    names = set(pyg_conv.__all__)
    uncovered = sorted(n for n in names if getattr(pyg_conv, n) not in tested
                       and n not in REFUSED_LAYERS)
    assert not uncovered, f"PyG layers neither verified nor refused: {uncovered}"
    verified = {c for c in EXACT_LAYERS if c.__name__ in names}
    assert verified == tested, "EXACT_LAYERS must list exactly the tested conv classes"
    assert not {c.__name__ for c in tested} & set(REFUSED_LAYERS)
    assert len([c for c in tested if c.__name__ not in TRAINING_REFUSED_LAYERS]) >= 40
    for reason in REFUSED_LAYERS.values():
        assert len(reason) > 30  # a reason, not a placeholder


def _bare(cls):
    # check_model looks at types only; some refused layers need packages to be built.
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    return layer


@pytest.mark.parametrize("name", sorted(n for n in REFUSED_LAYERS
                                        if hasattr(pyg_conv, n) and n != "MessagePassing"))
def test_refused_layers_name_the_layer_and_the_reason(name):
    layer = _bare(getattr(pyg_conv, name))
    model = torch.nn.ModuleDict({"block": layer})
    with pytest.raises(UnsupportedLayerError) as info:
        check_model(model)
    message = str(info.value)
    assert f"'block' ({name})" in message
    assert REFUSED_LAYERS[name] in message


def test_a_subclass_of_a_refused_layer_is_refused_and_trust_overrides():
    class MyGPS(pyg_conv.GPSConv):
        pass

    model = torch.nn.ModuleDict({"g": _bare(MyGPS)})
    with pytest.raises(UnsupportedLayerError, match="global attention"):
        check_model(model)
    check_model(model, trusted_layers=[MyGPS])


def test_coverage_table_in_the_docs_is_current():
    assert DOCS.read_text() == coverage_table(), (
        "docs/layers.md is out of date: run python -m tests.engine.catalogue > docs/layers.md")
