"""Launch a function on several gloo processes (for tests, examples and notebooks).

:func:`run_distributed` spawns ``world_size`` processes, initializes a gloo
process group in each (their rendezvous store served by the caller, on a port that stays
bound for the run), runs ``fn(rank, world_size, *args)`` and returns the
per-rank results in rank order.  An exception in any rank is re-raised in the
caller with that rank's traceback (and those of the ranks that fail within two seconds of
it); the other ranks are terminated, never left waiting.

:func:`run_outcomes` instead waits for *every* rank to finish, fail or die (up to a
deadline) and returns what happened to each, with the time it happened: fault-injection
tests use it to check that every surviving rank raises, and when.

**Start method.**  Ranks are started with ``spawn`` by default: each imports torch, PyG and
the caller's module afresh, seconds per rank.  ``start_method="forkserver"`` (or the
environment variable :data:`START_METHOD_ENV`; this project's test suite sets it) forks every
rank from a server process that imported torch, ``torch.distributed`` and PyG once
(:data:`FORKSERVER_PRELOAD`), and hands each rank the caller's environment as it is at the
call: a clean process that skips those imports, not a copy of the caller (nothing of this
library nor of the caller is preloaded, so settings read at import time still apply).
"""
import os
import pickle
import queue as queue_module
import time
import socket
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_distributed", "run_outcomes", "RankOutcome", "free_port", "START_METHOD_ENV",
           "FORKSERVER_PRELOAD", "count_collectives", "CollectiveLog", "COLLECTIVES"]

#: Environment variable naming the default start method of the ranks (``spawn``, the
#: default, or ``forkserver``).
START_METHOD_ENV = "LIGHTNING_FULLGRAPH_START_METHOD"
#: What the fork server imports once for every rank it starts: third-party modules only,
#: which read none of this library's settings.
FORKSERVER_PRELOAD = ("torch", "torch.distributed", "torch_geometric")
_START_METHODS = ("spawn", "forkserver")


def _context(start_method: Optional[str]):
    method = (start_method or os.environ.get(START_METHOD_ENV) or "spawn").strip().lower()
    if method not in _START_METHODS:
        raise ValueError(f"start method {method!r} is not one of {_START_METHODS} (argument "
                         f"start_method or the environment variable {START_METHOD_ENV})")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


@dataclass
class RankOutcome:
    r"""What happened to one rank in :func:`run_outcomes`.

    Attributes:
        rank (int): The rank.
        status (str): ``"returned"``, ``"raised"`` (``value`` is the traceback),
            ``"died"`` (exited without a result; ``exitcode`` says how) or ``"hung"``
            (still running at the deadline; it was then terminated).
        value (Any): The return value or the formatted traceback.
        exitcode (int, optional): Process exit code when known.
        seconds (float): When the outcome was observed, since the start.
    """
    rank: int
    status: str
    value: Any = None
    exitcode: Optional[int] = None
    seconds: float = 0.0


def free_port() -> int:
    r"""A TCP port on the loopback interface that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rendezvous(timeout_s: float) -> "dist.TCPStore":
    r"""The ranks' rendezvous store, served by the caller for the whole run on a port the
    kernel picks and that stays bound: no other run can take it between a probe and the
    bind (two parallel tests that drew the same port from :func:`free_port`, which closes
    the port it probed, could meet in one store: the suspected cause of a gloo
    ``connectFullMesh`` failure seen once in CI)."""
    return dist.TCPStore("127.0.0.1", 0, None, is_master=True,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def _worker(rank: int, world_size: int, port: int, timeout_s: float, fn: Callable,
            args: tuple, queue, environ: Optional[dict] = None) -> None:
    if environ is not None:  # a fork server's child: the caller's environment, not the server's
        os.environ.clear()
        os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    import torch
    torch.set_num_threads(1)
    try:
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
        result = fn(rank, world_size, *args)
        # Pickled here, by value: torch.multiprocessing's queue would share a tensor's memory
        # through a handle only this process serves, which fails once it has exited.
        queue.put((rank, True, pickle.dumps(result)))
    except BaseException:  # report every failure, including asserts, to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _processes(ctx, world_size: int, port: int, timeout_s: float, fn: Callable, args: tuple,
               queue) -> list:
    environ = dict(os.environ) if ctx.get_start_method() == "forkserver" else None
    return [ctx.Process(target=_worker, args=(r, world_size, port, timeout_s, fn, args, queue,
                                              environ), daemon=True)
            for r in range(world_size)]


def run_distributed(fn: Callable, world_size: int, *args: Any,
                    timeout_s: float = 120.0, start_method: Optional[str] = None) -> List[Any]:
    r"""Runs :obj:`fn` on :obj:`world_size` spawned gloo ranks.

    Args:
        fn (Callable): A module-level function ``fn(rank, world_size, *args)``;
            its return value must be picklable.
        world_size (int): Number of processes.
        *args: Extra arguments (picklable).
        timeout_s (float): Collective timeout and overall deadline.
        start_method (str, optional): ``"spawn"`` or ``"forkserver"`` (see the module
            docstring); default: :data:`START_METHOD_ENV`, else ``"spawn"``.

    Returns:
        The results of ranks ``0 .. world_size - 1``.
    """
    ctx = _context(start_method)
    queue = ctx.Queue()
    store = _rendezvous(timeout_s)
    procs = _processes(ctx, world_size, store.port, timeout_s, fn, args, queue)
    for p in procs:
        p.start()
    results, errors = {}, []
    deadline = time.monotonic() + timeout_s + 60
    try:
        while len(results) < world_size and not errors:
            try:
                rank, ok, payload = queue.get(timeout=0.5)
            except queue_module.Empty:
                # A rank that died without reporting (killed, segfault) fails the run now.
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in results]
                if dead and queue.empty():
                    errors.append(f"rank(s) {dead} exited with codes "
                                  f"{[procs[r].exitcode for r in dead]} without a result")
                elif time.monotonic() > deadline:
                    errors.append(f"ranks did not finish within {timeout_s + 60:.0f} s")
                continue
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                errors.append(f"rank {rank} failed:\n{payload}")
        # The other ranks' failures too, those reported within a moment (a rank's error
        # often follows from another's: both sides say what broke).
        grace = time.monotonic() + 2.0
        while errors and len(results) + len(errors) < world_size and time.monotonic() < grace:
            try:
                rank, ok, payload = queue.get(timeout=0.2)
            except queue_module.Empty:
                continue
            if not ok:
                errors.append(f"rank {rank} failed:\n{payload}")
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.1)
            if p.is_alive():
                p.terminate()
        del store  # after the ranks: they may still talk to it until they exit
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]


def run_outcomes(fn: Callable, world_size: int, *args: Any, timeout_s: float = 120.0,
                 deadline_s: Optional[float] = None,
                 start_method: Optional[str] = None) -> List[RankOutcome]:
    r"""Runs :obj:`fn` like :func:`run_distributed` and reports every rank's outcome.

    Nothing is terminated early: each rank is observed until it returns, raises or dies,
    and ranks still running after :obj:`deadline_s` are reported as ``"hung"``.

    Args:
        fn (Callable): A module-level function ``fn(rank, world_size, *args)``.
        world_size (int): Number of processes.
        *args: Extra arguments (picklable).
        timeout_s (float): Collective timeout of the process group.
        deadline_s (float, optional): When to give up on a rank (default
            ``timeout_s + 60``).
        start_method (str, optional): As in :func:`run_distributed`.

    Returns:
        One :class:`RankOutcome` per rank, in rank order.
    """
    ctx = _context(start_method)
    queue = ctx.Queue()
    store = _rendezvous(timeout_s)
    procs = _processes(ctx, world_size, store.port, timeout_s, fn, args, queue)
    start = time.monotonic()
    for p in procs:
        p.start()
    deadline = start + (timeout_s + 60 if deadline_s is None else deadline_s)
    outcomes = {}
    try:
        while len(outcomes) < world_size and time.monotonic() < deadline:
            try:
                rank, ok, payload = queue.get(timeout=0.2)
                outcomes[rank] = RankOutcome(rank, "returned" if ok else "raised",
                                             pickle.loads(payload) if ok else payload,
                                             seconds=time.monotonic() - start)
                continue
            except queue_module.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in outcomes and p.exitcode not in (None, 0) and queue.empty():
                    outcomes[r] = RankOutcome(r, "died", None, p.exitcode,
                                              seconds=time.monotonic() - start)
    finally:
        for r, p in enumerate(procs):
            p.join(timeout=1 if r in outcomes else 0.1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if r not in outcomes:
                outcomes[r] = RankOutcome(r, "hung", None, p.exitcode,
                                          seconds=time.monotonic() - start)
            elif outcomes[r].exitcode is None:
                outcomes[r].exitcode = p.exitcode
        del store
    return [outcomes[r] for r in range(world_size)]


#: The collectives :func:`count_collectives` counts (``torch.distributed`` functions).
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "all_to_all", "all_to_all_single", "barrier", "broadcast",
               "broadcast_object_list", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "gather", "scatter", "send", "recv", "isend", "irecv")


class CollectiveLog(list):
    r"""What :func:`count_collectives` recorded: one ``(name, caller)`` per collective, in
    order (``caller``: ``module.function`` of the innermost frame outside ``torch``)."""

    def names(self) -> List[str]:
        return [name for name, _ in self]


class count_collectives:
    r"""Records every ``torch.distributed`` collective called inside the ``with`` block, with
    its caller, on this process (for tests and for documenting what a step costs)::

        with count_collectives() as log:
            train_step()
        assert log.names().count("all_to_all_single") == 4

    It replaces the functions of :data:`COLLECTIVES` on the ``torch.distributed`` module for
    the duration of the block (only code that looks them up there at call time is seen, as
    this library and Lightning do) and puts them back after.
    """

    def __init__(self) -> None:
        self.log = CollectiveLog()
        self._saved = {}

    def __enter__(self) -> CollectiveLog:
        import sys as _sys
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._saved[name] = original

            def counted(*args, __name=name, __original=original, **kwargs):
                frame = _sys._getframe(1)
                while frame is not None and frame.f_globals.get("__name__", "").startswith(
                        "torch"):
                    frame = frame.f_back
                caller = "?" if frame is None else \
                    f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"
                self.log.append((__name, caller))
                return __original(*args, **kwargs)

            setattr(dist, name, counted)
        return self.log

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved = {}
