"""The benchmark suite as a package: ``python -m benchmarks`` lists and runs the topics, no module
edits ``sys.path``, results go outside the repository, ``benchmarks/results.json`` keeps its
format and ``curate`` rebuilds an entry of it from a result file."""
import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
DATA = Path(__file__).resolve().parent / "data"
TOPICS = sorted(p.stem for p in BENCH.glob("*.py")
                if not p.name.startswith("_") and p.stem != "training_runs")


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO, **kw)


def test_every_topic_is_a_module_with_main():
    assert len(TOPICS) == 23
    for topic in TOPICS:
        tree = ast.parse((BENCH / f"{topic}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), topic


def test_help_lists_every_topic_with_a_description():
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()
             if line.startswith("  ") and line.strip()}
    for name in TOPICS + ["curate", "plot"]:
        assert name in lines, name
        assert len(lines[name].split()) > 2, lines[name]  # a description after the name
    assert "training_runs" not in lines


def test_unknown_topic_is_refused():
    proc = _run("no_such_topic")
    assert proc.returncode == 2 and "unknown topic" in proc.stderr


def test_a_topic_runs_and_its_help_names_it():
    proc = _run("cluster", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m benchmarks cluster")
    assert "--out DIR" in proc.stdout and "--json-out" in proc.stdout


def test_no_module_edits_sys_path():
    for path in BENCH.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=", text), path.name
        # sibling modules are imported as the package's (relative imports), never by bare name
        tree = ast.parse(text)
        siblings = {p.stem for p in BENCH.glob("*.py")}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] not in siblings, (path.name, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] not in siblings, (path.name, alias.name)


def test_results_go_outside_the_repository_by_default(monkeypatch, tmp_path):
    from benchmarks import _common
    monkeypatch.delenv(_common.RESULTS_ENV, raising=False)
    monkeypatch.delenv("LIGHTNING_FULLGRAPH_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    # The library's one cache directory: partitions/, ext/ and benchmarks/ inside it.
    assert _common.results_dir() == tmp_path / ".cache" / "lightning_fullgraph" / "benchmarks"
    monkeypatch.setenv("LIGHTNING_FULLGRAPH_CACHE", str(tmp_path / "cache"))
    assert _common.results_dir() == tmp_path / "cache" / "benchmarks"
    monkeypatch.setenv(_common.RESULTS_ENV, str(tmp_path / "env"))
    assert _common.results_dir() == tmp_path / "env"
    assert _common.results_dir(tmp_path / "given") == tmp_path / "given"
    path = _common.write_result("topic", {"a": 1})
    assert path.parent == tmp_path / "env" and path.name.startswith("topic-") and path.suffix == ".json"
    assert json.loads(path.read_text()) == {"a": 1}
    # the topics whose --out named a file keep that meaning for a path ending in .json
    assert _common.result_path("hosts", tmp_path / "x" / "h.json") == tmp_path / "x" / "h.json"


def test_a_topic_writes_its_result_file(results_in_tmp):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "sage_fusion", "--nodes", "300",
                           "--edges", "2000", "--features", "8", "--rounds", "2", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (written,) = results_in_tmp.glob("sage_fusion-*.json")
    assert json.loads(written.read_text()) == json.loads(proc.stdout)
    assert f"# result: {written}" in proc.stderr


def test_results_json_format():
    from benchmarks._curate import REQUIRED, check, dump
    text = (BENCH / "results.json").read_text()
    doc = json.loads(text)
    assert check(doc) == []
    assert dump(doc) == text  # written by the curate command's dump, one row per line
    assert len(text.splitlines()) < 400
    for key, entry in doc.items():
        for field in REQUIRED:
            assert entry[field], (key, field)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["measured"]), key
        assert entry["command"].startswith(("python -m benchmarks ", "sudo python -m benchmarks ")), key
        assert all(len(row) == len(entry["columns"]) for row in entry["rows"]), key
    for topic in ("cluster-sage", "cluster-duplex", "cluster-gcn", "aggregation-rows", "planner",
                  "quantization-cora", "stale_halos-cora", "kernels", "cora_accuracy",
                  "fourd-synthetic", "fullgraph"):
        assert topic in doc, topic


def test_check_finds_bad_entries():
    from benchmarks._curate import check
    bad = {"t": {"title": "x", "command": "c", "measured": "2026-01-01", "setup": "s",
                 "columns": ["a", "b"], "rows": [[1]], "extra": 1}}
    problems = check(bad)
    assert any("row 0" in p for p in problems) and any("unknown fields" in p for p in problems)
    assert any("no 'setup'" in p for p in check({"t": {"title": "x"}}))


def test_curate_reproduces_the_committed_entry(tmp_path):
    committed = json.loads((BENCH / "results.json").read_text())
    results = tmp_path / "results.json"
    # the entry's hand-written text stays, the rows, command and date come from the file
    stale = dict(committed["cluster-sage"], rows=[], command="old", measured="2000-01-01")
    results.write_text(json.dumps({"cluster-sage": stale}))
    proc = _run("curate", str(DATA / "cluster-sage-narrow.json"), "--topic", "cluster",
                "--key", "cluster-sage", "--results", str(results))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(results.read_text())["cluster-sage"] == committed["cluster-sage"]


def test_curate_refuses_a_topic_without_curator_and_an_entry_without_text(tmp_path):
    sample = str(DATA / "cluster-sage-narrow.json")
    proc = _run("curate", sample, "--topic", "hosts", "--results", str(tmp_path / "r.json"))
    assert proc.returncode != 0 and "no curator" in proc.stderr
    proc = _run("curate", sample, "--topic", "cluster", "--results", str(tmp_path / "r.json"))
    assert proc.returncode != 0 and "'title'" in proc.stderr
    proc = _run("curate", sample, "--topic", "cluster", "--where", "config=int2", "--title", "T",
                "--setup", "S", "--print")
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)["cluster"]
    assert [row[1] for row in entry["rows"]] == ["int2"]
    assert entry["measured"] == "2026-11-28" and "--json-out" not in entry["command"]


@pytest.mark.parametrize("topic, result", [("cluster", "cluster-sage-narrow.json"),
                                           ("fourd", "fourd-cora.json")])
def test_plot_from_a_result_file(tmp_path, topic, result):
    pytest.importorskip("matplotlib")
    png = tmp_path / f"{topic}.png"
    proc = _run("plot", topic, str(DATA / result), "--out", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 0


def test_benchmarks_stay_out_of_the_wheel():
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r'\[tool\.setuptools\.packages\.find\]\s*include = \["lightning_fullgraph\*"\]', text)


def test_curate_a_fourd_result():
    proc = _run("curate", str(DATA / "fourd-cora.json"), "--topic", "fourd", "--where",
                "config=4d grid gcn bf16", "--title", "T", "--setup", "S", "--command", "C",
                "--measured", "2026-11-29", "--print")
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)["fourd"]
    assert entry["columns"][:3] == ["configuration", "processes", "test acc (%)"]
    (row, ) = entry["rows"]
    assert row[0] == "4d grid gcn bf16" and row[1] == 4 and len(row[3].split(" / ")) == 3


def test_cluster_planner_step_hides_what_runs_in_flight():
    # The planner's step: the reference's compute plus the exposed exchange, no less than the
    # link is busy with what the step waits for, plus the codec; a result without exposed
    # seconds (older) hides nothing.
    from benchmarks.cluster import derive

    def row(config, step, **kw):
        return dict(model="sage", rate="1gbit", nodes=4, seed=0, config=config, step_s=step,
                    val_trace=[], **kw)
    rows = [row("post", 7.0, step_compute_s=3.0, predicted_exchange_s=5.0,
                predicted_exposed_s=4.0, predicted_codec_s=0.0),
            row("int2c", 3.0, predicted_exchange_s=0.5, predicted_exposed_s=0.0,
                predicted_codec_s=0.25),
            row("pipeline", 6.0, predicted_exchange_s=5.0, predicted_exposed_s=0.0),
            # Background transfers (into the next step): not in the link the step waits for.
            row("pipeline-bg", 3.5, predicted_exchange_s=5.0, predicted_exposed_s=0.5,
                predicted_link_s=0.0),
            row("old", 8.0, predicted_exchange_s=5.0, predicted_codec_s=0.5)]
    derive(rows, "post")
    assert [r["predicted_step_s"] for r in rows] == [7.0, 3.25, 5.0, 3.5, 8.5]
    assert rows[1]["predicted_vs_measured"] == 3.25 / 3.0
    # The reference's least compute over ranks where the result has it (rank 0's own also
    # counts its wait at the gradient all-reduce for a slower rank).
    rows[0]["step_compute_min_s"] = 2.5
    derive(rows, "post")
    assert [r["predicted_step_s"] for r in rows] == [6.5, 2.75, 5.0, 3.0, 8.0]
    # With the link's contention (0.5: half a second of compute lost per second of transfer in
    # flight), the reference's compute is first taken back to nothing in flight (its 1 s
    # hidden: 2.0 s), then slowed by each configuration's hidden seconds, no more than by a
    # link busy throughout (the pipeline's background: 2.0 / (1 - 0.5)); the older row hides
    # nothing (2.0 + 5.0 + its codec's 0.5).
    for r in rows:
        r["link_contention"] = 0.5
    derive(rows, "post")
    assert [r["predicted_step_s"] for r in rows] == pytest.approx([6.5, 2.5, 5.0, 4.5, 7.5])


def test_cluster_planner_step_is_the_median_over_the_steady_epochs():
    # The run's step terms per epoch: the predicted step is the median over the epochs its
    # measured step is the median of, not the last epoch's (a bounded pipeline's last epoch
    # is synchronous: here its exposed 8 s would predict 10 s).
    from benchmarks.cluster import derive, steady_step_terms

    def row(config, step, **kw):
        return dict(model="sage", rate="1gbit", nodes=4, seed=0, config=config, step_s=step,
                    val_trace=[], **kw)
    epochs = dict(predicted_step_exchange_s=[None, 9.0, 5.0, 5.0, 5.0, 5.0],
                  predicted_step_exposed_s=[None, 9.0, 0.5, 1.0, 0.0, 8.0],
                  predicted_step_link_s=[None, 9.0, 0.0, 0.0, 0.0, 0.0],
                  predicted_step_codec_s=[None, 0.0, 0.0, 0.0, 0.0, 0.0])
    rows = [row("post", 7.0, step_compute_s=2.0, predicted_exchange_s=5.0,
                predicted_exposed_s=5.0),
            row("pipeline", 3.0, predicted_exchange_s=5.0, predicted_exposed_s=8.0,
                predicted_link_s=0.0, steady_from_epoch=2, per_epoch=epochs)]
    assert steady_step_terms(rows[1]) == [(5.0, 0.5, 0.0, 0.0), (5.0, 1.0, 0.0, 0.0),
                                          (5.0, 0.0, 0.0, 0.0), (5.0, 8.0, 0.0, 0.0)]
    assert steady_step_terms(rows[0]) == []  # no per-epoch terms: the last epoch's
    derive(rows, "post")
    assert [r["predicted_step_s"] for r in rows] == [7.0, 2.75]  # median of 2.5, 3, 2, 10


def test_cluster_repeats_keep_the_median_step():
    from benchmarks.cluster import median_repeats

    def row(config, step):
        return dict(model="gcn", rate="1gbit", nodes=4, seed=0, config=config, step_s=step)
    rows = median_repeats([row("post", 0.4), row("int2", 0.3), row("post", 0.2),
                           row("int2", 0.5), row("post", 0.3), row("hybrid", 0.1)])
    assert [(r["config"], r["step_s"], r.get("step_s_repeats")) for r in rows] == [
        ("post", 0.3, [0.4, 0.2, 0.3]), ("int2", 0.3, [0.3, 0.5]), ("hybrid", 0.1, None)]


def test_cluster_refuses_no_repeats():
    proc = _run("cluster", "--repeats", "0")
    assert proc.returncode == 2 and "--repeats must be at least 1, got 0" in proc.stderr


def test_cluster_step_is_the_steady_state_after_step_aside_decides():
    # The median over the second half of the epochs, and none before step aside's decision:
    # its trial's steps are every arm's, not the configuration's.  A run that ends in the
    # trial is flagged.
    from benchmarks.cluster import summarize, table

    def summary(steps, decision=None):
        return dict(per_epoch=dict(step_s=steps, exchange_s=[s / 10 for s in steps]),
                    step_aside=decision, train_steps_per_epoch=1, train_step_seconds=0.0,
                    exchange_s_per_epoch=0.0, compute_s_per_epoch=0.0,
                    comm_MB_per_epoch_per_rank=1.0, test_acc=0.5, val_trace=[],
                    fit_seconds=1.0, wall_s=1.0)
    steps = [9.0] * 4 + [5.0, 7.0, 5.0, 7.0, 7.0] + [2.0, 3.0, 2.0]
    plain = summarize(summary(steps), "sage", "sampling", "1gbit", 4, 0)
    assert plain["steady_from_epoch"] == 6 and plain["step_s"] == 4.0 and not plain["in_trial"]
    decided = summarize(summary(steps, dict(stages=["sampling"], step=9)), "sage",
                        "sampling+aside", "1gbit", 4, 0)
    assert decided["steady_from_epoch"] == 9 and decided["step_s"] == 2.0
    assert decided["exchange_s"] == 0.2 and not decided["in_trial"]
    # Two steps per epoch: the epoch of step 9 (4) mixes the trial's last step and the first
    # decided one, so the steady state starts at epoch 5.
    two = summary(steps, dict(stages=[], step=9))
    two["train_steps_per_epoch"] = 2
    assert summarize(two, "sage", "sampling+aside", "1gbit", 4, 0)["steady_from_epoch"] == 6
    two["step_aside"]["step"] = 18
    assert summarize(two, "sage", "sampling+aside", "1gbit", 4, 0)["steady_from_epoch"] == 9
    short = summarize(summary(steps[:6]), "sage", "sampling+aside", "1gbit", 4, 0)
    assert short["in_trial"] and short["step_s"] == 7.0
    assert table([plain, short]).splitlines()[-1].startswith("* still in step aside's trial")
    assert "*" not in table([plain])


def test_cluster_nodes_wait_passively_unless_told_and_rows_say_which(monkeypatch):
    # A node is a CPU quota that charges OpenMP's spinning threads as work (a machine's own
    # idle cores spin for free): the nodes sleep at once by default, and a row says which
    # policy its run had.
    from benchmarks.cluster import node_openmp_env, openmp_wait_policy
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    passive = argparse.Namespace(omp_wait_policy="passive")
    inherit = argparse.Namespace(omp_wait_policy="inherit")
    assert node_openmp_env(passive) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert openmp_wait_policy(passive) == "PASSIVE"
    assert node_openmp_env(inherit) == {}
    assert openmp_wait_policy(inherit) == "default"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert openmp_wait_policy(inherit) == "ACTIVE"
    assert openmp_wait_policy(passive) == "PASSIVE"


def test_cluster_jobs_pass_the_wait_policy_to_every_node(monkeypatch):
    import benchmarks.cluster as bench
    seen = []

    class Proc:
        returncode = 0

        def communicate(self, timeout=None):
            return '{"train_step_seconds": 1.0}', ""

    class Cluster:
        nodes, node_cores = 2, 1

        def torchrun(self, args, env, **kwargs):
            seen.append(env)
            return [Proc(), Proc()]

    for policy, expected in (("passive", "PASSIVE"), ("inherit", None)):
        opts = argparse.Namespace(dataset="cora", hidden=16, layers=2, epochs=1,
                                  cache_dir="/tmp", predict=False, job_timeout=10,
                                  omp_wait_policy=policy)
        bench.run_job(Cluster(), "gcn", "post", opts, 0, 29999)
        assert seen[-1].get("OMP_WAIT_POLICY") == expected


def test_busy_link_help_and_table():
    proc = _run("busy_link", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m benchmarks busy_link")
    assert "--grad-mb" in proc.stdout and "--json-out" in proc.stdout
    from benchmarks.busy_link import table
    row = dict(rate="1gbit", node_cores=4, all_reduce_idle_s=0.08, all_reduce_busy_s=0.37,
               all_reduce_ratio=4.625, compute_idle_s=0.8, compute_busy_s=0.96,
               compute_ratio=1.2)
    last = table([row]).splitlines()[-1].split()
    assert last[:2] == ["1gbit", "4"] and last[4] == "4.62" and last[-1] == "1.20"


def test_link_sizes_help_and_table():
    proc = _run("link_sizes", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m benchmarks link_sizes")
    assert "--sizes" in proc.stdout and "--json-out" in proc.stdout
    from benchmarks.link_sizes import table
    mib = 1 << 20
    row = dict(rate="1gbit", nodes=2, node_cores=1, line_rate=125e6, sizes=[mib, 64 * mib],
               bandwidth=[121.8e6, 60.2e6], duplex_bandwidth=119.5e6, duplex_speedup=1.99,
               short_beta=82.1e6, short_vs_largest=1.36, short_s=9.2, default_beta=61.6e6,
               default_vs_largest=1.02, default_s=11.9)
    lines = table([row]).splitlines()
    assert lines[2].split() == ["1gbit", "2", "1", "1.00", "121.80", "0.97"]
    assert lines[3].split()[-2:] == ["60.20", "0.48"]
    assert "1.99x faster" in lines[4] and lines[4].split()[2:4] == ["119.50", "0.96"]
    assert "1.36x" in lines[5] and "1.02x" in lines[6]
