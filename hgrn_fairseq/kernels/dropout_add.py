"""Residual connection with dropout, ``x + dropout(y, p)``, in one kernel each way.

PyTorch runs a Bernoulli draw, a scale, a product and the addition (four kernels forward, a masked
product backward) per residual; the LM has two residuals per layer. Here the mask comes from
Triton's counter-based generator (``tl.rand(seed, offset)``): nothing is stored for backward, which
regenerates it from the same seed. The seed is drawn from PyTorch's CPU generator, so
``torch.manual_seed`` (fairseq's ``--seed``) makes runs repeatable, though the masks differ from
``nn.Dropout``'s. Statistically it is the same dropout: each element of ``y`` is kept with
probability ``1 - p`` and scaled by ``1 / (1 - p)``.
"""
from __future__ import annotations

import torch

from .dispatch import eager, resolve_backend

Tensor = torch.Tensor

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_BLOCK = 2048


if triton is not None:

    @triton.jit
    def _dropout_add_kernel(X, Y, OUT, n, p, scale, seed, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
        keep = tl.rand(seed, offs) >= p
        out = x + tl.where(keep, y * scale, 0.0)
        tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=mask)

    @triton.jit
    def _dropout_grad_kernel(DOUT, DY, n, p, scale, seed, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        d = tl.load(DOUT + offs, mask=mask, other=0.0).to(tl.float32)
        keep = tl.rand(seed, offs) >= p
        tl.store(DY + offs, tl.where(keep, d * scale, 0.0).to(DY.dtype.element_ty), mask=mask)


class _DropoutAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, p, seed):
        out_dtype = torch.promote_types(x.dtype, y.dtype)
        xc, yc = x.contiguous(), y.contiguous()
        out = torch.empty(x.shape, device=x.device, dtype=out_dtype)
        n = out.numel()
        scale = 1.0 / (1.0 - p)
        _dropout_add_kernel[(triton.cdiv(n, _BLOCK),)](xc, yc, out, n, p, scale, seed, BLOCK=_BLOCK, num_warps=8)
        ctx.p, ctx.seed, ctx.y_dtype, ctx.x_dtype = p, seed, y.dtype, x.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        dout = dout.contiguous()
        dy = torch.empty(dout.shape, device=dout.device, dtype=ctx.y_dtype)
        n = dout.numel()
        _dropout_grad_kernel[(triton.cdiv(n, _BLOCK),)](
            dout, dy, n, ctx.p, 1.0 / (1.0 - ctx.p), ctx.seed, BLOCK=_BLOCK, num_warps=8
        )
        return dout.to(ctx.x_dtype), dy, None, None


@eager
def dropout_add(x: Tensor, y: Tensor, p: float, training: bool = True, backend: str = "auto") -> Tensor:
    """``x + dropout(y, p)`` (``x + y`` when not training or ``p == 0``).

    Args:
        x: the residual stream, y: the sublayer output, same shape (dtypes may differ; the result has
            their promoted dtype, as ``x + y`` would).
        p: drop probability in [0, 1).
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p={p} must be in [0, 1)")
    if x.shape != y.shape:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must have the same shape")
    if not training or p == 0.0:
        return x + y
    if resolve_backend(backend, x) != "triton":
        return x + torch.nn.functional.dropout(y, p, True)
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # CPU generator: no GPU sync
    return _DropoutAdd.apply(x, y, float(p), seed)
