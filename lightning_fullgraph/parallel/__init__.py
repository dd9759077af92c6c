r"""ScaleGNN's 4-D parallelism (data parallel x a 3-D grid), piece by piece.

* :mod:`.dims` -- :class:`FourDDims`, the validated sizes of the four axes and their groups;
  :mod:`.mesh` -- :class:`FourDMesh`, one rank's process groups.
* :mod:`.sampling` -- :class:`UniformVertexSampler`, communication-free uniform vertex
  sampling with unbiased edge rescaling; :mod:`.shards` -- :func:`write_shards` and
  :class:`GraphShard`: each process of a grid holds only its tiles of the graph and extracts
  its part of every batch (Alg. 2).
* :mod:`.scalegnn` -- :class:`ScaleGNN`, the model on one process; :mod:`.grid3d` --
  :class:`Grid3DScaleGNN`, the same model over a 3-D grid (:mod:`.pmm`: blocks, layouts and
  the collectives), with data-parallel replicas; :mod:`.gcn3d` -- :class:`Grid3DGCN`, PyG's
  ``GCN`` split the same way; :mod:`.grid_rows` -- :class:`GridRowsModel`, any model of
  ``GCNConv``, ``SAGEConv``, ``GraphConv`` and ``GINConv`` layers (GraphSAGE, GIN, a
  hand-written one) with whole rows between its layers.
"""
from .dims import AXES, FourDDims
from .gcn3d import Grid3DGCN
from .grid3d import Grid3DScaleGNN
from .grid_rows import GridRowsModel
from .mesh import FourDMesh
from .sampling import SampledSubgraph, UniformVertexSampler, sample_seed
from .scalegnn import ScaleGNN
from .shards import GraphShard, ShardPlan, write_shards

__all__ = ["AXES", "FourDDims", "FourDMesh", "GraphShard", "Grid3DGCN", "Grid3DScaleGNN",
           "GridRowsModel", "SampledSubgraph", "ScaleGNN", "ShardPlan", "UniformVertexSampler",
           "sample_seed", "write_shards"]
