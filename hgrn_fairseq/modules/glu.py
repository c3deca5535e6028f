"""The gated linear unit channel mixer."""
from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import BACKENDS
from ..kernels.block_ops import GATED_ACTIVATIONS, gated_act, linear
from .hgru import BlockOpsSwitch, stack_old_projections

ACTIVATIONS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda x: x,
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation={name!r} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def aligned_width(width: int, multiple: int = 8) -> int:
    """``width`` rounded up to a multiple of ``multiple`` (16-byte rows in bf16/fp16)."""
    return -(-width // multiple) * multiple


class GLU(BlockOpsSwitch, nn.Module):
    """y = W3(act(W1 x) * W2 x). ``activation='none'`` is the bilinear GLU of the WikiText LM.

    Shapes: ``[..., dim] -> [..., dim]``, hidden width ``hidden_dim``.

    W1 and W2 are one ``[2 * hidden_dim, dim]`` projection (``in_proj``: W1's rows, then W2's), so
    the forward runs two matrix products instead of three. On CUDA, a hidden width that is not a
    multiple of 8 (HGRN2's 1365 = 8/3 * 512) is padded (``align``: "cuda", "always", "never") with zero rows/columns for the products:
    unaligned rows keep cuBLAS off its fast kernels (a quarter of an hgrn2_lm_base training step went
    to the three GLU products unpadded). The padding is exact (the padded hidden
    units are act(0) * 0 = 0 and meet zero columns of W3) and adds no parameters.
    """

    ALIGN = ("cuda", "always", "never")

    def __init__(
        self, dim: int, hidden_dim: int, activation: str = "none", bias: bool = True, align: str = "cuda",
        backend: str = "auto",
    ):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
        self.backend = backend
        if hidden_dim < 1:
            raise ValueError(f"hidden_dim={hidden_dim} must be >= 1")
        if align not in self.ALIGN:
            raise ValueError(f"align={align!r} is not one of {self.ALIGN}")
        self.align = align
        self.dim, self.hidden_dim = dim, hidden_dim
        self.activation_name = activation
        self.act = get_activation(activation)
        self.in_proj = nn.Linear(dim, 2 * hidden_dim, bias=bias)
        self.out_proj = nn.Linear(hidden_dim, dim, bias=bias)  # same init as two Linear(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w_in, b_in, w_out = self.in_proj.weight, self.in_proj.bias, self.out_proj.weight
        hidden, padded = self.hidden_dim, aligned_width(self.hidden_dim)
        pad_here = self.align == "always" or (self.align == "cuda" and x.is_cuda)
        if pad_here and padded != hidden:
            pad = padded - hidden
            w_in = F.pad(w_in.view(2, hidden, self.dim), (0, 0, 0, pad)).view(2 * padded, self.dim)
            b_in = None if b_in is None else F.pad(b_in.view(2, hidden), (0, pad)).view(2 * padded)
            w_out = F.pad(w_out, (0, pad))
        ab = linear(x, w_in, b_in, self.ops_backend)
        if self.activation_name in GATED_ACTIVATIONS:  # one kernel each way on the Triton path
            hidden_act = gated_act(ab, ab.shape[-1] // 2, self.activation_name, self.ops_backend)
        else:
            a, b = ab.chunk(2, dim=-1)
            hidden_act = self.act(a) * b
        return linear(hidden_act, w_out, self.out_proj.bias, self.ops_backend)

    def upgrade_state_dict_named(self, state_dict, name: str) -> None:
        """Checkpoints with separate ``l1``/``l2``/``l3`` load as ``in_proj``/``out_proj``."""
        stack_old_projections(state_dict, name, ("l1", "l2"), "in_proj")
        stack_old_projections(state_dict, name, ("l3",), "out_proj")

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden_dim={self.hidden_dim}, activation={self.activation_name!r}"
