"""A process-wide choice among a few modes: set in code, else by an environment variable.

The kernels' switches (:func:`~.locality.set_locality`, :func:`~.kept.set_static_inputs`,
:func:`~.sage_reorder.set_layer_order`) share this rule: the value set in code wins; without one,
the environment variable's (read once, at the first query, and again after ``set(None)``: it
seeds the default, as a launcher sets it for every rank, and is not consulted on every call);
else the first mode, the default. A bad value raises ``ValueError`` naming the setting and the
modes.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

__all__ = ["ModeSetting"]


class ModeSetting:
    """One switch: ``what`` (its name in messages), its ``modes`` (the first is the default)
    and the environment variable ``env`` read when nothing was set in code."""

    def __init__(self, what: str, modes: Tuple[str, ...], env: str) -> None:
        self.what, self.modes, self.env = what, tuple(modes), env
        self._value: Optional[str] = None
        self._seeded: Optional[str] = None  # the environment's, once read

    def set(self, mode: Optional[str]) -> None:
        """Choose ``mode``; ``None`` goes back to the environment's (read again) or the
        default."""
        if mode is not None and mode not in self.modes:
            raise ValueError(f"{self.what} must be one of {self.modes}, got {mode!r}")
        self._value = mode
        if mode is None:
            self._seeded = None

    def get(self) -> str:
        """The mode in effect: the one set in code, else the environment's, else the default."""
        if self._value is not None:
            return self._value
        if self._seeded is None:
            mode = os.environ.get(self.env, "").strip().lower() or self.modes[0]
            if mode not in self.modes:
                raise ValueError(f"{self.env}={os.environ[self.env]!r}: must be one of "
                                 f"{self.modes}")
            self._seeded = mode
        return self._seeded
