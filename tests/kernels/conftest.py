"""Shared fixtures for the kernel tests.

Triton reads ``TRITON_INTERPRET`` when kernels are decorated, so it is set here - before
any test imports ``lightning_fullgraph.kernels.triton`` - on machines without a GPU.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
