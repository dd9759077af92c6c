"""Shared graph generators and brute-force invariant checks for partition tests."""
import pytest
import torch
from torch_geometric.data import Data


def random_graph(num_nodes=60, num_edges=300, *, seed=0, self_loops=True,
                 duplicates=True, isolated=5, feat=8):
    r"""Directed random graph with self-loops, duplicate edges, isolated nodes,
    node features, labels, masks and two edge-level attributes."""
    g = torch.Generator().manual_seed(seed)
    active = num_nodes - isolated  # the last `isolated` nodes get no edges
    src = torch.randint(0, active, (num_edges,), generator=g)
    dst = torch.randint(0, active, (num_edges,), generator=g)
    if self_loops:
        loops = torch.arange(0, active, 7)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    if duplicates:
        src, dst = torch.cat([src, src[:20]]), torch.cat([dst, dst[:20]])
    perm = torch.randperm(src.numel(), generator=g)  # duplicates not adjacent
    edge_index = torch.stack([src[perm], dst[perm]])
    E = edge_index.size(1)
    r = torch.rand(num_nodes, generator=g)
    return Data(
        x=torch.randn(num_nodes, feat, generator=g),
        y=torch.randint(0, 3, (num_nodes,), generator=g),
        train_mask=r < 0.3, val_mask=(r >= 0.3) & (r < 0.5), test_mask=r >= 0.5,
        edge_index=edge_index,
        edge_weight=torch.rand(E, generator=g),
        edge_attr=torch.randn(E, 3, generator=g),
        num_nodes=num_nodes,
    )


def check_invariants(data, parts, locals_):
    r"""Brute-force check of every contract of :class:`LocalPartition`."""
    N, P = data.num_nodes, len(locals_)
    ei = data.edge_index
    assert [lp.rank for lp in locals_] == list(range(P))
    seen_owned = torch.zeros(N, dtype=torch.long)
    for r, lp in enumerate(locals_):
        assert lp.num_parts == P and lp.num_nodes == N and lp.num_edges == ei.size(1)
        owned = lp.owned_ids
        assert torch.equal(owned, (parts == r).nonzero().flatten())
        seen_owned[owned] += 1
        owned_set = set(owned.tolist())
        pos = {int(g): i for i, g in enumerate(owned)}

        # Edges: exactly the global edges with owned target, in global order.
        expect_eids = [e for e in range(ei.size(1)) if int(ei[1, e]) in owned_set]
        assert lp.edge_ids.tolist() == expect_eids

        # Halo: exactly the non-owned sources, by (owner, id).
        halo_expect = sorted({int(ei[0, e]) for e in expect_eids} - owned_set,
                             key=lambda v: (int(parts[v]), v))
        assert lp.halo_ids.tolist() == halo_expect
        assert lp.halo_counts.tolist() == [
            sum(1 for v in halo_expect if int(parts[v]) == s) for s in range(P)]
        assert int(lp.halo_counts[r]) == 0 and int(lp.send_counts[r]) == 0
        assert int(lp.halo_counts.sum()) == lp.num_halo
        assert int(lp.send_counts.sum()) == lp.send_index.numel()
        hpos = {v: lp.num_owned + i for i, v in enumerate(halo_expect)}

        # Renumbered edges map back to the global ones.
        for k, e in enumerate(expect_eids):
            s, d = int(ei[0, e]), int(ei[1, e])
            assert int(lp.edge_index[1, k]) == pos[d]
            assert int(lp.edge_index[0, k]) == (pos[s] if s in owned_set else hpos[s])
        local_to_global = torch.cat([lp.owned_ids, lp.halo_ids])
        assert torch.equal(local_to_global[lp.edge_index], ei[:, lp.edge_ids])

        # Attributes.
        for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(lp.node_attrs[key], data[key][owned])
        for key in ("edge_weight", "edge_attr"):
            assert torch.equal(lp.edge_attrs[key], data[key][lp.edge_ids])
        for key in ("train_mask", "val_mask", "test_mask"):
            assert lp.global_counts[key] == int(data[key].sum())
    assert bool((seen_owned == 1).all())
    simulate_exchange(data.x, locals_)


def simulate_exchange(x, locals_):
    r"""In-process all_to_all: owners send ``send_index`` rows, receivers split
    by ``halo_counts``; must reproduce ``x[halo_ids]`` on every rank."""
    P = len(locals_)
    outbox = []  # outbox[s][r] = rows rank s sends to rank r
    for lp in locals_:
        send = x[lp.owned_ids][lp.send_index]
        outbox.append(list(torch.split(send, lp.send_counts.tolist())))
    for r, lp in enumerate(locals_):
        recv = [outbox[s][r] for s in range(P)]
        assert [t.size(0) for t in recv] == lp.halo_counts.tolist()
        assert torch.equal(torch.cat(recv), x[lp.halo_ids])


@pytest.fixture
def graph():
    return random_graph()


@pytest.fixture
def make_graph():
    return random_graph


@pytest.fixture
def check():
    return check_invariants


@pytest.fixture
def read_only(monkeypatch):
    r"""Makes every path under the given directories unwritable (as a chmod
    would for a non-root user): mkdir, open for writing, rename fail with EACCES."""
    import builtins
    import errno
    import os
    blocked = []

    def check(path):
        path = os.path.abspath(os.fspath(path))
        for b in blocked:
            if path == b or path.startswith(b + os.sep):
                raise PermissionError(errno.EACCES, "Permission denied", path)

    real_mkdir, real_open, real_rename, real_replace = (os.mkdir, builtins.open,
                                                        os.rename, os.replace)

    def mkdir(path, *a, **k):
        if not os.path.isdir(path):
            check(path)
        return real_mkdir(path, *a, **k)

    def open_(file, mode="r", *a, **k):
        if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
            check(file)
        return real_open(file, mode, *a, **k)

    def rename(a, b, *args, **kw):
        check(a), check(b)
        return real_rename(a, b, *args, **kw)

    def replace(a, b, *args, **kw):
        check(a), check(b)
        return real_replace(a, b, *args, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    return lambda path: blocked.append(os.path.abspath(os.fspath(path)))


def hub_graph(num_nodes=150, *, seed=0, feat=4):
    r"""Directed graph with hubs (quadratic skew of sources and destinations
    towards a few ids), self-loops, duplicate edges and isolated nodes, with
    float64 edge weights (``edge_weight``) and a 2-column ``edge_attr``."""
    g = torch.Generator().manual_seed(seed)
    active = num_nodes - 4  # the last 4 nodes are isolated
    n_edges = num_nodes * 5
    src = (torch.rand(n_edges, generator=g).pow(3) * active).long()  # source hubs
    dst = (torch.rand(n_edges, generator=g).pow(2) * active).long().flip(0)  # sink hubs
    dst = (active - 1) - dst  # hubs at the other end of the id range
    loops = torch.arange(0, active, 11)
    src = torch.cat([src, loops, src[:25], torch.tensor([3, 3, 3])])
    dst = torch.cat([dst, loops, dst[:25], torch.tensor([3, 9, 9])])
    perm = torch.randperm(src.numel(), generator=g)
    edge_index = torch.stack([src[perm], dst[perm]])
    E = edge_index.size(1)
    r = torch.rand(num_nodes, generator=g)
    return Data(
        x=torch.randn(num_nodes, feat, generator=g), y=torch.randint(0, 3, (num_nodes,),
                                                                      generator=g),
        train_mask=r < 0.4, val_mask=(r >= 0.4) & (r < 0.6), test_mask=r >= 0.6,
        edge_index=edge_index,
        edge_weight=torch.rand(E, generator=g, dtype=torch.float64) + 0.1,
        edge_attr=torch.randn(E, 2, generator=g),
        num_nodes=num_nodes)


@pytest.fixture(scope="session")
def make_hub_graph():
    return hub_graph
