r"""What the config objects (:class:`~lightning_fullgraph.ExchangeConfig`,
:class:`~lightning_fullgraph.KernelConfig`, :class:`~lightning_fullgraph.TimeoutConfig`) share."""
from dataclasses import fields
from typing import Any, Mapping, Type, TypeVar

T = TypeVar("T")


def from_mapping(cls: Type[T], value: Mapping[str, Any]) -> T:
    r"""``cls(**value)``, refusing keys that are not fields of the dataclass :obj:`cls` with a
    ``TypeError`` that lists the fields (a misspelled option, a YAML key)."""
    names = [f.name for f in fields(cls)]
    unknown = set(value) - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}; fields are {names}")
    return cls(**value)
