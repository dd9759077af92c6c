r"""Ends a process that does not act on SIGTERM (or Ctrl-C) in time.

A Python signal handler runs only when the main thread executes Python code: a process blocked
in C++, e.g. in a collective whose peer is stuck, never runs it, so SIGTERM, however often
sent, would not stop it.  CPython's C-level handler still writes the signal's number to the
wakeup file descriptor (:func:`signal.set_wakeup_fd`) at once, and a daemon thread can read it
while the main thread is blocked (collectives release the GIL).  :class:`StopWatchdog` is that
thread; :class:`~lightning_fullgraph.strategies.signals.DeferredSignals` runs one during
training.  Standard library only, so that it is cheap to import.
"""
import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, List, Optional

__all__ = ["StopWatchdog", "STOP_GRACE_SECONDS"]

log = logging.getLogger(__name__)

#: Seconds a process has, after the first SIGTERM or Ctrl-C, to stop by itself (all ranks at
#: the next step) before :class:`StopWatchdog` ends it: well inside the 30 s that SLURM
#: (``KillWait``) and Kubernetes (``terminationGracePeriodSeconds``) wait before SIGKILL.
STOP_GRACE_SECONDS = 10.0


class StopWatchdog:
    r"""Ends this process when a termination signal is not acted on in time.

    Once :meth:`start` ed (from the main thread), the first watched signal starts the grace
    period and is passed to :obj:`on_signal`; when the grace is over, or at a second watched
    signal, the thread writes why to stderr and ends the process with exit code
    ``128 + signal``.  Signal numbers are passed on to a wakeup descriptor set before.

    Args:
        grace (float): Seconds after the first signal before the process is ended.
        on_signal (Callable[[int], None], optional): Called (in the thread) with the signal
            number when the first signal arrives, e.g. to forward it to launched processes.
        signals (tuple): The signals watched.
    """

    def __init__(self, grace: float = STOP_GRACE_SECONDS,
                 on_signal: Optional[Callable[[int], None]] = None,
                 signals=(signal.SIGTERM, signal.SIGINT)) -> None:
        self.grace = float(grace)
        self.on_signal = on_signal
        self.signals = tuple(int(s) for s in signals)
        self.received: List[int] = []
        self._pipe: Optional[tuple] = None
        self._previous_fd = -1
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        r"""Starts watching (main thread only; returns whether it started)."""
        if self.running:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_fd)
            os.close(write_fd)
            return False
        self._pipe = (read_fd, write_fd)
        self._stopped = False
        self._thread = threading.Thread(target=self._watch, name="lightning-fullgraph-stop",
                                        daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        r"""Stops watching and gives the wakeup descriptor back (main thread only).  Called
        once the run has stopped (the strategy's teardown), also after a signal: what the
        process does afterwards is its own (a script may still write its results)."""
        if not self.running:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        self._stopped = True
        try:
            signal.set_wakeup_fd(self._previous_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            pass
        read_fd, write_fd = self._pipe
        try:
            os.write(write_fd, b"\0")  # wakes the thread (0 is no signal number)
        except OSError:
            pass
        self._thread.join(timeout=1.0)
        os.close(write_fd)
        os.close(read_fd)
        self._thread, self._pipe = None, None

    def _watch(self) -> None:
        read_fd = self._pipe[0]
        deadline = None
        while not self._stopped:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([read_fd], [], [], wait)
            if not ready:  # the grace period is over
                self._end(f"it has not stopped {self.grace:g} s after the signal (blocked in "
                          "a collective or a step that does not return)")
                return
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            for signum in data:
                if self._previous_fd >= 0:  # whoever had the descriptor before still gets it
                    try:
                        os.write(self._previous_fd, bytes([signum]))
                    except OSError:
                        pass
                if signum not in self.signals or self._stopped:
                    continue
                self.received.append(signum)
                if len(self.received) == 1:
                    deadline = time.monotonic() + self.grace
                    if self.on_signal is not None:
                        try:
                            self.on_signal(signum)
                        except Exception:  # never let forwarding kill the watchdog
                            log.debug("forwarding signal %s failed", signum, exc_info=True)
                else:
                    self._end("a second signal arrived")
                    return

    def _end(self, why: str) -> None:
        signum = self.received[0]
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "?"))
        message = (f"lightning-fullgraph: rank {rank} received {name}; ending the process "
                   f"now because {why}.\n")
        try:
            os.write(sys.stderr.fileno(), message.encode())
        except (OSError, ValueError, AttributeError):
            pass
        os._exit(128 + signum)
