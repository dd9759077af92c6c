"""The engine with its tensors on a CUDA GPU: two gloo ranks share the GPU, the halo exchange
stages its buffers through host memory, and training equals the same run on the CPU.

Checked per model (GCN, GraphSAGE) and lossless mode (post; hybrid, whose post rows and pre
partials travel in one buffer per peer), with overlap on (the default) and off:

* the logits, losses and parameters of 3 steps equal the CPU run's to fp32 rounding;
* the rows, the logits and the parameters live on the GPU;
* a steady-state step makes the same collectives as on the CPU (one ``all_to_all_single``
  per exchange point and direction, counted);
* with overlap, every aggregation runs split (the owned sources while the halo travels)
  through the kernels (C++ on the CPU, Triton on the GPU).

Needs a CUDA GPU (skipped without one: CI has none; the Triton kernels' tests skip likewise).
"""
import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.kernels.backend import resolve, triton_installed
from lightning_fullgraph.testing import count_collectives, run_distributed

from .models import rank_partition

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = 3
CASES = [(kind, aggregation, overlap) for kind in ("gcn", "sage")
         for aggregation in ("post", "hybrid") for overlap in (True, False)]


def _model(kind, in_channels):
    from torch_geometric.nn.models import GCN, GraphSAGE
    torch.manual_seed(0)
    return (GCN if kind == "gcn" else GraphSAGE)(in_channels, 16, 2, 4, dropout=0.0)


def _train(rank, world_size, kind, aggregation, overlap, device):
    import lightning_fullgraph.kernels.pyg as kernel_pyg
    inner, split = kernel_pyg.aggregate_split, [0]

    def counted(*args, **kwargs):  # the overlapped (split) aggregation ran
        split[0] += 1
        return inner(*args, **kwargs)

    kernel_pyg.aggregate_split = counted
    data, part = rank_partition(rank, world_size)
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation=aggregation,
                                                           overlap=overlap, step_aside=False))
    engine.to(device)
    model = _model(kind, data.num_features).to(device)
    engine.attach(model)
    engine.use_kernels("auto")  # C++ on the CPU, Triton on the GPU; overlap runs through them
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    local = engine.data
    losses, log = [], None
    for _ in range(STEPS):
        split_before = split[0]
        with count_collectives() as counted:
            optimizer.zero_grad()
            out = model(local.x, local.edge_index)
            loss = F.cross_entropy(out[local.train_mask], local.y[local.train_mask])
            loss.backward()
            optimizer.step()
        losses.append(float(loss.detach()))
        # The last step's: steady state (the raw input's exchange is kept).
        log, split_last = counted, split[0] - split_before
    engine.drain()
    on_device = {"rows": local.x.device.type, "logits": out.device.type,
                 "params": {p.device.type for p in model.parameters()}}
    result = dict(losses=losses, logits=out.detach().cpu(),
                  params=[p.detach().cpu() for p in model.parameters()],
                  exchanges=log.names().count("all_to_all_single"), on_device=on_device)
    engine.detach()
    kernel_pyg.aggregate_split = inner
    result["split"] = (split[0], split_last)
    result["backend"] = resolve("auto", torch.device(device))
    return result


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1.0))


def _run(rank, world_size):
    torch.cuda.set_device(0)  # both ranks share the one GPU
    out = {}
    for case in CASES:
        cpu, gpu = (_train(rank, world_size, *case, device) for device in ("cpu", "cuda"))
        # The comparisons, made here: the test gets their largest errors.
        out[case] = dict(
            on_device=gpu["on_device"], exchanges=(cpu["exchanges"], gpu["exchanges"]),
            loss_error=max(abs(a - b) for a, b in zip(gpu["losses"], cpu["losses"])),
            logits_error=_rel(gpu["logits"], cpu["logits"]),
            param_error=max(_rel(g, c) for g, c in zip(gpu["params"], cpu["params"])),
            split=(cpu["split"], gpu["split"]), backend=gpu["backend"])
    return out


@pytest.mark.multiprocess
def test_the_exchange_on_the_gpu_equals_the_cpu():
    # Spawned: a forked rank cannot start CUDA once its parent has asked about the GPU.
    results = run_distributed(_run, 2, timeout_s=300, start_method="spawn")
    for rank, result in enumerate(results):
        for case, r in result.items():
            assert r["on_device"] == {"rows": "cuda", "logits": "cuda", "params": {"cuda"}}, \
                (rank, case)
            assert r["loss_error"] <= 1e-5, (rank, case, r)
            assert r["logits_error"] <= 1e-5 and r["param_error"] <= 1e-5, (rank, case, r)
            # One collective per exchange point and direction on the GPU as on the CPU.
            assert r["exchanges"] == (2, 2), (rank, case, r["exchanges"])
            # With overlap, every exchanged aggregation ran split (owned sources while the
            # halo travels) on either device: in a steady-state step the hidden layer's (the
            # raw input's aggregation is kept), before it both layers'. (On the GPU, GCN's
            # raw-input aggregate is kept from the third step, on the CPU from the second:
            # 5 split aggregations in 3 steps against 4.)  Without overlap, none ran split.
            (cpu_total, cpu_last), (gpu_total, gpu_last) = r["split"]
            if case[2]:
                assert cpu_last == gpu_last == 1, (rank, case, r)
                assert cpu_total >= STEPS + 1 and gpu_total >= STEPS + 1, (rank, case, r)
            else:
                assert cpu_total == gpu_total == 0, (rank, case, r)
            assert r["backend"] == ("triton" if triton_installed() else "torch"), r["backend"]
