"""PyG's GCN split over a 3-D grid (Grid3DGCN) equals the model on one process: logits and
every weight block's gradient on a fixed mini-batch; what cannot be split is refused by name."""
import pytest
import torch
from torch_geometric.nn.models import GCN

from lightning_fullgraph.parallel import FourDDims, Grid3DGCN
from lightning_fullgraph.parallel.gcn3d import check_convertible
from lightning_fullgraph.parallel.mesh import FourDMesh
from lightning_fullgraph.testing import run_distributed

from .test_grid3d import CLASSES, D_IN, HIDDEN, LAYERS
from .test_grid3d import _batch as sampled_batch


def _batch():
    x, ei, w, y, _ = sampled_batch(replica=0)  # the same mini-batch as the ScaleGNN tests
    return x, ei, w, y


def _model():
    torch.manual_seed(0)
    return GCN(D_IN, HIDDEN, LAYERS, CLASSES, normalize=False)


def _run(rank, world_size, grid):
    mesh = FourDMesh.create(FourDDims.of(1, grid))
    x, ei, w, y = _batch()
    ref = _model()
    ref_logits = ref(x, ei, w)
    torch.nn.functional.cross_entropy(ref_logits, y).backward()
    split = Grid3DGCN(_model(), mesh)
    logits = split(x, ei, w)
    torch.nn.functional.cross_entropy(logits, y).backward()
    split.reduce_gradients()

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))

    grads = dict(ref.named_parameters())
    errors = {"logits": rel(logits.detach(), ref_logits.detach())}
    for name, param, index in split.blocks():
        info = split._blocks[name]
        full = grads[info.key].grad
        full = full.t() if info.transpose else full
        errors[name] = rel(param.grad, full[index])
    state = split.full_state_dict()
    errors["state"] = max(rel(state[k], v) for k, v in _model().state_dict().items()
                          if k in state)
    assert set(state) == {k for k, _ in ref.named_parameters()}
    return errors


@pytest.mark.parametrize("grid", [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1)])
def test_split_gcn_equals_pyg(grid):
    for errors in run_distributed(_run, grid[0] * grid[1] * grid[2], grid, timeout_s=240):
        assert max(errors.values()) <= 1e-5, errors


def test_what_cannot_be_split_is_refused_by_name():
    with pytest.raises(TypeError, match="normalize=False"):
        check_convertible(GCN(4, 8, 2, 3), "model")
    with pytest.raises(TypeError, match="norms.0"):
        check_convertible(GCN(4, 8, 2, 3, normalize=False, norm="batch_norm"), "model")
    with pytest.raises(TypeError, match="Linear"):
        check_convertible(torch.nn.Linear(3, 3), "head")
