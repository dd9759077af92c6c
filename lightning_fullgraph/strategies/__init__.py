r"""Lightning strategies. Importing this package registers ``strategy="fullgraph"`` and
``strategy="4d"``."""
from .fourd import FourDStrategy
from .faults import TimeoutConfig
from .fullgraph import FullGraphStrategy

__all__ = ["FourDStrategy", "FullGraphStrategy", "TimeoutConfig"]
