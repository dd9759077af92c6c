r"""Lightning callbacks of lightning-fullgraph."""
from .communication import CommunicationMonitor

__all__ = ["CommunicationMonitor"]
