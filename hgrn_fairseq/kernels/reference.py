"""Readable pure-PyTorch recurrences: the oracle for every kernel in this package.

Everything here loops over time in the dtype it is given (call it with float64 tensors to get an
exact reference), supports an initial state, returns the final state, and runs in either direction.
Autograd goes through the loop, so gradients of the reference are also a reference.

Layout conventions (shared with the Triton kernels):

* batch-first: sequences are ``[B, T, D]``; heads are ``[B, T, H, K]``.
* complex numbers are stored as a trailing dimension of size 2, ``(..., 0)`` the real part and
  ``(..., 1)`` the imaginary part (the memory layout of ``torch.view_as_real``). A complex
  ``[B, T, D]`` sequence is therefore a real ``[B, T, D, 2]`` tensor, whose ``[B, T, 2D]`` view
  interleaves the channels as ``Re c_0, Im c_0, Re c_1, Im c_1, ...``.
* ``reverse=True`` runs the recurrence from ``t = T-1`` down to ``0``; the initial state is then
  the state "to the right of" the last step and the final state is the one after step ``t = 0``.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _time_order(T: int, reverse: bool):
    return range(T - 1, -1, -1) if reverse else range(T)


def real_scan_reference(
    x: Tensor, a: Tensor, initial_state: Optional[Tensor] = None, reverse: bool = False
) -> Tuple[Tensor, Tensor]:
    """h_t = a_t * h_{t-1} + x_t.

    Args:
        x, a: ``[B, T, D]``, any floating dtype (the loop runs in that dtype).
        initial_state: ``[B, D]`` or None (zeros).
    Returns:
        ``(h, final_state)``: ``h`` is ``[B, T, D]``, ``final_state`` is ``[B, D]``.
    """
    B, T, D = x.shape
    h = x.new_zeros(B, D) if initial_state is None else initial_state.to(x.dtype)
    # unbind once: indexing x[:, t] in the loop makes autograd scatter into a full-size zero
    # tensor at every step of the backward pass.
    xs, as_ = x.unbind(1), a.unbind(1)
    out = [None] * T
    for t in _time_order(T, reverse):
        h = as_[t] * h + xs[t]
        out[t] = h
    return torch.stack(out, dim=1), h


def complex_scan_reference(
    x: Tensor,
    a: Tensor,
    theta: Tensor,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
) -> Tuple[Tensor, Tensor]:
    """h_t = a_t * exp(i * theta) * h_{t-1} + x_t, with real magnitude a_t and complex x_t, h_t.

    Args:
        x: ``[B, T, D, 2]`` (real, imaginary).
        a: ``[B, T, D]`` real decay.
        theta: ``[D]`` rotation angle per channel (constant over time).
        initial_state: ``[B, D, 2]`` or None.
    Returns:
        ``(h, final_state)``: ``h`` is ``[B, T, D, 2]``, ``final_state`` is ``[B, D, 2]``.
    """
    B, T, D, two = x.shape
    assert two == 2, "complex tensors carry a trailing dimension of size 2"
    cos, sin = torch.cos(theta).to(x.dtype), torch.sin(theta).to(x.dtype)
    if initial_state is None:
        hr = x.new_zeros(B, D)
        hi = x.new_zeros(B, D)
    else:
        hr, hi = initial_state[..., 0].to(x.dtype), initial_state[..., 1].to(x.dtype)
    xr, xi = x[..., 0].unbind(1), x[..., 1].unbind(1)
    as_ = a.unbind(1)
    out = [None] * T
    for t in _time_order(T, reverse):
        at = as_[t]
        hr, hi = at * (cos * hr - sin * hi) + xr[t], at * (sin * hr + cos * hi) + xi[t]
        out[t] = torch.stack([hr, hi], dim=-1)
    return torch.stack(out, dim=1), torch.stack([hr, hi], dim=-1)


def hgru_gates_reference(
    forget_logits: Tensor, inputs: Tensor, lower_bound: Union[float, Tensor, None] = None
) -> Tuple[Tensor, Tensor]:
    """The HGRU gates: lambda = gamma + (1 - gamma) * sigmoid(f); x = (1 - lambda) * SiLU(inputs).

    Args:
        forget_logits: ``[B, T, D]``.
        inputs: input pre-activations, ``[B, T, D]`` (real) or ``[B, T, D, 2]`` (complex).
        lower_bound: gamma, a float or a ``[D]`` tensor (or None for 0).
    Returns:
        ``(x, lam)``: the scan input (shape of ``inputs``) and the decay ``[B, T, D]``.
    """
    mu = torch.sigmoid(forget_logits)
    if lower_bound is None:
        lam = mu
    else:
        lam = lower_bound + (1 - lower_bound) * mu
    c = F.silu(inputs)
    scale = 1 - lam
    x = scale.unsqueeze(-1) * c if inputs.dim() == 4 else scale * c
    return x, lam


def hgru_reference(
    forget_logits: Tensor,
    inputs: Tensor,
    theta: Optional[Tensor] = None,
    lower_bound: Union[float, Tensor, None] = None,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Gates and scan of one HGRU direction (what the fused kernel computes).

    Real when ``inputs`` is ``[B, T, D]`` (``theta`` must be None), complex when it is
    ``[B, T, D, 2]`` (``theta`` is ``[D]``). Returns ``(h, final_state)`` like the scans.
    """
    x, lam = hgru_gates_reference(forget_logits, inputs, lower_bound)
    if inputs.dim() == 4:
        if theta is None:
            raise ValueError("complex HGRU inputs [B, T, D, 2] need theta of shape [D]")
        return complex_scan_reference(x, lam, theta, initial_state, reverse)
    if theta is not None:
        raise ValueError("real HGRU inputs [B, T, D] take no theta; pass theta=None")
    return real_scan_reference(x, lam, initial_state, reverse)


def hgrn2_scan_reference(
    q: Tensor,
    v: Tensor,
    log_decay: Tensor,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
) -> Tuple[Tensor, Tensor]:
    """The HGRN2 (state-expanded) recurrence, per head, with ``k = 1 - lambda`` and scale 1.

        lambda_t = exp(log_decay_t)                    (per key channel)
        S_t = Diag(lambda_t) S_{t-1} + (1 - lambda_t)^T v_t      (K x V outer product)
        o_t = q_t S_t

    Args:
        q, log_decay: ``[B, T, H, K]``; ``log_decay <= 0``.
        v: ``[B, T, H, V]``.
        initial_state: ``[B, H, K, V]`` or None.
    Returns:
        ``(o, final_state)``: ``o`` is ``[B, T, H, V]``, ``final_state`` ``[B, H, K, V]``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    if initial_state is None:
        S = q.new_zeros(B, H, K, V)
    else:
        S = initial_state.to(q.dtype)
    lam = torch.exp(log_decay).unsqueeze(-1).unbind(1)
    k = (-torch.expm1(log_decay)).unsqueeze(-1).unbind(1)  # 1 - lambda, no cancellation near 1
    vs, qs = v.unsqueeze(-2).unbind(1), q.unbind(1)
    out = [None] * T
    for t in _time_order(T, reverse):
        S = lam[t] * S + k[t] * vs[t]
        out[t] = torch.einsum("bhk,bhkv->bhv", qs[t], S)
    return torch.stack(out, dim=1), S


def hgrn2_log_decay_reference(forget_logits: Tensor, lower_bound: Union[float, Tensor, None] = None) -> Tensor:
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


def hgrn2_gates_reference(
    q_pre: Tensor, forget_logits: Tensor, lower_bound: Union[float, Tensor, None] = None, activation: str = "silu"
) -> Tuple[Tensor, Tensor]:
    """The HGRN2 gates: ``q = SiLU(q_pre)`` ("silu") or ``sigmoid(q_pre)`` ("sigmoid"), and
    ``log_decay = log(gamma + (1 - gamma) * sigmoid(f))`` computed in (at least) fp32 and returned in
    the input dtype. ``lower_bound``: a float or a ``[D]`` tensor (or None for 0)."""
    q = F.silu(q_pre) if activation == "silu" else torch.sigmoid(q_pre)
    if isinstance(lower_bound, Tensor):
        lower_bound = lower_bound.to(torch.promote_types(lower_bound.dtype, torch.float32))
    work = forget_logits.to(torch.promote_types(forget_logits.dtype, torch.float32))
    return q, hgrn2_log_decay_reference(work, lower_bound).to(q_pre.dtype)
