"""Choosing between the Triton kernels and the PyTorch reference for each op."""
from __future__ import annotations

import os
from typing import Optional, Tuple, Union

import torch

from . import reference

Tensor = torch.Tensor
BACKENDS = ("auto", "triton", "reference")


def as_rows(t: Tensor) -> Tuple[Tensor, int]:
    """``t`` as ``[N, C]`` rows with unit channel stride, a view when its layout allows (e.g. a slice
    of a wider projection), else a copy; and the row stride the kernels should use."""
    C = t.shape[-1]
    if t.stride(-1) != 1:
        t = t.contiguous()
    rows = t.reshape(-1, C)  # (a view when the strides allow)
    if rows.shape[0] > 1 and rows.stride(0) < C:  # overlapping rows (an expanded tensor)
        rows = rows.contiguous()
    return rows, (rows.stride(0) if rows.shape[0] > 1 else C)


def eager(fn):
    """Keep ``fn`` out of ``torch.compile`` graphs: the ops run our own kernels (and their autograd
    Functions) as they are; a compiled caller gets a graph break around them."""
    return torch.compiler.disable(fn)


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(backend: str, tensor: Tensor) -> str:
    """Map ``backend`` to ``"triton"`` or ``"reference"`` for a tensor on its device.

    ``auto`` picks Triton for CUDA tensors (and for CPU tensors when ``TRITON_INTERPRET=1``
    is set, which is how the kernels are tested without a GPU), the reference otherwise.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "reference":
        return "reference"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' needs the triton package (pip install triton, Linux only)")
        if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "backend='triton' got a CPU tensor; move the model to CUDA, set TRITON_INTERPRET=1 "
                "(slow, for tests) or use backend='reference'"
            )
        return "triton"
    return "triton" if tensor.is_cuda and triton_available() else "reference"


@eager
def hgru_scan(
    forget_logits: Tensor,
    inputs: Tensor,
    theta: Optional[Tensor] = None,
    lower_bound: Union[float, Tensor, None] = None,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """One direction of the HGRU: lambda = gamma + (1-gamma) sigmoid(f), h_t = lambda_t
    [exp(i theta)] h_{t-1} + (1 - lambda_t) SiLU(inputs_t). See ``reference.hgru_reference``."""
    if resolve_backend(backend, forget_logits) == "triton":
        from .hgru import hgru_fused

        return hgru_fused(forget_logits, inputs, theta, lower_bound, initial_state, reverse)
    return reference.hgru_reference(forget_logits, inputs, theta, lower_bound, initial_state, reverse)


@eager
def real_scan(
    x: Tensor,
    a: Tensor,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """h_t = a_t h_{t-1} + x_t, ``x, a: [B, T, D]``. See ``reference.real_scan_reference``."""
    if resolve_backend(backend, x) == "triton":
        from .hgru import real_scan as real_scan_triton

        return real_scan_triton(x, a, initial_state, reverse)
    return reference.real_scan_reference(x, a, initial_state, reverse)


@eager
def complex_scan(
    x: Tensor,
    a: Tensor,
    theta: Tensor,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """h_t = a_t exp(i theta) h_{t-1} + x_t, ``x: [B, T, D, 2]``, ``a: [B, T, D]``, ``theta: [D]``.
    See ``reference.complex_scan_reference``."""
    if resolve_backend(backend, x) == "triton":
        from .hgru import complex_scan as complex_scan_triton

        return complex_scan_triton(x, a, theta, initial_state, reverse)
    return reference.complex_scan_reference(x, a, theta, initial_state, reverse)


@eager
def hgrn2_scan(
    q: Tensor,
    v: Tensor,
    log_decay: Tensor,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """HGRN2 recurrence with k = 1 - exp(log_decay), scale 1. See ``reference.hgrn2_scan_reference``."""
    if resolve_backend(backend, q) == "triton":
        from .hgrn2_small_heads import SMALL_HEAD_STATE, hgrn2_small_head_scan

        if q.shape[-1] * v.shape[-1] <= SMALL_HEAD_STATE:  # heads of one number: an HGRU scan
            return hgrn2_small_head_scan(q, v, log_decay, initial_state, reverse)
        from .hgrn2_triton import hgrn2_fused

        return hgrn2_fused(q, v, log_decay, initial_state, reverse)
    return reference.hgrn2_scan_reference(q, v, log_decay, initial_state, reverse)


@eager
def hgrn2_scan_bidirectional(q: Tensor, v: Tensor, log_decay: Tensor, backend: str = "auto") -> Tensor:
    """``hgrn2_scan(q, v, g)[0] + hgrn2_scan(q, v, g, reverse=True)[0]`` (no initial state); on the
    Triton path with the chunked kernels, the reverse direction adds its output and gradients into the
    forward direction's inside its kernels (``hgrn2_triton.hgrn2_fused_bidirectional``)."""
    if resolve_backend(backend, q) == "triton":
        from .hgrn2_small_heads import SMALL_HEAD_STATE

        if q.shape[-1] * v.shape[-1] > SMALL_HEAD_STATE:
            from .hgrn2_triton import hgrn2_fused_bidirectional

            return hgrn2_fused_bidirectional(q, v, log_decay)
    return hgrn2_scan(q, v, log_decay, None, False, backend)[0] + hgrn2_scan(q, v, log_decay, None, True, backend)[0]


@eager
def hgrn2_step(
    q: Tensor,
    v: Tensor,
    log_decay: Tensor,
    state: Tensor,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """One HGRN2 decoding step: q, log_decay ``[B, H, K]``, v ``[B, H, V]``, state ``[B, H, K, V]``.

    Returns ``(o [B, H, V], new_state [B, H, K, V])`` (the new state is fp32 on the Triton path)."""
    if resolve_backend(backend, q) == "triton":
        from .hgrn2_triton import hgrn2_step as hgrn2_step_triton

        return hgrn2_step_triton(q, v, log_decay, state)
    o, new_state = reference.hgrn2_scan_reference(
        q.unsqueeze(1), v.unsqueeze(1), log_decay.unsqueeze(1), state, False
    )
    return o.squeeze(1), new_state
