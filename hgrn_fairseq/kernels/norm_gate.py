"""The HGRU output gate ``y = LayerNorm(h) * SiLU(g)`` in one kernel each way.

In PyTorch under bf16 autocast this is a fp32 LayerNorm, a SiLU on a strided slice of the
in-projection, a fp32 product and a cast for the out-projection forward, and about ten kernels
backward (two of them PyTorch's slow LayerNorm weight/bias reduction). Here: one kernel forward (statistics in fp32, output in ``h``'s dtype, which is what the
out-projection reads), one backward that also produces per-program partial sums of the LayerNorm
weight and bias gradients, and one column sum of those.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import as_rows, eager, resolve_backend

Tensor = torch.Tensor

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_ROWS_PER_PROGRAM = 16


def norm_gate_reference(h: Tensor, g: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """``F.layer_norm(h) * SiLU(g)`` over the last dimension (the readable definition)."""
    return F.layer_norm(h, (h.shape[-1],), weight, bias, eps) * F.silu(g)


if triton is not None:

    @triton.jit
    def _norm_gate_fwd_kernel(
        H, stride_h, G, stride_g, W, B, Y, MEAN, RSTD, N, C, eps,
        BLOCK_C: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        h = tl.load(H + row * stride_h + cols, mask=cmask, other=0.0).to(tl.float32)
        g = tl.load(G + row * stride_g + cols, mask=cmask, other=0.0).to(tl.float32)
        mean = tl.sum(h, axis=0) / C
        diff = tl.where(cmask, h - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / C + eps)
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        y = (diff * rstd * w + b) * (g / (1.0 + tl.exp(-g)))
        tl.store(Y + row * C + cols, y.to(Y.dtype.element_ty), mask=cmask)
        tl.store(MEAN + row, mean)
        tl.store(RSTD + row, rstd)

    @triton.jit
    def _norm_gate_bwd_kernel(
        H, stride_h, G, stride_g, W, B, DY, MEAN, RSTD, DH, DG, DW_PART, DB_PART, N, C,
        ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK_C,), dtype=tl.float32)
        db = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for i in range(ROWS):
            row = pid.to(tl.int64) * ROWS + i
            if row < N:
                h = tl.load(H + row * stride_h + cols, mask=cmask, other=0.0).to(tl.float32)
                g = tl.load(G + row * stride_g + cols, mask=cmask, other=0.0).to(tl.float32)
                dy = tl.load(DY + row * C + cols, mask=cmask, other=0.0).to(tl.float32)
                mean = tl.load(MEAN + row)
                rstd = tl.load(RSTD + row)
                xhat = tl.where(cmask, (h - mean) * rstd, 0.0)
                s = 1.0 / (1.0 + tl.exp(-g))
                dn = dy * g * s  # gradient of the normalised, affine output
                dgate = dy * (xhat * w + b) * s * (1.0 + g * (1.0 - s))
                dw += dn * xhat
                db += dn
                dxhat = tl.where(cmask, dn * w, 0.0)
                c1 = tl.sum(dxhat * xhat, axis=0) / C
                c2 = tl.sum(dxhat, axis=0) / C
                dh = (dxhat - xhat * c1 - c2) * rstd
                tl.store(DH + row * C + cols, dh.to(DH.dtype.element_ty), mask=cmask)
                tl.store(DG + row * C + cols, dgate.to(DG.dtype.element_ty), mask=cmask)
        tl.store(DW_PART + pid.to(tl.int64) * C + cols, dw, mask=cmask)
        tl.store(DB_PART + pid.to(tl.int64) * C + cols, db, mask=cmask)


class _NormGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, g, weight, bias, eps):
        hr, stride_h = as_rows(h)
        gr, stride_g = as_rows(g)
        N, C = hr.shape
        y = torch.empty(h.shape, device=h.device, dtype=h.dtype)
        mean = torch.empty(N, device=h.device, dtype=torch.float32)
        rstd = torch.empty(N, device=h.device, dtype=torch.float32)
        block = triton.next_power_of_2(C)
        _norm_gate_fwd_kernel[(N,)](hr, stride_h, gr, stride_g, weight, bias, y, mean, rstd, N, C, eps,
                                    BLOCK_C=block, num_warps=min(max(block // 256, 1), 8))
        ctx.save_for_backward(h, g, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        h, g, weight, bias, mean, rstd = ctx.saved_tensors
        hr, stride_h = as_rows(h)
        gr, stride_g = as_rows(g)
        N, C = hr.shape
        dy = dy.contiguous()
        dh = torch.empty(h.shape, device=h.device, dtype=h.dtype)
        dg = torch.empty(g.shape, device=g.device, dtype=g.dtype)
        programs = triton.cdiv(N, _ROWS_PER_PROGRAM)
        dw_part = torch.empty((programs, C), device=h.device, dtype=torch.float32)
        db_part = torch.empty((programs, C), device=h.device, dtype=torch.float32)
        block = triton.next_power_of_2(C)
        _norm_gate_bwd_kernel[(programs,)](
            hr, stride_h, gr, stride_g, weight, bias, dy, mean, rstd, dh, dg, dw_part, db_part, N, C,
            ROWS=_ROWS_PER_PROGRAM, BLOCK_C=block, num_warps=min(max(block // 256, 1), 8),
        )
        return dh, dg, dw_part.sum(0).to(weight.dtype), db_part.sum(0).to(bias.dtype), None


@eager
def norm_gate(h: Tensor, g: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5, backend: str = "auto") -> Tensor:
    """``LayerNorm(h) * SiLU(g)`` over the last dimension.

    Args:
        h: ``[..., C]`` (the HGRU state), g: gate pre-activations of the same shape (any strides with
            a unit channel stride, e.g. a slice of the in-projection).
        weight, bias: the LayerNorm's ``[C]`` affine parameters; eps its epsilon.
    Returns:
        ``[..., C]``: on the Triton path in ``h``'s dtype (statistics and products in fp32); on the
        reference path what PyTorch gives (fp32 under autocast).
    """
    if h.shape != g.shape:
        raise ValueError(f"h {tuple(h.shape)} and g {tuple(g.shape)} must have the same shape")
    C = h.shape[-1]
    if weight is None or bias is None or tuple(weight.shape) != (C,) or tuple(bias.shape) != (C,):
        raise ValueError(f"norm_gate needs an affine LayerNorm of width {C} (weight and bias of shape ({C},))")
    if resolve_backend(backend, h) != "triton" or h.dtype == torch.float64 or C > 16384:
        return norm_gate_reference(h, g, weight, bias, eps)
    return _NormGate.apply(h, g, weight, bias, float(eps))
