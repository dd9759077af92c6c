"""The ``lightning`` command: ``lightning run model [OPTIONS] SCRIPT [SCRIPT_ARGS]...``.

``lightning run model script.py`` is the launcher named in Lightning's design documents (and
in this project's). Lightning 2.5 renamed it ``fabric run``, and Lightning 2.6 installs no
``lightning`` command at all, so the old spelling answered "command not found". This console
script forwards it unchanged to Fabric's launcher (the ``run`` command of the click group
``lightning.fabric.cli._main``, the one behind ``fabric run``), after a one-line note that
``fabric run`` is the current name. Nothing else of the old ``lightning`` command exists here;
any other subcommand is an error that lists what is supported.

Fabric's CLI needs ``click``, which Lightning does not require: it comes with the ``fabric``
extra (``pip install 'lightning-fullgraph[fabric]'``).
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

__all__ = ["main", "SUPPORTED"]

PROG = "lightning"
#: The subcommands this ``lightning`` command understands.
SUPPORTED = ("run model",)

USAGE = f"""usage: {PROG} run model [OPTIONS] SCRIPT [SCRIPT_ARGS]...

Launches SCRIPT in one process per device with Lightning Fabric's launcher; the same as
`fabric run [OPTIONS] SCRIPT [SCRIPT_ARGS]...` (its current name). Options: `{PROG} run model --help`.

This `{PROG}` command is provided by lightning-fullgraph and supports only: {", ".join(SUPPORTED)}.
"""

NOTE = (f"{PROG}: note: `{PROG} run model` is the old name of `fabric run` (Lightning >= 2.5); "
        "forwarding to `fabric run`.")

MISSING_CLICK = (f"{PROG}: error: `{PROG} run model` uses Lightning Fabric's launcher, which needs "
                 "the 'click' package; install the fabric extra: "
                 "pip install 'lightning-fullgraph[fabric]'")


def _error(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def _fabric_run_command():
    """The click command behind ``fabric run``; ``None`` when click is not installed."""
    from .compat import fabric_run_command
    return fabric_run_command()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``lightning`` console script; returns the exit status.

    ``lightning run model ...`` does not return: Fabric's launcher exits with the status of
    the launched processes.
    """
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[:2] != ["run", "model"]:
        given = " ".join(args[:2]) if args[0] == "run" else args[0]
        return _error(f"{PROG}: error: unsupported command `{PROG} {given}`.\n"
                      f"Supported: {', '.join(f'`{PROG} {s}`' for s in SUPPORTED)}, which forwards "
                      f"to `fabric run` (Lightning Fabric's launcher).\n\n{USAGE}")
    command = _fabric_run_command()
    if command is None:
        return _error(MISSING_CLICK)
    print(NOTE, file=sys.stderr, flush=True)
    # standalone_mode: click prints usage errors and --help itself and exits (SystemExit).
    command.main(args=args[2:], prog_name=f"{PROG} run model", standalone_mode=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
