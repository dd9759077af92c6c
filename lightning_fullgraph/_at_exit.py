"""Closes the default process group once, at interpreter exit.

gloo's worker threads, left to C++ static destruction when a process ends with its process
group open, can abort the interpreter after the script has finished ("terminate called
without an active exception", exit code -6 on one rank, at random).  Lightning and Fabric keep
the group open between runs and never close it, so every entry point that runs collectives of
ours (the strategies' setup, :func:`~lightning_fullgraph.fabric.setup_fullgraph`,
:func:`~lightning_fullgraph.fabric.setup_fourd`) registers :func:`close_process_group` here:
once per process, however many runs it starts.  A script that closes the group itself is
left alone.
"""
import atexit

__all__ = ["close_process_group", "close_process_group_at_exit"]


def close_process_group() -> None:
    r"""Destroys the default process group (and with it every subgroup) if one is open."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def close_process_group_at_exit() -> None:
    r"""Registers :func:`close_process_group` to run at exit (once per process)."""
    atexit.unregister(close_process_group)
    atexit.register(close_process_group)
