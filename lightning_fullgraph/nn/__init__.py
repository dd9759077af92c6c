r"""Model-side building blocks that wrap unmodified PyG models."""
from .masked_label import MaskedLabelInput, label_selection, mask_share, scale_masked_loss

__all__ = ["MaskedLabelInput", "label_selection", "mask_share", "scale_masked_loss"]
