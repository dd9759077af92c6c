"""``lightning-fullgraph plan``: JSON output, table, plot and errors."""
import json
import os
import sys

import pytest

from lightning_fullgraph.cli import main
from lightning_fullgraph.partition import read_manifest
from lightning_fullgraph.planner import LinkModel


@pytest.fixture(scope="module")
def link_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("link") / "link.json"
    LinkModel(alpha=5e-5, beta=2e9, codec_throughput=1e10, world_size=2,
              backend="gloo").save(path)
    return str(path)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def test_plan_json_on_cora(capsys, link_file, cache_dir):
    assert main(["plan", "--dataset", "cora", "--parts", "4,2", "--json", "--link", link_file,
                 "--cache-dir", cache_dir]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)  # stdout is JSON only
    assert "[plan] partitioning into 2 parts" in err and "[plan] link from" in err
    assert result["dataset"] == "cora" and result["nodes"] == 2708
    assert result["model"]["name"] == "gcn" and result["link"]["alpha"] == 5e-5
    assert [e["parts"] for e in result["results"]] == [2, 4]
    assert set(result["widths"]["hybrid"]) == {"convs.0", "convs.1"}
    memory = {}
    for entry in result["results"]:
        modes = entry["modes"]
        assert set(modes) == {"post", "pre", "hybrid"}
        stats = read_manifest(entry["partition"])["stats"]
        for mode, s in modes.items():
            assert s["rows_per_exchange"] == stats["mode_rows"][mode]
            assert len(s["bytes_sent"]) == len(s["memory_bytes"]) == entry["parts"]
            assert s["bytes_per_epoch_max"] == max(s["bytes_sent"]) > 0
            assert 0 < s["exchange_seconds"] < 1
            assert s["memory_bytes_max"] == max(s["memory_bytes"]) == s["memory"]["total"]
        total = {m: s["bytes_per_epoch_total"] for m, s in modes.items()}
        assert total["hybrid"] <= min(total["post"], total["pre"])
        memory[entry["parts"]] = modes["post"]["memory_bytes_max"]
    assert memory[4] < memory[2]  # more ranks, less per rank


def test_plan_table_reuses_the_partition_cache(capsys, link_file, cache_dir):
    assert main(["plan", "--parts", "2", "--model", "sage", "--aggregation", "hybrid",
                 "--link", "none", "--cache-dir", cache_dir]) == 0
    out, err = capsys.readouterr()
    assert "SAGE hidden 16 x 2 layers" in out and "link: none" in out
    lines = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    assert [line[1] for line in lines] == ["hybrid"] and lines[0][7] == "n/a"


def test_plot_writes_a_png(capsys, tmp_path, link_file, cache_dir):
    if os.environ.get("LIGHTNING_FULLGRAPH_CI", "0").lower() not in ("", "0", "false", "no"):
        import matplotlib  # noqa: F401  (CI installs the plot extra: a skip would hide it)
    pytest.importorskip("matplotlib")
    png = tmp_path / "figs" / "plan.png"
    assert main(["plan", "--parts", "2,4", "--link", link_file, "--cache-dir", cache_dir,
                 "--plot", str(png), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plot_without_matplotlib_names_the_extra(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert main(["plan", "--parts", "2", "--link", "none", "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "lightning-fullgraph[plot]" in err and "matplotlib" in err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("parts", ["2,x", "0,2", ""])
def test_bad_parts_list(capsys, parts):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--parts", parts])
    assert e.value.code == 2
    assert "comma-separated list of part counts" in capsys.readouterr().err


def test_other_errors_are_clear(capsys, tmp_path):
    assert main(["plan", "--parts", "2,4", "--hosts", "4", "--link", "none"]) == 2
    assert "--hosts 4 must divide every --parts value; 2 is not" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["plan", "--parts", "2", "--link", str(tmp_path / "bad.json")]) == 2
    assert "not a JSON link model" in capsys.readouterr().err
    assert main(["plan", "--parts", "5000", "--link", "none"]) == 2
    assert "exceeds the 2708 nodes" in capsys.readouterr().err


def test_link_rate_caps_the_bandwidth(capsys, link_file, cache_dir):
    # The file's 2 GB/s per rank capped at a 1 Gbit/s link: 125 MB/s, the latency kept.
    args = ["plan", "--dataset", "cora", "--parts", "2", "--aggregation", "post", "--json",
            "--link", link_file, "--cache-dir", cache_dir]
    assert main(args) == 0
    fast = json.loads(capsys.readouterr()[0])
    assert main(args + ["--link-rate", "1gbit"]) == 0
    out, err = capsys.readouterr()
    slow = json.loads(out)
    assert "link capped at 1gbit" in err
    assert slow["link"]["beta"] == 1.25e8 and slow["link"]["alpha"] == 5e-5
    post_fast = fast["results"][0]["modes"]["post"]
    post_slow = slow["results"][0]["modes"]["post"]
    assert post_slow["bytes_per_epoch_max"] == post_fast["bytes_per_epoch_max"]
    assert post_slow["exchange_seconds"] > post_fast["exchange_seconds"]


def test_link_rate_is_checked_first(capsys, cache_dir):
    # Refused before calibrating or partitioning anything (exit 2, the reason on stderr).
    assert main(["plan", "--parts", "2", "--link-rate", "fast", "--cache-dir", cache_dir]) == 2
    assert "not a positive rate like '1gbit'" in capsys.readouterr()[1]
    assert main(["plan", "--parts", "2", "--link", "none", "--link-rate", "1gbit",
                 "--cache-dir", cache_dir]) == 2
    assert "drop one of them" in capsys.readouterr()[1]


def test_duplex_predicts_at_the_measured_gain(capsys, tmp_path, cache_dir):
    # A link measured on a cluster with its duplex gain: the exchanges predicted at 1.6x the
    # bandwidth (the latency kept), capped at the rate each way; the bytes unchanged.
    path = tmp_path / "duplex.json"
    LinkModel(alpha=5e-5, beta=1e8, world_size=2, backend="gloo", duplex_gain=1.6).save(path)
    args = ["plan", "--dataset", "cora", "--parts", "2", "--aggregation", "post", "--json",
            "--link", str(path), "--cache-dir", cache_dir]
    assert main(args) == 0
    one = json.loads(capsys.readouterr()[0])
    assert main(args + ["--duplex"]) == 0
    out, err = capsys.readouterr()
    both = json.loads(out)
    assert "both directions at once, 1.60x the bandwidth" in err
    assert both["duplex_gain"] == 1.6 and both["link"]["beta"] == pytest.approx(1.6e8)
    assert both["link"]["alpha"] == 5e-5
    post_one, post_both = one["results"][0]["modes"]["post"], both["results"][0]["modes"]["post"]
    assert post_both["bytes_per_epoch_max"] == post_one["bytes_per_epoch_max"]
    assert post_both["exchange_seconds"] < post_one["exchange_seconds"]
    assert main(args + ["--duplex", "--link-rate", "1gbit"]) == 0
    assert json.loads(capsys.readouterr()[0])["link"]["beta"] == 1.25e8  # at most the rate
    assert main(args[:-5] + ["--cache-dir", cache_dir, "--link", str(path), "--duplex"]) == 0
    assert "both directions at once (1.60x" in capsys.readouterr()[0]  # the table says so


def test_duplex_needs_a_measured_gain(capsys, link_file, cache_dir):
    assert main(["plan", "--parts", "2", "--duplex", "--cache-dir", cache_dir]) == 2
    assert "pass --link FILE.json" in capsys.readouterr()[1]  # refused before calibrating
    assert main(["plan", "--parts", "2", "--duplex", "--link", link_file,
                 "--cache-dir", cache_dir]) == 2
    assert "holds no duplex gain" in capsys.readouterr()[1]
