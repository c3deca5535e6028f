"""MLGRU: the matmul-free linear GRU token mixer of Zhu et al. (2024)."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..kernels import BACKENDS, hgru_scan
from .bitlinear import linear
from .hgru import check_mixer_call

Tensor = torch.Tensor


class MLGRU(nn.Module):
    """``[B, T, dim] -> [B, T, dim]``::

        f = gamma + (1 - gamma) * sigmoid(W_f x + b_f)     (gamma: the layer's lower bound, 0 when None)
        c = SiLU(W_c x + b_c),   g = sigmoid(W_g x + b_g)
        h_t = f_t * h_{t-1} + (1 - f_t) * c_t
        o = W_o(g * h) + b_o

    ``ternary``: W_f and W_c are ``BitLinear`` (GRU-MML); ``fully_mml``: all four are.
    ``num_heads`` splits the channels evenly; the recurrence is per channel, so heads
    group channels without changing the computation (kept so that configurations carry over).
    The gates and the scan are HGRU's real op ``hgru_scan`` (same equations: lambda = f, x = (1 - f) SiLU(.)):
    on CUDA one Triton kernel that computes f and c in fp32 without storing them (in bf16, a stored f would
    round to 1.0 above ~0.998 and stop forgetting); the float64-capable reference elsewhere.
    """

    def __init__(self, dim: int, num_heads: int = 1, ternary: bool = False, fully_mml: bool = False,
                 causal: bool = True, backend: str = "auto"):
        super().__init__()
        if dim < 1:
            raise ValueError(f"MLGRU: dim={dim} must be >= 1")
        if num_heads < 1 or dim % num_heads:
            raise ValueError(f"MLGRU: num_heads={num_heads} must be >= 1 and divide dim={dim}")
        if backend not in BACKENDS:
            raise ValueError(f"MLGRU: backend={backend!r} is not one of {BACKENDS}")
        self.dim, self.num_heads, self.causal, self.backend = dim, num_heads, causal, backend
        self.ternary, self.fully_mml = ternary or fully_mml, fully_mml
        self.forget_proj = linear(dim, dim, self.ternary)
        self.input_proj = linear(dim, dim, self.ternary)
        self.gate_proj = linear(dim, dim, fully_mml)
        self.out_proj = linear(dim, dim, fully_mml)

    @property
    def gate_dim(self) -> int:
        return self.dim

    def state_shape(self, batch: int) -> Tuple[int, ...]:
        return (batch, self.dim)

    def forward(self, x: Tensor, lower_bound: Union[float, Tensor, None] = None,
                initial_state: Optional[Tensor] = None, output_final_state: bool = False):
        check_mixer_call(self, x, lower_bound, initial_state, output_final_state)
        forget_logits, inputs = self.forget_proj(x), self.input_proj(x)
        h, final = hgru_scan(forget_logits, inputs, None, lower_bound, initial_state, False, self.backend)
        if not self.causal:
            h = h + hgru_scan(forget_logits, inputs, None, lower_bound, None, True, self.backend)[0]
        y = self.out_proj(torch.sigmoid(self.gate_proj(x)) * h)
        return y, (final if output_final_state else None)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, ternary={self.ternary}, fully_mml={self.fully_mml}"
