r"""ScaleGNN's 4-D parallelism (data parallel x a 3-D grid), piece by piece.

* :mod:`.dims` -- :class:`FourDDims`, the validated sizes of the four axes and their groups.
* :mod:`.sampling` -- :class:`UniformVertexSampler`, communication-free uniform vertex
  sampling with unbiased edge rescaling.
"""
from .dims import AXES, FourDDims
from .sampling import SampledSubgraph, UniformVertexSampler, sample_seed

__all__ = ["AXES", "FourDDims", "SampledSubgraph", "UniformVertexSampler", "sample_seed"]
