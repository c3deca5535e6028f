"""Shared test set-up.

Without a GPU, Triton kernels run through the interpreter on CPU tensors: set TRITON_INTERPRET=1
before any kernel is compiled. (With ``backend='auto'`` CPU tensors take the PyTorch reference
anyway; only tests that force ``backend='triton'`` reach the interpreter.)
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
