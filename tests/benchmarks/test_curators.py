"""The curators of ``python -m benchmarks curate``: each turns a small hand-made result (the shape
its topic writes) into the rows the documentation shows, so that no entry of
``benchmarks/results.json`` has to be copied by hand."""
import json

import pytest

from benchmarks._curate import CURATORS, check, curate_entry


def test_every_topic_of_the_committed_entries_has_a_curator():
    for topic in ("cluster", "fourd", "fourd-memory", "cora_accuracy", "fullgraph",
                  "aggregation-rows", "aggregation-measured", "planner", "quantization",
                  "stale_halos", "kernels"):
        assert topic in CURATORS, topic


def test_every_committed_entry_is_named_after_a_topic_with_a_curator():
    # An entry's key is its topic's curator or starts with it and a dash (stale_halos-cora):
    # an entry no curator can build could only have been copied by hand.
    from benchmarks._curate import RESULTS_JSON
    for key in json.loads(RESULTS_JSON.read_text()):
        assert key in CURATORS or key.split("-")[0] in CURATORS, key


def test_cora_accuracy():
    result = {"seeds": [0, 1], "epochs": 200, "processes": 4,
              "single_process": [0.813, 0.824], "partitioned": [0.821, 0.8185],
              "single_mean": 0.8185, "partitioned_mean": 0.81975,
              "single_std": 0.0055, "partitioned_std": 0.00125}
    columns, rows, _ = CURATORS["cora_accuracy"](result, {})
    assert columns == ["seed", "0", "1", "mean ± std"]
    assert rows == [["1 process (plain PyG)", 81.3, 82.4, "81.85 ± 0.55 %"],
                    ["4 processes (METIS, halo exchange, kernels)", 82.1, 81.8, "81.97 ± 0.12 %"]]


def _fullgraph_run(world, threads, epoch, std, peaks, shares=None, oversubscribed=False):
    ranks = [{"rss_after_import_torch_pyg_kib": 400 * 1024} for _ in peaks]
    for rank, share in zip(ranks, shares or []):
        rank["exchange_fraction"] = share
    return {"world_size": world, "threads_per_process": threads, "oversubscribed": oversubscribed,
            "epoch_s": epoch, "epoch_s_std": std, "peak_rss_kib_per_rank": peaks,
            "peak_rss_kib_max": max(peaks), "ranks": ranks}


def test_fullgraph():
    mib = 1024
    result = {"meta": {"model": "gcn", "kernels": "auto"}, "graph": {"num_nodes": 1_000_000},
              "runs": {"single": _fullgraph_run(1, 2, 3.05, 0.15, [2400 * mib]),
                       "P=2": _fullgraph_run(2, 1, 3.3, 0.1, [1200 * mib, 1400 * mib],
                                             [0.12, 0.14]),
                       "P=4": _fullgraph_run(4, 1, 3.6, 0.02, [800 * mib] * 4, [0.15] * 4, True)}}
    columns, rows, _ = CURATORS["fullgraph"](result, {})
    assert columns[0] == "GCN, 1M nodes, kernels auto"
    assert columns[-1] == "of single-process peak (net of the 400 MiB interpreter)"
    # net of the interpreter: (1200 - 400) / (2400 - 400) = 40 %, (1400 - 400) / 2000 = 50 %
    assert rows == [["1 process", "3.05 ± 0.15", None, "2,400", "100 %"],
                    ["P = 2 (2 × 1 thread)", "3.30 ± 0.10", "12–14 %", "1,200–1,400",
                     "50–58 % (40–50 %)"],
                    ["P = 4 (4 × 1 thread, oversubscribed)", "3.60 ± 0.02", "15 %", "800",
                     "33 % (20 %)"]]


def _plan_part(P, post, hybrid, cover):
    return {"num_parts": P, "cover_s": cover, "ratios": {"rows_post_over_hybrid": post / hybrid},
            "modes": {"post": {"rows_sum": post}, "hybrid": {"rows_sum": hybrid}}}


def test_aggregation_rows():
    result = {"plan": {"datasets": {
        "cora": {"name": "cora", "num_nodes": 2708, "num_edges": 10556,
                 "partitions": {"4": _plan_part(4, 495, 350, 0.004),
                                "2": _plan_part(2, 254, 182, 0.003)}},
        "synthetic": {"name": "synthetic", "num_nodes": 1_000_000, "num_edges": 9_999_000,
                      "partitions": {"2": _plan_part(2, 491_000, 375_000, 1.8),
                                     "8": _plan_part(8, 1_310_000, 1_050_000, 8.3),
                                     "1": {"dir": "only measured"}}}}}}
    columns, rows, _ = CURATORS["aggregation-rows"](result, {})
    assert columns[:2] == ["rows per exchange (all ranks)", "P"]
    assert rows == [["Cora", "2 / 4", "254 / 495", "182 / 350", "1.396× / 1.414×", "0.00 s"],
                    ["synthetic 1M / 10M", "2 / 8", "491k / 1.31M", "375k / 1.05M",
                     "1.309× / 1.248×", "1.80–8.30 s"]]


def _measured(world, epoch, peaks, halo=None, **kw):
    r = {"world_size": world, "epoch_s": epoch, "epoch_s_std": 0.5,
         "peak_rss_kib_per_rank": [p * 1024 for p in peaks], **kw}
    if halo is not None:
        r["halo"] = {"bytes_per_epoch": halo * 2 ** 20}
    return r


def test_aggregation_measured():
    result = {"measured": {"synthetic": {"runs": {
        "single": _measured(1, 12.8, [3000]),
        "P=4 post": _measured(4, 17.6, [1800, 1900], 1000, parts=4, mode="post",
                              max_peak_ratio_to_single=1900 / 3000),
        "P=4 hybrid": _measured(4, 16.0, [1700], 800, parts=4, mode="hybrid",
                                max_peak_ratio_to_single=1700 / 3000)}}},
        "static_cache": {"runs": {
            "gcn P=4 cache_static=False": _measured(4, 9.0, [1600], 800, parts=4, model="gcn",
                                                    cache_static=False, aggregation="hybrid"),
            "gcn P=4 cache_static=True": _measured(4, 5.6, [1500], 100, parts=4, model="gcn",
                                                   cache_static=True, aggregation="hybrid",
                                                   max_peak_ratio_to_single=0.5),
            "sage P=4 cache_static=True": _measured(4, 5.0, [1500], 100, parts=4, model="sage",
                                                    cache_static=True)}}}
    columns, rows, _ = CURATORS["aggregation-measured"](result, {})
    assert len(columns) == 5
    assert rows == [["1 process", "12.80 ± 0.50", None, "3,000", "100 %"],
                    ["P = 4 post", "17.60 ± 0.50", "1,000", "1,800–1,900", "63 %"],
                    ["P = 4 hybrid", "16.00 ± 0.50", "800 (1.25× less)", "1,700", "57 %"],
                    ["P = 4 hybrid + static-input memo", "5.60 ± 0.50", "100 (10.00× less)", "1,500",
                     "50 %"]]


def test_planner():
    def row(dataset, P, mode, ratio, fit):
        return {"dataset": dataset, "parts": P, "mode": mode, "ratio": ratio, "ratio_fit": fit}
    result = {"rows": [row("cora", 2, "post", 0.861, 1.0), row("cora", 2, "pre", 1.05, 1.304),
                       row("cora", 2, "hybrid", 0.79, None),
                       row("synthetic:nodes=200000,degree=10", 4, "post", 0.6, 0.86)]}
    columns, rows, _ = CURATORS["planner"](result, {})
    assert columns == ["graph", "P", "post: ping-pong / fitted", "pre", "hybrid"]
    assert rows == [["Cora", 2, "0.86 / 1.00", "1.05 / 1.30", "0.79 / -"],
                    ["synthetic 200k", 4, "0.60 / 0.86", None, None]]
    with pytest.raises(SystemExit, match="no planner rows"):
        CURATORS["planner"](result, {"parts": "8"})


def _acc_row(dataset, model, config, accs, mb, delta, post_mb, hybrid_mb, post_accs=None):
    mean = sum(accs) / len(accs)
    r = {"dataset": dataset, "model": model, "config": config, "test_acc_mean": mean,
         "test_acc_std": 0.01, "delta_pp_vs_fp32": delta, "MB_per_epoch_per_rank": mb,
         "post_fp32_MB": post_mb, "reduction_vs_post_fp32": post_mb / mb,
         "reduction_vs_hybrid_fp32": hybrid_mb / mb, "rows_skipped_frac": None,
         "exchange_s": 0.0157}
    if post_accs is not None:
        r.update(post_fp32_test_acc_mean=sum(post_accs) / len(post_accs),
                 post_fp32_test_acc_std=0.0)
    return r


def test_quantization_keeps_one_data_set_and_adds_the_post_baseline():
    result = {"accuracy": [
        _acc_row("cora", "gcn", "fp32", [0.81, 0.82], 0.02, 0.0, 0.03, 0.02, [0.8, 0.8]),
        _acc_row("cora", "gcn", "int2", [0.80, 0.81], 0.005, -1.0, 0.03, 0.02, [0.8, 0.8]),
        _acc_row("cora", "sage", "adaptive+schedule", [0.8], 0.1, 0.2, 0.75, 0.6, [0.79]),
        _acc_row("synthetic:nodes=100000", "gcn", "fp32", [0.9], 50.0, 0.0, 70.0, 50.0, [0.9])]}
    columns, rows, _ = CURATORS["quantization"](result, {"dataset": "cora"})
    assert columns[-1] == "× fewer than hybrid fp32"
    assert rows == [["GCN", "post fp32", "80.00 ± 0.00", None, 0.03, 1.0, None],
                    ["GCN", "fp32", "81.50 ± 1.00", 0.0, 0.02, 1.5, 1.0],
                    ["GCN", "int2", "80.50 ± 1.00", -1.0, 0.005, 6.0, 4.0],
                    ["SAGE", "post fp32", "79.00 ± 0.00", None, 0.75, 1.0, None],
                    ["SAGE", "adaptive + --adaptive-bits", "80.00 ± 1.00", 0.2, 0.1, 7.5, 6.0]]


def test_stale_halos():
    cache = _acc_row("cora", "gcn", "cache@dropout0", [0.8], 0.0065, -0.04, 0.0143, 0.0103)
    cache.update(rows_skipped_frac=0.784, exchange_s=0.027)
    fp32 = _acc_row("cora", "sage", "fp32@dropout0", [0.79], 0.0168, 0.0, 0.0234, 0.0168)
    columns, rows, _ = CURATORS["stale_halos"]({"rows": [cache, fp32]}, {})
    assert columns[4] == "rows skipped" and columns[-1] == "exposed exchange ms/epoch"
    assert rows == [["GCN", "cache (adaptive ε)", "80.00 ± 1.00", -0.04, "78 %", 0.0065, 2.2, 27.0],
                    ["SAGE", "fp32 (exact)", "79.00 ± 1.00", 0.0, None, 0.0168, 1.39, 15.7]]


def _kernel_row(case, F, method, fwd, fwd_bwd=None, **kw):
    return {"case": case, "F": F, "method": method, "nodes": 1_000_000, "edges": 16_000_000,
            "load_avg_before": 0.43, "copy_best_gbs": 27.21, "read_best_gbs": 30.2,
            "fwd_best_s": fwd, "fwd_bwd_best_s": fwd_bwd, **kw}


def test_kernels():
    ours = dict(per_edge_gbs=19.44, per_edge_pct_copy=71.4, per_edge_pct_read=64.4,
                minimum_gbs=3.2, minimum_pct_copy=11.8, minimum_pct_read=10.6)
    result = {"aggregation": [
        _kernel_row("powerlaw", 16, "pyg", 1.7961, 3.6049),
        _kernel_row("powerlaw", 16, "ours", 0.0631, 0.1389, **ours),
        _kernel_row("powerlaw", 16, "row_read_floor", 0.05),  # not a column of the table
        _kernel_row("powerlaw", 256, "pyg", None),  # not run: memory
        _kernel_row("powerlaw", 256, "ours", 0.795, None, **ours)]}
    columns, rows, _ = CURATORS["kernels"](result, {})
    assert columns[2:5] == ["load; copy / read GB/s", "PyG gather-scatter", "ours"]
    assert rows == [["powerlaw 1M/16M", 16, "0.4; 27.2 / 30.2", "1.796 / 3.605", "0.063 / 0.139",
                     "19.4 (71 % / 64 %)", "3.2 (12 % / 11 %)"],
                    ["powerlaw 1M/16M", 256, "0.4; 27.2 / 30.2", "not run (memory)",
                     "0.795 / not run (memory)", "19.4 (71 % / 64 %)", "3.2 (12 % / 11 %)"]]


def test_a_curated_entry_keeps_its_text_and_passes_the_check():
    result = {"seeds": [0], "processes": 2, "single_process": [0.8], "partitioned": [0.81],
              "single_mean": 0.8, "partitioned_mean": 0.81, "single_std": 0.0,
              "partitioned_std": 0.0}
    base = {"title": "T", "setup": "S", "command": "python -m benchmarks cora_accuracy",
            "measured": "2000-01-01", "columns": [], "rows": [], "notes": "N"}
    entry = curate_entry("cora_accuracy", result, {}, base,
                         command="python -m benchmarks cora_accuracy --seeds 1 --processes 2",
                         measured="2026-12-06")
    assert entry["measured"] == "2026-12-06" and entry["notes"] == "N"
    assert entry["rows"][1] == ["2 processes (METIS, halo exchange, kernels)", 81.0, "81.00 ± 0.00 %"]
    assert check({"cora_accuracy": entry}) == []
    json.dumps(entry)  # the file's format: plain JSON
