import json

import pytest
import torch

import lightning_fullgraph.partition.store as store
from lightning_fullgraph.partition import (
    FORMAT_VERSION,
    PartitionFormatError,
    PartitionMismatchError,
    StalePartitionError,
    build_local_partitions,
    graph_fingerprint,
    load_partition,
    partition_cache_dir,
    partition_graph,
    read_manifest,
    save_partitions,
)


@pytest.fixture
def saved(tmp_path, graph):
    path = partition_graph(graph, 3, root=tmp_path, progress=False)
    return graph, path


def test_partition_graph_roundtrip(saved, check):
    data, path = saved
    manifest = read_manifest(path)
    assert manifest["num_parts"] == 3 and manifest["format_version"] == FORMAT_VERSION
    assert manifest["fingerprint"] == graph_fingerprint(data)
    assert sorted(manifest["files"]) == [f"part-{r}-of-3.pt" for r in range(3)]
    assert manifest["stats"]["num_edges"] == data.edge_index.size(1)
    locals_ = [load_partition(path, r, num_parts=3, fingerprint=graph_fingerprint(data))
               for r in range(3)]
    parts = torch.empty(data.num_nodes, dtype=torch.long)
    for lp in locals_:
        parts[lp.owned_ids] = lp.rank
    check(data, parts, locals_)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no tmp left


def test_cache_hit_does_not_rerun_metis(tmp_path, graph, monkeypatch):
    calls = []
    real = store.metis_partition
    monkeypatch.setattr(store, "metis_partition", lambda *a, **k: calls.append(1) or real(*a, **k))
    p1 = partition_graph(graph, 2, root=tmp_path, progress=False)
    p2 = partition_graph(graph, 2, root=tmp_path, progress=False)
    assert p1 == p2 and len(calls) == 1
    p3 = partition_graph(graph, 2, root=tmp_path, progress=False, force=True)
    assert p3 == p1 and len(calls) == 2
    p4 = partition_graph(graph, 2, root=tmp_path, progress=False, seed=1)  # new options
    assert p4 != p1 and len(calls) == 3
    load_partition(p3, 1, num_parts=2)


def test_env_cache_root(tmp_path, graph, monkeypatch):
    monkeypatch.setenv("LIGHTNING_FULLGRAPH_CACHE", str(tmp_path / "envroot"))
    path = partition_graph(graph, 2, progress=False)
    assert path.parent == tmp_path / "envroot"


def test_progress_prints_table(tmp_path, graph, capsys):
    partition_graph(graph, 2, root=tmp_path, progress=True)
    out = capsys.readouterr().out
    assert "edge cut" in out and "imbalance" in out


def test_world_size_mismatch(saved):
    _, path = saved
    msg = "made for 3 parts but the world size is 2; re-partition with --parts 2"
    with pytest.raises(PartitionMismatchError, match=msg):
        load_partition(path, 0, num_parts=2)


def test_stale_fingerprint(saved):
    data, path = saved
    other = data.clone()
    other.x = other.x + 1
    fp = graph_fingerprint(other)
    assert fp != graph_fingerprint(data)
    with pytest.raises(StalePartitionError, match="different graph .*delete the directory"):
        load_partition(path, 0, fingerprint=fp)


def test_corrupted_file(saved):
    _, path = saved
    f = path / "part-1-of-3.pt"
    blob = bytearray(f.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    f.write_bytes(bytes(blob))
    with pytest.raises(PartitionFormatError, match="part-1-of-3.pt is corrupted"):
        load_partition(path, 1)
    load_partition(path, 0)  # other ranks unaffected


def test_truncated_file(saved):
    _, path = saved
    f = path / "part-2-of-3.pt"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(PartitionFormatError, match="part-2-of-3.pt is corrupted or truncated"):
        load_partition(path, 2)


def test_missing_file_and_manifest(saved):
    _, path = saved
    (path / "part-0-of-3.pt").unlink()
    with pytest.raises(PartitionFormatError, match="part-0-of-3.pt is missing"):
        load_partition(path, 0)
    (path / "manifest.json").unlink()
    with pytest.raises(PartitionFormatError, match="no partition manifest"):
        load_partition(path, 1)


def test_wrong_format_version(saved):
    _, path = saved
    m = json.loads((path / "manifest.json").read_text())
    m["format_version"] = 99
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PartitionFormatError, match="format version 99"):
        load_partition(path, 0)


def test_garbage_manifest(saved):
    _, path = saved
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(PartitionFormatError, match="manifest.json is unreadable"):
        load_partition(path, 0)


def test_incomplete_cache_is_rebuilt(tmp_path, graph, monkeypatch):
    path = partition_graph(graph, 2, root=tmp_path, progress=False)
    (path / "manifest.json").unlink()  # e.g. crashed writer from an old version
    calls = []
    real = store.metis_partition
    monkeypatch.setattr(store, "metis_partition", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert partition_graph(graph, 2, root=tmp_path, progress=False) == path
    assert len(calls) == 1
    load_partition(path, 0, num_parts=2)


def test_save_partitions_direct(tmp_path, graph):
    parts = torch.arange(graph.num_nodes) % 2
    lps = build_local_partitions(graph, parts, fingerprint="abc", options={"k": 1})
    save_partitions(tmp_path / "d", iter(lps))
    lp = load_partition(tmp_path / "d", 1, num_parts=2, fingerprint="abc")
    assert torch.equal(lp.send_index, lps[1].send_index) and lp.options == {"k": 1}
    with pytest.raises(ValueError, match="expected ranks"):
        save_partitions(tmp_path / "e", lps[:1])


def test_cache_dir_key(tmp_path):
    a = partition_cache_dir(tmp_path, "f" * 64, 2, {"seed": 0})
    assert a == partition_cache_dir(tmp_path, "f" * 64, 2, {"seed": 0})
    assert a != partition_cache_dir(tmp_path, "f" * 64, 4, {"seed": 0})
    assert a != partition_cache_dir(tmp_path, "f" * 64, 2, {"seed": 1})
    assert a != partition_cache_dir(tmp_path, "e" * 64, 2, {"seed": 0})


def test_fingerprint_sensitivity(graph):
    fp = graph_fingerprint(graph)
    assert fp == graph_fingerprint(graph.clone())
    for mutate in (
        lambda d: d.edge_index.__setitem__((0, 0), (int(d.edge_index[0, 0]) + 1) % d.num_nodes),
        lambda d: d.train_mask.__setitem__(0, not bool(d.train_mask[0])),
        lambda d: d.y.__setitem__(0, int(d.y[0]) + 1),
        lambda d: setattr(d, "extra", torch.zeros(d.num_nodes)),
    ):
        d = graph.clone()
        mutate(d)
        assert graph_fingerprint(d) != fp


def test_picklable(graph):
    import pickle
    lp = build_local_partitions(graph, torch.arange(graph.num_nodes) % 2)[0]
    back = pickle.loads(pickle.dumps(lp))
    assert torch.equal(back.edge_index, lp.edge_index)


def test_publish_race_and_force(tmp_path, graph):
    # A concurrent writer already published the same partition: ours is dropped.
    target = partition_graph(graph, 2, root=tmp_path, progress=False)
    before = (target / "part-0-of-2.pt").stat().st_mtime_ns
    tmp = tmp_path / ".tmp-copy"
    save_partitions(tmp, build_local_partitions(graph, torch.arange(graph.num_nodes) % 2,
                                                fingerprint=graph_fingerprint(graph)))
    store._publish(tmp, target, False, 2, graph_fingerprint(graph))
    assert not tmp.exists() and (target / "part-0-of-2.pt").stat().st_mtime_ns == before
    # force replaces the published directory.
    save_partitions(tmp, build_local_partitions(graph, torch.arange(graph.num_nodes) % 2,
                                                fingerprint=graph_fingerprint(graph)))
    store._publish(tmp, target, True, 2, graph_fingerprint(graph))
    assert not tmp.exists()
    owned0 = load_partition(target, 0, num_parts=2).owned_ids
    assert torch.equal(owned0, torch.arange(0, graph.num_nodes, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_partition_graph_rejects_too_many_parts(tmp_path, graph):
    with pytest.raises(ValueError, match=f"cannot split {graph.num_nodes} nodes"):
        partition_graph(graph, graph.num_nodes + 1, root=tmp_path, progress=False)
    assert not any(tmp_path.iterdir())


@pytest.mark.multiprocess
def test_concurrent_writers(tmp_path, graph):
    # Two processes partition the same graph into the same cache at once; both
    # must end up with the same, complete directory and no temporaries remain.
    import subprocess
    import sys
    torch.save(graph.to_dict(), tmp_path / "g.pt")
    root = tmp_path / "cache"
    code = (
        "import sys, torch; from torch_geometric.data import Data;"
        "from lightning_fullgraph.partition import partition_graph;"
        f"d = Data.from_dict(torch.load(r'{tmp_path / 'g.pt'}', weights_only=False));"
        f"print(partition_graph(d, 3, root=r'{root}', progress=False))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    paths = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(paths) == 1
    path = paths.pop()
    assert [p.name for p in root.iterdir()] == [path.rsplit("/", 1)[-1]]
    for r in range(3):
        load_partition(path, r, num_parts=3, fingerprint=graph_fingerprint(graph))
