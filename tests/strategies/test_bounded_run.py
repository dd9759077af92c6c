"""The pieces that keep a run from hanging, in isolation: the stop watchdog, the order of the
library's callbacks against Lightning's progress bars, and backend errors of collectives made
outside the engine turned into CollectiveErrors."""
import signal
import subprocess
import sys
import time

import pytest

# Timing: run alone, not beside other tests (scripts/test.sh).
pytestmark = pytest.mark.serial

WATCHED = """
import signal, time
from lightning_fullgraph.stop_watchdog import StopWatchdog
signal.signal(signal.SIGTERM, lambda *a: None)  # a handler that does not stop the process
StopWatchdog(grace={grace}).start()
print("READY", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # busy in Python: the handler runs, nothing stops
    sum(range(1000))
print("NOT ENDED", flush=True)
"""


def _watched(grace, signals=1, gap=0.0):
    proc = subprocess.Popen([sys.executable, "-c", WATCHED.format(grace=grace)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    start = time.monotonic()
    for _ in range(signals):
        proc.send_signal(signal.SIGTERM)
        time.sleep(gap)
    out, err = proc.communicate(timeout=90)
    return proc.returncode, time.monotonic() - start, out, err


def test_a_process_that_does_not_stop_after_sigterm_is_ended_after_the_grace():
    code, seconds, out, err = _watched(grace=1.0)
    assert code == 128 + signal.SIGTERM, (code, out, err)
    assert 0.9 <= seconds < 10, seconds
    assert "received SIGTERM; ending the process now because it has not stopped 1 s" in err


def test_a_second_sigterm_ends_the_process_at_once():
    code, seconds, out, err = _watched(grace=30.0, signals=2, gap=0.3)
    assert code == 128 + signal.SIGTERM and seconds < 10, (code, seconds, err)
    assert "a second signal arrived" in err


STOPPED_AFTER_THE_SIGNAL = """
import signal, time
from lightning_fullgraph.stop_watchdog import StopWatchdog
seen = []
signal.signal(signal.SIGTERM, lambda *a: seen.append(1))
watchdog = StopWatchdog(grace=0.5)
watchdog.start()
print("READY", flush=True)
while not seen or not watchdog.received:  # the handler ran and the watchdog saw it
    time.sleep(0.01)
watchdog.stop()  # the run stopped (teardown): the script goes on with its own work
time.sleep(1.5)
print("SURVIVED", flush=True)
"""


def test_a_run_that_stopped_after_sigterm_is_not_ended_later():
    # After a fit stopped on SIGTERM, a script that went on (writing its results) was ended
    # by the watchdog 10 s later.
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_AFTER_THE_SIGNAL],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "SURVIVED" in out, (proc.returncode, err)


def test_a_stopped_watchdog_leaves_the_process_and_the_wakeup_descriptor_alone():
    from lightning_fullgraph.stop_watchdog import StopWatchdog
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    previous = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        watchdog = StopWatchdog(grace=0.2)
        assert watchdog.start() and watchdog.running
        watchdog.stop()
        assert not watchdog.running
        assert signal.set_wakeup_fd(before) == before  # given back
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.6)  # past the grace: this process is still here
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert watchdog.received == []


def test_library_callbacks_run_before_the_progress_bars():
    from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

    from lightning_fullgraph.callbacks import CommunicationMonitor, RandomStateCheckpoint
    from lightning_fullgraph.strategies.faults import _before_progress_bars
    user, bar, ckpt = ModelCheckpoint(), TQDMProgressBar(), ModelCheckpoint()
    monitor, states = CommunicationMonitor(), RandomStateCheckpoint()
    callbacks = [user, bar, ckpt, monitor, states]
    _before_progress_bars(callbacks)
    assert callbacks == [user, monitor, states, bar, ckpt]
    _before_progress_bars(callbacks)  # idempotent
    assert callbacks == [user, monitor, states, bar, ckpt]


def _raise_from_a_collective():
    import torch
    import torch.distributed as dist
    from lightning_fullgraph.strategies.faults import _Translating
    from lightning_fullgraph.testing import free_port

    def metric_sync():  # a collective outside the engine, e.g. a metric's compute
        dist.barrier()
        raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms "
                           "for recv operation to complete")

    def stuck():
        metric_sync()

    # A real traceback through torch.distributed: raise from inside its module's frame.
    import torch.distributed.distributed_c10d as c10d
    code = compile("def _raise(fn):\n    fn()\n", c10d.__file__, "exec")
    namespace = {}
    exec(code, namespace)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        _Translating(lambda: namespace["_raise"](stuck), timeout=5)()
    finally:
        dist.destroy_process_group()


def test_a_backend_timeout_outside_the_engine_becomes_a_collective_error():
    from lightning_fullgraph.engine import CollectiveError
    with pytest.raises(CollectiveError) as info:
        _raise_from_a_collective()
    message = str(info.value)
    assert info.value.timed_out and "rank 0: a collective outside the halo exchange" in message
    assert "collective timeout 5 s" in message and "FullGraphStrategy(timeout=...)" in message
    assert "metric_sync" in message  # the caller is named


def test_other_errors_pass_unchanged():
    from lightning_fullgraph.strategies.faults import _Translating
    with pytest.raises(ValueError, match="a user's bug"):
        _Translating(lambda: (_ for _ in ()).throw(ValueError("a user's bug")), timeout=5)()
