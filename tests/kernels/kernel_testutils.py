"""Graph generators, state resets and skips shared by the kernel tests (imported by basename)."""
import os
from contextlib import contextmanager

import pytest
import torch


def make_graph(num_src, num_dst, num_edges, *, seed=0, skew=False, self_loops=True, duplicates=True,
               isolated=True):
    """Random edge_index with the awkward cases the kernels must handle.

    Includes self-loops (square graphs), duplicate edges, destinations and sources
    without any edge, and (``skew=True``) one hub destination holding ~half the edges.
    """
    g = torch.Generator().manual_seed(seed)
    hi_src = max(1, num_src - 2) if isolated else num_src
    hi_dst = max(1, num_dst - 3) if isolated else num_dst  # last rows isolated
    src = torch.randint(0, hi_src, (num_edges,), generator=g)
    dst = torch.randint(0, hi_dst, (num_edges,), generator=g)
    if skew:
        dst[: num_edges // 2] = 1
    parts_s, parts_d = [src], [dst]
    if self_loops and num_src == num_dst:
        loops = torch.arange(0, min(num_src, hi_dst), 3)
        parts_s.append(loops)
        parts_d.append(loops)
    if duplicates:
        parts_s.append(src[:7])
        parts_d.append(dst[:7])
    return torch.stack([torch.cat(parts_s), torch.cat(parts_d)])



def random_features_graph(n, e, f, *, dtype=torch.float32, seed=0, weights=False):
    """``(x [n, f], edge_index [2, e])`` drawn uniformly, plus ``[e]`` edge weights in ``[0, 1)``
    with ``weights=True``; the same values for the same arguments."""
    g = torch.Generator().manual_seed(seed)
    x, edge_index = torch.randn(n, f, generator=g, dtype=dtype), torch.randint(0, n, (2, e), generator=g)
    return (x, edge_index, torch.rand(e, generator=g, dtype=dtype)) if weights else (x, edge_index)


@contextmanager
def fresh_kernel_state(*switches):
    """Kernels' caches emptied and the given mode setters (``K.set_static_inputs``, ...) back to
    their defaults, before and after the enclosed test."""
    import lightning_fullgraph.kernels as K

    K.clear_memos()
    for switch in switches:
        switch(None)
    try:
        yield
    finally:
        for switch in switches:
            switch(None)
        K.clear_memos()


CI_ENV = "LIGHTNING_FULLGRAPH_CI"


def in_ci() -> bool:
    """Whether tests run under ``.ci/run``, which installs every optional piece."""
    return os.environ.get(CI_ENV, "0").lower() not in ("", "0", "false", "no")


def skip_or_fail(reason: str, *, allow_module_level: bool = False):
    """Skip because an optional piece is missing - or fail under CI, which installs it.

    A missing C++ compiler or Triton makes tests skip on a developer's machine; in CI the
    same skip would hide a broken build, so ``LIGHTNING_FULLGRAPH_CI=1`` turns it into a
    failure. (Skips for a missing GPU do not go through here: CI has none.)
    """
    if in_ci():
        pytest.fail(f"{reason} - not allowed with {CI_ENV}=1 (CI installs it)", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


def cpp_or_skip():
    from lightning_fullgraph.kernels import cpp

    if cpp.disabled_by_env():  # deliberately switched off: a skip even in CI
        pytest.skip("C++ extension disabled by LIGHTNING_FULLGRAPH_NO_EXT=1")
    if cpp.load() is None:
        skip_or_fail("C++ extension unavailable (no compiler or ninja, or the build failed; "
                     "see the RuntimeWarning)")
