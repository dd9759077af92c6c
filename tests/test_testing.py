"""``lightning_fullgraph.testing``: the start methods of the ranks."""
import os

import pytest

from lightning_fullgraph.testing import START_METHOD_ENV, run_distributed, run_outcomes


def _report(rank, world_size):
    import sys
    return (rank, os.environ.get("LF_TESTING_PROBE"), os.environ["RANK"],
            "lightning_fullgraph.engine" in sys.modules)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ranks_see_the_callers_environment_at_the_call(method, monkeypatch):
    monkeypatch.setenv("LF_TESTING_PROBE", f"set before {method}")
    got = run_distributed(_report, 2, start_method=method)
    assert [g[:3] for g in got] == [(0, f"set before {method}", "0"),
                                    (1, f"set before {method}", "1")]
    monkeypatch.setenv("LF_TESTING_PROBE", "changed")  # a running fork server sees it too
    assert run_distributed(_report, 2, start_method=method)[0][1] == "changed"


def test_the_fork_server_preloads_nothing_of_this_library():
    # Settings read at import (huge pages, kernels) then still follow the caller's environment.
    assert not any(g[3] for g in run_distributed(_report, 2, start_method="forkserver"))


def test_an_unknown_start_method_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="'fork' is not one of"):
        run_distributed(_report, 2, start_method="fork")
    monkeypatch.setenv(START_METHOD_ENV, "threads")
    with pytest.raises(ValueError, match=START_METHOD_ENV):
        run_outcomes(_report, 2)
