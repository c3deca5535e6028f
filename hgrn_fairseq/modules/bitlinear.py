"""BitLinear: the ternary-weight linear layer of the matmul-free LMs (Zhu et al., 2024).

::

    x~ = RMSNorm(x)                                        (affine, over the input features)
    x_q = clamp(round(x~ * s_x), -128, 127) / s_x,   s_x = 127 / max|x~|  (per token: 8-bit absmax)
    W_q = clamp(round(W * s_w), -1, 1) / s_w,        s_w = 1 / mean|W|   (per tensor: ternary absmean)
    y = x_q W_q^T + b

Both quantisers pass gradients straight through (``q(v) = quantise(v) + (v - v.detach())``): the
backward is that of ``RMSNorm`` followed by a plain linear layer with the full-precision weight.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor
EPS = 1e-5


def ternary_weight(w: Tensor) -> Tensor:
    """``w`` quantised to {-1, 0, +1} / s with s = 1 / mean|w| (absmean, per tensor); values only."""
    scale = 1.0 / w.abs().mean().clamp(min=EPS)
    return (w * scale).round().clamp(-1, 1) / scale


def int8_activations(x: Tensor) -> Tensor:
    """``x`` quantised per token (last dimension) to 8 bits by absmax; values only."""
    scale = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=EPS)
    return (x * scale).round().clamp(-128, 127) / scale


def straight_through(v: Tensor, quantised: Tensor) -> Tensor:
    """``quantised`` in the forward, exactly, and the identity's gradient in the backward.

    (``quantised + (v - v.detach())`` adds an exact zero; the textbook ``v + (quantised - v).detach()``
    rounds twice, which leaves float32 weights a few ulps off the three ternary values.)"""
    return quantised.detach() + (v - v.detach())


class BitLinear(nn.Linear):
    """``nn.Linear`` with an RMSNorm on its input, 8-bit activations and ternary weights (see the module
    docstring). Shapes as ``nn.Linear``: ``[..., in_features] -> [..., out_features]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-6):
        super().__init__(in_features, out_features, bias=bias)
        self.norm = nn.RMSNorm(in_features, eps=eps)

    def quantised_weight(self) -> Tensor:
        return straight_through(self.weight, ternary_weight(self.weight))

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(x)
        return F.linear(straight_through(x, int8_activations(x)), self.quantised_weight(), self.bias)


def linear(in_features: int, out_features: int, ternary: bool, bias: bool = True) -> nn.Linear:
    """A ``BitLinear`` when ``ternary``, else an ``nn.Linear``."""
    return (BitLinear if ternary else nn.Linear)(in_features, out_features, bias=bias)
