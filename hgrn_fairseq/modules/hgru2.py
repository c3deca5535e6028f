"""HGRU2: the HGRN2 token mixer with state expansion."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import BACKENDS, hgrn2_scan, hgrn2_scan_bidirectional, hgrn2_step, resolve_backend
from ..kernels.block_ops import layer_norm, linear
from ..kernels.hgrn2_gates import hgrn2_gates, hgrn2_in_gates
from ..kernels.reference import hgrn2_log_decay_reference
from .hgru import BlockOpsSwitch, check_mixer_call, mask_padding
from .scan2d import grid_scan

Tensor = torch.Tensor
VARIANTS = ("lm", "lra")


hgrn2_log_decay = hgrn2_log_decay_reference  # the stable log(lambda), also importable under this name


class HGRU2(BlockOpsSwitch, nn.Module):
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
    norm. ``padding_mask`` (``[B, T]``, True at padding) zeroes v and the log-decay there (a padded step
    is a no-op), so padding never reaches a valid position; ``grid=(H, W)`` (non-causal): the four-direction 2-D scan (scan2d.py). Incremental decoding: pass ``initial_state`` ``[B, heads, e, e]`` and
    ``output_final_state=True``; a single CUDA step goes through the ``hgrn2_step`` kernel.

    ``HGRU2(512, 128, 'lm')`` has 787,968 + 1,024 + 262,656 = 1,051,648 parameters (the HGRN2
    WikiText-103 configuration: in-projection with bias, affine LayerNorm, out-projection with bias).
    """

    # With block_ops: v's SiLU fused into the gates kernel (hgrn2_in_gates) and the fused LayerNorm. False
    # keeps the split / PyTorch SiLU / PyTorch LayerNorm (for A/B runs: bench_image.py --ab-hgru2).
    fuse_in_gates = True
    # Non-causal: the reverse scan adds its output and gradients into the forward scan's inside the
    # chunked kernels (kernels.hgrn2_scan_bidirectional) instead of by element-wise adds. Off: the
    # image models trained no faster with it (within the run-to-run spread) and took more peak memory
    # (bench_image.py --ab-accum; docs/design.md).
    accumulate_directions = False

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
        proj = linear(x, self.in_proj.weight, self.in_proj.bias, self.ops_backend)
        q_act = "silu" if self.variant == "lm" else "sigmoid"
        if self.block_ops and self.fuse_in_gates:
            # v's activation too, and the in-projection's gradient written whole (image models)
            v, q, log_decay = hgrn2_in_gates(proj, lower_bound, q_act, "silu" if self.variant == "lra" else "none",
                                             backend=self.backend)
        else:
            v, q, f = proj.chunk(3, dim=-1)
            if self.variant == "lra":
                v = F.silu(v)
            # q's activation and the log-decay (fp32 math) in one kernel on the Triton path
            q, log_decay = hgrn2_gates(q, f, lower_bound, q_act, backend=self.backend)
        shape = (B, T, self.num_heads, self.head_dim)
        return q.reshape(shape), v.reshape(shape), log_decay.reshape(shape)

    def forward(
        self,
        x: Tensor,
        lower_bound: Union[float, Tensor, None] = None,
        initial_state: Optional[Tensor] = None,
        output_final_state: bool = False,
        padding_mask: Optional[Tensor] = None,
        grid: Optional[Tuple[int, int]] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """x: ``[B, T, dim]``. initial_state: ``[B, heads, e, e]`` (causal only).
        padding_mask: ``[B, T]`` bool, True at padding. grid: ``(H, W)`` with ``H * W == T``.

        Returns ``(y [B, T, dim], final_state [B, heads, e, e] (fp32 on the Triton path) or None)``.
        """
        grid = check_mixer_call(self, x, lower_bound, initial_state, output_final_state, padding_mask, grid)
        B, T, _ = x.shape
        q, v, log_decay = self._gates(x, lower_bound)
        # padding: v = 0 (nothing enters the state) and log-decay 0 (the state passes unchanged), so a
        # padded step is an exact no-op and the chunked kernels see the same decay sums at valid positions
        v, log_decay = mask_padding(v, padding_mask), mask_padding(log_decay, padding_mask)
        backend = resolve_backend(self.backend, q)
        if grid is not None:
            def both_ways(q_, v_, d_):
                if self.accumulate_directions:
                    return hgrn2_scan_bidirectional(q_, v_, d_, backend)
                return hgrn2_scan(q_, v_, d_, None, False, backend)[0] + hgrn2_scan(q_, v_, d_, None, True, backend)[0]

            o = grid_scan(both_ways, (q, v, log_decay), grid)
            return self._out(o.reshape(B, T, self.dim)), None
        if T == 1 and initial_state is not None and self.causal and q.is_cuda and backend == "triton":
            o, final = hgrn2_step(q[:, 0], v[:, 0], log_decay[:, 0], initial_state, backend=backend)
            o = o.unsqueeze(1)
        elif not self.causal and self.accumulate_directions:
            o, final = hgrn2_scan_bidirectional(q, v, log_decay, backend), None
        else:
            o, final = hgrn2_scan(q, v, log_decay, initial_state, False, backend)
            if not self.causal:
                o_r, _ = hgrn2_scan(q, v, log_decay, None, True, backend)
                o = o + o_r
        return self._out(o.reshape(B, T, self.dim)), (final if output_final_state else None)

    def _out(self, o: Tensor) -> Tensor:
        """W_out(LayerNorm(o)); with ``block_ops`` the LayerNorm is the fused kernel (bf16 out under
        autocast), which is PyTorch's own otherwise."""
        y = layer_norm(o, self.norm.weight, self.norm.bias, self.norm.eps,
                       self.ops_backend if self.fuse_in_gates else "reference")
        return linear(y, self.out_proj.weight, self.out_proj.bias, self.ops_backend)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, expand_ratio={self.expand_ratio}, heads={self.num_heads}, "
            f"variant={self.variant!r}, causal={self.causal}, backend={self.backend!r}"
        )
