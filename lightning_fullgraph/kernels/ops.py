"""``torch.library`` custom ops for CSR aggregation, with autograd and fake (meta) kernels.

Ops (namespace ``lightning_fullgraph``):

* ``csr_sum(rowptr, col, weight?, x, mean, t_rowptr, t_col, t_perm, backend) -> out``
* ``csr_max(rowptr, col, weight?, x, backend) -> (out, arg)``

The transposed structure is an *input* of ``csr_sum`` so that backward
(``grad_x = A^T grad_out``) is another forward-style CSR aggregation without atomics,
using a structure built once per graph. ``backend`` picks the implementation
(``"cpp"``, ``"triton"``, ``"torch"``); it is a plain string so ``torch.compile`` treats
it as a constant. Registering with ``torch.library`` lets autograd and ``torch.compile``
see the ops as opaque nodes with known output shapes.

Double backward is not supported (the backward is built from the raw kernels).

Every op validates its CSR before launching a kernel: ``rowptr[0] == 0``, ``rowptr``
non-decreasing, ``rowptr[-1] == col.numel()``, ``col`` in ``[0, x.size(0))``, one weight per
edge (``csrc/aggregate.cpp`` for ``"cpp"``, :mod:`.validate` for ``"triton"`` and
``"torch"``; ``ValueError`` for a malformed structure, ``IndexError`` for an out-of-range
column; pairs already validated and unchanged since are not read again). ``csr_sum`` also
checks the shapes of the transposed CSR up front; its contents are validated when backward
uses them.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import reference, validate

__all__ = ["csr_sum", "csr_max", "csr_sum_raw", "csr_edge_dot", "take_checked", "permute_values", "impl"]


def impl(backend: str):
    """Module implementing ``csr_sum``/``csr_max``/``csr_edge_dot`` for ``backend``."""
    if backend == "cpp":
        from . import cpp

        mod = cpp.load()
        return mod if mod is not None else reference
    if backend == "triton":
        from . import triton as triton_kernels

        return triton_kernels
    return reference


_CPP_DTYPES = (torch.float32, torch.float64)
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _kernel_ok(backend: str, x: Tensor, cpp_dtypes: Tuple[torch.dtype, ...] = _CPP_DTYPES) -> str:
    # The compiled CPU kernels cover cpp_dtypes on CPU; anything else uses the reference.
    if backend == "cpp" and (x.device.type != "cpu" or x.dtype not in cpp_dtypes):
        return "torch"
    if backend == "triton":
        import os

        interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
        if x.dtype not in _TRITON_DTYPES:
            return "torch"
        if x.device.type != "cuda" and not interpreted:
            return "torch"  # Triton compiles for GPUs only; CPU runs need the interpreter
    return backend


def _sum(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor, mean: bool,
         backend: str, weight_perm: Optional[Tensor] = None) -> Tensor:
    # The output dtype is PyG's (reference.sum_dtype: bfloat16 rows with float32 weights, as
    # under autocast, give float32), sums accumulate in float32 for 16-bit rows. The C++
    # kernels read float32/float64/bfloat16 rows; bfloat16 rows cost half the bytes.
    # weight_perm (validated by csr_sum_raw): edge e weighs weight[weight_perm[e]]; the C++
    # kernels read it so, the others get the weights permuted first.
    out_dtype = reference.sum_dtype(x, weight)
    native = x.dtype == out_dtype or (x.dtype == torch.bfloat16 and out_dtype == torch.float32)
    if backend == "cpp" and not native and out_dtype in _CPP_DTYPES:
        x = x.to(out_dtype)  # e.g. float32 rows with float64 weights: summed in float64
    cpp_ok = _CPP_DTYPES + (torch.bfloat16,)
    backend = _kernel_ok(backend, x, cpp_ok)
    if backend == "triton" and out_dtype not in _TRITON_DTYPES:
        backend = "torch"
    mod = impl(backend)
    fused = weight_perm is not None and mod is not reference and backend == "cpp" \
        and not mean and weight_perm.dtype == col.dtype
    if weight_perm is not None and not fused:
        weight = _gather_values(weight.contiguous(), weight_perm, backend)
    if mod is reference or backend == "triton":
        return mod.csr_sum(rowptr, col, weight, x.contiguous(), mean, out_dtype=out_dtype)
    if fused:
        return mod.csr_sum(rowptr, col, weight, x.contiguous(), mean, out_dtype != x.dtype,
                           weight_perm)
    return mod.csr_sum(rowptr, col, weight, x.contiguous(), mean, out_dtype != x.dtype)


# --------------------------------------------------------------------------- raw ops
# Backward formulas must only call ops that torch.compile can trace, so the raw kernels
# used there are custom ops too (without autograd: double backward raises clearly).
@torch.library.custom_op("lightning_fullgraph::csr_sum_raw", mutates_args=())
def csr_sum_raw(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor, mean: bool,
                backend: str, weight_perm: Optional[Tensor] = None) -> Tensor:
    """:func:`csr_sum` without autograd (used by backward on the transposed CSR).

    ``weight_perm`` (optional, ``[E]``): edge ``e`` is weighted by
    ``weight[weight_perm[e]]`` -- backward's weights are the forward's, in the transposed
    CSR's order, read through its positions instead of gathered into a new tensor first.
    Its range is checked here, inside the op, so that the check sees real tensors under
    ``torch.compile`` too (cached like the CSR validation)."""
    if weight_perm is not None:
        validate.check_index_range("csr_sum backward", weight_perm, weight.numel(), "t_perm",
                                   "CSR positions, nnz = col.numel()")
    return _sum(rowptr, col, weight, x, mean, backend, weight_perm)


@csr_sum_raw.register_fake
def _(rowptr, col, weight, x, mean, backend, weight_perm=None):
    return x.new_empty(rowptr.shape[0] - 1, x.shape[1], dtype=reference.sum_dtype(x, weight))


@torch.library.custom_op("lightning_fullgraph::csr_edge_dot", mutates_args=())
def csr_edge_dot(rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor, backend: str) -> Tensor:
    """``out[e] = <a[row(e)], b[col[e]]>`` per CSR edge (gradient of per-edge weights)."""
    # Mixed or 16-bit operands (autocast): dot products summed in float32, like csr_sum.
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    acc = reference.accumulation_dtype(out_dtype)
    a, b = a.to(acc), b.to(acc)
    backend = _kernel_ok(backend, b)
    return impl(backend).csr_edge_dot(rowptr, col, a.contiguous(), b.contiguous()).to(out_dtype)


@csr_edge_dot.register_fake
def _(rowptr, col, a, b, backend):
    return b.new_empty(col.shape[0], dtype=torch.promote_types(a.dtype, b.dtype))


def _gather_values(values: Tensor, perm: Tensor, backend: str) -> Tensor:
    # values[perm] for a 1-D permutation: the C++ kernel prefetches the random reads (about 2x
    # torch's index_select for millions of edges, which a weighted layer pays every forward
    # and backward); other devices and dtypes use index_select.
    if backend == "cpp" and values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64):
        from . import cpp

        mod = cpp.load()
        if mod is not None and hasattr(mod, "take_values"):
            return mod.take_values(values, perm)
    return values.index_select(0, perm)


@torch.library.custom_op("lightning_fullgraph::take_checked", mutates_args=())
def take_checked(values: Tensor, perm: Tensor, backend: str) -> Tensor:
    """``values[perm]`` after checking ``perm`` lies in ``[0, values.numel())``.

    Backward no longer calls it (the kernel reads the weights through ``t_perm``, see
    :func:`csr_sum_raw`), but graphs that ``torch.compile`` cached on disk with an earlier
    version of this library do: AOTAutograd's cache keys a custom op's backward by the op's
    name, not by its formula, so the op stays for them."""
    validate.check_index_range("csr_sum backward", perm, values.numel(), "t_perm",
                               "CSR positions, nnz = col.numel()")
    return _gather_values(values.contiguous(), perm, _kernel_ok(backend, values))


@take_checked.register_fake
def _(values, perm, backend):
    return values.new_empty(perm.shape[0])


@torch.library.custom_op("lightning_fullgraph::permute_values", mutates_args=())
def permute_values(values: Tensor, perm: Tensor, backend: str) -> Tensor:
    """``values[perm]`` for per-edge values ``[E]`` and the CSR's permutation (input order to
    CSR order; built by :func:`~lightning_fullgraph.kernels.get_csr`, so not validated again),
    differentiable in ``values``."""
    return _gather_values(values.contiguous(), perm, _kernel_ok(backend, values))


@permute_values.register_fake
def _(values, perm, backend):
    return values.new_empty(perm.shape[0])


def _permute_setup(ctx, inputs, output):
    values, perm, _ = inputs
    ctx.num_values = values.numel()
    ctx.save_for_backward(perm)


def _permute_backward(ctx, grad):
    (perm,) = ctx.saved_tensors
    # perm is a permutation: each value receives the gradient of its one position.
    grad_values = grad.new_zeros(ctx.num_values).index_add_(0, perm, grad.contiguous())
    return grad_values, None, None


permute_values.register_autograd(_permute_backward, setup_context=_permute_setup)


# --------------------------------------------------------------------------- sum / mean
@torch.library.custom_op("lightning_fullgraph::csr_sum", mutates_args=())
def csr_sum(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor, mean: bool,
            t_rowptr: Tensor, t_col: Tensor, t_perm: Tensor, backend: str) -> Tensor:
    """Sum/mean aggregation ``out[r] = reduce_e weight[e] * x[col[e]]`` over a CSR.

    Args:
        rowptr: ``[N_dst + 1]`` int64.
        col: ``[E]`` source ids (CSR order).
        weight: optional ``[E]`` per-edge scalar in CSR order.
        x: ``[N_src, F]`` source features.
        mean: divide by the in-degree (rows without edges stay 0).
        t_rowptr, t_col, t_perm: transposed CSR (used by backward only).
        backend: ``"cpp"``, ``"triton"`` or ``"torch"``.

    Returns:
        ``[N_dst, F]`` of PyG's dtype (:func:`~.reference.sum_dtype`: ``bfloat16`` rows with
        ``float32`` weights give ``float32``), summed in ``float32`` for 16-bit rows.
    """
    _check_transpose_shapes(col, x, t_rowptr, t_col, t_perm)
    return _sum(rowptr, col, weight, x, mean, backend)


def _check_transpose_shapes(col: Tensor, x: Tensor, t_rowptr: Tensor, t_col: Tensor, t_perm: Tensor) -> None:
    # O(1): the transposed CSR has one row per source row of x and one entry per edge.
    n_src, nnz = x.shape[0], col.numel()
    if t_rowptr.dim() != 1 or t_rowptr.numel() != n_src + 1:
        raise ValueError(f"csr_sum: transposed CSR for backward: t_rowptr must be 1-D with N_src + 1 = {n_src + 1} "
                         f"entries (N_src = x.size(0)), got shape {tuple(t_rowptr.shape)}")
    if t_col.numel() != nnz or t_perm.numel() != nnz:
        raise ValueError(f"csr_sum: transposed CSR for backward: t_col and t_perm must have nnz = col.numel() = {nnz} "
                         f"entries, got {t_col.numel()} and {t_perm.numel()}")


@csr_sum.register_fake
def _(rowptr, col, weight, x, mean, t_rowptr, t_col, t_perm, backend):
    return x.new_empty(rowptr.shape[0] - 1, x.shape[1], dtype=reference.sum_dtype(x, weight))


def _sum_setup(ctx, inputs, output):
    rowptr, col, weight, x, mean, t_rowptr, t_col, t_perm, backend = inputs
    ctx.mean, ctx.backend = mean, backend
    ctx.needs_w = weight is not None and ctx.needs_input_grad[2]
    ctx.has_w = weight is not None
    ctx.save_for_backward(rowptr, col, weight if weight is not None else None,
                          x if ctx.needs_w else None, t_rowptr, t_col, t_perm)


def _sum_backward(ctx, grad):
    rowptr, col, weight, x, t_rowptr, t_col, t_perm = ctx.saved_tensors
    grad = grad.contiguous()
    if ctx.mean:
        deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(grad.dtype)
        grad = grad / deg.unsqueeze(1)
    grad_x = None
    if ctx.needs_input_grad[3]:
        try:  # the transposed CSR and t_perm (weights read through it) are validated there
            grad_x = csr_sum_raw(t_rowptr, t_col, weight, grad, False, ctx.backend,
                                 t_perm if ctx.has_w else None)
        except (ValueError, IndexError) as exc:
            raise type(exc)("csr_sum backward: the transposed CSR (t_rowptr, t_col: one row per source, columns "
                            f"= destinations in [0, N_dst = {grad.shape[0]}); t_perm: CSR positions) is "
                            f"invalid: {exc}") from exc
    grad_w = None
    if ctx.needs_w:
        grad_w = csr_edge_dot(rowptr, col, grad, x, ctx.backend).to(weight.dtype)
    return None, None, grad_w, grad_x, None, None, None, None, None


csr_sum.register_autograd(_sum_backward, setup_context=_sum_setup)


# --------------------------------------------------------------------------- max
@torch.library.custom_op("lightning_fullgraph::csr_max", mutates_args=())
def csr_max(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor,
            backend: str) -> Tuple[Tensor, Tensor]:
    """Feature-wise max aggregation over a CSR.

    Returns:
        ``(out [N_dst, F], arg [N_dst, F] int64)`` - ``arg`` is the CSR position of the
        (first) maximising edge, ``-1`` for rows without in-edges (their output is 0).
    """
    out_dtype = reference.sum_dtype(x, weight)  # PyG's message weight * x_j promotes
    if x.dtype != out_dtype:
        x = x.to(out_dtype)
    backend = _kernel_ok(backend, x)
    out, arg = impl(backend).csr_max(rowptr, col, weight, x.contiguous())
    return out, arg


@csr_max.register_fake
def _(rowptr, col, weight, x, backend):
    n = rowptr.shape[0] - 1
    return (x.new_empty(n, x.shape[1], dtype=reference.sum_dtype(x, weight)),
            x.new_empty(n, x.shape[1], dtype=torch.long))


def _max_setup(ctx, inputs, output):
    rowptr, col, weight, x, backend = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.num_src = x.shape[0]
    ctx.has_w = weight is not None
    ctx.needs_w = ctx.has_w and ctx.needs_input_grad[2]
    ctx.num_edges = col.shape[0]
    ctx.save_for_backward(col, weight, x if ctx.needs_w else None, output[1])


def _max_backward(ctx, grad, _grad_arg):
    # Each (row, feature) routes its gradient to the single maximising edge (PyG's
    # scatter 'amax' splits exact ties evenly; for tie-free inputs both agree).
    col, weight, x, arg = ctx.saved_tensors
    valid = arg >= 0
    safe = arg.clamp(min=0)
    if ctx.num_edges == 0:
        return None, None, None if weight is None else torch.zeros_like(weight), torch.zeros(
            ctx.num_src, grad.shape[1], dtype=grad.dtype, device=grad.device), None
    src = col.long()[safe]  # [N_dst, F] source row per (row, feature)
    g = torch.where(valid, grad, torch.zeros_like(grad))
    grad_x = grad_w = None
    if ctx.needs_input_grad[3]:
        scaled = g * weight[safe].to(g.dtype) if ctx.has_w else g
        grad_x = g.new_zeros(ctx.num_src, g.shape[1]).scatter_add_(0, src, scaled)
    if ctx.needs_w:
        contrib = g * x.gather(0, src)
        grad_w = contrib.new_zeros(ctx.num_edges).index_add_(0, safe.flatten(), contrib.flatten())
        grad_w = grad_w.to(weight.dtype)
    return None, None, grad_w, grad_x, None


csr_max.register_autograd(_max_backward, setup_context=_max_setup)
