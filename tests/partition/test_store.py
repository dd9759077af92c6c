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


def test_objective_is_part_of_the_cache_key(tmp_path, graph, monkeypatch):
    seen = []
    real = store.metis_partition
    monkeypatch.setattr(store, "metis_partition",
                        lambda *a, **k: seen.append(k["objective"]) or real(*a, **k))
    vol = partition_graph(graph, 2, root=tmp_path, progress=False)
    cut = partition_graph(graph, 2, root=tmp_path, progress=False, objective="cut")
    assert vol != cut and seen == ["vol", "cut"]
    assert read_manifest(vol)["options"]["objective"] == "vol"
    assert read_manifest(cut)["options"]["objective"] == "cut"
    with pytest.raises(ValueError, match="unknown METIS objective 'edges'"):
        partition_graph(graph, 2, root=tmp_path, progress=False, objective="edges")


def test_env_cache_root(tmp_path, graph, monkeypatch):
    monkeypatch.setenv("LIGHTNING_FULLGRAPH_CACHE", str(tmp_path / "envroot"))
    path = partition_graph(graph, 2, progress=False)
    # The library's one cache directory: partitions in partitions/, the kernels in ext/.
    assert path.parent == tmp_path / "envroot" / "partitions"


def test_progress_prints_table_to_stderr(tmp_path, graph, capsys):
    # stdout stays free for results (`lightning-fullgraph train --json`).
    partition_graph(graph, 2, root=tmp_path, progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "[partition] METIS" in captured.err
    assert "edge cut" in captured.err and "imbalance" in captured.err
    partition_graph(graph, 2, root=tmp_path, progress=True)  # cache hit
    captured = capsys.readouterr()
    assert captured.out == "" and "[partition] reusing cached partition" in captured.err


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
        # Content of every tensor, not only x, y, masks and edge_index:
        lambda d: d.edge_weight.__setitem__(0, 5.0),
        lambda d: d.edge_attr.__setitem__((1, 2), 7.0),
        lambda d: setattr(d, "pos", torch.zeros(d.num_nodes, 2)),
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


# -- stale partitions: every copied tensor is in the fingerprint -----------------------

def _value_on_rank(path, num_parts, key, edge):
    r"""The row of edge-level attribute ``key`` of global edge ``edge``, read
    from the rank that holds the edge."""
    for r in range(num_parts):
        lp = load_partition(path, r, num_parts=num_parts)
        hit = (lp.edge_ids == edge).nonzero().flatten()
        if hit.numel():
            return lp.edge_attrs[key][int(hit[0])]
    raise AssertionError(f"no rank holds edge {edge}")


@pytest.mark.parametrize("key, index, value", [
    ("edge_weight", (0,), 5.0),        # [E]
    ("edge_attr", (0, 2), 7.0),        # [E, 3]
])
def test_in_place_edit_of_edge_attribute_is_not_served_stale(tmp_path, graph, key,
                                                             index, value):
    before = partition_graph(graph, 3, root=tmp_path, progress=False)
    assert _value_on_rank(before, 3, key, 0)[index[1:]] != value
    graph[key][index] = value  # in place: shape, dtype and name unchanged
    after = partition_graph(graph, 3, root=tmp_path, progress=False)
    assert after != before  # a cache miss, not the old directory
    row = _value_on_rank(after, 3, key, 0)
    assert float(row[index[1:]]) == value
    # Every rank holds the current values of every edge- and node-level tensor.
    for r in range(3):
        lp = load_partition(after, r, num_parts=3, fingerprint=graph_fingerprint(graph))
        for k, v in lp.edge_attrs.items():
            assert torch.equal(v, graph[k][lp.edge_ids]), k
        for k, v in lp.node_attrs.items():
            assert torch.equal(v, graph[k][lp.owned_ids]), k


def test_in_place_edit_of_other_node_attribute_is_not_served_stale(tmp_path, graph):
    graph.node_weight = torch.ones(graph.num_nodes)
    before = partition_graph(graph, 2, root=tmp_path, progress=False)
    graph.node_weight[3] = 9.0
    after = partition_graph(graph, 2, root=tmp_path, progress=False)
    assert after != before
    for r in range(2):
        lp = load_partition(after, r, num_parts=2)
        assert torch.equal(lp.node_attrs["node_weight"], graph.node_weight[lp.owned_ids])


def _fingerprint_v1(data):
    # The previous definition (content of x, y, masks and edge_index only).
    import hashlib

    from lightning_fullgraph.partition.fingerprint import hash_tensor
    h = hashlib.sha256()
    h.update(b"lightning-fullgraph-graph-v1|")
    h.update(f"num_nodes={int(data.num_nodes)}|".encode())
    hash_tensor(h, data.edge_index)
    for key in sorted(k for k in data.keys() if k != "edge_index"):
        value = data[key]
        if isinstance(value, torch.Tensor):
            h.update(f"{key}:{tuple(value.shape)}:{value.dtype}|".encode())
            if key in ("x", "y") or key.endswith("mask") or value.dtype == torch.bool:
                hash_tensor(h, value)
        elif isinstance(value, (int, float, str, bool)):
            h.update(f"{key}={value!r}|".encode())
    return h.hexdigest()


def test_fingerprint_version_makes_old_caches_misses(graph):
    # Also for graphs whose tensors v1 already hashed in full: a cache
    # directory keyed by a v1 fingerprint is never looked up again.
    del graph.edge_weight, graph.edge_attr
    assert graph_fingerprint(graph) != _fingerprint_v1(graph)


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")
def test_fingerprint_of_sparse_attribute(graph):
    graph.adj = torch.sparse_coo_tensor(graph.edge_index, torch.ones(graph.num_edges),
                                        (graph.num_nodes, graph.num_nodes))
    fp = graph_fingerprint(graph)
    other = graph.clone()
    other.adj = torch.sparse_coo_tensor(graph.edge_index, torch.full((graph.num_edges,), 2.0),
                                        (graph.num_nodes, graph.num_nodes))
    assert graph_fingerprint(other) != fp
    csr = graph.clone()
    csr.adj = graph.adj.to_sparse_csr()
    assert graph_fingerprint(csr) != fp  # another layout, same values
    assert graph_fingerprint(csr) == graph_fingerprint(csr.clone())


# -- a part file must belong to its manifest -----------------------------------------

def _set_manifest_digest(path, name):
    import hashlib
    m = json.loads((path / "manifest.json").read_text())
    m["files"][name] = hashlib.sha256((path / name).read_bytes()).hexdigest()
    (path / "manifest.json").write_text(json.dumps(m))


def test_part_file_of_another_graph_is_refused(tmp_path, make_graph):
    import shutil
    a, b = make_graph(seed=0), make_graph(seed=1)
    path_a = partition_graph(a, 2, root=tmp_path / "a", progress=False)
    path_b = partition_graph(b, 2, root=tmp_path / "b", progress=False)
    shutil.copyfile(path_b / "part-0-of-2.pt", path_a / "part-0-of-2.pt")
    msg = "part-0-of-2.pt was made for a different graph than its manifest"
    with pytest.raises(StalePartitionError, match=msg + ".*mixes files of two partitions"):
        load_partition(path_a, 0, num_parts=2)
    # Even with a manifest whose sha256 matches the foreign file.
    _set_manifest_digest(path_a, "part-0-of-2.pt")
    with pytest.raises(StalePartitionError, match=msg):
        load_partition(path_a, 0, num_parts=2)
    load_partition(path_a, 1, num_parts=2)  # the other rank is still fine


def test_part_file_with_other_options_is_refused(tmp_path, graph):
    import shutil
    p0 = partition_graph(graph, 2, root=tmp_path, progress=False, seed=0)
    p1 = partition_graph(graph, 2, root=tmp_path, progress=False, seed=1)
    shutil.copyfile(p1 / "part-1-of-2.pt", p0 / "part-1-of-2.pt")
    _set_manifest_digest(p0, "part-1-of-2.pt")
    with pytest.raises(PartitionFormatError, match="other partitioning options than its "
                                                   "manifest"):
        load_partition(p0, 1, num_parts=2)


def test_save_partitions_refuses_options_other_than_the_parts(tmp_path, graph):
    lps = build_local_partitions(graph, torch.arange(graph.num_nodes) % 2,
                                 fingerprint="abc", options={"k": 1})
    with pytest.raises(ValueError, match="differ from the options stored in the partitions"):
        save_partitions(tmp_path / "d", lps, options={"k": 2})


# -- refusing files that need more than weights_only=True ----------------------------

def test_file_with_arbitrary_objects_is_refused_without_unsafe_advice(saved):
    import argparse
    _, path = saved
    state = torch.load(path / "part-0-of-3.pt", weights_only=True)
    state["options"] = argparse.Namespace(seed=0)  # not a tensor / plain container
    torch.save(state, path / "part-0-of-3.pt")
    _set_manifest_digest(path, "part-0-of-3.pt")
    with pytest.raises(PartitionFormatError) as info:
        load_partition(path, 0)
    text = str(info.value)
    assert "holds objects other than tensors and plain containers" in text
    assert "argparse.Namespace" in text
    assert "can run arbitrary code" in text and "lightning-fullgraph partition" in text
    # torch's advice (retry with weights_only=False / allowlist globals) is never relayed.
    for advice in ("weights_only", "add_safe_globals", "safe_globals", "trust"):
        assert advice not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__


# -- unwritable cache directory -------------------------------------------------------

def test_unwritable_cache_dir_is_a_clear_error(tmp_path, graph, read_only):
    from lightning_fullgraph.partition import PartitionError, PartitionWriteError
    root = tmp_path / "cache"
    root.mkdir()
    read_only(root)
    with pytest.raises(PartitionWriteError) as info:
        partition_graph(graph, 2, root=root, progress=False)
    e = info.value
    assert isinstance(e, PartitionError) and isinstance(e, OSError)
    assert isinstance(e.__cause__, PermissionError)
    text = str(e)
    assert f"cannot write partitions to the cache directory {root}: permission denied" in text
    for fix in ("cache_dir=", "LIGHTNING_FULLGRAPH_CACHE", "--cache-dir"):
        assert fix in text
    assert ".tmp-" not in text  # the hidden temporary path is not what the user chose
    assert list(root.iterdir()) == []


def test_unwritable_default_cache_root_names_the_environment_variable(tmp_path, graph,
                                                                       read_only,
                                                                       monkeypatch):
    from lightning_fullgraph.partition import PartitionWriteError
    monkeypatch.setenv("LIGHTNING_FULLGRAPH_CACHE", str(tmp_path / "ro" / "cache"))
    read_only(tmp_path / "ro")  # the root cannot even be created
    with pytest.raises(PartitionWriteError,
                       match=r"cache directory .*ro/cache/partitions \(from the "
                             r"LIGHTNING_FULLGRAPH_CACHE environment variable\)"):
        partition_graph(graph, 2, progress=False)


def test_read_only_cache_with_complete_partition_is_reused(tmp_path, graph, read_only):
    path = partition_graph(graph, 2, root=tmp_path, progress=False)
    read_only(tmp_path)
    assert partition_graph(graph, 2, root=tmp_path, progress=False) == path


# -- format version 2: cut-edge data and aggregation plans ---------------------------

def test_old_format_artifacts_are_refused_with_re_partition(saved):
    _, path = saved
    # A version-1 part file under a current manifest (sha256 made to match).
    state = torch.load(path / "part-0-of-3.pt", weights_only=True)
    state["format_version"] = 1
    for key in ("in_pre", "out_edge_ids", "out_src", "out_dst", "out_dst_rank", "out_pre",
                "out_dst_in_degree", "out_edge_attrs"):
        del state[key]
    torch.save(state, path / "part-0-of-3.pt")
    _set_manifest_digest(path, "part-0-of-3.pt")
    with pytest.raises(PartitionFormatError,
                       match="format version 1 .*reads version 3.*re-partition"):
        load_partition(path, 0)
    # A version-1 manifest.
    m = json.loads((path / "manifest.json").read_text())
    m["format_version"] = 1
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PartitionFormatError,
                       match="format version 1 but this library reads version 3; "
                             "re-partition the graph"):
        load_partition(path, 1)
    # partition_graph does not reuse it.
    assert FORMAT_VERSION == 3


def test_loaded_partitions_carry_cut_edges_and_plans(saved):
    from lightning_fullgraph.partition import (
        LOCAL_FORMAT_VERSION,
        MODES,
        build_local_partitions,
        cut_cover,
    )
    data, path = saved
    assert LOCAL_FORMAT_VERSION == 3
    loaded = [load_partition(path, r, num_parts=3) for r in range(3)]
    parts = torch.empty(data.num_nodes, dtype=torch.long)
    for lp in loaded:
        parts[lp.owned_ids] = lp.rank
    cover = cut_cover(data.edge_index, parts, 3)
    built = build_local_partitions(data, parts, cover=cover)
    for a, b in zip(loaded, built):
        for name in ("in_pre", "out_edge_ids", "out_src", "out_dst", "out_dst_rank",
                     "out_pre", "out_dst_in_degree"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.out_edge_attrs.keys() == b.out_edge_attrs.keys() == {"edge_weight",
                                                                       "edge_attr"}
        for k in a.out_edge_attrs:
            assert torch.equal(a.out_edge_attrs[k], b.out_edge_attrs[k])
        for m in MODES:
            pa, pb = a.plan(m), b.plan(m)
            for name in ("halo_ids", "pre_slot_ids", "edge_index", "in_edges", "out_edges"):
                assert torch.equal(getattr(pa, name), getattr(pb, name)), (m, name)
    manifest = read_manifest(path)
    assert manifest["stats"]["mode_rows"]["hybrid"] == int(cover.rows["hybrid"].sum())


def test_level_percentiles_are_part_of_the_cache_key(tmp_path, graph):
    default = partition_graph(graph, 2, root=tmp_path, progress=False)
    # Quartiles given explicitly are the default partition (same directory, same levels).
    assert partition_graph(graph, 2, root=tmp_path, progress=False,
                           level_percentiles=(0.25, 0.5, 0.75)) == default
    skewed = partition_graph(graph, 2, root=tmp_path, progress=False,
                             level_percentiles=(0.5, 0.8, 0.95))
    assert skewed != default
    a, b = load_partition(default, 0, num_parts=2), load_partition(skewed, 0, num_parts=2)
    assert torch.equal(a.owned_ids, b.owned_ids)  # the same METIS parts
    assert (b.owned_level <= a.owned_level).all() and (b.owned_level < a.owned_level).any()
    assert b.options["level_percentiles"] == [0.5, 0.8, 0.95]
    assert "level_percentiles" not in a.options
    with pytest.raises(ValueError, match="level_percentiles"):
        partition_graph(graph, 2, root=tmp_path, progress=False, level_percentiles=(0.9, 0.5, 0.6))


def test_datamodule_refuses_level_percentiles_for_a_written_partition(saved):
    from lightning_fullgraph import FullGraphDataModule
    _, path = saved
    dm = FullGraphDataModule(str(path), level_percentiles=(0.5, 0.8, 0.95))
    with pytest.raises(ValueError, match="re-partition"):
        dm.prepare_data()
    with pytest.raises(ValueError, match="increasing fractions"):
        FullGraphDataModule("cora", level_percentiles=(0.5, 0.5, 0.9))


def test_datamodule_checks_every_part_of_a_partition_directory_up_front(tmp_path, make_graph):
    # A part copied from another graph's partition is found by the process that prepares the
    # data (rank 0), before any rank loads its own: the cause reaches the user once, from the
    # rank that reports, instead of only from the rank whose file it is.
    import shutil

    from lightning_fullgraph import FullGraphDataModule
    from lightning_fullgraph.partition import check_partition
    a, b = make_graph(seed=0), make_graph(seed=1)
    path_a = partition_graph(a, 2, root=tmp_path / "a", progress=False)
    path_b = partition_graph(b, 2, root=tmp_path / "b", progress=False)
    assert check_partition(path_a, 2)["num_parts"] == 2
    shutil.copyfile(path_b / "part-1-of-2.pt", path_a / "part-1-of-2.pt")
    msg = "part-1-of-2.pt was made for a different graph than its manifest"
    with pytest.raises(StalePartitionError, match=msg):
        check_partition(path_a, 2)
    with pytest.raises(StalePartitionError, match=msg):
        FullGraphDataModule(str(path_a), num_parts=2).prepare_data()  # part 0 is fine
    with pytest.raises(PartitionMismatchError, match="made for 2 parts but the world size is 3"):
        check_partition(path_b, 3)
    (path_b / "part-0-of-2.pt").unlink()
    with pytest.raises(PartitionFormatError, match="part-0-of-2.pt is missing"):
        FullGraphDataModule(str(path_b), num_parts=2).prepare_data()


def test_labels_of_a_partition_directory_are_checked_against_num_classes(tmp_path, graph):
    # As validate_graph checks a Data before partitioning, with the same message.
    from lightning_fullgraph import FullGraphDataModule
    from lightning_fullgraph.data import GraphValidationError
    path = partition_graph(graph, 2, root=tmp_path, progress=False)
    too_large = graph.y >= 2
    first = int(too_large.nonzero()[0])
    msg = (rf"y has {int(too_large.sum())} labels >= num_classes=2 \(first at node {first}: "
           rf"{int(graph.y[first])}\) in the partition directory .*fix: pass the right "
           r"num_classes")
    with pytest.raises(GraphValidationError, match=msg):
        FullGraphDataModule(str(path), num_parts=2, num_classes=2).prepare_data()
    FullGraphDataModule(str(path), num_parts=2, num_classes=2, validate=False).prepare_data()
    FullGraphDataModule(str(path), num_parts=2, num_classes=3).prepare_data()
    # The labels' true range is known after setup, also when num_classes is given (wrong or
    # not), e.g. to explain a target outside the model's outputs.
    one = partition_graph(graph, 1, root=tmp_path, progress=False)
    dm = FullGraphDataModule(str(one), num_classes=2, validate=False)
    dm.setup()
    assert dm.num_classes == 2 and dm.max_label == int(graph.y.max()) == 2


def test_reusing_a_cached_partition_is_quiet_in_the_data_module(tmp_path, graph, capsys):
    # Every fit/test/predict prepares the data again: the cache hit prints nothing; a
    # partitioning that runs is shown once, at Lightning's info level (rank_zero_info), not
    # printed by every process.
    from lightning_fullgraph import FullGraphDataModule
    lines = []
    partition_graph(graph, 2, root=tmp_path / "p", progress=lines.append)
    assert any(line.startswith("[partition] METIS") for line in lines)
    partition_graph(graph, 2, root=tmp_path / "p", progress=lines.append)  # cache hit
    assert not any("reusing cached" in line for line in lines)
    assert capsys.readouterr().err == ""
    dm = FullGraphDataModule(graph, num_parts=2, cache_dir=str(tmp_path / "dm"))
    dm.prepare_data()
    capsys.readouterr()
    for _ in range(3):
        FullGraphDataModule(graph, num_parts=2, cache_dir=str(tmp_path / "dm")).prepare_data()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
