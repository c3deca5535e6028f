"""The HGRN2 gates in one elementwise kernel each way: the query activation and the log-decay.

    q = SiLU(q_pre)  (LM variant)  or  sigmoid(q_pre)  (LRA / MQAR variant)
    log_decay = log(gamma + (1 - gamma) * sigmoid(f))       (gamma: the layer's lower bound)

In PyTorch these are about 15 elementwise kernels forward and 25 backward per layer (fp32 casts, the
branches that keep log(lambda) accurate near 1 and finite near 0, ``where`` masks); under a 6-layer
LM that is ~200 launches of a ~1000-launch training step, which is bound by launch overhead at the
WikiText-103 shapes. Here: one kernel forward, one backward (plus a column sum for the lower bound's
gradient), fp32 math, outputs in the input dtype.

``hgrn2_in_gates`` takes the whole in-projection ``[v_pre, q_pre, f]`` instead and also applies v's
activation (SiLU or none) in the same kernel; its backward writes the in-projection's gradient as one
tensor, so autograd does not join three slices' gradients with one more copy (the image models, with
``block_ops``).

Numerics (the same as ``hgrn2_log_decay_reference``): with no bound, ``logsigmoid(f)``; with a bound,
``log1p(-(1 - gamma) * sigmoid(-f))`` where lambda > 1/2 (no cancellation near 1) and
``log(max(lambda, tiny))`` elsewhere; the gradient is zero where lambda underflows.
"""
from __future__ import annotations

import os
from typing import Tuple, Union

import torch
import torch.nn.functional as F

from . import reference
from .dispatch import as_rows, eager, resolve_backend

Tensor = torch.Tensor
ACTIVATIONS = ("silu", "sigmoid")
V_ACTIVATIONS = ("none", "silu")

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference path needs no Triton
    triton = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_BLOCK_N = 32
_BLOCK_D = 128 if not _INTERPRET else 32


if triton is not None:
    from .hgru_triton import _sigmoid

    @triton.jit
    def _hgrn2_gates_fwd_kernel(
        QP, stride_qp, F_, stride_f, GAMMA, Q, G, VP, stride_vp, V, N, D,
        HAS_GAMMA: tl.constexpr, ACT: tl.constexpr, HAS_V: tl.constexpr, V_SILU: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        """HAS_V: also v = SiLU(v_pre) (V_SILU) or v_pre, written contiguous to V."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < N) & (cols[None, :] < D)
        z = tl.load(QP + rows[:, None] * stride_qp + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        f = tl.load(F_ + rows[:, None] * stride_f + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if ACT == 0:
            q = z * _sigmoid(z)
        else:
            q = _sigmoid(z)
        if HAS_GAMMA:
            gamma = tl.load(GAMMA + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
            lam = gamma + (1.0 - gamma) * _sigmoid(f)
            near_one = lam > 0.5
            one_minus = tl.where(near_one, (1.0 - gamma) * _sigmoid(-f), 0.0)
            # log1p(-u) to a few ulps (Goldberg's trick: w = 1 - u rounded, log(w) * (-u) / (w - 1))
            w = 1.0 - one_minus
            log_near = tl.where(w == 1.0, -one_minus, tl.log(w) * (-one_minus) / tl.where(w == 1.0, -1.0, w - 1.0))
            log_far = tl.log(tl.maximum(tl.where(near_one, 1.0, lam), 1.1754943508222875e-38))
            g = tl.where(near_one, log_near, log_far)
        else:
            # logsigmoid(f) = min(f, 0) - log(1 + exp(-|f|))
            g = tl.minimum(f, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(f)))
        out = rows[:, None] * D + cols[None, :]
        tl.store(Q + out, q.to(Q.dtype.element_ty), mask=mask)
        tl.store(G + out, g.to(G.dtype.element_ty), mask=mask)
        if HAS_V:
            u = tl.load(VP + rows[:, None] * stride_vp + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if V_SILU:
                u = u * _sigmoid(u)
            tl.store(V + out, u.to(V.dtype.element_ty), mask=mask)

    @triton.jit
    def _hgrn2_gates_bwd_kernel(
        QP, stride_qp, F_, stride_f, GAMMA, DQ, DG, DQP, DF, DGAMMA_PART, VP, stride_vp, DV, DVP, stride_dp, N, D,
        HAS_GAMMA: tl.constexpr, NEED_DGAMMA: tl.constexpr, ACT: tl.constexpr, HAS_V: tl.constexpr,
        V_SILU: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        """NEED_DGAMMA: write the lower bound's gradient, per program's rows, to DGAMMA_PART. DQP, DF (and
        DVP with HAS_V) have row stride stride_dp: slices of one [N, 3D] gradient of the in-projection."""
        pid_n = tl.program_id(0)
        rows = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < N) & (cols[None, :] < D)
        out = rows[:, None] * D + cols[None, :]
        dout = rows[:, None] * stride_dp + cols[None, :]
        z = tl.load(QP + rows[:, None] * stride_qp + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        f = tl.load(F_ + rows[:, None] * stride_f + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dq = tl.load(DQ + out, mask=mask, other=0.0).to(tl.float32)
        dg = tl.load(DG + out, mask=mask, other=0.0).to(tl.float32)
        sz = _sigmoid(z)
        if ACT == 0:
            dz = dq * sz * (1.0 + z * (1.0 - sz))
        else:
            dz = dq * sz * (1.0 - sz)
        s_neg = _sigmoid(-f)
        if HAS_GAMMA:
            gamma = tl.load(GAMMA + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
            s_pos = _sigmoid(f)
            lam = gamma + (1.0 - gamma) * s_pos
            alive = lam >= 1.1754943508222875e-38
            inv = tl.where(alive, 1.0 / tl.where(alive, lam, 1.0), 0.0)
            df = dg * (1.0 - gamma) * s_pos * s_neg * inv
            if NEED_DGAMMA:
                dgamma = tl.sum(tl.where(mask, dg * s_neg * inv, 0.0), axis=0)
                tl.store(DGAMMA_PART + pid_n.to(tl.int64) * D + cols, dgamma, mask=cols < D)
        else:
            df = dg * s_neg
        tl.store(DQP + dout, dz.to(DQP.dtype.element_ty), mask=mask)
        tl.store(DF + dout, df.to(DF.dtype.element_ty), mask=mask)
        if HAS_V:
            dv = tl.load(DV + out, mask=mask, other=0.0).to(tl.float32)
            if V_SILU:
                u = tl.load(VP + rows[:, None] * stride_vp + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                su = _sigmoid(u)
                dv = dv * su * (1.0 + u * (1.0 - su))
            tl.store(DVP + dout, dv.to(DVP.dtype.element_ty), mask=mask)


def _grid(N: int, D: int) -> Tuple[int, int]:
    return triton.cdiv(N, _BLOCK_N), triton.cdiv(D, _BLOCK_D)


def _grad_or_zeros(t, shape, like: Tensor) -> Tensor:
    """An output's incoming gradient as the kernels read it: contiguous, zeros where autograd passed None."""
    return torch.zeros(shape, device=like.device, dtype=like.dtype) if t is None else t.contiguous()


class _Hgrn2Gates(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_pre, forget_logits, gamma, activation):
        shape = q_pre.shape
        zp, stride_qp = as_rows(q_pre)
        fp, stride_f = as_rows(forget_logits)
        N, D = zp.shape
        q = torch.empty(shape, device=q_pre.device, dtype=q_pre.dtype)
        g = torch.empty(shape, device=q_pre.device, dtype=q_pre.dtype)
        has_gamma = gamma is not None
        _hgrn2_gates_fwd_kernel[_grid(N, D)](
            zp, stride_qp, fp, stride_f, gamma if has_gamma else zp, q, g, zp, stride_qp, q, N, D,
            HAS_GAMMA=has_gamma, ACT=ACTIVATIONS.index(activation), HAS_V=False, V_SILU=False,
            BLOCK_N=_BLOCK_N, BLOCK_D=_BLOCK_D,
        )
        ctx.save_for_backward(q_pre, forget_logits, gamma)
        ctx.activation = activation
        return q, g

    @staticmethod
    def backward(ctx, dq, dg):
        q_pre, forget_logits, gamma = ctx.saved_tensors
        shape = q_pre.shape
        zp, stride_qp = as_rows(q_pre)
        fp, stride_f = as_rows(forget_logits)
        N, D = zp.shape
        dq, dg = _grad_or_zeros(dq, shape, zp), _grad_or_zeros(dg, shape, zp)
        dqp = torch.empty(shape, device=zp.device, dtype=q_pre.dtype)
        df = torch.empty(shape, device=zp.device, dtype=forget_logits.dtype)
        has_gamma = gamma is not None
        # (a bound that needs no gradient, e.g. the zeros of LayerLowerBounds(enabled=False), gets none)
        need_dgamma = has_gamma and ctx.needs_input_grad[2]
        grid = _grid(N, D)
        part = torch.empty((grid[0], D), device=zp.device, dtype=torch.float32) if need_dgamma else None
        _hgrn2_gates_bwd_kernel[grid](
            zp, stride_qp, fp, stride_f, gamma if has_gamma else zp, dq, dg, dqp, df,
            part if need_dgamma else zp, zp, stride_qp, dq, dqp, D, N, D,
            HAS_GAMMA=has_gamma, NEED_DGAMMA=need_dgamma, ACT=ACTIVATIONS.index(ctx.activation),
            HAS_V=False, V_SILU=False, BLOCK_N=_BLOCK_N, BLOCK_D=_BLOCK_D,
        )
        dgamma = part.sum(0).to(gamma.dtype) if need_dgamma else None
        return dqp, df, dgamma, None


@eager
def hgrn2_gates(
    q_pre: Tensor,
    forget_logits: Tensor,
    lower_bound: Union[float, Tensor, None] = None,
    activation: str = "silu",
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """``(q, log_decay)`` of HGRN2 from the pre-activations; see the module docstring.

    Args:
        q_pre, forget_logits: ``[..., D]``, same shape and dtype (bf16 / fp16 / fp32 / fp64 on the
            reference path); any strides with unit channel stride are read in place (e.g. slices
            of one in-projection).
        lower_bound: gamma, a float, a ``[D]`` tensor in [0, 1), or None (0).
        activation: ``"silu"`` (LM variant) or ``"sigmoid"`` (LRA / MQAR variant) for q.
    Returns:
        ``q`` and ``log_decay`` (``<= 0``), both ``[..., D]`` in the input dtype.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {ACTIVATIONS}")
    if q_pre.shape != forget_logits.shape:
        raise ValueError(
            f"q_pre {tuple(q_pre.shape)} and forget_logits {tuple(forget_logits.shape)} must have the same shape"
        )
    D = q_pre.shape[-1]
    if isinstance(lower_bound, Tensor) and tuple(lower_bound.shape) != (D,):
        raise ValueError(f"lower_bound has shape {tuple(lower_bound.shape)}, expected ({D},)")
    use_triton = resolve_backend(backend, q_pre) == "triton" and q_pre.dtype != torch.float64
    if not use_triton:
        return reference.hgrn2_gates_reference(q_pre, forget_logits, lower_bound, activation)
    return _Hgrn2Gates.apply(q_pre, forget_logits, _kernel_gamma(lower_bound, D, q_pre.device), activation)


def _kernel_gamma(lower_bound, D: int, device) -> Union[Tensor, None]:
    """The lower bound as the kernels take it: None for 0, else a contiguous fp32 ``[D]`` tensor."""
    gamma = lower_bound
    if gamma is not None and not isinstance(gamma, Tensor):
        if float(gamma) == 0.0:
            return None
        gamma = torch.full((D,), float(gamma), device=device, dtype=torch.float32)
    if gamma is not None and (gamma.dtype != torch.float32 or not gamma.is_contiguous()):
        gamma = gamma.float().contiguous()
    return gamma


class _Hgrn2InGates(torch.autograd.Function):
    """v, q and log-decay from the whole in-projection ``[..., 3D]`` (v_pre, q_pre, f in that order): one
    kernel each way, the gradient written as one ``[..., 3D]`` tensor (no split / cat of three)."""

    @staticmethod
    def forward(ctx, proj, gamma, activation, v_silu):
        D = proj.shape[-1] // 3
        rows, stride = as_rows(proj)
        N = rows.shape[0]
        shape = (*proj.shape[:-1], D)
        v, q, g = (torch.empty(shape, device=proj.device, dtype=proj.dtype) for _ in range(3))
        has_gamma = gamma is not None
        _hgrn2_gates_fwd_kernel[_grid(N, D)](
            rows[:, D:2 * D], stride, rows[:, 2 * D:], stride, gamma if has_gamma else rows, q, g,
            rows[:, :D], stride, v, N, D,
            HAS_GAMMA=has_gamma, ACT=ACTIVATIONS.index(activation), HAS_V=True, V_SILU=v_silu,
            BLOCK_N=_BLOCK_N, BLOCK_D=_BLOCK_D,
        )
        ctx.save_for_backward(rows, gamma)  # (a view of proj unless as_rows had to copy it)
        ctx.proj_shape, ctx.stride, ctx.activation, ctx.v_silu = proj.shape, stride, activation, v_silu
        return v, q, g

    @staticmethod
    def backward(ctx, dv, dq, dg):
        rows, gamma = ctx.saved_tensors
        N, D, stride = rows.shape[0], rows.shape[1] // 3, ctx.stride
        shape = (*ctx.proj_shape[:-1], D)
        dv, dq, dg = (_grad_or_zeros(t, shape, rows) for t in (dv, dq, dg))
        dproj = torch.empty((N, 3 * D), device=rows.device, dtype=rows.dtype)
        has_gamma = gamma is not None
        need_dgamma = has_gamma and ctx.needs_input_grad[1]
        grid = _grid(N, D)
        part = torch.empty((grid[0], D), device=rows.device, dtype=torch.float32) if need_dgamma else None
        _hgrn2_gates_bwd_kernel[grid](
            rows[:, D:2 * D], stride, rows[:, 2 * D:], stride, gamma if has_gamma else rows, dq, dg,
            dproj[:, D:2 * D], dproj[:, 2 * D:], part if need_dgamma else dproj,
            rows[:, :D], stride, dv, dproj[:, :D], 3 * D, N, D,
            HAS_GAMMA=has_gamma, NEED_DGAMMA=need_dgamma, ACT=ACTIVATIONS.index(ctx.activation),
            HAS_V=True, V_SILU=ctx.v_silu, BLOCK_N=_BLOCK_N, BLOCK_D=_BLOCK_D,
        )
        dgamma = part.sum(0).to(gamma.dtype) if need_dgamma else None
        return dproj.view(ctx.proj_shape), dgamma, None, None


@eager
def hgrn2_in_gates(
    proj: Tensor,
    lower_bound: Union[float, Tensor, None] = None,
    activation: str = "silu",
    v_activation: str = "none",
    backend: str = "auto",
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(v, q, log_decay)`` of HGRN2 from the whole in-projection ``proj = [v_pre, q_pre, f]``
    (``[..., 3D]``): ``v = SiLU(v_pre)`` (``v_activation="silu"``) or ``v_pre`` (``"none"``), ``q`` and
    ``log_decay`` as in ``hgrn2_gates``. All three are contiguous ``[..., D]`` in ``proj``'s dtype. On
    the Triton path one kernel each way, and ``proj``'s gradient is written whole (autograd would
    otherwise join the three slices' gradients with one more copy)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {ACTIVATIONS}")
    if v_activation not in V_ACTIVATIONS:
        raise ValueError(f"v_activation={v_activation!r} is not one of {V_ACTIVATIONS}")
    if proj.shape[-1] % 3:
        raise ValueError(f"proj has {proj.shape[-1]} channels: need 3 * D (v_pre, q_pre, forget logits)")
    D = proj.shape[-1] // 3
    if isinstance(lower_bound, Tensor) and tuple(lower_bound.shape) != (D,):
        raise ValueError(f"lower_bound has shape {tuple(lower_bound.shape)}, expected ({D},)")
    use_triton = (resolve_backend(backend, proj) == "triton" and proj.dtype != torch.float64
                  and proj.numel() > 0)
    if not use_triton:
        v, q_pre, f = proj.chunk(3, dim=-1)
        q, g = reference.hgrn2_gates_reference(q_pre, f, lower_bound, activation)
        return (F.silu(v) if v_activation == "silu" else v), q, g
    return _Hgrn2InGates.apply(proj, _kernel_gamma(lower_bound, D, proj.device), activation,
                               v_activation == "silu")
