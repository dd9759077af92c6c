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


# Normalizations between the layers: (norm, norm_kwargs, act_first).
NORMS = {
    "none": (None, None, False),
    "batch_norm": ("batch_norm", None, False),
    "batch_norm act_first": ("batch_norm", None, True),
    "layer_norm graph": ("layer_norm", None, False),
    "layer_norm node": ("layer_norm", {"mode": "node"}, False),
}


def _model(norm="none"):
    torch.manual_seed(0)
    kind, kwargs, act_first = NORMS[norm]
    model = GCN(D_IN, HIDDEN, LAYERS, CLASSES, normalize=False, norm=kind, norm_kwargs=kwargs,
                act_first=act_first)
    with torch.no_grad():  # affine weights away from 1 and 0, so that their use is checked
        for name, p in model.named_parameters():
            if name.startswith("norms."):
                p.add_(0.3 * torch.randn_like(p))
    return model


def _rel(a, b, floor=1e-12):
    return float((a - b).abs().max() / b.abs().max().clamp_min(floor))


def _compare(mesh, norm):
    x, ei, w, y = _batch()
    ref = _model(norm)
    ref_logits = ref(x, ei, w)
    torch.nn.functional.cross_entropy(ref_logits, y).backward()
    split = Grid3DGCN(_model(norm), mesh)
    logits = split(x, ei, w)
    torch.nn.functional.cross_entropy(logits, y).backward()
    split.reduce_gradients()

    grads = dict(ref.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in grads.values())
    errors = {"logits": _rel(logits.detach(), ref_logits.detach())}
    for name, param, index in split.blocks():
        info = split._blocks[name]
        full = grads[info.key].grad
        full = full.t() if info.transpose else full
        # A bias before BatchNorm or graph-mode LayerNorm has no effect (they subtract the
        # mean): its gradient is zero up to rounding, so its error is taken against the
        # largest gradient of the model.
        shift_invariant = name[0] == "b" and NORMS[norm][0] is not None and \
            NORMS[norm][1] is None and int(name[1:]) < LAYERS
        errors[name] = _rel(param.grad, full[index], floor=scale if shift_invariant else 1e-12)
    # After the training step: the running statistics too (BatchNorm), then evaluation.
    state, ref_state = split.full_state_dict(), ref.state_dict()
    assert set(state) == set(ref_state), (set(state) ^ set(ref_state))
    errors["state"] = max(_rel(state[k].double(), v.double()) for k, v in ref_state.items())
    split.eval(), ref.eval()
    with torch.no_grad():
        errors["eval logits"] = _rel(split(x, ei, w), ref(x, ei, w))
    return {f"{norm}: {k}": v for k, v in errors.items()}


def _run(rank, world_size, grid, norms):
    mesh = FourDMesh.create(FourDDims.of(1, grid))
    errors = {}
    for norm in norms:
        errors.update(_compare(mesh, norm))
    return errors


@pytest.mark.parametrize("grid", [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1)])
def test_split_gcn_equals_pyg(grid):
    for errors in run_distributed(_run, grid[0] * grid[1] * grid[2], grid, ["none"],
                                  timeout_s=240):
        assert max(errors.values()) <= 1e-5, errors


@pytest.mark.parametrize("grid", [(2, 2, 1), (1, 2, 2)])
def test_split_gcn_with_normalization_equals_pyg(grid):
    # Three layers: the norm after layer 1 has its rows split over z and channels over x,
    # after layer 2 rows over y and channels over z (pmm.layer_axes); the two grids split
    # rows, channels and both.
    norms = [n for n in NORMS if n != "none"]
    for errors in run_distributed(_run, 4, grid, norms, timeout_s=240):
        assert max(errors.values()) <= 1e-5, errors


def _replicas(rank, world_size):
    # dp = 2 replicas of a (2,1,1) grid, each on its own mini-batch: BatchNorm's running
    # statistics are the mean of the two replicas' (every process keeps the same), the
    # gradients the mean of theirs.
    mesh = FourDMesh.create(FourDDims.of(2, (2, 1, 1)))
    refs = []
    for replica in range(2):
        x, ei, w, y, _ = sampled_batch(replica=replica)
        ref = _model("batch_norm")
        out = ref(x, ei, w)
        torch.nn.functional.cross_entropy(out, y).backward()
        refs.append((ref, out.detach()))
    x, ei, w, y, _ = sampled_batch(replica=mesh.coordinate("dp"))
    split = Grid3DGCN(_model("batch_norm"), mesh)
    logits = split(x, ei, w)
    torch.nn.functional.cross_entropy(logits, y).backward()
    split.reduce_gradients()
    errors = {"logits": _rel(logits.detach(), refs[mesh.coordinate("dp")][1])}
    scale = max(float(p.grad.abs().max()) for r, _ in refs for p in r.parameters()) / 2
    for name, param, index in split.blocks():
        info = split._blocks[name]
        full = sum(dict(r.named_parameters())[info.key].grad for r, _ in refs) / 2
        full = full.t() if info.transpose else full
        # A bias before BatchNorm: its gradient is zero to rounding (see _compare).
        floor = scale if name[0] == "b" and int(name[1:]) < LAYERS else 1e-12
        errors[name] = _rel(param.grad, full[index], floor=floor)
    state = split.full_state_dict()
    for key in state:
        if "running" in key:
            want = sum(r.state_dict()[key] for r, _ in refs) / 2
            errors[key] = _rel(state[key], want)
    assert all(int(v) == 1 for k, v in state.items() if "num_batches" in k)
    return errors


def test_replicas_average_batchnorm_statistics_and_gradients():
    for errors in run_distributed(_replicas, 4, timeout_s=240):
        assert max(errors.values()) <= 1e-5, errors


def test_what_cannot_be_split_is_refused_by_name():
    with pytest.raises(TypeError, match="normalize=False"):
        check_convertible(GCN(4, 8, 2, 3), "model")
    with pytest.raises(TypeError, match="norms.0.*GraphNorm"):
        check_convertible(GCN(4, 8, 2, 3, normalize=False, norm="graph_norm"), "model")
    with pytest.raises(TypeError, match="Linear"):
        check_convertible(torch.nn.Linear(3, 3), "head")
