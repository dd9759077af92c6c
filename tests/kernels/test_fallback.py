"""Forced pure-PyTorch fallback (no compiler): same results, one clear warning."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import warnings
    import torch
    import torch_geometric.nn as gnn
    import lightning_fullgraph.kernels as K
    from lightning_fullgraph.kernels import cpp
    torch.manual_seed(0)
    ei = torch.randint(0, 30, (2, 200))
    x = torch.randn(30, 8)
    conv = gnn.SAGEConv(8, 4, aggr="max")
    ref = conv(x, ei)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert cpp.load() is None and cpp.load() is None
        with K.use("cpp"):
            out = conv(x, ei)
            out2 = conv(x, ei)
    assert K.resolve("auto", torch.device("cpu")) == "torch"
    torch.testing.assert_close(out, ref)
    msgs = [str(w.message) for w in rec if "pure-PyTorch fallback" in str(w.message)]
    assert len(msgs) == 1, msgs
    print("OK")
    """
)


def test_forced_fallback_env():
    env = dict(os.environ, LIGHTNING_FULLGRAPH_NO_EXT="1")
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-2000:]
