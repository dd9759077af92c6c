"""The aggregation router's check that a layer's edge list is the partition's own
(``_SameTensor``): by content, remembered per tensor while it lives unmodified."""
import torch

from lightning_fullgraph.engine.aggregation import _SameTensor


def test_recognizes_the_reference_by_content_and_rechecks_an_edited_tensor():
    ref = torch.tensor([[0, 1, 2], [1, 2, 0]])
    same = _SameTensor(ref)
    assert same(ref) and same(ref.clone()) and not same(ref.flip(0))
    assert not same(ref[:, :2]) and not same("not a tensor")
    copy = ref.clone()
    assert same(copy)
    copy[0, 0] = 2  # an in-place edit bumps the version: checked again, not remembered
    assert not same(copy)
    copy[0, 0] = 0
    assert same(copy)


def test_a_cast_reference_counts_and_results_follow_their_tensor():
    weights = torch.rand(5, dtype=torch.float32)
    same = _SameTensor(weights)
    assert same(weights.double())  # precision plugins cast the partition's edge values
    assert not same(weights.double() + 1)
    other = weights.double() + 1
    assert not same(other)
    assert len(same._seen) == 1  # only the living tensor's result: the temporaries' went
    del other  # a freed tensor's entry goes with it (its address may hold another next)
    assert len(same._seen) == 0
