"""Masked label propagation: partition-independent selection, no label leak, P-rank exactness."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCN, GraphSAGE

from lightning_fullgraph.nn import MaskedLabelInput, label_selection, mask_share, \
    scale_masked_loss
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from ..engine.models import skewed_graph

NUM_CLASSES = 4


class _Recorder(torch.nn.Module):
    r"""Returns its input features (what the wrapped model would see)."""

    def forward(self, x, edge_index):
        return x


def _wrapped(kind: str, data, **kwargs) -> MaskedLabelInput:
    torch.manual_seed(0)
    if kind == "gcn":
        model = GCN(data.num_features, 16, 2, NUM_CLASSES)
    else:  # SAGE (mean) exchanges raw inputs: the first layer's backward exchange matters
        model = GraphSAGE(data.num_features, 16, 3, NUM_CLASSES)
    return MaskedLabelInput(model, NUM_CLASSES, data.num_features, **kwargs)


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


# -- selection ---------------------------------------------------------------------------------
def test_label_selection_is_a_fair_independent_draw():
    ids = torch.arange(200_000)
    a, b = label_selection(ids, 0.5, 0, 1), label_selection(ids, 0.5, 0, 2)
    assert abs(a.float().mean().item() - 0.5) < 0.005
    assert abs((a & b).float().mean().item() - 0.25) < 0.005  # steps are independent
    assert abs(label_selection(ids, 0.2, 7, 1).float().mean().item() - 0.2) < 0.005
    assert not label_selection(ids, 0.0, 0, 1).any() and label_selection(ids, 1.0, 0, 1).all()
    # Pure function of the id: any order, any subset, ids beyond 32 bits.
    perm = torch.randperm(ids.numel())
    assert torch.equal(label_selection(ids[perm], 0.5, 0, 1), a[perm])
    big = torch.tensor([2 ** 40 + 5, 2 ** 40 + 6, 5])
    assert torch.equal(label_selection(big, 0.5, 0, 1)[2:], a[5:6])
    assert not torch.equal(label_selection(ids, 0.5, 1, 1), a)  # the seed matters


@pytest.mark.parametrize("num_parts", [2, 3])
def test_partitioned_selection_equals_single_process(num_parts):
    data = skewed_graph(num_nodes=400)
    wrapper = _wrapped("gcn", data)
    parts = build_local_partitions(data, metis_partition(data.edge_index, data.num_nodes,
                                                         num_parts, seed=0))
    for step in range(5):
        single_in, single_loss = wrapper.split(data.train_mask, step=step)
        assert torch.equal(single_in | single_loss, data.train_mask)
        assert not (single_in & single_loss).any()
        glued_in = torch.zeros_like(single_in)
        glued_loss = torch.zeros_like(single_loss)
        for part in parts:
            local = part.to_data()
            inp, loss = wrapper.split(local.train_mask, local.n_id, step)
            glued_in[local.n_id], glued_loss[local.n_id] = inp, loss
        assert torch.equal(glued_in, single_in) and torch.equal(glued_loss, single_loss)
    # A fresh selection every step, or step 0's throughout with resample="once".
    assert not torch.equal(wrapper.loss_mask(data.train_mask, step=0),
                           wrapper.loss_mask(data.train_mask, step=1))
    once = _wrapped("gcn", data, resample="once")
    assert torch.equal(once.loss_mask(data.train_mask, step=3),
                       wrapper.loss_mask(data.train_mask, step=0))
    with pytest.raises(ValueError, match="training step"):
        wrapper(data.x, data.edge_index, y=data.y, train_mask=data.train_mask)


# -- no leak -----------------------------------------------------------------------------------
def test_no_node_sees_its_own_label_in_training():
    data = skewed_graph(num_nodes=300)
    wrapper = MaskedLabelInput(_Recorder(), NUM_CLASSES, data.num_features).train()
    for step in range(3):
        seen = wrapper(data.x, data.edge_index, y=data.y, train_mask=data.train_mask, step=step)
        inp, loss = wrapper.split(data.train_mask, step=step)
        assert torch.equal(wrapper.last_loss_mask, loss) and loss.any() and inp.any()
        # Loss, validation and test nodes: their features, nothing else.
        assert torch.equal(seen[~inp], data.x[~inp])
        torch.testing.assert_close(seen[inp], data.x[inp] + wrapper.label_emb(data.y[inp]),
                                   rtol=0, atol=0)
        # Relabelling every node that is not an input node changes nothing, anywhere.
        y = data.y.clone()
        y[~inp] = (y[~inp] + 1 + torch.randint(0, NUM_CLASSES - 1, y[~inp].shape)) % NUM_CLASSES
        y[~data.train_mask] = -1  # unlabelled nodes are never looked up
        again = wrapper(data.x, data.edge_index, y=y, train_mask=data.train_mask, step=step)
        assert torch.equal(again, seen)


def test_no_leak_through_the_graph_and_eval_labels():
    # Through a real GCN: the output at loss nodes is a function of the input nodes' labels
    # only; in eval mode training labels are input, validation and test labels never.
    data = skewed_graph(num_nodes=300)
    wrapper = _wrapped("gcn", data)
    out = wrapper(data.x, data.edge_index, y=data.y, train_mask=data.train_mask, step=4)
    inp, _ = wrapper.split(data.train_mask, step=4)
    y = data.y.clone()
    y[~inp] = (y[~inp] + 1) % NUM_CLASSES
    assert torch.equal(wrapper(data.x, data.edge_index, y=y, train_mask=data.train_mask,
                               step=4), out)
    assert not torch.equal(wrapper(data.x, data.edge_index, y=(data.y + 1) % NUM_CLASSES,
                                   train_mask=data.train_mask, step=4), out)

    wrapper.eval()
    with torch.no_grad():
        ref = wrapper(data.x, data.edge_index, y=data.y, train_mask=data.train_mask)
        y = data.y.clone()
        y[~data.train_mask] = (y[~data.train_mask] + 1) % NUM_CLASSES  # val/test relabelled
        assert torch.equal(wrapper(data.x, data.edge_index, y=y, train_mask=data.train_mask),
                           ref)
        # Training labels are input in eval mode (UniMP's convention), unless switched off.
        changed = wrapper(data.x, data.edge_index, y=(data.y + 1) % NUM_CLASSES,
                          train_mask=data.train_mask)
        assert not torch.equal(changed, ref)
        wrapper.eval_labels = "none"
        plain = wrapper.model(data.x, data.edge_index)
        assert torch.equal(wrapper(data.x, data.edge_index, y=data.y,
                                   train_mask=data.train_mask), plain)

    recorder = MaskedLabelInput(_Recorder(), NUM_CLASSES, data.num_features).eval()
    seen = recorder(data.x, data.edge_index, y=data.y, train_mask=data.train_mask)
    assert torch.equal(seen[~data.train_mask], data.x[~data.train_mask])


# -- LayerNorm without editing the model -------------------------------------------------------
def test_layer_norm_hooks_before_hidden_layers():
    data = skewed_graph(num_nodes=200)
    wrapper = _wrapped("sage", data, layer_norm=True)
    convs = list(wrapper.model.convs)
    assert len(wrapper.norms) == 2  # before the 2nd and 3rd of 3 layers
    inputs = {}
    for i, conv in enumerate(convs):
        conv.register_forward_pre_hook(
            lambda m, a, i=i: inputs.__setitem__(i, a[0].detach()))
    wrapper(data.x, data.edge_index, y=data.y, train_mask=data.train_mask, step=0)
    # PyTorch runs pre-hooks in registration order: the norm's first, so the recorder sees
    # normalized rows (LayerNorm starts as the identity affine map).
    for i in (1, 2):
        x = inputs[i]
        torch.testing.assert_close(x.mean(-1), torch.zeros(x.size(0)), atol=1e-5, rtol=0)
    assert inputs[0].mean(-1).abs().max() > 1e-2  # the first layer sees raw features

    # A deep copy normalizes with its own norms.
    twin = copy.deepcopy(wrapper)
    with torch.no_grad():
        twin.norms[0].weight.mul_(3.0)
    args = (data.x, data.edge_index)
    kw = dict(y=data.y, train_mask=data.train_mask, step=0)
    out, out_twin = wrapper(*args, **kw), twin(*args, **kw)
    assert not torch.equal(out, out_twin)
    assert torch.equal(out, wrapper(*args, **kw))

    assert len(_wrapped("sage", data, layer_norm=True, input_norm=True).norms) == 3
    wrapper.remove_norm_hooks()
    plain = _wrapped("sage", data)  # same seed: same weights, no norms
    plain.load_state_dict({k: v for k, v in wrapper.state_dict().items()
                           if not k.startswith("norms.")})
    assert torch.equal(wrapper(*args, **kw), plain(*args, **kw))


# -- the loss helper ---------------------------------------------------------------------------
def test_scale_masked_loss_single_process():
    mask = torch.tensor([True, False, True])
    loss = torch.tensor(2.5, requires_grad=True)
    assert mask_share(mask) == 1.0
    assert scale_masked_loss(loss, mask).item() == 2.5
    empty = scale_masked_loss(torch.tensor(float("nan"), requires_grad=True),
                              torch.zeros(3, dtype=torch.bool))
    assert empty.item() == 0.0 and empty.requires_grad


# -- P ranks equal one process -----------------------------------------------------------------
def _exactness(rank, world_size):
    from lightning_fullgraph.engine import FullGraphEngine
    data = skewed_graph(num_nodes=240)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part)
    local = engine.data
    results = {}
    for kind, options in (("gcn", dict(layer_norm=True)),
                          ("sage", dict(layer_norm=True, input_norm=True))):
        ref = _wrapped(kind, data, seed=3, **options)
        model = copy.deepcopy(ref)
        engine.attach(model)
        errors = []
        for step in (0, 1, 5):
            ref.zero_grad()
            model.zero_grad()
            engine.stats.reset()
            out_ref = ref(data.x, data.edge_index, y=data.y, train_mask=data.train_mask,
                          step=step)
            mask = ref.last_loss_mask
            F.cross_entropy(out_ref[mask], data.y[mask]).backward()

            out = model(local.x, local.edge_index, y=local.y, train_mask=local.train_mask,
                        n_id=local.n_id, step=step)
            mask = model.last_loss_mask
            loss = scale_masked_loss(F.cross_entropy(out[mask], local.y[mask]), mask)
            engine.reduce_backward(loss.backward)
            grads = {name: _rel(p.grad, q.grad) for (name, p), q in
                     zip(model.named_parameters(), ref.parameters())}
            backward_keys = sorted({k for (k, d), c in engine.stats.counters.items()
                                    if d == "backward" and c.calls})
            errors.append(dict(step=step, logits=_rel(engine.gather(out), out_ref.detach()),
                               grads=grads, backward_keys=backward_keys,
                               local_loss_nodes=int(mask.sum())))
        model.eval(), ref.eval()
        with torch.no_grad():
            eval_err = _rel(engine.gather(model(local.x, local.edge_index, y=local.y,
                                                train_mask=local.train_mask)),
                            ref(data.x, data.edge_index, y=data.y, train_mask=data.train_mask))
        engine.detach()
        results[kind] = dict(steps=errors, eval=eval_err)
    return results


@pytest.mark.multiprocess
def test_two_ranks_equal_single_process():
    results = run_distributed(_exactness, 2)
    for rank, result in enumerate(results):
        for kind, res in result.items():
            assert res["eval"] < 1e-5, (rank, kind, res["eval"])
            for err in res["steps"]:
                assert err["logits"] < 1e-5, (rank, kind, err)
                assert set(err["grads"]) >= {"label_emb.weight", "norms.0.weight"}
                for name, value in err["grads"].items():
                    assert value < 1e-5, (rank, kind, err["step"], name, value)
                if kind == "sage":  # raw inputs now need their halo gradients back
                    assert any(k.startswith("model.convs.0.") for k in err["backward_keys"]), err
    # The loss nodes are split unevenly and change per step: the dynamic share is exercised.
    counts = [[e["local_loss_nodes"] for e in r["gcn"]["steps"]] for r in results]
    assert counts[0] != counts[1] and len(set(counts[0])) > 1
