"""Step-by-step Triton kernels of the HGRN2 recurrence (short sequences and decoding).

Same recurrence and layout as ``hgrn2_chunk_kernels``; the state of one head stays in registers
(fp32) while the kernel walks the sequence one step at a time::

    S_t = Diag(exp(g_t)) S_{t-1} + (1 - exp(g_t))^T v_t,     o_t = q_t S_t

* ``rec_fwd``  grid (V/BV, BH): o and the final state.
* ``rec_dq``   grid (K/BK, BH): dq_t = S_t dO_t (the state is recomputed forwards).
* ``rec_bwd``  grid (BH,): walks backwards carrying dS; dv, dg and the initial-state gradient.
  ``dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + rowsum(S_T * dS_T) - exp(g_t) dk_t``.

Pointers advance by one step per iteration (64-bit pointer arithmetic), so T is a plain runtime value.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .hgrn2_chunk_kernels import _one_minus, _state_tile


@triton.jit(do_not_specialize=["T"])
def hgrn2_rec_fwd_kernel(
    q, v, g, o, h0, ht,
    T, H,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    o_k, o_v, m_k, m_v, o_s, m_s, b_s = _state_tile(h0, 0, i_v, i_bh, K, V, BK, BV, HAS_H0)
    if REVERSE:
        t0 = T - 1
    else:
        t0 = 0
    row = (i_b * T + t0) * H + i_h
    p_q = q + row * K + o_k
    p_g = g + row * K + o_k
    p_v = v + row * V + o_v
    p_o = o + row * V + o_v
    for _ in range(T):
        b_q = tl.load(p_q, mask=m_k, other=0.0).to(tl.float32)
        b_g = tl.load(p_g, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
        b_lam = tl.exp(b_g)
        b_s = b_s * b_lam[:, None] + _one_minus(b_g, b_lam)[:, None] * b_v[None, :]
        b_o = tl.sum(b_q[:, None] * b_s, axis=0)
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)
        if REVERSE:
            p_q -= H * K
            p_g -= H * K
            p_v -= H * V
            p_o -= H * V
        else:
            p_q += H * K
            p_g += H * K
            p_v += H * V
            p_o += H * V
    tl.store(ht + i_bh.to(tl.int64) * K * V + o_s, b_s, mask=m_s)


@triton.jit(do_not_specialize=["T"])
def hgrn2_rec_dq_kernel(
    v, g, do, h0, dq,
    T, H,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
):
    i_k, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    o_k, o_v, m_k, m_v, o_s, m_s, b_s = _state_tile(h0, i_k, 0, i_bh, K, V, BK, BV, HAS_H0)
    if REVERSE:
        t0 = T - 1
    else:
        t0 = 0
    row = (i_b * T + t0) * H + i_h
    p_g = g + row * K + o_k
    p_dq = dq + row * K + o_k
    p_v = v + row * V + o_v
    p_do = do + row * V + o_v
    for _ in range(T):
        b_g = tl.load(p_g, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
        b_do = tl.load(p_do, mask=m_v, other=0.0).to(tl.float32)
        b_lam = tl.exp(b_g)
        b_s = b_s * b_lam[:, None] + _one_minus(b_g, b_lam)[:, None] * b_v[None, :]
        tl.store(p_dq, tl.sum(b_s * b_do[None, :], axis=1), mask=m_k)
        if REVERSE:
            p_g -= H * K
            p_dq -= H * K
            p_v -= H * V
            p_do -= H * V
        else:
            p_g += H * K
            p_dq += H * K
            p_v += H * V
            p_do += H * V


@triton.jit(do_not_specialize=["T"])
def hgrn2_rec_bwd_kernel(
    q, v, g, do, dq, ht, dht, dv, dg, dh0,
    T, H,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    i_bh = tl.program_id(0)
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    o_k, o_v, m_k, m_v, o_s, m_s, b_ds = _state_tile(dht, 0, 0, i_bh, K, V, BK, BV, HAS_DHT)
    # walk the scan order backwards: start where the forward scan ended
    if REVERSE:
        t0 = 0
    else:
        t0 = T - 1
    row = (i_b * T + t0) * H + i_h
    p_q = q + row * K + o_k
    p_g = g + row * K + o_k
    p_dq = dq + row * K + o_k
    p_dg = dg + row * K + o_k
    p_v = v + row * V + o_v
    p_do = do + row * V + o_v
    p_dv = dv + row * V + o_v
    if HAS_DHT:
        b_st = tl.load(ht + i_bh.to(tl.int64) * K * V + o_s, mask=m_s, other=0.0).to(tl.float32)
        # every term of the final state carries exp(sum of all g): d/dg_t of it is S_T (row-wise)
        b_dB = tl.sum(b_st * b_ds, axis=1)
    else:
        b_dB = tl.zeros([BK], dtype=tl.float32)
    b_acc = tl.zeros([BK], dtype=tl.float32)
    for _ in range(T):
        b_q = tl.load(p_q, mask=m_k, other=0.0).to(tl.float32)
        b_g = tl.load(p_g, mask=m_k, other=0.0).to(tl.float32)
        b_dq = tl.load(p_dq, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
        b_do = tl.load(p_do, mask=m_v, other=0.0).to(tl.float32)
        b_lam = tl.exp(b_g)
        b_k = _one_minus(b_g, b_lam)
        b_ds += b_q[:, None] * b_do[None, :]
        b_dk = tl.sum(b_ds * b_v[None, :], axis=1)
        b_dv = tl.sum(b_ds * b_k[:, None], axis=0)
        b_acc += b_q * b_dq - b_k * b_dk
        b_dg = b_acc + b_dB - b_lam * b_dk
        tl.store(p_dv, b_dv.to(dv.dtype.element_ty), mask=m_v)
        tl.store(p_dg, b_dg.to(dg.dtype.element_ty), mask=m_k)
        b_ds = b_ds * b_lam[:, None]
        if REVERSE:
            p_q += H * K
            p_g += H * K
            p_dq += H * K
            p_dg += H * K
            p_v += H * V
            p_do += H * V
            p_dv += H * V
        else:
            p_q -= H * K
            p_g -= H * K
            p_dq -= H * K
            p_dg -= H * K
            p_v -= H * V
            p_do -= H * V
            p_dv -= H * V
    if STORE_DH0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + o_s, b_ds, mask=m_s)
