"""With the kernels switched on globally (``K.use``), a model whose first call is traced by
torch.compile keeps PyG's path inside the graph: no graph break (PyG's
``test_compile_graph_breaks`` asserts none).  Installing the kernels is eager-only work."""
import pytest
import torch
from torch_geometric.nn.models import GCN, GIN, GraphSAGE

import lightning_fullgraph.kernels as K


@pytest.mark.parametrize("model", [GCN, GraphSAGE, GIN])
def test_a_model_compiled_at_its_first_call_has_no_graph_break(model):
    import torch._dynamo as dynamo
    torch.manual_seed(0)
    x, edge_index = torch.randn(3, 8), torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    kwargs = dict(add_self_loops=False) if model is GCN else {}  # (PyG's own graph break)
    net = model(8, 16, num_layers=2, **kwargs)
    dynamo.reset()
    try:
        with K.use("cpp"):
            explanation = dynamo.explain(net)(x, edge_index)
            assert explanation.graph_break_count == 0, explanation.break_reasons
            assert not any(K.is_accelerated(m) for m in net.modules())
            out = net(x, edge_index)  # eager now: installed at this call
            assert any(K.is_accelerated(m) for m in net.modules())
    finally:
        dynamo.reset()
    torch.testing.assert_close(out, net(x, edge_index), rtol=1e-5, atol=1e-6)
