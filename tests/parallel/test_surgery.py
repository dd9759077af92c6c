"""GridSplit: the model surgery shared by FourDStrategy and setup_fourd -- apply, the whole
model's state_dict in and out, revert with the trained weights, refusal by name."""
import pytest
import torch
from torch_geometric.nn.models import GCN

from lightning_fullgraph.parallel import FourDDims, ScaleGNN
from lightning_fullgraph.parallel.mesh import FourDMesh
from lightning_fullgraph.parallel.surgery import GridSplit, splittable_children
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
    holder.encoder = GCN(4, 8, 2, 3)  # normalize=True: not splittable
    with pytest.raises(TypeError, match="'encoder.convs.0' normalizes"):
        splittable_children(holder)
