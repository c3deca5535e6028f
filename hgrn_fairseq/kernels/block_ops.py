"""The element-wise parts of a residual block, one Triton kernel each way.

* ``layer_norm(x, weight, bias, eps)``: LayerNorm whose output is already in the autocast dtype
  (what the next matrix product reads). Under bf16 autocast PyTorch runs LayerNorm in fp32, writes an
  fp32 output that the product then casts (one more pass), and its weight/bias gradient kernel is
  slow at narrow widths (a tenth of an hgrn1d_vit_tiny training step at width 192). Here: one kernel forward
  (statistics in fp32), one backward that also writes per-program partial sums of the weight and
  bias gradients, and one column sum of those.
* ``gated_act(ab, hidden, activation)``: ``act(a) * b`` for ``ab = [a | b]`` (the GLU's stacked
  in-projection, ``[..., 2 * width]`` with ``a, b`` its first ``hidden`` columns of each half).
  PyTorch: the activation and the product on strided halves forward, and about four kernels
  backward (two products, the activation's gradient, a copy of both halves into one tensor); here
  one each way, the backward writing the stacked gradient directly.
* ``scaled_residual(x, y, scale)``: ``x + y * scale[b]``, the residual add with stochastic depth.
* ``linear(x, weight, bias)``: ``F.linear`` whose backward sums the bias gradient with a matrix
  product (a row of ones times the output gradient) instead of PyTorch's column reduction, which
  is slow for narrow outputs.

The image models use these ops (``modules.block.use_block_ops``); the language models do not, since
they trained slower with them (docs/design.md). All fall back to their PyTorch definitions on the CPU, in float64, and inside ``torch.compile``
graphs (where the compiler fuses the same operations itself).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .dispatch import resolve_backend

Tensor = torch.Tensor

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

GATED_ACTIVATIONS = ("silu", "none")
_ROWS_PER_PROGRAM = 16
_BLOCK = 1024


def layer_norm_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def gated_act_reference(ab: Tensor, hidden: int, activation: str = "silu") -> Tensor:
    a, b = ab.chunk(2, dim=-1)
    a, b = a[..., :hidden], b[..., :hidden]
    return (F.silu(a) if activation == "silu" else a) * b


def _use_triton(backend: str, t: Tensor) -> bool:
    return (triton is not None and not torch.compiler.is_compiling() and t.dtype != torch.float64
            and resolve_backend(backend, t) == "triton")


def _autocast_dtype(t: Tensor) -> torch.dtype:
    kind = t.device.type
    if kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind) and t.dtype == torch.float32:
        return torch.get_autocast_dtype(kind)
    return t.dtype


if triton is not None:

    @triton.jit
    def _ln_fwd_kernel(X, W, B, Y, MEAN, RSTD, N, C, eps, HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        x = tl.load(X + row * C + cols, mask=cmask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / C
        diff = tl.where(cmask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / C + eps)
        y = diff * rstd * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(Y + row * C + cols, y.to(Y.dtype.element_ty), mask=cmask)
        tl.store(MEAN + row, mean)
        tl.store(RSTD + row, rstd)

    @triton.jit
    def _ln_bwd_kernel(X, W, DY, MEAN, RSTD, DX, PART, N, C,
                       ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK_C,), dtype=tl.float32)
        db = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for i in range(ROWS):
            row = pid.to(tl.int64) * ROWS + i
            if row < N:
                x = tl.load(X + row * C + cols, mask=cmask, other=0.0).to(tl.float32)
                dy = tl.load(DY + row * C + cols, mask=cmask, other=0.0).to(tl.float32)
                xhat = tl.where(cmask, (x - tl.load(MEAN + row)) * tl.load(RSTD + row), 0.0)
                dw += dy * xhat
                db += dy
                dxhat = tl.where(cmask, dy * w, 0.0)
                c1 = tl.sum(dxhat * xhat, axis=0) / C
                c2 = tl.sum(dxhat, axis=0) / C
                dx = (dxhat - xhat * c1 - c2) * tl.load(RSTD + row)
                tl.store(DX + row * C + cols, dx.to(DX.dtype.element_ty), mask=cmask)
        tl.store(PART + pid.to(tl.int64) * 2 * C + cols, dw, mask=cmask)  # [programs, 2, C]: dw, db
        tl.store(PART + pid.to(tl.int64) * 2 * C + C + cols, db, mask=cmask)

    @triton.jit
    def _gated_fwd_kernel(AB, Y, total, hidden, width2, SILU: tl.constexpr, BLOCK: tl.constexpr):
        idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < total
        row = idx // hidden
        col = idx - row * hidden
        a = tl.load(AB + row * width2 + col, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(AB + row * width2 + (width2 // 2) + col, mask=mask, other=0.0).to(tl.float32)
        if SILU:
            a = a / (1.0 + tl.exp(-a))
        tl.store(Y + idx, (a * b).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _gated_bwd_kernel(AB, DY, DAB, total, hidden, width2, SILU: tl.constexpr, BLOCK: tl.constexpr):
        idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < total
        row = idx // hidden
        col = idx - row * hidden
        off_a = row * width2 + col
        off_b = off_a + width2 // 2
        a = tl.load(AB + off_a, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(AB + off_b, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + idx, mask=mask, other=0.0).to(tl.float32)
        if SILU:
            s = 1.0 / (1.0 + tl.exp(-a))
            da = dy * b * s * (1.0 + a * (1.0 - s))
            db = dy * a * s
        else:
            da = dy * b
            db = dy * a
        tl.store(DAB + off_a, da.to(DAB.dtype.element_ty), mask=mask)
        tl.store(DAB + off_b, db.to(DAB.dtype.element_ty), mask=mask)


    @triton.jit
    def _scaled_add_kernel(X, Y, S, OUT, total, per_sample, BLOCK: tl.constexpr):
        """OUT = X + Y * S[sample]."""
        idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < total
        s = tl.load(S + idx // per_sample, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + idx, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + idx, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + idx, (x + y * s).to(OUT.dtype.element_ty), mask=mask)

    @triton.jit
    def _scale_kernel(G, S, OUT, total, per_sample, BLOCK: tl.constexpr):
        idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < total
        s = tl.load(S + idx // per_sample, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + idx, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + idx, (g * s).to(OUT.dtype.element_ty), mask=mask)


class _ScaledResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, scale):
        out_dtype = torch.promote_types(x.dtype, y.dtype)
        out = torch.empty(x.shape, device=x.device, dtype=out_dtype)
        total, per_sample = x.numel(), x.numel() // x.shape[0]
        _scaled_add_kernel[(triton.cdiv(total, _BLOCK),)](x, y, scale, out, total, per_sample, BLOCK=_BLOCK)
        ctx.save_for_backward(scale)
        ctx.x_dtype, ctx.y_dtype, ctx.per_sample = x.dtype, y.dtype, per_sample
        return out

    @staticmethod
    def backward(ctx, g):
        (scale,) = ctx.saved_tensors
        g = g.contiguous()
        dy = torch.empty(g.shape, device=g.device, dtype=ctx.y_dtype)
        total = g.numel()
        _scale_kernel[(triton.cdiv(total, _BLOCK),)](g, scale, dy, total, ctx.per_sample, BLOCK=_BLOCK)
        return g.to(ctx.x_dtype), dy, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, out_dtype):
        C = x.shape[-1]
        xr = x.reshape(-1, C)
        if not xr.is_contiguous():
            xr = xr.contiguous()
        N = xr.shape[0]
        y = torch.empty(x.shape, device=x.device, dtype=out_dtype)
        mean = torch.empty(N, device=x.device, dtype=torch.float32)
        rstd = torch.empty(N, device=x.device, dtype=torch.float32)
        block = triton.next_power_of_2(C)
        _ln_fwd_kernel[(N,)](xr, weight, bias if bias is not None else weight, y, mean, rstd, N, C, eps,
                             HAS_BIAS=bias is not None, BLOCK_C=block, num_warps=min(max(block // 256, 1), 8))
        ctx.save_for_backward(xr, weight, mean, rstd)
        ctx.has_bias, ctx.x_shape, ctx.x_dtype = bias is not None, x.shape, x.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        xr, weight, mean, rstd = ctx.saved_tensors
        N, C = xr.shape
        dy = dy.reshape(N, C)
        if not dy.is_contiguous():
            dy = dy.contiguous()
        dx = torch.empty((N, C), device=xr.device, dtype=ctx.x_dtype)
        programs = triton.cdiv(N, _ROWS_PER_PROGRAM)
        part = torch.empty((programs, 2, C), device=xr.device, dtype=torch.float32)
        block = triton.next_power_of_2(C)
        _ln_bwd_kernel[(programs,)](xr, weight, dy, mean, rstd, dx, part, N, C,
                                    ROWS=_ROWS_PER_PROGRAM, BLOCK_C=block, num_warps=min(max(block // 256, 1), 8))
        dw, db = part.sum(0).to(weight.dtype).unbind(0)  # one column sum for both
        return dx.view(ctx.x_shape), dw, (db if ctx.has_bias else None), None, None


class _GatedAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ab, hidden, silu):
        width2 = ab.shape[-1]
        rows = ab.numel() // width2
        y = torch.empty((*ab.shape[:-1], hidden), device=ab.device, dtype=ab.dtype)
        total = rows * hidden
        _gated_fwd_kernel[(triton.cdiv(total, _BLOCK),)](ab, y, total, hidden, width2, SILU=silu, BLOCK=_BLOCK)
        ctx.save_for_backward(ab)
        ctx.hidden, ctx.silu = hidden, silu
        return y

    @staticmethod
    def backward(ctx, dy):
        (ab,) = ctx.saved_tensors
        width2, hidden = ab.shape[-1], ctx.hidden
        dy = dy.contiguous()
        # columns past ``hidden`` in each half (the GLU's alignment padding) get zero gradient
        dab = torch.empty_like(ab) if 2 * hidden == width2 else torch.zeros_like(ab)
        total = dy.numel()
        _gated_bwd_kernel[(triton.cdiv(total, _BLOCK),)](ab, dy, dab, total, hidden, width2,
                                                          SILU=ctx.silu, BLOCK=_BLOCK)
        return dab, None, None


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        xc, wc = x.to(dtype), weight.to(dtype)  # what autocast would hand F.linear
        with torch.autocast(kind, enabled=False):
            y = F.linear(xc, wc, bias.to(dtype))
        ctx.save_for_backward(xc, wc)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        xc, wc = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        g = dy.reshape(-1, dy.shape[-1])
        if g.dtype != wc.dtype:
            g = g.to(wc.dtype)
        dx = (g @ wc).view(*dy.shape[:-1], wc.shape[1]) if ctx.needs_input_grad[0] else None
        dw = (g.t() @ xc.reshape(-1, xc.shape[-1])).to(w_dtype) if ctx.needs_input_grad[1] else None
        db = None
        if ctx.needs_input_grad[2]:
            ones = torch.ones((1, g.shape[0]), device=g.device, dtype=g.dtype)
            db = (ones @ g).view(-1).to(b_dtype)
        return (dx.to(x_dtype) if dx is not None else None), dw, db


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], backend: str = "auto") -> Tensor:
    """``F.linear(x, weight, bias)`` (autocast as usual); on the Triton path (CUDA, not inside
    ``torch.compile``) the bias gradient is one matrix product with a row of ones."""
    if bias is None or not _use_triton(backend, x) or x.numel() == 0:
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


def layer_norm(x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float = 1e-5, backend: str = "auto") -> Tensor:
    """LayerNorm over the last dimension with an affine ``weight`` (and ``bias`` or None).

    On the Triton path the output is in the autocast dtype when autocast is on and ``x`` is fp32
    (bf16 for the next product to read), else in ``x``'s dtype; statistics in fp32. Elsewhere
    ``F.layer_norm`` (fp32 output under autocast)."""
    C = x.shape[-1]
    if weight is None or tuple(weight.shape) != (C,) or (bias is not None and tuple(bias.shape) != (C,)):
        raise ValueError(f"layer_norm needs an affine weight of shape ({C},) (and a bias of that shape or None)")
    if not _use_triton(backend, x) or C > 16384 or x.numel() == 0:
        return layer_norm_reference(x, weight, bias, eps)
    return _LayerNorm.apply(x, weight, bias, float(eps), _autocast_dtype(x))


def scaled_residual(x: Tensor, y: Tensor, scale: Tensor, backend: str = "auto") -> Tensor:
    """``x + y * scale[b]`` for ``x, y: [B, ...]`` and a per-sample ``scale: [B]`` (stochastic depth's
    kept/dropped mask divided by the keep probability), one kernel each way on the Triton path (PyTorch
    broadcasts the ``[B, 1, ...]`` factor through its slower non-vectorised kernel)."""
    if x.shape != y.shape or scale.shape != (x.shape[0],):
        raise ValueError(f"scaled_residual: x {tuple(x.shape)}, y {tuple(y.shape)} and scale "
                         f"{tuple(scale.shape)} must be [B, ...], [B, ...] and [B]")
    if (not _use_triton(backend, y) or not (x.is_contiguous() and y.is_contiguous() and scale.is_contiguous())
            or x.numel() == 0):
        return x + y * scale.reshape((-1,) + (1,) * (y.dim() - 1))
    return _ScaledResidual.apply(x, y, scale)


def gated_act(ab: Tensor, hidden: int, activation: str = "silu", backend: str = "auto") -> Tensor:
    """``act(a) * b`` with ``a, b = ab.chunk(2, -1)`` cut to their first ``hidden`` columns;
    ``activation`` is ``'silu'`` or ``'none'``. ``[..., 2 * width] -> [..., hidden]``, in ``ab``'s dtype."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {GATED_ACTIVATIONS}")
    if ab.shape[-1] % 2 or not 0 < hidden <= ab.shape[-1] // 2:
        raise ValueError(f"ab has {ab.shape[-1]} columns: need an even number, at least 2 * hidden ({hidden})")
    if not _use_triton(backend, ab) or not ab.is_contiguous() or ab.numel() == 0:
        return gated_act_reference(ab, hidden, activation)
    return _GatedAct.apply(ab, hidden, activation == "silu")
