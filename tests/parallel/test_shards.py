"""Graph shards (ScaleGNN Alg. 2): stratified sampling stays unbiased; each process's part of a
batch, extracted from its tiles alone, is the whole batch's restricted to its blocks, edge for
edge; a model split over the grid and fed the shards equals one process on the whole batch;
a process holds a fraction of the graph."""
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN

from lightning_fullgraph.parallel import (FourDDims, GraphShard, Grid3DGCN, Grid3DScaleGNN,
                                          ScaleGNN, ShardPlan, UniformVertexSampler,
                                          write_shards)
from lightning_fullgraph.parallel.mesh import FourDMesh
from lightning_fullgraph.parallel.pmm import block
from lightning_fullgraph.parallel.sampling import stratified_nodes, strata_bounds
from lightning_fullgraph.parallel.shards import plan_for, read_meta
from lightning_fullgraph.testing import run_distributed

from .graphs import random_graph

N, E, F, CLASSES, B = 61, 300, 10, 3, 30


def _data():
    ei, x, y, g = random_graph(N, E, F, CLASSES, seed=3)
    return Data(x=x, edge_index=ei, y=y, train_mask=torch.rand(N, generator=g) < 0.5,
                num_nodes=N)


def _coords(parts_grid, rank):
    sizes = dict(zip("xyz", parts_grid))
    dims = FourDDims.of(1, parts_grid)
    return sizes, dims.coordinates(rank)


def test_stratified_sample_takes_each_ranges_share_and_one_stratum_is_uniform():
    nodes = stratified_nodes(N, B, 4, seed=0, replica=0, step=5)
    n, b = strata_bounds(N, 4), strata_bounds(B, 4)
    for j in range(4):
        part = nodes[int(b[j]):int(b[j + 1])]
        assert bool(((part >= n[j]) & (part < n[j + 1])).all())
    assert bool((nodes.diff() > 0).all())
    g = torch.Generator().manual_seed(
        __import__("lightning_fullgraph.parallel.sampling", fromlist=["x"]).sample_seed(0, 0, 5))
    assert torch.equal(stratified_nodes(N, B, 1, 0, 0, 5),
                       torch.randperm(N, generator=g)[:B].sort().values)


def test_stratified_rescaling_is_unbiased():
    # E[sum over the sampled in-neighbours of ã x | v sampled] = sum of a x, per vertex.
    data = _data()
    sampler = UniformVertexSampler(data.edge_index, N, B, strata=4, dtype=torch.float64)
    full = sampler.full()
    x = torch.randn(N, dtype=torch.float64)
    exact = torch.zeros(N, dtype=torch.float64).index_add_(
        0, full.edge_index[1], full.edge_weight * x[full.edge_index[0]])
    total, count = torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
    for step in range(4000):
        sub = sampler.sample(step)
        agg = torch.zeros(sub.num_nodes, dtype=torch.float64).index_add_(
            0, sub.edge_index[1], sub.edge_weight * x[sub.nodes][sub.edge_index[0]])
        total[sub.nodes] += agg
        count[sub.nodes] += 1
    mean = total / count
    assert float((mean - exact).abs().max() / exact.abs().max()) < 0.05


@pytest.mark.parametrize("grid,model", [((2, 2, 1), "gcn"), ((2, 1, 2), "scalegnn"),
                                        ((1, 2, 2), "gcn"), ((2, 2, 1), "rows")])
def test_a_process_extracts_its_blocks_of_the_batch(tmp_path, grid, model):
    data = _data()
    parts = grid[0] * grid[1] * grid[2]
    write_shards(data, tmp_path, parts)
    sampler = UniformVertexSampler(data.edge_index, N, B, strata=parts)
    layout = {"gcn": (("x", "y"), 2), "scalegnn": (("x", "z"), 3), "rows": ((None, None), 1)}
    (rows_axis, cols_axis), layers = layout[model]

    class Split:  # what GridModule.shard_layout names, without building a mesh
        def shard_layout(self):
            from lightning_fullgraph.parallel.pmm import layer_axes
            return (rows_axis, cols_axis), frozenset(
                (layer_axes(l)[2], layer_axes(l)[0]) for l in range(1, layers + 1))

    for rank in range(parts):
        sizes, coords = _coords(grid, rank)
        plan = plan_for(sizes, coords, [Split()])
        shard = GraphShard(tmp_path, plan)
        for step, (mine, whole) in enumerate([(shard.sample(s, 1, B), sampler.sample(s, 1))
                                              for s in range(3)] + [(shard.full(), None)]):
            if whole is None:
                sub = sampler.full()
                nodes, n = sub.nodes, N
            else:
                sub, nodes, n = whole, whole.nodes, B
            assert torch.equal(mine.n_id, nodes)
            assert torch.equal(mine.y, data.y[nodes])
            assert torch.equal(mine.train_mask, data.train_mask[nodes])
            cut = lambda size_axis: slice(0, n) if size_axis is None else \
                block(n, sizes[size_axis], coords[size_axis])  # noqa: E731
            fcut = lambda a: slice(0, F) if a is None else block(F, sizes[a], coords[a])  # noqa
            assert torch.equal(mine.x, data.x[nodes][cut(rows_axis), fcut(cols_axis)])
            src, dst = sub.edge_index
            wanted = torch.zeros(src.numel(), dtype=torch.bool)
            for d, s in plan.pairs:
                rd, rs = cut(d), cut(s)
                block_edges = (dst >= rd.start) & (dst < rd.stop) & (src >= rs.start) & \
                    (src < rs.stop)
                wanted |= block_edges
            order = torch.argsort(dst[wanted] * n + src[wanted])
            assert torch.equal(mine.edge_index, sub.edge_index[:, wanted][:, order]), \
                (rank, step)
            assert torch.allclose(mine.edge_weight, sub.edge_weight[wanted][order],
                                  rtol=0, atol=0), (rank, step)


def test_a_process_holds_a_fraction_of_the_graph(tmp_path):
    data = _data()
    write_shards(data, tmp_path, 4)
    sizes, coords = _coords((2, 2, 1), 0)

    class Gcn:
        def shard_layout(self):
            return ("x", "y"), frozenset({("z", "x"), ("y", "z")})

    shard = GraphShard(tmp_path, plan_for(sizes, coords, [Gcn()]))
    whole = GraphShard(tmp_path, ShardPlan(sizes, coords))
    edges = lambda s: sum(int(t[1].numel()) for t in s.tiles.values())  # noqa: E731
    assert edges(shard) < 0.8 * edges(whole)  # 12 of the 16 tiles
    assert tuple(shard.x.shape) == (30, 5) and tuple(whole.x.shape) == (N, F)


def test_shards_are_written_once_and_nothing_else_is_overwritten(tmp_path):
    data = _data()
    out = write_shards(data, tmp_path, 2)
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert write_shards(data, tmp_path, 2) == out
    assert (out / "meta.json").stat().st_mtime_ns == stamp
    assert read_meta(tmp_path, 2)["num_nodes"] == N
    (tmp_path / "grid-4").mkdir()
    (tmp_path / "grid-4" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="move it"):
        write_shards(data, tmp_path, 4)
    assert (tmp_path / "grid-4" / "mine.txt").read_text() == "keep"
    with pytest.raises(FileNotFoundError, match="write_shards"):
        GraphShard(tmp_path, ShardPlan({"x": 2, "y": 4, "z": 1}, {"x": 0, "y": 0, "z": 0}))


def _split_on_shards(rank, world_size, root, grid, kind):
    mesh = FourDMesh.create(FourDDims.of(1, grid))
    torch.manual_seed(0)
    make = (lambda: GCN(F, 8, 2, CLASSES, normalize=False)) if kind == "gcn" else \
        (lambda: ScaleGNN(F, 8, 3, CLASSES, dropout=0.0))
    ref = make()
    torch.manual_seed(0)
    split = Grid3DGCN(make(), mesh) if kind == "gcn" else \
        Grid3DScaleGNN(make(), mesh, gather_output=True)
    axes = ("x", "y", "z")
    shard = GraphShard(root, plan_for({a: mesh.size(a) for a in axes},
                                      {a: mesh.coordinate(a) for a in axes}, [split]))
    sampler = UniformVertexSampler(_data().edge_index, N, B, strata=world_size)
    data = _data()
    errors = {}
    for step in range(2):
        batch, sub = shard.sample(step, 0, B), sampler.sample(step, 0)
        split.bind_input(batch.num_nodes, batch.x.shape)
        out = split(batch.x, batch.edge_index, batch.edge_weight)
        ref_out = ref(data.x[sub.nodes], sub.edge_index, sub.edge_weight)
        torch.nn.functional.cross_entropy(out, batch.y).backward()
        torch.nn.functional.cross_entropy(ref_out, data.y[sub.nodes]).backward()
        errors[f"logits {step}"] = float((out - ref_out).abs().max())
    split.reduce_gradients()
    grads = dict(ref.named_parameters())
    for name, param, index in split.blocks():
        info = split._blocks[name]
        full = grads[info.key].grad
        full = full.t() if info.transpose else full
        errors[name] = float((param.grad - full[index]).abs().max())
    split.eval(), ref.eval()
    batch = shard.full()
    split.bind_input(batch.num_nodes, batch.x.shape)
    whole = sampler.full()
    with torch.no_grad():
        errors["eval"] = float((split(batch.x, batch.edge_index, batch.edge_weight)
                                - ref(data.x, whole.edge_index, whole.edge_weight)).abs().max())
    return errors


@pytest.mark.parametrize("grid,kind", [((2, 2, 1), "gcn"), ((2, 1, 2), "scalegnn")])
def test_split_model_on_shards_equals_one_process(tmp_path, grid, kind):
    write_shards(_data(), tmp_path, 4)
    for errors in run_distributed(_split_on_shards, 4, str(tmp_path), grid, kind,
                                  timeout_s=240):
        assert max(errors.values()) <= 1e-5, errors


def test_the_data_module_writes_missing_shards_only_from_data_it_was_given(tmp_path):
    from lightning_fullgraph.data.sampled import ShardedNodeDataModule
    empty = ShardedNodeDataModule(tmp_path / "none")
    with pytest.raises(FileNotFoundError, match="pass data="):
        empty.prepare_data()
    with pytest.raises(FileNotFoundError, match="prepare_data writes them"):
        empty.num_nodes
    module = ShardedNodeDataModule(tmp_path / "shards", data=_data, seed=2)
    module.prepare_data()  # outside a Trainer: one process, one range
    assert (module.num_nodes, module.num_features, module.batch_size) == (N, F, N // 2)
    batch = module.full_batch()
    assert torch.equal(batch.x, _data().x) and not batch.grid_input_block
    first = [module.draw(s, 0) for s in range(2)]
    sampler = UniformVertexSampler(_data().edge_index, N, N // 2, seed=2)
    assert all(torch.equal(b.n_id, sampler.nodes(s)) for s, b in enumerate(first))


def test_an_edited_graph_is_refused_not_trained_on_stale_shards(tmp_path):
    from lightning_fullgraph.data.sampled import ShardedNodeDataModule
    data = _data()
    write_shards(data, tmp_path, 2)
    edited = _data()
    edited.x[0, 0] += 1.0
    with pytest.raises(ValueError, match="shards of another graph"):
        write_shards(edited, tmp_path, 2)
    # Outside a Trainer the data module cuts one range (grid-1).
    ShardedNodeDataModule(tmp_path, data=_data()).prepare_data()
    stamp = (tmp_path / "grid-1" / "meta.json").stat().st_mtime_ns
    with pytest.raises(ValueError, match="shards of another graph"):
        ShardedNodeDataModule(tmp_path, data=edited).prepare_data()
    ShardedNodeDataModule(tmp_path, data=_data()).prepare_data()  # the same graph: kept
    assert (tmp_path / "grid-1" / "meta.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="weight dtype"):
        write_shards(data, tmp_path, 2, dtype=torch.float64)
