"""Settings of the whole test suite.

Multi-process tests start their gloo ranks through :mod:`lightning_fullgraph.testing`; here
each rank is forked from a server that imported torch and PyG once, instead of spawned afresh
(seconds of imports per rank, most of this suite's time otherwise). A test that needs the
other way passes ``start_method="spawn"``; ``LIGHTNING_FULLGRAPH_START_METHOD=spawn`` before
pytest runs everything spawned.

Without a GPU the Triton kernels run interpreted: ``TRITON_INTERPRET=1`` (as
``scripts/test.sh`` sets it) before anything imports triton, which reads it when kernels are
decorated - a module that imports the library first would otherwise fix it for all later ones.
"""
import os

import torch

from lightning_fullgraph.testing import START_METHOD_ENV

os.environ.setdefault(START_METHOD_ENV, "forkserver")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
