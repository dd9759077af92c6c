"""``python -m benchmarks fullgraph --block-cache-ab``: which timed epochs run with the block cache,
which count, and what is refused."""
import pytest


def test_epochs_come_in_pairs_and_the_second_of_each_counts(load_benchmark):
    fg = load_benchmark("fullgraph")
    settings = [fg.block_cache_setting(i) for i in range(8)]
    assert settings == [False, False, True, True, False, False, True, True]
    timed = [{"block_cache": on, "block_cache_steady": i % 2 == 1}
             for i, on in enumerate(settings)]
    ab = fg.block_cache_ab([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], timed)
    assert ab["epochs_off"] == [2.0, 6.0] and ab["epochs_on"] == [4.0, 8.0]
    assert ab["off_s"] == 4.0 and ab["on_s"] == 6.0 and ab["speedup"] == pytest.approx(4 / 6)
    assert fg.block_cache_ab([1.0], [{"loss": 0.0}]) is None  # not an A/B run
    assert "cpu_off_s" not in ab  # no CPU times given


def test_cpu_and_system_seconds_per_mode(load_benchmark):
    fg = load_benchmark("fullgraph")
    timed = [{"block_cache": fg.block_cache_setting(i), "block_cache_steady": i % 2 == 1}
             for i in range(8)]
    cpu = [10.0, 2.0, 10.0, 1.0, 10.0, 4.0, 10.0, 3.0]
    system = [5.0, 0.5, 5.0, 0.1, 5.0, 1.5, 5.0, 0.3]
    ab = fg.block_cache_ab([1.0] * 8, timed, cpu, system)
    assert ab["cpu_off_s"] == 3.0 and ab["cpu_on_s"] == 2.0  # epochs 1, 5 off; 3, 7 on
    assert ab["sys_off_s"] == 1.0 and ab["sys_on_s"] == pytest.approx(0.2)


@pytest.mark.parametrize("argv,message", [
    (["--block-cache-ab", "8G"], "needs --kernels auto or cpp"),
    (["--block-cache-ab", "lots", "--kernels", "auto"], "expected bytes"),
    (["--block-cache-ab", "8G", "--kernels", "auto", "--epochs", "3"], "--epochs >= 4"),
])
def test_bad_options_are_refused(load_benchmark, capsys, argv, message):
    fg = load_benchmark("fullgraph")
    with pytest.raises(SystemExit):
        fg.parse_args(argv)
    assert message in capsys.readouterr().err


def test_good_options_parse(load_benchmark):
    args = load_benchmark("fullgraph").parse_args(
        ["--block-cache-ab", "8G", "--kernels", "auto", "--epochs", "8"])
    assert args.block_cache_ab == "8G"
