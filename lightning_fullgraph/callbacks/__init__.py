r"""Lightning callbacks of lightning-fullgraph."""
from .adaptive_bits import AdaptiveBitWidth, BitWidthController, apply_bit_width, exchange_codecs
from .cache_threshold import AdaptiveCacheThreshold, CacheThresholdController
from .communication import CommunicationMonitor
from .pipeline_adaptor import PipelineAdaptor, PipelineController
from .random_state import RandomStateCheckpoint
from .validation_trace import ValidationTrace

__all__ = ["CommunicationMonitor", "RandomStateCheckpoint", "AdaptiveBitWidth",
           "BitWidthController", "apply_bit_width", "exchange_codecs", "AdaptiveCacheThreshold",
           "CacheThresholdController", "PipelineAdaptor", "PipelineController", "ValidationTrace"]
