"""Chunk states of the HGRN2 recurrence in two passes: chunk-parallel products, then a light scan.

The state at the start of chunk n+1 is ``S_{n+1} = exp(B_n) * S_n + D_n`` (rows scaled per key
channel), with ``B_n`` the chunk's total log decay and ``D_n = (k * exp(B_n - b))^T v`` its own
contribution. The gradient of the state runs the other way: ``dS_n = exp(B_n) * dS_{n+1} + E_n`` with
``E_n = (q * exp(b))^T dO``. ``hgrn2_chunk_outer_kernel`` computes every ``D_n`` (or ``E_n``) and
``B_n`` in parallel over chunks; ``hgrn2_state_scan_kernel`` then walks the chunks doing only a
multiply-add per state element, so the sequential part carries no matrix product, reduction or scan
(the fused kernels in ``hgrn2_chunk_kernels`` do all of it inside the sequential loop). Costs one extra
round trip of the fp32 products through memory.

A third way (``hgrn2_chunk_decay_kernel`` + ``hgrn2_state_pass_kernel``) moves only what depends on the
decays out of the sequential loop: the chunk-parallel pass writes the product's operand ``k * exp(B - b)``
(or ``q * exp(b)``) in the dot dtype and ``B``; the sequential pass keeps the matrix product but no
cumulative sum, exponential or reduction, and reads half as many bytes per chunk as the scan above.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .hgrn2_chunk_kernels import _cast, _chunk_rows, _neg_expm1, _prefix_decay, _state_tile, _suffix_decay_of


@triton.jit
def _state_operand(x, g, i_n, i_bh, T, H, K: tl.constexpr, o_k, m_k, BT: tl.constexpr, REVERSE: tl.constexpr,
                   KEYS: tl.constexpr, EMU: tl.constexpr):
    """Chunk ``i_n``'s operand of the state product, fp32 ``[BT, BK]``, and its log decays ``g``:
    KEYS, ``k * exp(B - b)`` with k = 1 - exp(g) (x unused); else ``x * exp(b)``. Rows past T are 0."""
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    g_base = g + (i_b * T * H + i_h) * K
    p_tk = pos[:, None] * (H * K) + o_k[None, :]
    m_tk = valid[:, None] & m_k[None, :]
    b_graw = tl.load(g_base + p_tk, mask=m_tk, other=0.0)
    b_g = b_graw.to(tl.float32)
    if KEYS:
        b_x = _neg_expm1(b_g) * tl.exp(_suffix_decay_of(b_graw, g_base, i_n, T, H, K, o_k, m_k, BT, REVERSE, EMU))
    else:
        b_x = tl.load(x + (i_b * T * H + i_h) * K + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_x = b_x * tl.exp(_prefix_decay(b_graw, EMU))
    return b_x, b_g


@triton.jit(do_not_specialize=["T"])
def hgrn2_chunk_outer_kernel(
    x, g, y, D, LB,
    T, H, NT,
    K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, KEYS: tl.constexpr, DOT_BF16: tl.constexpr, EMU: tl.constexpr,
):
    """Grid (NT * BH, K/BK, V/BV). KEYS: ``D_n = (k * exp(B - b))^T y`` with k = 1 - exp(g) (x unused;
    y = v); else ``E_n = (x * exp(b))^T y`` (x = q, y = dO). D: fp32 ``[BH, NT, K, V]``; LB: fp32
    ``[BH, NT, K]``, the chunk's total log decay (written by the i_v == 0 programs). DOT_BF16: bf16
    operands (16-bit inputs), else tf32."""
    i_nbh, i_k, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = i_nbh % NT
    i_bh = i_nbh // NT
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    b_y = tl.load(y + (i_b * T * H + i_h) * V + pos[:, None] * (H * V) + o_v[None, :],
                  mask=valid[:, None] & m_v[None, :], other=0.0)
    b_x, b_g = _state_operand(x, g, i_n, i_bh, T, H, K, o_k, m_k, BT, REVERSE, KEYS, EMU)
    if DOT_BF16:
        b_d = tl.dot(tl.trans(_cast(b_x, tl.bfloat16, EMU)), _cast(b_y, tl.bfloat16, EMU))
    else:
        b_d = tl.dot(tl.trans(b_x), b_y.to(tl.float32))
    chunk = i_bh.to(tl.int64) * NT + i_n
    tl.store(D + chunk * (K * V) + o_k[:, None] * V + o_v[None, :], b_d, mask=m_k[:, None] & m_v[None, :])
    if i_v == 0:
        tl.store(LB + chunk * K + o_k, tl.sum(b_g, axis=0), mask=m_k)


@triton.jit
def hgrn2_state_scan_kernel(
    D, LB, h, s0, sT,
    NT, BH,  # BH = B * H: only an autotune key
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BACKWARD: tl.constexpr, HAS_S0: tl.constexpr, STORE_ST: tl.constexpr,
):
    """Grid (K/BK, V/BV, BH). Forward: h[n] = S before chunk n, S <- exp(LB_n) * S + D_n from s0
    (the initial state) to sT (the final state). BACKWARD: chunks from last to first, h[n] = dS after
    chunk n, from s0 = d final state to sT = d initial state. h in its own dtype, s0 / sT fp32."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_k, o_v, m_k, m_v, o_s, m_s, b_s = _state_tile(s0, i_k, i_v, i_bh, K, V, BK, BV, HAS_S0)
    base = i_bh.to(tl.int64) * NT
    for i in range(NT):
        if BACKWARD:
            i_n = NT - 1 - i
        else:
            i_n = i
        tl.store(h + (base + i_n) * (K * V) + o_s, b_s.to(h.dtype.element_ty), mask=m_s)
        b_d = tl.load(D + (base + i_n) * (K * V) + o_s, mask=m_s, other=0.0)
        b_lb = tl.load(LB + (base + i_n) * K + o_k, mask=m_k, other=0.0)
        b_s = b_s * tl.exp(b_lb)[:, None] + b_d
    if STORE_ST:
        tl.store(sT + i_bh.to(tl.int64) * K * V + o_s, b_s, mask=m_s)


@triton.jit(do_not_specialize=["T"])
def hgrn2_chunk_decay_kernel(
    x, g, xt, LB,
    T, H, NT,
    K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    REVERSE: tl.constexpr, KEYS: tl.constexpr, EMU: tl.constexpr,
):
    """Grid (NT * BH, K/BK). The chunk's operand of the state product, in xt's dtype (the dot dtype;
    with EMU, fp32 storage of bf16-rounded values): KEYS, ``k * exp(B - b)`` with k = 1 - exp(g) (x
    unused); else ``x * exp(b)`` (x = q). xt: ``[BH, NT, BT, K]``, the chunk's rows in step order, rows
    past T zero. LB: fp32 ``[BH, NT, K]``, the chunk's total log decay B."""
    i_nbh, i_k = tl.program_id(0), tl.program_id(1)
    i_n = i_nbh % NT
    i_bh = i_nbh // NT
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    o_t = tl.arange(0, BT)
    b_x, b_g = _state_operand(x, g, i_n, i_bh, T, H, K, o_k, m_k, BT, REVERSE, KEYS, EMU)
    chunk = i_bh.to(tl.int64) * NT + i_n
    tl.store(xt + (chunk * BT + o_t[:, None]) * K + o_k[None, :],
             _cast(b_x, xt.dtype.element_ty, EMU), mask=m_k[None, :])
    tl.store(LB + chunk * K + o_k, tl.sum(b_g, axis=0), mask=m_k)


@triton.jit
def _state_pass_loads(xt, y_base, LB, base, i_n, T, H, V: tl.constexpr, K: tl.constexpr, o_k, m_k, o_v, m_v,
                      BT: tl.constexpr, REVERSE: tl.constexpr):
    """Chunk ``i_n``'s tiles for ``hgrn2_state_pass_kernel``: xt ``[BT, BK]``, y ``[BT, BV]`` and B
    ``[BK]``. A chunk past the end (i_n = NT) loads nothing."""
    o_t = tl.arange(0, BT)
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    b_x = tl.load(xt + ((base + i_n) * BT + o_t[:, None]) * K + o_k[None, :],
                  mask=valid[:, None] & m_k[None, :], other=0.0)
    b_y = tl.load(y_base + pos[:, None] * (H * V) + o_v[None, :], mask=valid[:, None] & m_v[None, :], other=0.0)
    b_lb = tl.load(LB + (base + i_n) * K + o_k, mask=m_k & (o_k * 0 + i_n * BT < T), other=0.0)
    return b_x, b_y, b_lb


@triton.jit(do_not_specialize=["T"])
def hgrn2_state_pass_kernel(
    xt, y, LB, h, s0, sT,
    T, H, NT, BH,  # BH = B * H: only an autotune key
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, BACKWARD: tl.constexpr, HAS_S0: tl.constexpr, STORE_ST: tl.constexpr,
    EMU: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Grid (K/BK, V/BV, BH), sequential over chunks, with xt and LB from ``hgrn2_chunk_decay_kernel``
    and y = v (forward) or dO (BACKWARD), ``[B, T, H, V]``. Forward: h[n] = S before chunk n,
    S <- exp(B_n) * S + xt_n^T y_n from s0 (initial state) to sT (final state). BACKWARD: from the last
    chunk to the first, h[n] = dS after chunk n, from s0 = d final state to sT = d initial state. h in
    its own dtype (the dot dtype), s0 / sT fp32. PREFETCH: the next chunk's tiles are loaded before the
    current chunk's product."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    DT = h.dtype.element_ty
    o_k, o_v, m_k, m_v, o_s, m_s, b_s = _state_tile(s0, i_k, i_v, i_bh, K, V, BK, BV, HAS_S0)
    base = i_bh.to(tl.int64) * NT
    y_base = y + (i_b * T * H + i_h) * V
    if PREFETCH:
        if BACKWARD:
            n_x, n_y, n_lb = _state_pass_loads(xt, y_base, LB, base, NT - 1, T, H, V, K, o_k, m_k, o_v, m_v, BT,
                                               REVERSE)
        else:
            n_x, n_y, n_lb = _state_pass_loads(xt, y_base, LB, base, 0, T, H, V, K, o_k, m_k, o_v, m_v, BT, REVERSE)
    for i in range(NT):
        if BACKWARD:
            i_n = NT - 1 - i
            # (after chunk 0 there is none: NT lies past the end and loads nothing)
            i_next = tl.where(i_n > 0, i_n - 1, NT)
        else:
            i_n = i
            i_next = i + 1
        tl.store(h + (base + i_n) * (K * V) + o_s, _cast(b_s, DT, EMU), mask=m_s)
        if PREFETCH:
            b_x, b_y, b_lb = n_x, n_y, n_lb
            n_x, n_y, n_lb = _state_pass_loads(xt, y_base, LB, base, i_next, T, H, V, K, o_k, m_k, o_v, m_v, BT,
                                               REVERSE)
        else:
            b_x, b_y, b_lb = _state_pass_loads(xt, y_base, LB, base, i_n, T, H, V, K, o_k, m_k, o_v, m_v, BT,
                                               REVERSE)
        b_s = b_s * tl.exp(b_lb)[:, None] + tl.dot(tl.trans(_cast(b_x, DT, EMU)), _cast(b_y, DT, EMU))
    if STORE_ST:
        tl.store(sT + i_bh.to(tl.int64) * K * V + o_s, b_s, mask=m_s)
