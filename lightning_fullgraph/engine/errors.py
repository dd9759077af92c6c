r"""What a rank says when a collective fails: which one, with whom, why, and what to do.

gloo and NCCL report a dead or stuck peer as ``Connection closed by peer [addr]:port`` or
``Timed out waiting 300000ms for recv operation``, which names neither the exchange, nor the
ranks, nor the option that sets the timeout.  Every collective of the engine runs through
:func:`guarded`, which turns those errors into a :class:`CollectiveError` saying all of it.
"""
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterable, Iterator, Optional, Union

__all__ = ["CollectiveError", "guarded", "is_peer_failure", "from_backend_error",
           "TIMEOUT_OPTION"]

#: How users set the collective timeout (named in every timeout message).
TIMEOUT_OPTION = ("FullGraphStrategy(timeout=...) / lightning-fullgraph train --timeout "
                  "(plain torch.distributed: FullGraphEngine(timeout=...) and the group's timeout)")

_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "Socket closed", "connection refused", "Connection refused")
_TIMED_OUT = ("Timed out", "timed out", "Timeout", "timeout")


class CollectiveError(RuntimeError):
    r"""A collective of the engine failed or timed out on this rank.

    Attributes:
        what (str): The operation, e.g. ``"halo exchange 'conv1.propagate0.x' (forward)"``.
        rank (int): This rank.
        peers (tuple): Ranks this rank was exchanging data with.
        seconds (float): Time spent waiting.
        peer_failed (bool): A peer closed its connection (it failed or was killed);
            this rank's error is a consequence, the cause is in that rank's output.
        timed_out (bool): The collective timeout expired.
    """

    def __init__(self, message: str, *, what: str = "", rank: int = -1, peers=(),
                 seconds: float = 0.0, peer_failed: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.what, self.rank, self.peers = what, rank, tuple(peers)
        self.seconds, self.peer_failed, self.timed_out = seconds, peer_failed, timed_out

    def __reduce__(self):  # picklable across processes (test harnesses, spawn)
        return (_rebuild, (str(self), self.what, self.rank, self.peers, self.seconds,
                           self.peer_failed, self.timed_out))


def _rebuild(message, what, rank, peers, seconds, peer_failed, timed_out):
    return CollectiveError(message, what=what, rank=rank, peers=peers, seconds=seconds,
                           peer_failed=peer_failed, timed_out=timed_out)


def _seconds(timeout: Union[None, float, timedelta]) -> Optional[float]:
    if timeout is None:
        return None
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _describe(error: BaseException, what: str, rank: int, peers: Iterable[int],
              seconds: Optional[float], timeout: Union[None, float, timedelta]) -> CollectiveError:
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    peers = tuple(sorted(set(int(p) for p in peers)))
    with_whom = f" with rank(s) {', '.join(map(str, peers))}" if peers else ""
    limit = _seconds(timeout)
    peer_failed = any(s in text for s in _PEER_GONE)
    timed_out = not peer_failed and (any(s in text for s in _TIMED_OUT) or (
        limit is not None and seconds is not None and seconds >= 0.95 * limit))
    if peer_failed:
        why = ("a peer closed its connection: that rank failed or was killed (its own "
               "error is the cause; look for it above). This rank stops too")
    elif timed_out:
        budget = f"{limit:g} s" if limit is not None else "the process group's timeout"
        why = (f"timed out (collective timeout {budget}): a peer stopped, is stuck, or is "
               f"slower than the timeout. If ranks are only slow, raise it with {TIMEOUT_OPTION}")
    else:
        why = "the collective failed"
    after = f" after {seconds:.1f} s" if seconds is not None else ""
    message = (f"rank {rank}: {what} failed{after}{with_whom}: {why}. "
               f"[{type(error).__name__}: {first}]")
    return CollectiveError(message, what=what, rank=rank, peers=peers,
                           seconds=seconds if seconds is not None else float("nan"),
                           peer_failed=peer_failed, timed_out=timed_out)


def is_peer_failure(error: BaseException) -> bool:
    r"""Whether :obj:`error` only reports that another rank failed (its cause is there).

    True for a :class:`CollectiveError` with ``peer_failed`` and for a backend error
    raised by a collective outside the engine (e.g. Lightning's barrier) whose peer
    closed its connection.
    """
    if isinstance(error, CollectiveError):
        return error.peer_failed
    return isinstance(error, RuntimeError) and any(s in str(error) for s in _PEER_GONE)


@contextmanager
def guarded(what: str, rank: int, peers: Iterable[int] = (),
            timeout: Union[None, float, timedelta] = None) -> Iterator[None]:
    r"""Runs collectives, re-raising their failures as :class:`CollectiveError`.

    Args:
        what (str): The operation, for the message.
        rank (int): This rank.
        peers (Iterable[int]): Ranks data is exchanged with.
        timeout (float or timedelta, optional): The group's collective timeout.
    """
    start = time.perf_counter()
    try:
        yield
    except CollectiveError:
        raise
    except (RuntimeError, ValueError, OSError) as error:  # gloo/NCCL/MPI backend errors
        raise _describe(error, what, rank, peers, time.perf_counter() - start,
                        timeout) from error


def _raised_by_a_collective(error: BaseException) -> Optional[str]:
    r"""Where the collective that raised :obj:`error` was called from (``module.function`` of
    the innermost frame outside ``torch``), or ``None`` if no ``torch.distributed`` frame is
    on its traceback (then it is not a backend error of a collective)."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    files = [f.f_code.co_filename.replace("\\", "/") for f in frames]
    if not any("/torch/distributed/" in name for name in files):
        return None
    for frame, name in zip(reversed(frames), reversed(files)):
        if "/torch/" not in name:
            module = frame.f_globals.get("__name__", "?")
            return f"{module}.{frame.f_code.co_name}"
    return "torch.distributed"


def from_backend_error(error: BaseException, rank: int, peers: Iterable[int],
                       timeout: Union[None, float, timedelta]) -> Optional[CollectiveError]:
    r"""A :class:`CollectiveError` for a backend error raised by a collective that did not run
    through :func:`guarded` (Lightning's barrier and broadcasts, a metric's synchronization),
    or ``None`` when :obj:`error` is not one.

    The collective's caller is read off the traceback, so the message names it (e.g.
    ``torchmetrics.utilities.distributed.gather_all_tensors`` for a metric's ``compute``).

    Args:
        error (BaseException): The exception that ended the run.
        rank (int): This rank.
        peers (Iterable[int]): The other ranks of the process group.
        timeout (float or timedelta, optional): The timeout the group had.
    """
    if isinstance(error, CollectiveError) or not isinstance(error, (RuntimeError, OSError)):
        return None
    where = _raised_by_a_collective(error)
    if where is None:
        return None
    what = f"a collective outside the halo exchange (called by {where})"
    translated = _describe(error, what, rank, peers, None, timeout)
    return translated if translated.peer_failed or translated.timed_out else None
