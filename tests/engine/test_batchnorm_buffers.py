"""``DistributedBatchNorm`` keeps the running statistics one process keeps.

Rows of every step are split over the ranks unevenly (one rank holds none in one step);
after several training steps the buffers (``running_mean``, ``running_var``,
``num_batches_tracked``) and the eval-mode output equal ``torch.nn.BatchNorm1d`` on all rows
(float64, 1e-10), for the options that change how the buffers move: the default momentum,
``momentum=None`` (cumulative average), 3-D input ``[N, C, L]``, no affine parameters, and no
running statistics (eval mode then normalizes with the batch's).
"""
import pytest
import torch

from lightning_fullgraph.engine.batchnorm import convert_batchnorm
from lightning_fullgraph.testing import run_distributed

FP64 = 1e-10
C, STEPS = 5, 4
OPTIONS = {
    "default": dict(),
    "momentum=None": dict(momentum=None),
    "3-D input": dict(),
    "affine=False": dict(affine=False),
    "track_running_stats=False": dict(track_running_stats=False),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _rows(step: int, world_size: int, rank: int, shape):
    r"""All rows of a step and this rank's (uneven counts; rank 1 holds none in step 1)."""
    g = torch.Generator().manual_seed(step)
    n = 23 + 5 * step
    x = torch.randn(n, *shape, generator=g, dtype=torch.float64) * (1 + step) + step
    cuts = torch.linspace(0, n, world_size + 1).long()
    cuts[1] = n if step == 1 else cuts[1] + 3 * step  # uneven; rank 1 holds none in step 1
    return x, slice(int(cuts[rank]), int(cuts[rank + 1]))


def _compare(rank: int, world_size: int) -> dict:
    errors = {}
    for name, kwargs in OPTIONS.items():
        shape = (C, 3) if name == "3-D input" else (C, )
        torch.manual_seed(0)
        ref = torch.nn.BatchNorm1d(C, **kwargs).double()
        if ref.affine:
            with torch.no_grad():
                ref.weight.uniform_(0.5, 1.5), ref.bias.uniform_(-0.5, 0.5)
        holder = torch.nn.Sequential(torch.nn.BatchNorm1d(C, **kwargs).double())
        holder.load_state_dict(torch.nn.Sequential(ref).state_dict())
        convert_batchnorm(holder)
        bn = holder[0]
        for step in range(STEPS):
            x, own = _rows(step, world_size, rank, shape)
            weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(99 + step),
                                 dtype=torch.float64)
            x_ref, x_local = x.clone().requires_grad_(), x[own].clone().requires_grad_()
            (ref(x_ref) * weight).sum().backward()
            (bn(x_local) * weight[own]).sum().backward()
            errors[f"{name}/grad{step}"] = _rel(x_local.grad, x_ref.grad[own]) \
                if x_local.numel() else 0.0
        for key, buf in ref.named_buffers():
            mine = getattr(bn, key)
            errors[f"{name}/{key}"] = 0.0 if torch.equal(mine, buf) else \
                _rel(mine.double(), buf.double())
        ref.eval(), bn.eval()
        x, own = _rows(STEPS, world_size, rank, shape)
        with torch.no_grad():
            errors[f"{name}/eval"] = _rel(bn(x[own]), ref(x)[own])
    return errors


@pytest.mark.multiprocess
def test_running_statistics_and_eval_output_equal_one_process():
    for rank, errors in enumerate(run_distributed(_compare, 2)):
        assert len(errors) == len(OPTIONS) * (STEPS + 1) + sum(
            3 for o in OPTIONS.values() if o.get("track_running_stats", True))
        for what, value in errors.items():
            assert value < FP64, (rank, what, value)
