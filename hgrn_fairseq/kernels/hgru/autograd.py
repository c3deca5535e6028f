"""The autograd Function behind the three HGRU ops: it plans each launch (``plan._plan``), prepares the
inputs and scratch buffers, and launches the forward and backward kernels of the planned mode.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton

from .backward import _hgru_bwd_kernel, _hgru_bwd_lb_kernel, _hgru_stream_bwd_kernel
from .forward import (_hgru_block_fwd_kernel, _hgru_fwd_kernel, _hgru_fwd_lb_kernel, _hgru_fwd_lbc_kernel,
                      _hgru_stream_fwd_kernel)
from .plan import _plan, tuning
from .scan_math import INTERPRETED
from .tiles import MODE_AGG, MODE_APPLY, MODE_SEQ

Tensor = torch.Tensor


_LB_BUFFERS = {}
# Buffers a CUDA graph captured: the graph keeps their addresses, so they must never be freed.
_LB_CAPTURED = []


def _lookback_buffers(device: torch.device, n_words: int):
    """Tagged chunk maps/states and the launch epoch of the look-back kernels, kept per device and
    stream: launches on one stream run in order, each advances the epoch, and words from older
    epochs are ignored, so nothing is ever cleared.

    Under CUDA graph capture the buffers get their own key (graphs are replayed on the stream they
    are launched on, one after the other) and are allocated with device-side fills only (no
    host-to-device copy, which a capture forbids); every buffer a capture used is kept alive."""
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if capturing:
        key = (str(device), "graph")
    else:
        key = (str(device), torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    lbuf, state = _LB_BUFFERS.get(key, (None, None))
    if lbuf is None or lbuf.numel() < n_words:
        lbuf = torch.zeros(max(n_words, 1024), dtype=torch.int64, device=device)
        state = torch.zeros(2, dtype=torch.int32, device=device)  # epoch, last-chunk programs done
        state.narrow(0, 0, 1).fill_(1)  # (a fill kernel: no host copy)
        _LB_BUFFERS[key] = (lbuf, state)
        if capturing:  # (graph-key buffers are only ever allocated under capture)
            _LB_CAPTURED.append((lbuf, state))
    return lbuf, state


def _tile_input(t: Tensor, is_complex: bool) -> Tensor:
    """``t`` itself when the kernels can read it in place (unit channel stride; complex pairs
    interleaved, with even batch/time strides and 4-byte alignment; a time stride that keeps the
    offsets inside a tile 32-bit), else a contiguous copy."""
    if is_complex:
        ok = (t.stride(-1) == 1 and t.stride(-2) == 2 and t.stride(0) % 2 == 0 and t.stride(1) % 2 == 0
              and t.data_ptr() % (2 * t.element_size()) == 0)
    else:
        ok = t.stride(-1) == 1 or t.shape[-1] == 1
    ok = ok and t.stride(1) < 2**24  # offsets inside a tile are 32-bit
    return t if ok else t.contiguous()


def _vec_width(D: int, want: int, *tensors: Tensor) -> int:
    """The most channels (a power of two, at most ``want``) that every row of these [B, T, D] tensors
    (unit channel stride) can be read and written in per access (``VEC``): D, the batch and time strides
    and the data pointer (in elements) must all be multiples of it."""
    n = max(1, int(want))
    while n > 1 and not (D % n == 0 and all(t.stride(0) % n == 0 and t.stride(1) % n == 0
                                            and t.data_ptr() % (n * t.element_size()) == 0 for t in tensors)):
        n //= 2
    return n


def _strides(t: Optional[Tensor], n: int):
    if t is None:
        return (0,) * n
    st = tuple(t.stride())
    return st + (0,) * (n - len(st))


def _device_guard(t: Tensor):
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return _NullContext()


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _HGRUScanFunction(torch.autograd.Function):
    """One autograd Function for the three ops.

    ``x`` is the scan input (plain scans) or the input pre-activations (fused); ``a`` the decay
    (plain scans) or the forget-gate logits (fused). ``gamma`` is a ``[D]`` tensor or None,
    ``gamma_val`` the python-float lower bound used when ``gamma`` is None.
    """

    @staticmethod
    def forward(ctx, x, a, theta, gamma, h0, gamma_val, reverse, fused):
        ctx.set_materialize_grads(False)
        is_complex = x.dim() == 4
        B, T, D = a.shape
        plan = _plan(B, T, D, is_complex, a.device, fused, backward=False)
        mode, nc, cl, lbw = plan.pop("mode"), plan.pop("NC"), plan.pop("CL"), plan.pop("LBW")
        vec = plan.pop("VEC", 1)
        dev = a.device
        h = torch.empty(x.shape, dtype=x.dtype, device=dev)
        ht = torch.empty((B, D, 2) if is_complex else (B, D), dtype=x.dtype, device=dev)
        x, a = _tile_input(x, is_complex), _tile_input(a, False)
        s0 = _strides(h0, 3)
        dummy = a
        args = (x, x.stride(0), x.stride(1), a, a.stride(0), a.stride(1),
                theta if theta is not None else dummy, gamma if gamma is not None else dummy,
                float(gamma_val or 0.0), h0 if h0 is not None else dummy, s0[0], s0[1], s0[2], h, ht)
        flags = dict(COMPLEX=is_complex, FUSED=fused, REVERSE=reverse, HAS_H0=h0 is not None,
                     GAMMA_MODE=_gamma_mode(gamma, gamma_val), PRECISE=not INTERPRETED)
        n_cols = triton.cdiv(D, plan["BD"]) * B
        dw = 2 * D if is_complex else D  # row stride of h (and of dx)
        with _device_guard(a):
            if mode == "stream":
                _hgru_stream_fwd_kernel[(n_cols,)](
                    *args[:6], *args[7:12], h, ht, T, D, FUSED=fused, REVERSE=reverse,
                    HAS_H0=h0 is not None, GAMMA_MODE=flags["GAMMA_MODE"], BT=plan["BT"], BD=plan["BD"],
                    STAGES=plan["STAGES"], num_warps=plan["num_warps"])
            elif mode == "block":
                _hgru_block_fwd_kernel[(n_cols,)](
                    *args[:6], *args[7:12], h, ht, T, D, FUSED=fused, REVERSE=reverse, HAS_H0=h0 is not None,
                    GAMMA_MODE=flags["GAMMA_MODE"], R=plan["R"], NW=plan["NW"], BD=plan["BD"],
                    STAGES=plan["STAGES"], VEC=_vec_width(D, 8, x, a, h), num_warps=plan["num_warps"])
            elif mode == "chunklb":
                lbuf, state = _lookback_buffers(dev, (4 if is_complex else 2) * nc * B * D)
                _hgru_fwd_lbc_kernel[(n_cols * nc,)](
                    *args, lbuf, state, B, T, D, nc, cl, plan["BD"], dw, PREFETCH=plan["PREFETCH"],
                    FOLD=plan["FOLD"], AGG_REV=plan["AGG_REV"], PUBLISH_INC=tuning["publish_inclusive"] is not False,
                    LBW=lbw, VEC=_vec_width(D, vec, x, a, h), BT=plan["BT"], BD=plan["BD"],
                    num_warps=plan["num_warps"], **flags)
            elif mode == "lookback":
                _launch_lookback(_hgru_fwd_lb_kernel, args, n_cols, B, T, D, nc, dw, is_complex, dev, lbw, flags, plan)
            else:
                _launch_chunks(_hgru_fwd_kernel, args, n_cols, B, T, D, nc, cl, dw, is_complex, dev, dummy, flags, plan)
        ctx.save_for_backward(x if fused else None, a, theta, gamma, h0, h)
        ctx.cfg = (is_complex, fused, reverse, gamma_val, x.shape, x.dtype)
        return h, ht

    @staticmethod
    def backward(ctx, dh, dht):
        x, a, theta, gamma, h0, h = ctx.saved_tensors
        is_complex, fused, reverse, gamma_val, x_shape, x_dtype = ctx.cfg
        need_x, need_a, need_theta, need_gamma, need_h0 = ctx.needs_input_grad[:5]
        if dh is None and dht is None:
            return (None,) * 8
        B, T, D = a.shape
        plan = _plan(B, T, D, is_complex, a.device, fused, backward=True)
        mode, nc, cl, lbw = plan.pop("mode"), plan.pop("NC"), plan.pop("CL"), plan.pop("LBW")
        plan.pop("VEC", None)
        dev = a.device
        need_theta = bool(is_complex and need_theta)
        need_gamma = bool(fused and gamma is not None and need_gamma)
        need_h0 = bool(h0 is not None and need_h0)
        dx = torch.empty(x_shape, dtype=x_dtype, device=dev)
        da = torch.empty(a.shape, dtype=a.dtype, device=dev)
        dtheta_p = torch.empty((B * nc, D), dtype=torch.float32, device=dev) if need_theta else da
        dgamma_p = torch.empty((B * nc, D), dtype=torch.float32, device=dev) if need_gamma else da
        dh0 = torch.empty(h0.shape, dtype=h0.dtype, device=dev) if need_h0 else da
        if x is not None:
            x = _tile_input(x, is_complex)
        if dh is not None:
            dh = _tile_input(dh, is_complex)
        a = _tile_input(a, False)
        s0, st = _strides(h0, 3), _strides(dht, 3)
        dummy = a
        xs = x if x is not None else dummy
        dhs = dh if dh is not None else dummy
        args = (xs, xs.stride(0), xs.stride(1), a, a.stride(0), a.stride(1),
                theta if theta is not None else dummy, gamma if gamma is not None else dummy,
                float(gamma_val or 0.0), h0 if h0 is not None else dummy, s0[0], s0[1], s0[2], h,
                dhs, dhs.stride(0), dhs.stride(1), dht if dht is not None else dummy, st[0], st[1], st[2],
                dx, da, dh0, dtheta_p, dgamma_p)
        flags = dict(COMPLEX=is_complex, FUSED=fused, REVERSE=reverse, HAS_H0=h0 is not None,
                     HAS_DH=dh is not None, HAS_DHT=dht is not None,
                     GAMMA_MODE=_gamma_mode(gamma, gamma_val), NEED_DGAMMA=need_gamma,
                     NEED_DTHETA=need_theta, NEED_DH0=need_h0, NEED_A_T=bool(fused or need_theta),
                     PRECISE=not INTERPRETED)
        n_cols = triton.cdiv(D, plan["BD"]) * B
        dw = 2 * D if is_complex else D  # row stride of h (and of dx)
        with _device_guard(a):
            if mode == "stream":
                _hgru_stream_bwd_kernel[(n_cols,)](
                    *args[:6], *args[7:12], h, *args[14:20], dx, da, dh0,
                    dgamma_p, T, D, FUSED=fused, REVERSE=reverse, HAS_H0=h0 is not None, HAS_DH=dh is not None,
                    HAS_DHT=dht is not None, GAMMA_MODE=flags["GAMMA_MODE"], NEED_DGAMMA=need_gamma,
                    NEED_DH0=need_h0, BT=plan["BT"], BD=plan["BD"], STAGES=plan["STAGES"],
                    num_warps=plan["num_warps"])
            elif mode == "lookback":
                _launch_lookback(_hgru_bwd_lb_kernel, args, n_cols, B, T, D, nc, dw, is_complex, dev, lbw, flags, plan)
            else:
                _launch_chunks(_hgru_bwd_kernel, args, n_cols, B, T, D, nc, cl, dw, is_complex, dev, dummy, flags, plan)
        dtheta = dtheta_p.sum(0).to(theta.dtype) if need_theta else None
        dgamma = dgamma_p.sum(0).to(gamma.dtype) if need_gamma else None
        return (dx if need_x else None, da if need_a else None, dtheta, dgamma,
                dh0 if need_h0 else None, None, None, None)


def _gamma_mode(gamma: Optional[Tensor], gamma_val: Optional[float]) -> int:
    return 2 if gamma is not None else (1 if gamma_val is not None else 0)


def _launch_lookback(kernel, args, n_cols, B, T, D, nc, dw, is_complex, dev, lbw, flags, plan):
    """``kernel`` (``_hgru_fwd_lb_kernel`` or ``_hgru_bwd_lb_kernel``): "lookback", one tile per program."""
    lbuf, state = _lookback_buffers(dev, (4 if is_complex else 2) * nc * B * D)
    kernel[(n_cols * nc,)](*args, lbuf, state, B, T, D, nc, plan["BD"], dw,
                           PUBLISH_INC=tuning["publish_inclusive"] is not False, LBW=lbw, BT=plan["BT"], BD=plan["BD"],
                           num_warps=plan["num_warps"], **flags)


def _launch_chunks(kernel, args, n_cols, B, T, D, nc, cl, dw, is_complex, dev, dummy, flags, plan):
    """``kernel`` (``_hgru_fwd_kernel`` or ``_hgru_bwd_kernel``) as "seq" (``nc`` 1: one launch) or "twopass":
    the chunk maps (MODE_AGG), then the chunks entered with the composed maps (MODE_APPLY)."""
    agg_m, agg_s, kmode = dummy, dummy, MODE_SEQ
    if nc > 1:
        agg_m, agg_s = _agg_buffers(nc, B, D, is_complex, dev)
        kernel[(n_cols * (nc - 1),)](*args, agg_m, agg_s, B, T, D, nc, cl, plan["BD"], dw, MODE=MODE_AGG, **flags,
                                     **plan)
        kmode = MODE_APPLY
    kernel[(n_cols * nc,)](*args, agg_m, agg_s, B, T, D, nc, cl, plan["BD"], dw, MODE=kmode, **flags, **plan)


def _agg_buffers(nc: int, B: int, D: int, is_complex: bool, device: torch.device):
    shape = (2, nc - 1, B, D) if is_complex else (nc - 1, B, D)  # complex: real plane, imaginary plane
    return (torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device))
