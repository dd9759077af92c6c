"""How many collectives a steady-state training step makes, per aggregation mode and option:
the tables of the README and of docs/reductions.md ("Collectives per training step"), checked.

A 2-layer PyG model on 2 ranks (the raw input's aggregation is kept after the first step, so a
step exchanges the hidden layer's rows: one exchange point, forward and backward), a plain
``loss.backward()`` and an optimizer step; collectives are counted on this process with
:func:`lightning_fullgraph.testing.count_collectives`.
"""
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine, HaloCache
from lightning_fullgraph.testing import count_collectives, run_distributed

from .models import rank_partition

ROOT = Path(__file__).resolve().parents[2]

#: Per configuration: collectives of one steady-state step, by kind.  ``exchange``:
#: ``all_to_all_single`` of rows, partial aggregates or cache masks; ``control``: the small
#: all-reduces (static-input reuse agreement, which parameters have gradients); ``gradients``:
#: the gradient all-reduce (one bucket for this model).
EXPECTED = {
    ("gcn", "post"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "hybrid"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "hybrid+int2"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "hybrid+adaptive"): dict(exchange=4, control=3, gradients=1),
    ("gcn", "pre"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "post+int2"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "post+cache"): dict(exchange=4, control=3, gradients=1),
    ("gcn", "post+budgeted"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "post+pipeline"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "post+cache+pipeline"): dict(exchange=4, control=3, gradients=1),
    ("gcn", "post+sampling"): dict(exchange=2, control=3, gradients=1),
    ("gcn", "post+duplex"): dict(exchange=4, control=3, gradients=1),
    ("gcn", "hybrid+duplex"): dict(exchange=4, control=3, gradients=1),
    ("sage", "post"): dict(exchange=2, control=2, gradients=1),
    ("sage", "hybrid"): dict(exchange=2, control=2, gradients=1),
}


def _engine(part, config):
    mode, _, option = config.partition("+")
    kwargs = {"int2": dict(codec="int2"), "adaptive": dict(codec="adaptive"),
              "cache": dict(cache=0.01),
              "budgeted": dict(cache=HaloCache(0.01, budgeted=True)),
              "pipeline": dict(pipeline="async"), "sampling": dict(sampling=0.5),
              "cache+pipeline": dict(cache=0.01, pipeline="async"),
              "duplex": dict(duplex=True)}.get(option, {})
    return FullGraphEngine(part, exchange=ExchangeConfig(aggregation=mode, step_aside=False,
                                                         **kwargs))


def _model(kind, in_channels):
    from torch_geometric.nn.models import GCN, GraphSAGE
    torch.manual_seed(0)
    cls = GCN if kind == "gcn" else GraphSAGE
    return cls(in_channels, 16, 2, 4, dropout=0.0)


def _kind(name, caller):
    if name == "all_to_all_single":
        return "exchange"
    if "_reduce_bucket" in caller:
        return "gradients"
    return "control"


def _count(rank, world_size, kind, config):
    data, part = rank_partition(rank, world_size)
    engine = _engine(part, config)
    model = _model(kind, data.num_features)
    engine.attach(model)
    engine.use_kernels(None)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    local = engine.data

    def step():
        optimizer.zero_grad()
        out = model(local.x, local.edge_index)
        F.cross_entropy(out[local.train_mask], local.y[local.train_mask]).backward()
        optimizer.step()

    for _ in range(3):  # first steps: normalization degrees, unchanged inputs, fresh caches
        step()
    with count_collectives() as log:
        step()
    engine.drain()
    counts = dict(exchange=0, control=0, gradients=0)
    for name, caller in log:
        counts[_kind(name, caller)] += 1
    return counts, [f"{name} <- {caller}" for name, caller in log]


def _count_all(rank, world_size):
    return {key: _count(rank, world_size, *key) for key in EXPECTED}


@pytest.mark.multiprocess
def test_collectives_per_training_step_match_the_table():
    # Every configuration in one pair of processes (a gloo group is set up once).
    results = run_distributed(_count_all, 2)
    for key, expected in EXPECTED.items():
        counts, log = results[0][key]
        assert counts == expected, (key, counts, log)
        assert results[1][key][0] == counts  # every rank makes the same collectives


#: A configuration as the tables write it: a mode, then options joined by "+".
_CONFIG = re.compile(r"`((?:post|pre|hybrid)(?:\+[a-z0-9]+)*)`")
_MODELS = {"GCN": "gcn", "GraphSAGE": "sage"}


def _table(text):
    r"""``{(model, config): counts}`` of the table headed ``model | ExchangeConfig | ...``."""
    rows = {}
    lines = text.split("\n")
    head = next(i for i, line in enumerate(lines) if line.startswith("| model | `ExchangeConfig`"))
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        counts = [int(re.match(r"\d+", c).group()) for c in cells[2:5]]
        for config in _CONFIG.findall(cells[1]):
            key = (_MODELS[cells[0]], config)
            assert key not in rows, f"{key} twice in the table"
            rows[key] = dict(zip(("exchange", "control", "gradients"), counts))
    return rows


@pytest.mark.parametrize("page", ["README.md", "docs/reductions.md"])
def test_the_tables_say_what_the_count_finds(page):
    # The count above checks EXPECTED against the collectives a step makes; this checks that
    # the tables users read are EXPECTED, every configuration in it and nothing else.
    assert _table((ROOT / page).read_text()) == EXPECTED
