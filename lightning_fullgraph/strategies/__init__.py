r"""Lightning strategies. Importing this package registers ``strategy="fullgraph"``."""
from .fullgraph import FullGraphStrategy

__all__ = ["FullGraphStrategy"]
