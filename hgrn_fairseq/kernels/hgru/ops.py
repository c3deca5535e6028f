"""The public HGRU ops, ``real_scan``, ``complex_scan`` and ``hgru_fused``: argument checks (one-line
errors naming the argument), then ``autograd._HGRUScanFunction``.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple, Union

import torch

from .autograd import _HGRUScanFunction
from .scan_math import INTERPRETED

Tensor = torch.Tensor
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _describe(t: Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def _check_tensor(name: str, t, expected_shape, expect: str, ref: Optional[Tensor] = None,
                  dtypes=_SUPPORTED_DTYPES) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {expect}, got {type(t).__name__}")
    if tuple(t.shape) != tuple(expected_shape):
        raise ValueError(f"{name} has {_describe(t)}; expected shape {expect} = {tuple(expected_shape)}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(
            f"{name} has dtype {t.dtype}; expected one of {names} (use reference.py for float64)")
    if ref is not None and t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {ref.device}")


def _check_sequence(name: str, t, complex_: bool) -> Tuple[int, int, int]:
    expect = "[B, T, D, 2]" if complex_ else "[B, T, D]"
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {expect}, got {type(t).__name__}")
    ok = t.dim() == (4 if complex_ else 3) and (not complex_ or t.shape[-1] == 2)
    if not ok:
        raise ValueError(f"{name} has {_describe(t)}; expected shape {expect}")
    if t.dtype not in _SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in _SUPPORTED_DTYPES)
        raise ValueError(
            f"{name} has dtype {t.dtype}; expected one of {names} (use reference.py for float64)")
    B, T, D = t.shape[:3]
    if B < 1 or T < 1 or D < 1:
        raise ValueError(f"{name} has {_describe(t)}; B, T and D must all be at least 1")
    if not t.is_cuda and not INTERPRETED:
        raise RuntimeError(
            f"{name} is on {t.device}: the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 set "
            "before hgrn_fairseq.kernels.hgru_triton is imported (slow; for tests)")
    return B, T, D


def _check_state(initial_state, B: int, D: int, complex_: bool, ref: Tensor) -> None:
    if initial_state is None:
        return
    shape = (B, D, 2) if complex_ else (B, D)
    _check_tensor("initial_state", initial_state, shape, "[B, D, 2]" if complex_ else "[B, D]", ref)


def _check_theta(theta, D: int, ref: Tensor) -> Tensor:
    _check_tensor("theta", theta, (D,), "[D]", ref, dtypes=_SUPPORTED_DTYPES + (torch.float64,))
    return theta if theta.is_contiguous() else theta.contiguous()


def real_scan(x: Tensor, a: Tensor, initial_state: Optional[Tensor] = None,
              reverse: bool = False) -> Tuple[Tensor, Tensor]:
    """``h_t = a_t * h_{t-1} + x_t`` (``reverse``: from ``t = T-1`` down to 0).

    Args:
        x, a: ``[B, T, D]``, bf16 / fp16 / fp32 (may differ), any strides.
        initial_state: ``[B, D]`` or None (zeros).
    Returns:
        ``(h, final_state)``: ``[B, T, D]`` and ``[B, D]`` in ``x.dtype``.
    """
    B, T, D = _check_sequence("x", x, False)
    _check_tensor("a", a, (B, T, D), "[B, T, D] like x", x)
    _check_state(initial_state, B, D, False, x)
    return _HGRUScanFunction.apply(x, a, None, None, initial_state, None, bool(reverse), False)


def complex_scan(x: Tensor, a: Tensor, theta: Tensor, initial_state: Optional[Tensor] = None,
                 reverse: bool = False) -> Tuple[Tensor, Tensor]:
    """``h_t = a_t * exp(i theta) * h_{t-1} + x_t`` with complex ``x, h`` and real ``a``.

    Args:
        x: ``[B, T, D, 2]`` (real, imaginary), bf16 / fp16 / fp32, any strides (e.g. a
            ``[B, T, 2D]`` projection viewed as ``[B, T, D, 2]``).
        a: ``[B, T, D]`` real decay.
        theta: ``[D]`` rotation per step.
        initial_state: ``[B, D, 2]`` or None.
    Returns:
        ``(h, final_state)``: ``[B, T, D, 2]`` and ``[B, D, 2]`` in ``x.dtype``.
    """
    B, T, D = _check_sequence("x", x, True)
    _check_tensor("a", a, (B, T, D), "[B, T, D] (x without its trailing 2)", x)
    theta = _check_theta(theta, D, x)
    _check_state(initial_state, B, D, True, x)
    return _HGRUScanFunction.apply(x, a, theta, None, initial_state, None, bool(reverse), False)


def hgru_fused(
    forget_logits: Tensor,
    inputs: Tensor,
    theta: Optional[Tensor] = None,
    lower_bound: Union[float, Tensor, None] = None,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Gates and scan of one HGRU direction in one kernel (see ``reference.hgru_reference``).

    ``lambda = gamma + (1 - gamma) * sigmoid(forget_logits)``, ``x = (1 - lambda) * SiLU(inputs)``,
    then ``h_t = lambda_t [exp(i theta)] h_{t-1} + x_t``. Neither ``lambda`` nor ``x`` is stored.

    Args:
        forget_logits: ``[B, T, D]``.
        inputs: ``[B, T, D]`` (real) or ``[B, T, D, 2]`` (complex; then ``theta`` is ``[D]``).
        theta: ``[D]`` for complex inputs, None for real ones.
        lower_bound: gamma: None (0), a python float, or a ``[D]`` (or 0-dim) tensor; its gradient
            (a sum over batch and time) is computed when it requires grad.
        initial_state: ``[B, D]`` / ``[B, D, 2]`` or None.
        reverse: run from ``t = T-1`` down to 0.
    Returns:
        ``(h, final_state)`` in ``inputs.dtype``, shaped like ``inputs`` and ``inputs[:, 0]``.
    """
    if not isinstance(inputs, Tensor):
        raise ValueError(f"inputs must be a torch.Tensor [B, T, D] or [B, T, D, 2], got {type(inputs).__name__}")
    complex_ = inputs.dim() == 4
    B, T, D = _check_sequence("inputs", inputs, complex_)
    _check_tensor("forget_logits", forget_logits, (B, T, D),
                  "[B, T, D] (inputs without a trailing 2)" if complex_ else "[B, T, D] like inputs", inputs)
    if complex_:
        if theta is None:
            raise ValueError("complex HGRU inputs [B, T, D, 2] need theta of shape [D]; got theta=None")
        theta = _check_theta(theta, D, inputs)
    elif theta is not None:
        raise ValueError(
            f"real HGRU inputs [B, T, D] take no theta; got theta with shape {tuple(theta.shape)} "
            "(pass theta=None, or inputs of shape [B, T, D, 2] for the complex recurrence)")
    _check_state(initial_state, B, D, complex_, inputs)
    gamma, gamma_val = None, None
    if isinstance(lower_bound, Tensor):
        if lower_bound.dim() == 0:
            lower_bound = lower_bound.expand(D)
        _check_tensor("lower_bound", lower_bound, (D,), "[D] (or a 0-dim tensor / python float)", inputs,
                      dtypes=_SUPPORTED_DTYPES + (torch.float64,))
        gamma = lower_bound if lower_bound.is_contiguous() else lower_bound.contiguous()
    elif lower_bound is not None:
        if not isinstance(lower_bound, numbers.Real) or isinstance(lower_bound, bool):
            raise ValueError(
                f"lower_bound must be None, a python float or a [D] tensor; got {type(lower_bound).__name__}")
        gamma_val = float(lower_bound)
        if not math.isfinite(gamma_val):
            raise ValueError(f"lower_bound={gamma_val} is not finite")
    return _HGRUScanFunction.apply(inputs, forget_logits, theta, gamma, initial_state, gamma_val,
                                   bool(reverse), True)
