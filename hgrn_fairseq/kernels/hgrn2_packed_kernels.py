"""Step-by-step Triton kernels of the HGRN2 recurrence for small heads, many heads per program.

Same recurrence, layout and backward as ``hgrn2_recurrent_kernels``::

    S_t = Diag(exp(g_t)) S_{t-1} + (1 - exp(g_t))^T v_t,     o_t = q_t S_t

but one program walks ``BH`` heads of one batch row at once, their states a ``[BH, BK, BV]`` tile in
registers (fp32). The one-head kernels pad a head's K x V state to at least 16 x 16 and give every
(batch row, head) its own program: with the LRA 2-D models' heads of 2 x 2 (expand ratio 2) that is 4 useful
numbers in a tile of 256 and, for Pathfinder, 262,144 programs of 32 steps per scan, each step loading 2
numbers. Here a step of a program loads the ``BH * K`` contiguous q / decay numbers and ``BH * V`` value
numbers of its heads, and the grid is (batch rows, head blocks) with the batch rows on the axis that CUDA
does not cap at 65,535.

* ``packed_fwd`` o and the final state.
* ``packed_dq``  dq_t = S_t dO_t (the state recomputed forwards), fp32.
* ``packed_bwd`` walks backwards carrying dS: dv, dg and the initial-state gradient, with
  ``dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + rowsum(S_T * dS_T) - exp(g_t) dk_t`` as in the one-head
  kernel.

Pointers advance by one step per iteration, so T is a plain runtime value.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .hgrn2_chunk_kernels import _one_minus


@triton.jit
def _packed_offsets(i_hb, H, K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr):
    """Offsets and masks of a block of BH heads inside one time step ([BH, BK] keys, [BH, BV] values) and
    inside one batch row's states ([BH, BK, BV])."""
    o_h = i_hb * BH + tl.arange(0, BH)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_h = o_h < H
    m_k = o_k < K
    m_v = o_v < V
    o_hk = o_h[:, None] * K + o_k[None, :]
    m_hk = m_h[:, None] & m_k[None, :]
    o_hv = o_h[:, None] * V + o_v[None, :]
    m_hv = m_h[:, None] & m_v[None, :]
    o_s = o_hk[:, :, None] * V + o_v[None, None, :]
    m_s = m_hk[:, :, None] & m_v[None, None, :]
    return o_hk, m_hk, o_hv, m_hv, o_s, m_s


@triton.jit
def _packed_state(s0, i_b, H, o_s, m_s, K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, HAS_S0: tl.constexpr):
    if HAS_S0:
        b_s = tl.load(s0 + i_b * H * K * V + o_s, mask=m_s, other=0.0).to(tl.float32)
    else:
        b_s = tl.zeros([BH, BK, BV], dtype=tl.float32)
    return b_s


@triton.jit
def _packed_walk(i_b, T, H, K: tl.constexpr, V: tl.constexpr, DOWN: tl.constexpr):
    """Where a walk over one sequence starts (its first row of heads, from the last step when DOWN) and
    the pointer steps per iteration for the key-sized and value-sized tensors."""
    if DOWN:
        row = (i_b * T + T - 1) * H
        s_k = -H * K
        s_v = -H * V
    else:
        row = i_b * T * H
        s_k = H * K
        s_v = H * V
    return row, s_k, s_v


@triton.jit(do_not_specialize=["T"])
def hgrn2_packed_fwd_kernel(
    q, v, g, o, h0, ht,
    T, H,
    K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    o_hk, m_hk, o_hv, m_hv, o_s, m_s = _packed_offsets(i_hb, H, K, V, BH, BK, BV)
    b_s = _packed_state(h0, i_b, H, o_s, m_s, K, V, BH, BK, BV, HAS_H0)
    row, s_k, s_v = _packed_walk(i_b, T, H, K, V, REVERSE)
    p_q = q + row * K + o_hk
    p_g = g + row * K + o_hk
    p_v = v + row * V + o_hv
    p_o = o + row * V + o_hv
    for _ in range(T):
        b_q = tl.load(p_q, mask=m_hk, other=0.0).to(tl.float32)
        b_g = tl.load(p_g, mask=m_hk, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_hv, other=0.0).to(tl.float32)
        b_lam = tl.exp(b_g)
        b_k = _one_minus(b_g, b_lam)
        b_s = b_s * b_lam[:, :, None] + b_k[:, :, None] * b_v[:, None, :]
        b_o = tl.sum(b_q[:, :, None] * b_s, axis=1)
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_hv)
        p_q += s_k
        p_g += s_k
        p_v += s_v
        p_o += s_v
    tl.store(ht + i_b * H * K * V + o_s, b_s, mask=m_s)


@triton.jit(do_not_specialize=["T"])
def hgrn2_packed_dq_kernel(
    v, g, do, h0, dq,
    T, H,
    K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    o_hk, m_hk, o_hv, m_hv, o_s, m_s = _packed_offsets(i_hb, H, K, V, BH, BK, BV)
    b_s = _packed_state(h0, i_b, H, o_s, m_s, K, V, BH, BK, BV, HAS_H0)
    row, s_k, s_v = _packed_walk(i_b, T, H, K, V, REVERSE)
    p_g = g + row * K + o_hk
    p_dq = dq + row * K + o_hk
    p_v = v + row * V + o_hv
    p_do = do + row * V + o_hv
    for _ in range(T):
        b_g = tl.load(p_g, mask=m_hk, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_hv, other=0.0).to(tl.float32)
        b_do = tl.load(p_do, mask=m_hv, other=0.0).to(tl.float32)
        b_lam = tl.exp(b_g)
        b_s = b_s * b_lam[:, :, None] + _one_minus(b_g, b_lam)[:, :, None] * b_v[:, None, :]
        tl.store(p_dq, tl.sum(b_s * b_do[:, None, :], axis=2), mask=m_hk)
        p_g += s_k
        p_dq += s_k
        p_v += s_v
        p_do += s_v


@triton.jit(do_not_specialize=["T"])
def hgrn2_packed_bwd_kernel(
    q, v, g, do, dq, ht, dht, dv, dg, dh0,
    T, H,
    K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    o_hk, m_hk, o_hv, m_hv, o_s, m_s = _packed_offsets(i_hb, H, K, V, BH, BK, BV)
    b_ds = _packed_state(dht, i_b, H, o_s, m_s, K, V, BH, BK, BV, HAS_DHT)
    # walk the scan order backwards: start where the forward scan ended
    row, s_k, s_v = _packed_walk(i_b, T, H, K, V, not REVERSE)
    p_q = q + row * K + o_hk
    p_g = g + row * K + o_hk
    p_dq = dq + row * K + o_hk
    p_dg = dg + row * K + o_hk
    p_v = v + row * V + o_hv
    p_do = do + row * V + o_hv
    p_dv = dv + row * V + o_hv
    if HAS_DHT:
        b_st = tl.load(ht + i_b * H * K * V + o_s, mask=m_s, other=0.0).to(tl.float32)
        # every term of the final state carries exp(sum of all g): d/dg_t of it is S_T (row-wise)
        b_dB = tl.sum(b_st * b_ds, axis=2)
    else:
        b_dB = tl.zeros([BH, BK], dtype=tl.float32)
    b_acc = tl.zeros([BH, BK], dtype=tl.float32)
    for _ in range(T):
        b_q = tl.load(p_q, mask=m_hk, other=0.0).to(tl.float32)
        b_g = tl.load(p_g, mask=m_hk, other=0.0).to(tl.float32)
        b_dq = tl.load(p_dq, mask=m_hk, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_hv, other=0.0).to(tl.float32)
        b_do = tl.load(p_do, mask=m_hv, other=0.0).to(tl.float32)
        b_lam = tl.exp(b_g)
        b_k = _one_minus(b_g, b_lam)
        b_ds += b_q[:, :, None] * b_do[:, None, :]
        b_dk = tl.sum(b_ds * b_v[:, None, :], axis=2)
        b_dv = tl.sum(b_ds * b_k[:, :, None], axis=1)
        b_acc += b_q * b_dq - b_k * b_dk
        b_dg = b_acc + b_dB - b_lam * b_dk
        tl.store(p_dv, b_dv.to(dv.dtype.element_ty), mask=m_hv)
        tl.store(p_dg, b_dg.to(dg.dtype.element_ty), mask=m_hk)
        b_ds = b_ds * b_lam[:, :, None]
        p_q += s_k
        p_g += s_k
        p_dq += s_k
        p_dg += s_k
        p_v += s_v
        p_do += s_v
        p_dv += s_v
    if STORE_DH0:
        tl.store(dh0 + i_b * H * K * V + o_s, b_ds, mask=m_s)
