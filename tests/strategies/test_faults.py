"""Faults under a real Lightning launch: every process stops, in bounded time, with a clear error.

Each test runs ``train_script.py`` the way users run a training script (Lightning re-runs
it once per extra rank) and watches every process of the job.
"""
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Timing: run alone, not beside other tests (scripts/test.sh).
pytestmark = pytest.mark.serial

psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("train_script.py")


def _start(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TEST_CACHE_DIR=str(tmp_path / "cache"),
               OMP_NUM_THREADS="1")
    # stderr to a file: a full pipe that nobody reads would block the ranks (a false hang).
    log = open(tmp_path / f"stderr-{time.monotonic_ns()}.log", "w+")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    proc.log = log
    return proc


def _wait_all(proc, children, limit):
    r"""Waits until the launching process and the ranks it started have exited.

    Returns the processes still alive after :obj:`limit` seconds (then killed), stdout
    and stderr.  The launcher is waited for through ``Popen`` (which drains its pipes and
    keeps its exit code); its children through psutil.
    """
    deadline = time.monotonic() + limit
    alive = []
    try:
        stdout, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        alive.append(proc)
        proc.kill()
        stdout, _ = proc.communicate()
    _, still = psutil.wait_procs(children, timeout=max(0.1, deadline - time.monotonic()))
    for p in still:
        p.kill()
    proc.log.seek(0)
    return alive + still, stdout, proc.log.read()


def _children(proc, expected, limit=120):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if len(kids) >= expected:
            return kids
        time.sleep(0.05)
    raise AssertionError("the ranks were not started")


def _run(tmp_path, *args, limit=120):
    r"""Runs the script to its end; every process must be gone within :obj:`limit` seconds.

    Returns ``(exit code of the launcher, stdout, stderr)``.
    """
    proc = _start(tmp_path, *args)
    alive, stdout, stderr = _wait_all(proc, _children(proc, 1), limit)
    assert not alive, (f"{len(alive)} process(es) still running after {limit} s", stderr[-3000:])
    return proc.returncode, stdout, stderr


def _until(proc, epoch, rank):
    r"""Reads the job's stdout until rank :obj:`rank` starts :obj:`epoch`; returns the pids of
    the ranks seen so far (by rank), or a string saying what went wrong."""
    pids = {}
    for line in proc.stdout:  # the ranks' progress (stderr is read at the end)
        match = re.match(r"EPOCH (\d+) RANK (\d+) PID (\d+)", line)
        if match is None:
            continue
        seen, who = int(match[1]), int(match[2])
        pids[who] = int(match[3])
        if (seen, who) == (epoch, rank):
            return pids
        if who == rank and seen > epoch:
            for p in psutil.Process(proc.pid).children(recursive=True) + [proc]:
                p.kill()
            proc.wait()
            return f"missed the start of epoch {epoch}: {line!r}"
    proc.wait()
    proc.log.seek(0)
    return "training ended before the moment: " + proc.log.read()[-3000:]


def _sigterm_at(tmp_path, epoch, delay, rank=0, *args, clean=True, limit=30):
    r"""Starts a job, sends SIGTERM to rank :obj:`rank` at :obj:`epoch` (+ :obj:`delay` s);
    returns what went wrong (``None``: every process stopped within :obj:`limit` s, and, with
    :obj:`clean`, without a traceback)."""
    tmp_path.mkdir()
    proc = _start(tmp_path, "--epochs", 100000, "--timeout", 60, *args)
    pids = _until(proc, epoch, rank)
    if isinstance(pids, str):
        return pids
    children = _children(proc, 1)
    time.sleep(delay)
    start = time.monotonic()
    os.kill(pids[rank], signal.SIGTERM)
    alive, _, stderr = _wait_all(proc, children, limit)
    if alive or time.monotonic() - start >= limit:
        return f"{len(alive)} process(es) still running after {limit} s: {stderr[-3000:]}"
    if clean and "Traceback" in stderr:  # a clean stop, not a crash
        return stderr[-3000:]
    return None


@pytest.mark.multiprocess
def test_startup_is_not_limited_by_the_collective_timeout(tmp_path):
    # First in the module, alone: the other jobs (started together by the `jobs` fixture)
    # would load the machine, and this one trains under a 1 s collective timeout.
    # A 1 s dead-peer timeout used to limit the rendezvous and the barrier while rank 0
    # partitions (here: 3 s), failing start-up with "Timed out ... waiting for clients".
    code, stdout, stderr = _run(tmp_path, "--timeout", 1, "--slow-prepare", 3, "--epochs", 3,
                                limit=300)
    assert code == 0, stderr[-4000:]
    assert "RESULT" in stdout and "processes=2" in stdout


# Moments of training: (epoch at whose start rank 0 is signalled, extra delay in s).  Epochs
# of Cora on 2 processes take a few tens of ms, so the delays land in different phases
# (forward exchanges, backward, optimizer, validation).
MOMENTS = [(2, 0.0), (3, 0.005), (4, 0.02), (5, 0.05), (6, 0.1), (8, 0.2)]


def _finished(tmp_path, *args, limit=120):
    r"""Runs the script to its end (see :func:`_run`), or says why not: a string."""
    tmp_path.mkdir()
    try:
        return _run(tmp_path, *args, limit=limit)
    except AssertionError as error:
        return str(error)


def _stuck_between_steps(tmp_path):
    r"""Rank 1 sleeps in on_train_epoch_end, where no collective of the library runs.
    Returns ``(seconds until every process exited, exit code, stderr)``."""
    tmp_path.mkdir()
    proc = _start(tmp_path, "--timeout", 5, "--stall-in", "epoch_end", "--stall-rank", 1,
                  "--stall-epoch", 2, "--stall-seconds", 120, "--epochs", 6)
    pids = _until(proc, 2, 1)
    if isinstance(pids, str):
        return None, None, pids
    start = time.monotonic()
    alive, _, stderr = _wait_all(proc, _children(proc, 1), 60)
    return (None if alive else time.monotonic() - start), proc.returncode, stderr


def _jobs():
    r"""Every job of this module but the start-up one (whose point is a 1 s collective
    timeout, which other jobs' load could trip), as ``name -> (function, args)``."""
    jobs = {f"moment-{i}": (_sigterm_at, moment) for i, moment in enumerate(MOMENTS)}
    # SIGTERM to a non-zero rank, and under FourDStrategy, whose processes used to hang.
    jobs.update({f"any-{strategy}-{rank}": (_sigterm_at, (3, 0.01, rank, "--strategy", strategy))
                 for strategy, rank in (("fullgraph", 1), ("4d", 0), ("4d", 1))})
    # A rank blocked in a collective (timeout 60 s) while the other sleeps between steps.
    for blocked in (0, 1):
        jobs[f"blocked-{blocked}"] = (_blocked, (blocked, ))
    jobs["stuck-in-step"] = (_finished, ("--timeout", 3, "--stall-rank", 1, "--stall-epoch", 2,
                                         "--stall-seconds", 15, "--epochs", 6))
    jobs["stuck-between-steps"] = (_stuck_between_steps, ())
    jobs["bad-label"] = (_finished, ("--bad-label", "--epochs", 3, "--timeout", 60))
    jobs["metric-in-progress-bar"] = (_finished, ("--log-train-acc", "--progress-bar",
                                                  "--epochs", 3, "--timeout", 30))
    return jobs


def _blocked(tmp_path, blocked):
    return _sigterm_at(tmp_path, 2, 2.0, blocked, "--stall-in", "epoch_end", "--stall-rank",
                       1 - blocked, "--stall-epoch", 1, "--stall-seconds", 120, clean=False)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    r"""Starts every job at once, three at a time (most of a job's time is its start-up and
    its waits; CI's time budget is 30 minutes); each test waits for its own."""
    root = tmp_path_factory.mktemp("faults")
    pool = ThreadPoolExecutor(max_workers=3)
    futures = {name: pool.submit(fn, root / name, *args) for name, (fn, args) in _jobs().items()}
    yield futures
    pool.shutdown(wait=True)


def _outcome(jobs, name):
    r"""``(exit code, stdout, stderr)`` of a job run to its end (fails with why it was not)."""
    result = jobs[name].result()
    assert not isinstance(result, str), result
    return result


def _failures(jobs, names):
    r"""The jobs of :obj:`names` that did not stop as they should, with why."""
    outcomes = {name: jobs[name].result() for name in names}
    return {name: why for name, why in outcomes.items() if why is not None}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_to_rank_zero_stops_every_process(jobs):
    # How SLURM and Kubernetes stop jobs. Lightning's own handler broadcast from inside the
    # signal handler while the other rank waited in a halo exchange: both hung for the
    # whole collective timeout (60 s here).
    failed = _failures(jobs, [f"moment-{i}" for i in range(len(MOMENTS))])
    assert not failed, {MOMENTS[int(name.split("-")[1])]: why for name, why in failed.items()}


@pytest.mark.multiprocess
def test_stuck_rank_gives_a_timeout_naming_the_exchange_and_the_option(jobs):
    code, _, stderr = _outcome(jobs, "stuck-in-step")
    assert code != 0
    assert "CollectiveError: rank 0:" in stderr, stderr[-4000:]
    assert "timed out (collective timeout 3 s)" in stderr, stderr[-4000:]
    assert "FullGraphStrategy(timeout=...)" in stderr, stderr[-4000:]
    assert "with rank(s) 1" in stderr, stderr[-4000:]


@pytest.mark.multiprocess
def test_label_out_of_range_stops_every_rank_with_the_cause(jobs):
    # num_classes not given: inferred as 100 from the bad label (with a warning), while
    # the model has 7 outputs. The rank holding the node raises torch's error, with notes
    # saying where and why; the other rank stops at its next exchange instead of hanging.
    code, _, stderr = _outcome(jobs, "bad-label")
    assert code != 0
    assert "Target 99 is out of bounds" in stderr, stderr[-4000:]
    assert "the graph's labels reach 99" in stderr, stderr[-4000:]
    assert "in training_step; the other ranks stop" in stderr, stderr[-4000:]
    assert "num_classes is inferred as 100" in stderr, stderr[-4000:]  # the warning


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_to_any_rank_stops_every_process(jobs):
    # FourDStrategy kept Lightning's handler, which broadcasts inside the signal handler: every
    # rank hung for the collective timeout, then failed with a raw gloo error.
    failed = _failures(jobs, ("any-fullgraph-1", "any-4d-0", "any-4d-1"))
    assert not failed, failed


@pytest.mark.multiprocess
def test_a_metric_in_the_progress_bar_does_not_deadlock(jobs):
    # PyG's Lightning example logs a torchmetrics metric per epoch in the progress bar. At the
    # epoch's end Lightning's progress bar synchronizes it on rank 0 alone, while the other
    # rank was already in CommunicationMonitor's all-reduce: a deadlock until the start-up
    # timeout (30 minutes).
    code, stdout, stderr = _outcome(jobs, "metric-in-progress-bar")
    assert code == 0, stderr[-4000:]
    assert "RESULT" in stdout


@pytest.mark.multiprocess
def test_a_rank_stuck_between_steps_is_bounded_by_the_collective_timeout(jobs):
    # The other rank waited in default-group collectives under the 30-minute start-up timeout.
    seconds, code, stderr = jobs["stuck-between-steps"].result()
    assert seconds is not None and seconds < 30, (seconds, stderr[-4000:])
    assert code != 0
    assert "CollectiveError: rank 0:" in stderr, stderr[-4000:]
    assert "timed out (collective timeout 5 s)" in stderr, stderr[-4000:]
    assert "with rank(s) 1" in stderr, stderr[-4000:]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_ends_a_rank_blocked_in_a_collective(jobs):
    # The blocked rank waits in a collective (timeout 60 s), where no Python signal handler
    # runs: SIGTERM, even sent three times, did nothing. Rank 0 (the launcher) and rank 1.
    failed = _failures(jobs, ("blocked-0", "blocked-1"))
    assert not failed, failed
