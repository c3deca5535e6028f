"""The gated linear unit channel mixer (SPEC 4)."""
from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import nn

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


class GLU(nn.Module):
    """y = W3(act(W1 x) * W2 x). ``activation='none'`` is the bilinear GLU of the WikiText LM.

    Shapes: ``[..., dim] -> [..., dim]``, hidden width ``hidden_dim``.
    """

    def __init__(self, dim: int, hidden_dim: int, activation: str = "none", bias: bool = True):
        super().__init__()
        if hidden_dim < 1:
            raise ValueError(f"hidden_dim={hidden_dim} must be >= 1")
        self.activation_name = activation
        self.act = get_activation(activation)
        self.l1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.l2 = nn.Linear(dim, hidden_dim, bias=bias)
        self.l3 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(self.act(self.l1(x)) * self.l2(x))

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}"
