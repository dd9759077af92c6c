r"""A dataclass that round-trips through a JSON-able dictionary."""
from dataclasses import asdict
from typing import Any, Dict, Type, TypeVar

__all__ = ["JsonRecord"]

T = TypeVar("T", bound="JsonRecord")


class JsonRecord:
    r"""Mixin for dataclasses whose fields are JSON-able: :meth:`to_dict` / :meth:`from_dict`."""

    def to_dict(self) -> Dict[str, Any]:
        r"""JSON-able dictionary of the fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls: Type[T], state: Dict[str, Any]) -> T:
        r"""Inverse of :meth:`to_dict`."""
        return cls(**state)
