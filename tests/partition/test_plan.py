"""Per-mode aggregation plans: channel agreement between ranks, an in-process
simulation of the post + pre exchange against the single-process aggregation,
and the row counts of every mode."""
import networkx as nx
import pytest
import torch

from lightning_fullgraph.partition import (
    MODES,
    AggregationPlan,
    ChannelPlan,
    build_local_partitions,
    cut_cover,
    metis_partition,
    partition_stats,
)

PS = [2, 3, 4]


@pytest.fixture(scope="module")
def cora():
    from lightning_fullgraph.data import load_cora
    data = load_cora()
    g = torch.Generator().manual_seed(0)
    data.edge_weight = torch.rand(data.edge_index.size(1), generator=g,
                                  dtype=torch.float64) + 0.1
    return data


def _parts(name, data, P):
    if name == "random":  # many cut edges, every part non-empty
        g = torch.Generator().manual_seed(P)
        parts = torch.randint(0, P, (data.num_nodes,), generator=g)
        parts[:P] = torch.arange(P)
        return parts
    return metis_partition(data.edge_index, data.num_nodes, P)


CASES = [(g, p) for g in ("hub", "cora") for p in ("metis", "random")]


@pytest.fixture(scope="module")
def built(cora, make_hub_graph):
    cache = {}

    def get(graph, parts_kind, P):
        key = (graph, parts_kind, P)
        if key not in cache:
            data = cora if graph == "cora" else make_hub_graph(seed=P)
            parts = _parts(parts_kind, data, P)
            cache[key] = (data, parts, build_local_partitions(data, parts),
                          cut_cover(data.edge_index, parts, P))
        return cache[key]
    return get


def _blocks(t, counts):
    return list(torch.split(t, counts.tolist()))


def _expected_decision(mode, data, parts, cover):
    r"""Global per-edge 'pre' flag of a mode."""
    ei = data.edge_index
    cut = parts[ei[0]] != parts[ei[1]]
    return {"post": torch.zeros_like(cut), "pre": cut, "hybrid": cover.pre}[mode]


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("graph, parts_kind", CASES)
@pytest.mark.parametrize("mode", MODES)
def test_channels_agree_and_match_reference(built, graph, parts_kind, P, mode):
    data, parts, lps, cover = built(graph, parts_kind, P)
    ei = data.edge_index
    pre = _expected_decision(mode, data, parts, cover)
    ps, pd = parts[ei[0]], parts[ei[1]]
    plans = [lp.plan(mode) for lp in lps]
    for s in range(P):
        ls, pls = lps[s], plans[s]
        assert isinstance(pls, AggregationPlan) and isinstance(pls.post, ChannelPlan)
        assert pls.mode == mode and pls.num_owned == ls.num_owned
        assert pls.post.send_counts[s] == 0 and pls.pre.send_counts[s] == 0
        assert int(pls.post.send_counts.sum()) == pls.post.send_index.numel()
        assert int(pls.pre.send_counts.sum()) == pls.pre.send_index.numel()
        assert torch.equal(pls.post.recv_index,
                           torch.arange(ls.num_owned, ls.num_owned + pls.num_halo))
        assert torch.equal(pls.pre.send_index,
                           torch.arange(ls.num_owned, ls.num_owned + pls.num_pre_slots))
        assert pls.pre_slot_ids.numel() == pls.num_pre_slots
        post_send = _blocks(ls.owned_ids[pls.post.send_index], pls.post.send_counts)
        slots = _blocks(pls.pre_slot_ids, pls.pre.send_counts)
        for d in range(P):
            ld, pld = lps[d], plans[d]
            halo_from_s = _blocks(pld.halo_ids, pld.post.recv_counts)[s]
            pre_from_s = _blocks(ld.owned_ids[pld.pre.recv_index], pld.pre.recv_counts)[s]
            if s == d:
                assert halo_from_s.numel() == 0 and pre_from_s.numel() == 0
                continue
            sel = (ps == s) & (pd == d)
            # Reference from the global decisions: sorted distinct ids.
            exp_post = sorted(set(ei[0, sel & ~pre].tolist()))
            exp_pre = sorted(set(ei[1, sel & pre].tolist()))
            # (i) what s sends == what d expects, id by id, in order.
            assert post_send[d].tolist() == halo_from_s.tolist() == exp_post
            assert slots[d].tolist() == pre_from_s.tolist() == exp_pre
            assert int(pls.post.send_counts[d]) == int(pld.post.recv_counts[s])
            assert int(pls.pre.send_counts[d]) == int(pld.pre.recv_counts[s])


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("graph, parts_kind", CASES)
@pytest.mark.parametrize("mode", MODES)
def test_edges_map_back_to_the_global_graph(built, graph, parts_kind, P, mode):
    data, parts, lps, cover = built(graph, parts_kind, P)
    ei = data.edge_index
    seen = torch.zeros(ei.size(1), dtype=torch.long)
    pre = _expected_decision(mode, data, parts, cover)
    for lp in lps:
        pl = lp.plan(mode)
        n_own, H = lp.num_owned, pl.num_halo
        a, b = pl.in_edges.numel(), pl.out_edges.numel()
        assert pl.edge_index.shape == (2, a + b)
        src, dst = pl.edge_index
        assert bool((src < n_own + H).all())
        assert bool((dst < n_own + pl.num_pre_slots).all())
        # Part (a): in-edges in LocalPartition order; sources in this mode's halo.
        assert bool((pl.in_edges[1:] > pl.in_edges[:-1]).all())
        gid_a = lp.edge_ids[pl.in_edges]
        to_global = torch.cat([lp.owned_ids, pl.halo_ids])
        assert torch.equal(to_global[src[:a]], ei[0, gid_a])
        assert torch.equal(lp.owned_ids[dst[:a]], ei[1, gid_a])
        assert not bool(pre[gid_a].any())
        assert bool((dst[:a] < n_own).all())
        # Part (b): outgoing pre cut edges in global order, into pre slots.
        gid_b = lp.out_edge_ids[pl.out_edges]
        assert bool((gid_b[1:] > gid_b[:-1]).all())
        assert bool(pre[gid_b].all())
        assert bool((src[a:] < n_own).all()) and bool((dst[a:] >= n_own).all())
        assert torch.equal(lp.owned_ids[src[a:]], ei[0, gid_b])
        assert torch.equal(pl.pre_slot_ids[dst[a:] - n_own], ei[1, gid_b])
        slot_rank = torch.repeat_interleave(torch.arange(P), pl.pre.send_counts)
        assert torch.equal(slot_rank[dst[a:] - n_own], parts[ei[1, gid_b]])
        seen[gid_a] += 1
        seen[gid_b] += 1
        # Edge tensors of the mode, as the runtime builds them.
        for key in ("edge_weight", "edge_attr"):
            if key in lp.edge_attrs:
                t = torch.cat([lp.edge_attrs[key][pl.in_edges],
                               lp.out_edge_attrs[key][pl.out_edges]])
                assert torch.equal(t, data[key][torch.cat([gid_a, gid_b])])
    assert bool((seen == 1).all())  # every global edge aggregated exactly once


def _exchange(send, send_counts, recv_counts_of):
    r"""In-process all_to_all: ``send[s]`` split by ``send_counts[s]``; rank d
    receives the blocks of all sources, concatenated by source rank."""
    P = len(send)
    outbox = [list(torch.split(send[s], send_counts[s].tolist())) for s in range(P)]
    recv = []
    for d in range(P):
        blocks = [outbox[s][d] for s in range(P)]
        assert [t.size(0) for t in blocks] == recv_counts_of[d].tolist()
        recv.append(torch.cat(blocks))
    return recv


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("graph, parts_kind", CASES)
@pytest.mark.parametrize("mode", MODES)
def test_simulated_exchange_equals_single_process(built, graph, parts_kind, P, mode):
    data, parts, lps, _ = built(graph, parts_kind, P)
    ei = data.edge_index
    g = torch.Generator().manual_seed(7)
    X = torch.randn(data.num_nodes, 5, generator=g, dtype=torch.float64)
    w = data.edge_weight.to(torch.float64)
    ref = torch.zeros_like(X).index_add_(0, ei[1], w.view(-1, 1) * X[ei[0]])

    plans = [lp.plan(mode) for lp in lps]
    x_own = [X[lp.owned_ids] for lp in lps]
    # Post channel: owners send rows, receivers append them after the owned rows.
    recv = _exchange([x_own[r][plans[r].post.send_index] for r in range(P)],
                     [pl.post.send_counts for pl in plans],
                     [pl.post.recv_counts for pl in plans])
    aggs_ext, out = [], []
    for r, (lp, pl) in enumerate(zip(lps, plans)):
        x_src = torch.zeros(lp.num_owned + pl.num_halo, X.size(1), dtype=torch.float64)
        x_src[:lp.num_owned] = x_own[r]
        x_src[pl.post.recv_index] = recv[r]
        assert torch.equal(x_src[lp.num_owned:], X[pl.halo_ids])
        w_mode = torch.cat([lp.edge_attrs["edge_weight"][pl.in_edges],
                            lp.out_edge_attrs["edge_weight"][pl.out_edges]]).to(torch.float64)
        src, dst = pl.edge_index
        agg_ext = torch.zeros(lp.num_owned + pl.num_pre_slots, X.size(1), dtype=torch.float64)
        agg_ext.index_add_(0, dst, w_mode.view(-1, 1) * x_src[src])
        aggs_ext.append(agg_ext)
    # Pre channel: partial aggregates go to the destinations' owners.
    recv = _exchange([aggs_ext[r][plans[r].pre.send_index] for r in range(P)],
                     [pl.pre.send_counts for pl in plans],
                     [pl.pre.recv_counts for pl in plans])
    for r, (lp, pl) in enumerate(zip(lps, plans)):
        agg = aggs_ext[r][:lp.num_owned].clone().index_add_(0, pl.pre.recv_index, recv[r])
        expect = ref[lp.owned_ids]
        scale = float(expect.abs().max()) if expect.numel() else 1.0
        assert torch.allclose(agg, expect, rtol=0, atol=1e-12 * max(scale, 1.0))
        if mode == "post":  # same edges in the same order as single process: bitwise
            assert torch.equal(agg, expect)


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("graph, parts_kind", CASES)
def test_rows_per_mode(built, graph, parts_kind, P):
    data, parts, lps, cover = built(graph, parts_kind, P)
    ei = data.edge_index
    ps, pd = parts[ei[0]], parts[ei[1]]
    rows = {m: torch.zeros(P, P, dtype=torch.long) for m in MODES}
    for s, lp in enumerate(lps):
        for m in MODES:
            pl = lp.plan(m)
            rows[m][s] = pl.post.send_counts + pl.pre.send_counts
    assert int(rows["post"].sum()) > 0
    for s in range(P):
        for d in range(P):
            if s == d:
                continue
            sel = (ps == s) & (pd == d)
            # Independent maximum matching (networkx Hopcroft–Karp) == |C| == hybrid rows.
            G = nx.Graph()
            U = {("u", int(u)) for u in ei[0, sel]}
            G.add_nodes_from(U)
            G.add_edges_from((("u", int(u)), ("w", int(v))) for u, v in ei[:, sel].t())
            matching = len(nx.bipartite.hopcroft_karp_matching(G, top_nodes=U)) // 2 \
                if U else 0
            assert int(rows["hybrid"][s, d]) == matching == int(cover.rows["hybrid"][s, d])
            assert int(rows["hybrid"][s, d]) <= min(int(rows["post"][s, d]),
                                                    int(rows["pre"][s, d]))
            assert int(rows["post"][s, d]) == len(set(ei[0, sel].tolist()))
            assert int(rows["pre"][s, d]) == len(set(ei[1, sel].tolist()))
    for m in MODES:
        assert torch.equal(rows[m], cover.rows[m])
    # Totals in the stats, computed either way.
    a = partition_stats(parts, ei, num_parts=P, cover=cover)
    b = partition_stats(lps)
    for st in (a, b):
        assert st.mode_rows == {m: int(rows[m].sum()) for m in MODES}
        assert st.mode_matrix == {m: rows[m].t().tolist() for m in MODES}
        assert st.mode_rows["post"] == st.total_halo
        assert st.mode_matrix["post"] == st.comm_matrix
    assert a.mode_rows["hybrid"] <= min(a.mode_rows["post"], a.mode_rows["pre"])


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("graph, parts_kind", CASES)
def test_post_mode_is_todays_plan(built, graph, parts_kind, P):
    _, _, lps, _ = built(graph, parts_kind, P)
    for lp in lps:
        pl = lp.plan("post")
        assert torch.equal(pl.halo_ids, lp.halo_ids)
        assert torch.equal(pl.post.send_index, lp.send_index)
        assert torch.equal(pl.post.send_counts, lp.send_counts)
        assert torch.equal(pl.post.recv_counts, lp.halo_counts)
        assert torch.equal(pl.edge_index, lp.edge_index)
        assert torch.equal(pl.in_edges.long(), torch.arange(lp.num_local_edges))
        assert pl.num_pre_slots == 0 and pl.out_edges.numel() == 0
        assert pl.pre.send_index.numel() == 0 and pl.pre.recv_index.numel() == 0
        assert int(pl.pre.send_counts.sum()) == 0 and int(pl.pre.recv_counts.sum()) == 0
        # "pre": no halo at all, every cut in-edge arrives as a partial aggregate.
        pre = lp.plan("pre")
        assert pre.num_halo == 0 and pre.post.send_index.numel() == 0
        assert bool((pre.edge_index[0] < lp.num_owned).all())
        assert lp.plan("hybrid") is lp.plan("hybrid")  # cached


def test_out_edge_fields(built):
    data, parts, lps, cover = built("hub", "metis", 3)
    ei = data.edge_index
    deg = torch.bincount(ei[1], minlength=data.num_nodes)
    for lp in lps:
        r = lp.rank
        exp = ((parts[ei[0]] == r) & (parts[ei[1]] != r)).nonzero().flatten()
        assert torch.equal(lp.out_edge_ids, exp)
        assert torch.equal(lp.owned_ids[lp.out_src], ei[0, exp])
        assert torch.equal(lp.out_dst, ei[1, exp])
        assert torch.equal(lp.out_dst_rank, parts[ei[1, exp]])
        assert torch.equal(lp.out_pre, cover.pre[exp])
        assert torch.equal(lp.in_pre, cover.pre[lp.edge_ids])
        assert torch.equal(lp.out_dst_in_degree, deg[ei[1, exp]])
        assert set(lp.out_edge_attrs) == set(lp.edge_attrs) == {"edge_weight", "edge_attr"}
        for k, v in lp.out_edge_attrs.items():
            assert torch.equal(v, data[k][exp])
        assert lp.num_out_edges == exp.numel()


def test_unknown_mode_and_empty_rank(make_graph):
    data = make_graph()
    lps = build_local_partitions(data, torch.arange(data.num_nodes) % 2, num_parts=3)
    with pytest.raises(ValueError, match="unknown aggregation mode 'mixed'"):
        lps[0].plan("mixed")
    for m in MODES:
        pl = lps[2].plan(m)  # rank without nodes
        assert pl.edge_index.shape == (2, 0) and pl.num_halo == 0 and pl.num_pre_slots == 0
        assert pl.post.send_counts.tolist() == [0, 0, 0]


def test_single_part_has_no_exchange(make_graph):
    data = make_graph()
    lp = build_local_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long))[0]
    for m in MODES:
        pl = lp.plan(m)
        assert pl.rows_sent == pl.rows_received == 0
        assert torch.equal(pl.edge_index, lp.edge_index)


def test_modes_without_pre_edges_share_the_in_edge_list(cora):
    # P = 1: nothing is cut, so every mode keeps all in-edges: no copy of the edge list.
    lp = build_local_partitions(cora, torch.zeros(cora.num_nodes, dtype=torch.long))[0]
    for mode in MODES:
        pl = lp.plan(mode)
        assert pl.edge_index is lp.edge_index
        assert pl.in_edges.dtype == torch.int32
    # Post shares it at any P; a mode with pre edges has its own list.
    parts = metis_partition(cora.edge_index, cora.num_nodes, 2)
    lp = build_local_partitions(cora, parts)[0]
    assert lp.plan("post").edge_index is lp.edge_index
    assert lp.plan("pre").edge_index is not lp.edge_index
