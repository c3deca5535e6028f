"""HGRU2: the HGRN2 token mixer with state expansion (SPEC 3)."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import BACKENDS, hgrn2_scan, hgrn2_step, resolve_backend
from .hgru import check_mixer_call

Tensor = torch.Tensor
VARIANTS = ("lm", "lra")


def hgrn2_log_decay(forget_logits: Tensor, lower_bound: Union[float, Tensor, None] = None) -> Tensor:
    """log(lambda) with lambda = gamma + (1 - gamma) * sigmoid(f), computed without cancellation.

    Near lambda -> 1 it uses ``log1p(-(1 - gamma) * sigmoid(-f))``; elsewhere ``log(lambda)``; with no
    bound (or a bound of 0) it is ``logsigmoid(f)``. Each branch only sees inputs for which it is
    finite, so the unused branch cannot poison the gradient.

    Args:
        forget_logits: ``[..., D]``. lower_bound: gamma, a float or a ``[D]`` tensor in [0, 1), or None.
    Returns:
        ``[..., D]``, same dtype as ``forget_logits``, ``<= 0``.
    """
    if lower_bound is None or (not isinstance(lower_bound, Tensor) and float(lower_bound) == 0.0):
        return F.logsigmoid(forget_logits)
    gamma = lower_bound
    lam = gamma + (1 - gamma) * torch.sigmoid(forget_logits)
    near_one = lam > 0.5
    one_minus = (1 - gamma) * torch.sigmoid(-forget_logits)
    log_near_one = torch.log1p(-torch.where(near_one, one_minus, torch.zeros_like(one_minus)))
    # a zero bound lets lambda underflow for very negative f: clamp instead of taking log(0)
    tiny = torch.finfo(lam.dtype).tiny
    log_far = torch.log(torch.where(near_one, torch.ones_like(lam), lam).clamp_min(tiny))
    return torch.where(near_one, log_near_one, log_far)


class HGRU2(nn.Module):
    """HGRN2 token mixer, batch-first ``[B, T, dim] -> [B, T, dim]``.

    ::

        v, q, f = split(W_in x)                    W_in: dim -> 3 * dim (bias)
        LM variant:  v = v,        q = SiLU(q)
        LRA variant: v = SiLU(v),  q = sigmoid(q)
        lambda = gamma + (1 - gamma) * sigmoid(f)  (gamma = lower bound; log lambda computed stably)
        per head (heads = dim / expand_ratio, head size e = expand_ratio, state e x e):
            S_t = Diag(lambda_t) S_{t-1} + (1 - lambda_t)^T v_t,   o_t = q_t S_t
        y = W_out(LayerNorm(o))                    W_out: dim -> dim (bias), affine LayerNorm(dim)

    Non-causal (``causal=False``): forward and reverse scans over the same gates, summed before the
    norm. Incremental decoding: pass ``initial_state`` ``[B, heads, e, e]`` and
    ``output_final_state=True``; a single CUDA step goes through the ``hgrn2_step`` kernel.

    ``HGRU2(512, 128, 'lm')`` has 787,968 + 1,024 + 262,656 = 1,051,648 parameters (the HGRN2
    WikiText-103 configuration: in-projection with bias, affine LayerNorm, out-projection with bias).
    """

    def __init__(
        self,
        dim: int,
        expand_ratio: int,
        variant: str = "lm",
        causal: bool = True,
        bias: bool = True,
        backend: str = "auto",
    ):
        super().__init__()
        if dim < 1:
            raise ValueError(f"dim={dim} must be >= 1")
        if expand_ratio < 1:
            raise ValueError(f"expand_ratio={expand_ratio} must be >= 1")
        if dim % expand_ratio != 0:
            raise ValueError(
                f"expand_ratio={expand_ratio} must divide dim={dim} (heads = dim / expand_ratio)"
            )
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} is not one of {VARIANTS}")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
        self.dim, self.expand_ratio, self.variant = dim, expand_ratio, variant
        self.causal, self.backend = causal, backend
        self.num_heads = dim // expand_ratio
        self.head_dim = expand_ratio
        self.in_proj = nn.Linear(dim, 3 * dim, bias=bias)
        self.norm = nn.LayerNorm(dim)
        self.out_proj = nn.Linear(dim, dim, bias=bias)

    @property
    def gate_dim(self) -> int:
        """Width of the forget gate, i.e. of the lower bound this layer takes."""
        return self.dim

    def state_shape(self, batch: int) -> Tuple[int, ...]:
        return (batch, self.num_heads, self.head_dim, self.head_dim)

    def _gates(self, x: Tensor, lower_bound) -> Tuple[Tensor, Tensor, Tensor]:
        B, T, _ = x.shape
        v, q, f = self.in_proj(x).chunk(3, dim=-1)
        if self.variant == "lm":
            q = F.silu(q)
        else:
            v = F.silu(v)
            q = torch.sigmoid(q)
        if isinstance(lower_bound, Tensor):
            lower_bound = lower_bound.float()
        # the gate in fp32 (cheap, elementwise), handed to the kernel in the activations' dtype
        log_decay = hgrn2_log_decay(f.float(), lower_bound).to(q.dtype)
        shape = (B, T, self.num_heads, self.head_dim)
        return q.reshape(shape), v.reshape(shape), log_decay.reshape(shape)

    def forward(
        self,
        x: Tensor,
        lower_bound: Union[float, Tensor, None] = None,
        initial_state: Optional[Tensor] = None,
        output_final_state: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """x: ``[B, T, dim]``. initial_state: ``[B, heads, e, e]`` (causal only).

        Returns ``(y [B, T, dim], final_state [B, heads, e, e] (fp32 on the Triton path) or None)``.
        """
        check_mixer_call(self, x, lower_bound, initial_state, output_final_state)
        B, T, _ = x.shape
        q, v, log_decay = self._gates(x, lower_bound)
        backend = resolve_backend(self.backend, q)
        if T == 1 and initial_state is not None and self.causal and q.is_cuda and backend == "triton":
            o, final = hgrn2_step(q[:, 0], v[:, 0], log_decay[:, 0], initial_state, backend=backend)
            o = o.unsqueeze(1)
        else:
            o, final = hgrn2_scan(q, v, log_decay, initial_state, False, backend)
        if not self.causal:
            o_r, _ = hgrn2_scan(q, v, log_decay, None, True, backend)
            o = o + o_r
        y = self.out_proj(self.norm(o.reshape(B, T, self.dim)))
        return y, (final if output_final_state else None)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, expand_ratio={self.expand_ratio}, heads={self.num_heads}, "
            f"variant={self.variant!r}, causal={self.causal}, backend={self.backend!r}"
        )
