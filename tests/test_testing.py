"""``lightning_fullgraph.testing``: the start methods of the ranks, their rendezvous and
what a failure reports."""
import os
import socket

import pytest

from lightning_fullgraph import testing
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


def _port(rank, world_size):
    return int(os.environ["MASTER_PORT"])


@pytest.mark.parametrize("run", [run_distributed, run_outcomes])
def test_the_rendezvous_port_is_bound_by_the_caller_for_the_run(run, monkeypatch):
    # A port probed free and closed again can be handed to another run before the ranks bind
    # it (parallel tests could meet in one store that way): the caller binds one and holds it.
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        monkeypatch.setattr(testing, "free_port", lambda: taken)
        got = run(_port, 2, timeout_s=60)
    ports = [g.value if run is run_outcomes else g for g in got]
    assert ports[0] == ports[1] != taken


def _fail(rank, world_size):
    raise RuntimeError(f"rank {rank} broke")


def test_every_failing_rank_is_reported():
    with pytest.raises(RuntimeError) as info:
        run_distributed(_fail, 2, timeout_s=60)
    assert "rank 0 broke" in str(info.value) and "rank 1 broke" in str(info.value)
