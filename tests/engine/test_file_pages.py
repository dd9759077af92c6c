"""``engine.file_pages``: the pages of a memory-mapped tensor are given back, its values kept;
the static-input memo gives back its kept aggregations' inputs."""
import os
import sys

import pytest
import torch

from lightning_fullgraph.engine.file_pages import release_file_pages
from lightning_fullgraph.engine.static import StaticInputs
from lightning_fullgraph.engine import ExchangeConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="madvise(MADV_PAGEOUT) and /proc/self/pagemap are Linux's")

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident_fraction(t: torch.Tensor) -> float:
    r"""Fraction of the whole pages :obj:`t` spans that are mapped in memory in this process
    (``/proc/self/pagemap``'s present bit; the page cache may keep a file's pages either way)."""
    start = -(-t.data_ptr() // PAGE) * PAGE
    end = (t.data_ptr() + t.numel() * t.element_size()) // PAGE * PAGE
    pages = (end - start) // PAGE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start // PAGE * 8)
        entries = pagemap.read(pages * 8)
    present = sum(entries[8 * i + 7] >> 7 for i in range(pages))
    return present / pages


def _mapped(tmp_path, rows=4096, name="x.pt"):
    torch.manual_seed(0)
    torch.save({"x": torch.randn(rows, 256)}, tmp_path / name)  # 4 MiB
    # On disk before it is mapped, as a partition written earlier is: the kernel reclaims
    # clean pages of a file, not ones still waiting to be written.
    fd = os.open(tmp_path / name, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    x = torch.load(tmp_path / name, mmap=True, weights_only=True)["x"]
    x.sum()  # read every page once
    return x


def test_a_mapped_tensors_pages_are_given_back_and_its_values_kept(tmp_path):
    x = _mapped(tmp_path)
    expected = torch.load(tmp_path / "x.pt", weights_only=True)["x"]  # a copy in memory
    assert _resident_fraction(x) == 1.0
    released = release_file_pages(x)
    assert released >= x.numel() * x.element_size() - 2 * PAGE
    assert _resident_fraction(x) < 0.05
    assert torch.equal(x, expected)  # read again from the file
    assert _resident_fraction(x) == 1.0


def test_in_place_edits_are_never_lost(tmp_path):
    x = _mapped(tmp_path)
    x[::64].mul_(-3.0)  # copy-on-write pages of the private mapping: anonymous now
    edited = x.clone()
    release_file_pages(x)
    assert torch.equal(x, edited)


def test_a_view_gives_back_its_own_pages_only(tmp_path):
    x = _mapped(tmp_path)
    half = x.size(0) // 2
    assert release_file_pages(x[:half]) > 0
    assert _resident_fraction(x[:half]) < 0.05
    assert _resident_fraction(x[half + 16:]) == 1.0  # the other half is untouched


def test_memory_not_mapped_from_a_file_is_left_alone():
    x = torch.randn(4096, 256)
    assert release_file_pages(x) == 0
    assert _resident_fraction(x) == 1.0
    assert release_file_pages(torch.empty(0)) == 0
    assert release_file_pages(torch.randn(8, 8).to_sparse()) == 0
    assert release_file_pages("not a tensor") == 0


@pytest.mark.parametrize("release", [True, False])
def test_the_static_cache_gives_back_a_kept_aggregations_inputs(tmp_path, release):
    x = _mapped(tmp_path)
    cache = StaticInputs(release_inputs=release)  # one process: agreements need no peers
    first = cache.aggregation("conv.propagate0.train", (x, ), lambda: x.sum(0) * 2)
    assert torch.equal(first, torch.load(tmp_path / "x.pt", weights_only=True)["x"].sum(0) * 2)
    if release:
        assert cache.released_bytes > 0 and _resident_fraction(x) < 0.05
    else:
        assert cache.released_bytes == 0 and _resident_fraction(x) == 1.0
    # Reused from its storage and version: the input's pages are not read again.
    again = cache.aggregation("conv.propagate0.train", (x, ), lambda: x.sum(0) * 2)
    assert again is first and cache.hits == 1
    if release:
        assert _resident_fraction(x) < 0.05


def _train_from_disk(rank, world_size, pdir, release):
    import torch.nn.functional as F
    from torch_geometric.nn.models import GCN

    from lightning_fullgraph.data.synthetic import synthetic_graph
    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.partition import load_partition
    part = load_partition(pdir, rank, num_parts=world_size)  # torch.load(mmap=True)
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="hybrid"))
    engine.static.release_inputs = release
    data = engine.data
    torch.manual_seed(1)
    model = GCN(data.num_features, 16, 2, 4)
    engine.attach(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses, resident = [], []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(data.x, data.edge_index)[data.train_mask],
                               data.y[data.train_mask])
        engine.backward(loss)
        opt.step()
        losses.append(float(loss))
        resident.append(_resident_fraction(data.x))
    graph = synthetic_graph(6000, avg_degree=6.0, num_features=128, num_classes=4, seed=0)
    return dict(losses=losses, resident=resident, released=engine.static.released_bytes,
                hits=engine.static.hits, x_kept=torch.equal(data.x, graph.x[part.owned_ids]))


def test_ranks_give_back_their_loaded_features_once_aggregated(tmp_path):
    from lightning_fullgraph.data.synthetic import synthetic_graph
    from lightning_fullgraph.partition import partition_graph
    from lightning_fullgraph.testing import run_distributed
    graph = synthetic_graph(6000, avg_degree=6.0, num_features=128, num_classes=4, seed=0)
    pdir = partition_graph(graph, 2, root=tmp_path, seed=0, progress=False)
    os.sync()  # written pages are reclaimed once on disk (a partition written earlier is)
    kept = run_distributed(_train_from_disk, 2, str(pdir), False)
    given = run_distributed(_train_from_disk, 2, str(pdir), True)
    for off, on in zip(kept, given):
        assert on["losses"] == off["losses"]  # the same computation, bit for bit
        assert on["x_kept"] and off["x_kept"]
        assert off["released"] == 0 and min(off["resident"]) > 0.9
        # GCNConv aggregates the loaded features first from step one (reorder.py), keeps
        # the aggregate and gives the features' pages back; later steps do not read them.
        assert on["released"] > 0 and max(on["resident"]) < 0.25, on  # (edge folios stay)
        assert on["hits"] >= 2
