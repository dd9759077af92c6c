"""Exact minimum vertex cover (König from Hopcroft–Karp) of bipartite remote graphs."""
import itertools

import networkx as nx
import pytest
import torch

from lightning_fullgraph.partition import cut_cover, metis_partition, min_vertex_cover


def _random_bipartite(seed, max_u=7, max_w=7, max_e=14):
    g = torch.Generator().manual_seed(seed)
    nu = int(torch.randint(1, max_u + 1, (1,), generator=g))
    nw = int(torch.randint(1, max_w + 1, (1,), generator=g))
    e = int(torch.randint(1, max_e + 1, (1,), generator=g))
    # Sparse ids (not 0..n-1) so that the numbering is exercised.
    src = torch.randint(0, nu, (e,), generator=g) * 3 + 5
    dst = torch.randint(0, nw, (e,), generator=g) * 2
    return src, dst


def _brute_force_cover_size(src, dst):
    U = sorted(set(src.tolist()))
    W = sorted(set(dst.tolist()))
    verts = [("u", u) for u in U] + [("w", w) for w in W]
    edges = set(zip(src.tolist(), dst.tolist()))
    for k in range(len(verts) + 1):
        for c in itertools.combinations(verts, k):
            c = set(c)
            if all(("u", u) in c or ("w", w) in c for u, w in edges):
                return k
    raise AssertionError("unreachable")


def _nx_matching_size(src, dst):
    G = nx.Graph()
    U = {("u", int(u)) for u in src}
    G.add_nodes_from(U, bipartite=0)
    G.add_nodes_from({("w", int(w)) for w in dst}, bipartite=1)
    G.add_edges_from((("u", int(u)), ("w", int(w))) for u, w in zip(src, dst))
    m = nx.bipartite.hopcroft_karp_matching(G, top_nodes=U)
    return len(m) // 2, G, m, U


def _koenig_from_matching(G, matching, U):
    r"""König's construction in plain Python from any maximum matching."""
    free = [u for u in U if u not in matching]
    seen, stack = set(free), list(free)
    while stack:
        x = stack.pop()
        if x[0] == "u":
            for w in G[x]:
                if w not in seen and matching.get(x) != w:
                    seen.add(w)
                    stack.append(w)
        else:
            u = matching.get(x)
            if u is not None and u not in seen:
                seen.add(u)
                stack.append(u)
    return {u for u in U if u not in seen} | {w for w in G if w[0] == "w" and w in seen}


def _cover_set(src, dst, vc):
    c = {("u", int(u)) for u, m in zip(src, vc.src_in_cover) if m}
    return c | {("w", int(w)) for w, m in zip(dst, vc.dst_in_cover) if m}


@pytest.mark.parametrize("seed", range(40))
def test_exact_minimum_on_small_graphs(seed):
    src, dst = _random_bipartite(seed)
    vc = min_vertex_cover(src, dst)
    cover = _cover_set(src, dst, vc)
    # Covers every edge; pre edges (source not in cover) have their destination in it.
    assert bool((vc.src_in_cover | vc.dst_in_cover).all())
    # Minimum: equals brute force and the independent networkx maximum matching.
    size, G, m, U = _nx_matching_size(src, dst)
    assert len(cover) == int(vc.cover_size[0]) == size == _brute_force_cover_size(src, dst)
    # Per-vertex flags are consistent across the edges of a vertex.
    for ids, flags in ((src, vc.src_in_cover), (dst, vc.dst_in_cover)):
        for v in set(ids.tolist()):
            assert len(set(flags[ids == v].tolist())) == 1
    assert vc.num_src.tolist() == [len(set(src.tolist()))]
    assert vc.num_dst.tolist() == [len(set(dst.tolist()))]
    assert int(vc.cover_size[0]) <= min(int(vc.num_src[0]), int(vc.num_dst[0]))
    # Canonical: König's cover built from networkx' (different) matching is the same set.
    assert cover == _koenig_from_matching(G, m, U)


def test_rows_of_the_hybrid_split_equal_the_cover():
    # Rows shipped = distinct post sources + distinct pre destinations == |C|.
    for seed in range(20):
        src, dst = _random_bipartite(seed, 12, 12, 40)
        vc = min_vertex_cover(src, dst)
        post = vc.post
        rows = len(set(src[post].tolist())) + len(set(dst[~post].tolist()))
        assert rows == int(vc.cover_size[0])


def test_deterministic_and_order_independent():
    src, dst = _random_bipartite(3, 30, 30, 120)
    a = min_vertex_cover(src, dst)
    b = min_vertex_cover(src, dst)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # Shuffled and with duplicated edges: the same decision per edge.
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(src.numel(), generator=g)
    idx = torch.cat([perm, perm[:17]])
    c = min_vertex_cover(src[idx], dst[idx])
    assert torch.equal(c.src_in_cover, a.src_in_cover[idx])
    assert torch.equal(c.dst_in_cover, a.dst_in_cover[idx])
    assert torch.equal(c.cover_size, a.cover_size)


def test_groups_are_independent_graphs():
    # Solving many groups at once gives each group exactly its own cover (the
    # cover is canonical), and sources/destinations of different groups never mix.
    pieces = [_random_bipartite(s, 9, 9, 25) for s in range(6)]
    src = torch.cat([p[0] for p in pieces])
    dst = torch.cat([p[1] for p in pieces])
    group = torch.cat([torch.full((p[0].numel(),), 2 * i) for i, p in enumerate(pieces)])
    vc = min_vertex_cover(src, dst, group, num_groups=13)
    assert vc.cover_size.shape == (13,) and int(vc.cover_size[1::2].sum()) == 0
    for i, (s, d) in enumerate(pieces):
        one = min_vertex_cover(s, d)
        sel = group == 2 * i
        assert torch.equal(vc.src_in_cover[sel], one.src_in_cover)
        assert torch.equal(vc.dst_in_cover[sel], one.dst_in_cover)
        assert int(vc.cover_size[2 * i]) == int(one.cover_size[0]) == _nx_matching_size(s, d)[0]


def test_structured_cases():
    # A star u -> {w0..w4}: cover {u}, all post.
    vc = min_vertex_cover(torch.zeros(5, dtype=torch.long), torch.arange(5))
    assert vc.src_in_cover.all() and int(vc.cover_size[0]) == 1
    # A reverse star {u0..u4} -> w: cover {w}, all pre.
    vc = min_vertex_cover(torch.arange(5), torch.zeros(5, dtype=torch.long))
    assert not vc.src_in_cover.any() and vc.dst_in_cover.all() and int(vc.cover_size[0]) == 1
    # A perfect matching: cover = all sources (König from the U side), all post.
    vc = min_vertex_cover(torch.arange(4), torch.arange(4))
    assert vc.src_in_cover.all() and not vc.dst_in_cover.any()
    # Empty.
    vc = min_vertex_cover(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long),
                          torch.empty(0, dtype=torch.long), num_groups=4)
    assert vc.src_in_cover.numel() == 0 and vc.cover_size.tolist() == [0] * 4


def test_bad_inputs():
    with pytest.raises(ValueError, match="dst has"):
        min_vertex_cover(torch.arange(3), torch.arange(2))
    with pytest.raises(ValueError, match="non-negative"):
        min_vertex_cover(torch.tensor([-1]), torch.tensor([0]))
    with pytest.raises(ValueError, match="num_groups=1"):
        min_vertex_cover(torch.tensor([0]), torch.tensor([0]), torch.tensor([1]), num_groups=1)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_cut_cover_per_rank_pair(make_hub_graph, P):
    data = make_hub_graph(seed=P)
    ei = data.edge_index
    parts = metis_partition(ei, data.num_nodes, P)
    cc = cut_cover(ei, parts, P)
    ps, pd = parts[ei[0]], parts[ei[1]]
    assert not bool(cc.pre[ps == pd].any())  # only cut edges can be pre
    for s in range(P):
        assert int(cc.rows["hybrid"][s, s]) == 0
        for d in range(P):
            if s == d:
                continue
            sel = (ps == s) & (pd == d)
            src, dst = ei[0, sel], ei[1, sel]
            post_rows = len(set(src.tolist()))
            pre_rows = len(set(dst.tolist()))
            assert int(cc.rows["post"][s, d]) == post_rows
            assert int(cc.rows["pre"][s, d]) == pre_rows
            hybrid = len(set(src[~cc.pre[sel]].tolist())) + len(set(dst[cc.pre[sel]].tolist()))
            assert hybrid == int(cc.rows["hybrid"][s, d])
            assert hybrid == (_nx_matching_size(src, dst)[0] if src.numel() else 0)
            assert hybrid <= min(post_rows, pre_rows)
    # Edge order does not change the decisions.
    perm = torch.randperm(ei.size(1), generator=torch.Generator().manual_seed(1))
    again = cut_cover(ei[:, perm], parts, P)
    assert torch.equal(again.pre, cc.pre[perm])
