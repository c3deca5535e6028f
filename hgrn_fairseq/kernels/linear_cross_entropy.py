"""Fused output projection + cross entropy that never materialises fp32 logits.

``linear_cross_entropy(hidden [N, d], weight [V, d], target [N])`` is the fp32 loss
``sum_i -log softmax(hidden_i @ weight.T)[target_i]`` over the rows whose target is not
``ignore_index`` (``reduction="sum"``), or the per-row losses ``[N]`` with 0 at ignored rows
(``reduction="none"``). It is what fairseq's ``cross_entropy`` criterion computes from the logits of
a tied output projection, without the ``[N, V]`` fp32 copies (``.float()``, log-softmax, its
gradient), which at 8192 tokens x vocab 50264 are 1.65 GB each.

How (one chunk of at most ``chunk_rows`` rows at a time; default: one chunk of logits <= 512 MiB):

1. ``logits_c = hidden_c @ weight.T`` in the compute dtype: the autocast dtype under
   ``torch.autocast`` (hidden and weight are cast to it once), the inputs' dtype otherwise.
2. One row kernel reads each row of ``logits_c``, computes max and sum-exp online in fp32 over
   blocks of the vocabulary, writes the row's loss ``lse - logit[target]`` and overwrites the row
   with ``d loss / d logits = softmax - onehot(target)`` (zeros for ignored rows) in the compute
   dtype. Triton on CUDA (and on CPU under ``TRITON_INTERPRET=1``), torch ops on the reference path.
3. ``grad_hidden_c = g_c @ weight`` and ``grad_weight += g_c.T @ hidden_c``, both accumulated in
   fp32 (``torch.mm/addmm(..., out_dtype=torch.float32)`` for bf16/fp16 on CUDA).

With ``reduction="sum"`` all of this happens in the forward (when a gradient is needed at all) and
the backward only scales the saved fp32 gradients by the incoming scalar. With ``reduction="none"``
the forward computes the losses only and the backward recomputes each chunk, with the row kernel
scaling row ``i`` of the gradient by ``grad_output[i]``. Gradients come back in the dtypes of
``hidden`` and ``weight``.

Targets outside ``[0, V)`` that are not ``ignore_index`` raise on CPU tensors and on the reference
path; on CUDA the Triton path does not check them (that would synchronise) and gives a NaN loss for
such rows.

``backend``: ``"auto"`` (Triton for CUDA tensors, the reference otherwise), ``"triton"`` or
``"reference"``, as in ``dispatch.resolve_backend``.

(``hgrn_fairseq.kernels.linear_cross_entropy`` is the function, re-exported by the package; this module
itself is ``importlib.import_module("hgrn_fairseq.kernels.linear_cross_entropy")``.)
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import torch

from .dispatch import resolve_backend

Tensor = torch.Tensor
REDUCTIONS = ("sum", "none")
# one chunk of logits in the compute dtype: bounds the extra memory of the loss
CHUNK_BYTES = 512 * 2**20
# vocabulary columns per block of the row kernel (smaller blocks for the last one are masked)
MAX_BLOCK_V = 8192
NUM_WARPS = 8


# ================================================================================================
# Row kernel: loss of each row, and its gradient over the logits written in place
# ================================================================================================
@functools.lru_cache(maxsize=None)
def _row_kernel():
    # built on first use: importing the package needs no Triton, and TRITON_INTERPRET is read then
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_grad_rows_kernel(
        logits_ptr,  # [n, V] compute dtype, overwritten with the gradient when WRITE_GRAD
        target_ptr,  # [n] int64
        loss_ptr,  # [n] fp32 out
        scale_ptr,  # [n] fp32 gradient scale of each row (read when HAS_SCALE)
        V,
        stride_row,
        ignore_index,
        BLOCK_V: tl.constexpr,
        WRITE_GRAD: tl.constexpr,
        HAS_SCALE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * stride_row
        target = tl.load(target_ptr + row)
        cols = tl.arange(0, BLOCK_V)

        m = float("-inf")
        s = 0.0
        for start in range(0, V, BLOCK_V):
            c = start + cols
            x = tl.load(row_ptr + c, mask=c < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(s)

        ignored = target == ignore_index
        valid = (target >= 0) & (target < V)
        x_target = tl.load(row_ptr + tl.where(valid, target, 0)).to(tl.float32)
        loss = tl.where(valid, lse - x_target, float("nan"))  # out of range: NaN, not a wild read
        tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))

        if WRITE_GRAD:
            if HAS_SCALE:
                scale = tl.load(scale_ptr + row).to(tl.float32)
            else:
                scale = 1.0
            scale = tl.where(ignored, 0.0, scale)
            for start in range(0, V, BLOCK_V):
                c = start + cols
                x = tl.load(row_ptr + c, mask=c < V, other=0.0).to(tl.float32)
                g = tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0)
                tl.store(row_ptr + c, (g * scale).to(logits_ptr.dtype.element_ty), mask=c < V)

    return softmax_grad_rows_kernel


def _block_v(vocab: int) -> int:
    return min(MAX_BLOCK_V, 1 << max(vocab - 1, 0).bit_length())


def softmax_grad_rows_triton(
    logits: Tensor, target: Tensor, ignore_index: int, row_scale: Optional[Tensor], write_grad: bool
) -> Tensor:
    """Per-row loss ``[n]`` (fp32) of ``logits [n, V]``; with ``write_grad`` the logits are overwritten
    with ``(softmax - onehot(target)) * row_scale`` (zero rows where ``target == ignore_index``)."""
    n, vocab = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return loss
    scale = loss if row_scale is None else row_scale
    _row_kernel()[(n,)](
        logits, target, loss, scale, vocab, logits.stride(0), ignore_index,
        BLOCK_V=_block_v(vocab), WRITE_GRAD=write_grad, HAS_SCALE=row_scale is not None, num_warps=NUM_WARPS,
    )
    return loss


def softmax_grad_rows_reference(
    logits: Tensor, target: Tensor, ignore_index: int, row_scale: Optional[Tensor], write_grad: bool
) -> Tensor:
    """``softmax_grad_rows_triton`` in torch ops (fp32 copies of the chunk: for tests and CPU)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    ignored = target == ignore_index
    safe_target = target.masked_fill(ignored, 0)
    loss = (lse - x.gather(1, safe_target[:, None]).squeeze(1)).masked_fill(ignored, 0.0)
    if write_grad:
        grad = torch.softmax(x, dim=-1)
        grad[torch.arange(len(target), device=grad.device), safe_target] -= 1.0
        scale = torch.ones_like(lse) if row_scale is None else row_scale.float()
        logits.copy_(grad * scale.masked_fill(ignored, 0.0)[:, None])
    return loss


# ================================================================================================
# Matrix products with fp32 results
# ================================================================================================
@functools.lru_cache(maxsize=None)
def _has_out_dtype(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm/addmm(..., out_dtype=torch.float32)`` run for ``dtype`` on this device
    (CUDA, bf16/fp16, torch >= 2.8)."""
    if device_type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    try:
        a = torch.zeros(1, 1, dtype=dtype, device=device_type)
        acc = torch.zeros(1, 1, dtype=torch.float32, device=device_type)
        torch.mm(a, a, out_dtype=torch.float32)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError, NotImplementedError):
        return False
    return True


def _mm_fp32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` accumulated and returned in fp32."""
    if a.dtype == torch.float32:
        return a @ b
    if _has_out_dtype(a.device.type, a.dtype):
        return torch.mm(a, b, out_dtype=torch.float32)
    if a.device.type == "cpu":  # what out_dtype computes: exact products of the rounded inputs
        return a.float() @ b.float()
    return (a @ b).float()  # older torch on a GPU: the result rounds to the compute dtype once


def _addmm_fp32_(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """``acc += a @ b`` with ``acc`` fp32."""
    if a.dtype != torch.float32 and _has_out_dtype(a.device.type, a.dtype):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc += _mm_fp32(a, b)


# ================================================================================================
# The chunked pass and the autograd Function
# ================================================================================================
def default_chunk_rows(rows: int, vocab: int, dtype: torch.dtype) -> int:
    """Rows per chunk so that one chunk of logits ``[rows, vocab]`` in ``dtype`` is at most
    ``CHUNK_BYTES``, with the rows spread evenly over the chunks (8192 x 50264 bf16: 2 x 4096)."""
    max_rows = max(1, CHUNK_BYTES // max(1, vocab * torch.empty((), dtype=dtype).element_size()))
    chunks = max(1, math.ceil(rows / max_rows))
    return max(1, math.ceil(rows / chunks))


def _chunked_pass(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    ignore_index: int,
    chunk_rows: int,
    backend: str,
    row_scale: Optional[Tensor],
    need_grad_hidden: bool,
    need_grad_weight: bool,
) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """Per-row losses ``[N]`` and the fp32 gradients of ``sum_i row_scale_i * loss_i`` (None where not
    needed). ``hidden [N, d]`` and ``weight [V, d]`` are already in the compute dtype."""
    rows, vocab = hidden.shape[0], weight.shape[0]
    device = hidden.device
    row_op = softmax_grad_rows_triton if backend == "triton" else softmax_grad_rows_reference
    write_grad = need_grad_hidden or need_grad_weight
    loss = torch.empty(rows, dtype=torch.float32, device=device)
    grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=device) if need_grad_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=device) if need_grad_weight else None
    # one buffer for the logits of every chunk (a fresh one per chunk would briefly hold two)
    buffer = torch.empty(min(chunk_rows, rows), vocab, dtype=hidden.dtype, device=device)
    for start in range(0, rows, chunk_rows):
        end = min(start + chunk_rows, rows)
        h = hidden[start:end]
        logits = torch.mm(h, weight.t(), out=buffer[: end - start])
        scale = None if row_scale is None else row_scale[start:end]
        loss[start:end] = row_op(logits, target[start:end], ignore_index, scale, write_grad)
        if need_grad_hidden:
            grad_hidden[start:end] = _mm_fp32(logits, weight)
        if need_grad_weight:
            _addmm_fp32_(grad_weight, logits.t(), h)
    return loss, grad_hidden, grad_weight


class LinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, ignore_index, reduction, chunk_rows, backend, compute_dtype,
                need_grad_hidden, need_grad_weight):
        ctx.settings = (ignore_index, chunk_rows, backend, compute_dtype)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.reduction = reduction
        ctx.need = (need_grad_hidden, need_grad_weight)
        eager = reduction == "sum"  # gradients now; "none" recomputes them in backward
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            loss, grad_hidden, grad_weight = _chunked_pass(
                hidden.to(compute_dtype), weight.to(compute_dtype), target, ignore_index, chunk_rows, backend,
                None, need_grad_hidden and eager, need_grad_weight and eager,
            )
        if eager:
            ctx.grads = (grad_hidden, grad_weight)
            return loss.sum()
        ctx.save_for_backward(hidden, weight, target)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden_dtype, weight_dtype = ctx.dtypes
        if ctx.reduction == "sum":
            grad_hidden, grad_weight = ctx.grads
            grad_loss = grad_loss.float()
            grad_hidden = None if grad_hidden is None else (grad_hidden * grad_loss).to(hidden_dtype)
            grad_weight = None if grad_weight is None else (grad_weight * grad_loss).to(weight_dtype)
        else:
            hidden, weight, target = ctx.saved_tensors
            ignore_index, chunk_rows, backend, compute_dtype = ctx.settings
            need_grad_hidden, need_grad_weight = ctx.need
            with torch.autocast(device_type=hidden.device.type, enabled=False):
                _, grad_hidden, grad_weight = _chunked_pass(
                    hidden.to(compute_dtype), weight.to(compute_dtype), target, ignore_index, chunk_rows, backend,
                    grad_loss.float().contiguous(), need_grad_hidden, need_grad_weight,
                )
            grad_hidden = None if grad_hidden is None else grad_hidden.to(hidden_dtype)
            grad_weight = None if grad_weight is None else grad_weight.to(weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None, None


# ================================================================================================
# Public entry point
# ================================================================================================
def _check_inputs(hidden: Tensor, weight: Tensor, target: Tensor, reduction: str, chunk_rows) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not one of {REDUCTIONS}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, d], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [V, d], got shape {tuple(weight.shape)}")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [N, d] and weight [V, d] disagree on d: hidden {tuple(hidden.shape)}, "
            f"weight {tuple(weight.shape)}"
        )
    if target.shape != hidden.shape[:1]:
        raise ValueError(f"target must be [N] = [{hidden.shape[0]}] like hidden's rows, got shape {tuple(target.shape)}")
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        raise TypeError(f"target must hold integer class indices (int64), got dtype {target.dtype}")
    if not hidden.dtype.is_floating_point or not weight.dtype.is_floating_point:
        raise TypeError(f"hidden and weight must be floating point, got {hidden.dtype} and {weight.dtype}")
    if hidden.device != weight.device or hidden.device != target.device:
        raise ValueError(
            f"hidden, weight and target must be on one device, got {hidden.device}, {weight.device}, {target.device}"
        )
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"chunk_rows must be a positive int or None, got {chunk_rows!r}")


def _check_target_range(target: Tensor, vocab: int, ignore_index: int) -> None:
    bad = ((target < 0) | (target >= vocab)) & (target != ignore_index)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"target[{i}] = {int(target[i])} is outside [0, {vocab}) (V = weight.shape[0]) and is not "
            f"ignore_index = {ignore_index}"
        )


def compute_dtype_of(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The autocast dtype under ``torch.autocast`` for hidden's device, else the inputs' dtype."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    if hidden.dtype != weight.dtype:
        raise TypeError(
            f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have one dtype outside torch.autocast"
        )
    return hidden.dtype


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    reduction: str = "sum",
    chunk_rows: Optional[int] = None,
    backend: str = "auto",
) -> Tensor:
    """Cross entropy of ``softmax(hidden @ weight.T)`` against ``target``, without fp32 logits.

    Args:
        hidden: ``[N, d]`` features (any float dtype).
        weight: ``[V, d]`` output projection (no bias), e.g. the tied embedding.
        target: ``[N]`` integer class indices in ``[0, V)``, or ``ignore_index``.
        ignore_index: rows with this target add 0 to the loss and get zero gradients.
        reduction: ``"sum"`` (a scalar) or ``"none"`` (``[N]``, 0 at ignored rows).
        chunk_rows: rows per chunk (default: logits chunk <= 512 MiB in the compute dtype).
        backend: ``"auto"``, ``"triton"`` or ``"reference"``.

    Returns:
        The fp32 loss (natural log). Gradients flow to ``hidden`` and ``weight`` in their dtypes.
    """
    _check_inputs(hidden, weight, target, reduction, chunk_rows)
    resolved = resolve_backend(backend, hidden)
    ignore_index = int(ignore_index)
    vocab = weight.shape[0]
    target = target.long().contiguous()
    if resolved == "reference" or not target.is_cuda:
        _check_target_range(target, vocab, ignore_index)
    compute_dtype = compute_dtype_of(hidden, weight)
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(hidden.shape[0], vocab, compute_dtype)
    grad_enabled = torch.is_grad_enabled()
    return LinearCrossEntropyFunction.apply(
        hidden, weight, target, ignore_index, reduction, chunk_rows, resolved, compute_dtype,
        grad_enabled and hidden.requires_grad, grad_enabled and weight.requires_grad,
    )
