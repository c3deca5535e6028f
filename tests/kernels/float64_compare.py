"""Shared by the kernel tests: where the kernels run, and the error measure against float64."""
import os

import torch

# Triton's interpreter on CPU tensors unless a GPU is there and TRITON_INTERPRET is unset
# (tests/conftest.py sets TRITON_INTERPRET=1 on machines without a GPU before anything compiles)
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def rel(x, ref):
    """Norm-relative error ||x - ref|| / ||ref|| in float64 on the CPU; x must be finite."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()
