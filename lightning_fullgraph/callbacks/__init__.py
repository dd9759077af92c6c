r"""Lightning callbacks of lightning-fullgraph."""
from .communication import CommunicationMonitor
from .random_state import RandomStateCheckpoint

__all__ = ["CommunicationMonitor", "RandomStateCheckpoint"]
