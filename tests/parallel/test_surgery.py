"""GridSplit: the model surgery shared by FourDStrategy and setup_fourd -- apply, the whole
model's state_dict in and out, revert with the trained weights, refusal by name, and the
dropout step counter as checkpoint state."""
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN

from lightning_fullgraph.parallel import FourDDims, ScaleGNN
from lightning_fullgraph.parallel.mesh import FourDMesh
from lightning_fullgraph.parallel.surgery import (GridSplit, grid_steps, load_grid_steps,
                                                  splittable_children)
from lightning_fullgraph.testing import run_distributed


class _Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = ScaleGNN(6, 8, 3, 3)
        self.gcn = GCN(6, 8, 2, 3, normalize=False, norm="batch_norm")


def _roundtrip(rank, world_size):
    mesh = FourDMesh.create(FourDDims.of(1, (2, 1, 1)))
    holder = _Holder()
    initial = {k: v.clone() for k, v in holder.state_dict().items()}
    surgery = GridSplit(holder, mesh).apply()
    assert len(surgery.splits) == 2 and surgery.applied
    state = surgery.state_dict()  # gathered: the single-process state_dict
    assert set(state) == set(initial)
    same = all(torch.equal(state[k], v) for k, v in initial.items())
    # Load another model's weights into the split one, then put the original back: it holds them.
    other = {k: (v + 1 if v.is_floating_point() else v) for k, v in initial.items()}
    surgery.load_state_dict(other)
    surgery.revert(gather=True)
    back = holder.state_dict()
    restored = all(torch.equal(back[k], v) for k, v in other.items())
    return same, restored, isinstance(holder.model, ScaleGNN)


def test_state_dict_round_trip_and_revert():
    for same, restored, reverted in run_distributed(_roundtrip, 2):
        assert same and restored and reverted


def test_splittable_children_refuse_by_name():
    holder = torch.nn.Module()
    # normalize=True: not for Grid3DGCN; BatchNorm's statistics: not for whole rows either.
    holder.encoder = GCN(4, 8, 2, 3, norm="batch_norm")
    with pytest.raises(TypeError, match="'encoder.norms.0.module' is a BatchNorm1d"):
        splittable_children(holder)


def _dropout_holder():
    holder = torch.nn.Module()
    torch.manual_seed(0)
    holder.model = ScaleGNN(6, 8, 2, 3, dropout=0.5)
    return holder


def _graph():
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 12, (2, 40), generator=g)
    return Data(x=torch.randn(12, 6, generator=g), edge_index=edge_index, num_nodes=12)


def _resumed_masks(rank, world_size):
    # FourDRun.state_dict holds the split model's dropout step counter: a run restored from
    # it draws the masks the original draws next (without it, step 0's again).
    from lightning_fullgraph.data.sampled import SampledNodeDataModule
    from lightning_fullgraph.fabric import FourDRun

    mesh, data = FourDMesh.create(FourDDims.of(1, (2, 1, 1))), _graph()

    def run():
        holder = _dropout_holder()
        return FourDRun(None, holder, mesh, GridSplit(holder, mesh).apply(),
                        SampledNodeDataModule(data, 6, seed=1))

    original = run()
    for _ in range(3):  # three training forwards: the counter is at 3
        original.model(data.x, data.edge_index)
    state = original.state_dict()
    want = original.model(data.x, data.edge_index)
    resumed, forgetful = run(), run()
    resumed.load_state_dict(state)
    forgetful.load_state_dict({k: v for k, v in state.items() if k != "grid_steps"})
    same = torch.equal(resumed.model(data.x, data.edge_index), want)
    differs = not torch.equal(forgetful.model(data.x, data.edge_index), want)
    # Put back, the model keeps the counter (a checkpoint saved after Lightning's teardown
    # holds it); split again, it continues from there.
    original.surgery.revert(gather=True)
    after_revert = grid_steps(original._holder)
    again = GridSplit(original._holder, mesh).apply()
    continued = original._holder.model.step
    again.revert(gather=False)
    try:
        load_grid_steps(original._holder, {"encoder": 2})
        refused = None
    except ValueError as error:
        refused = str(error)
    return state["grid_steps"], same, differs, after_revert, continued, refused


def test_dropout_step_counter_is_checkpoint_state():
    for steps, same, differs, after_revert, continued, refused in run_distributed(
            _resumed_masks, 2):
        assert steps == {"model": 3}
        assert same and differs
        assert after_revert == {"model": 4} and continued == 4
        assert refused is not None and "'encoder'" in refused


def test_a_refusal_names_the_layers_by_class():
    # What a grid cannot split yet (GraphSAGE, GIN, a hand-written head) is named as the
    # user wrote it: the message-passing layer, or the module owning the parameter.
    from torch_geometric.nn.models import GIN, GraphSAGE

    from lightning_fullgraph.parallel.surgery import _owning_layers
    holder = torch.nn.Module()
    holder.sage, holder.gin, holder.head = GraphSAGE(4, 8, 2), GIN(4, 8, 2), torch.nn.Linear(8, 3)
    names = [n for n, _ in holder.named_parameters()]
    assert _owning_layers(holder, names) == [
        "sage.convs.0 (SAGEConv)", "sage.convs.1 (SAGEConv)", "gin.convs.0 (GINConv)",
        "gin.convs.1 (GINConv)", "head (Linear)"]
