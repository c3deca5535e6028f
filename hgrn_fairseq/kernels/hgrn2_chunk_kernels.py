"""Chunked Triton kernels of the HGRN2 recurrence (training path).

Per head, with ``g = log_decay <= 0``, ``lambda = exp(g)`` and ``k = 1 - lambda`` (derived here from
``g``, never read from memory)::

    S_t = Diag(lambda_t) S_{t-1} + k_t^T v_t,        o_t = q_t S_t          (scale 1)

The sequence is cut into chunks of ``BT`` steps. Inside a chunk, with ``b`` the inclusive cumulative
sum of ``g`` from the chunk start and ``B`` its total::

    o_i     = (q_i * exp(b_i)) S_n + sum_{j <= i} A_ij v_j,   A_ij = sum_c q_ic k_jc exp(b_ic - b_jc)
    S_{n+1} = exp(B) * S_n + sum_j (k_j * exp(B - b_j))^T v_j

Every exponent in the inter-chunk terms is <= 0. The intra-chunk products exp(b_i - b_j), i >= j, are
factorised as exp(b_i - r) * exp(r - b_j) so that ``A`` becomes a matrix product, on one of three
paths chosen per chunk (and per group of BK channels) from the decays themselves:

1. one reference in the middle of the chunk, when each half chunk decays by at most ``CSAFE`` (natural
   log units) in every channel: every factor lies in exp(+-CSAFE); one product per chunk. (The upper
   triangle, i < j, may overflow; it is masked away.)
2. otherwise four blocks of ``BC`` rows: rows of block I and columns of earlier blocks factor through
   the cumulative decay at the end of block I-1, both exponents <= 0 (exact for any decay); the
   diagonal blocks through the same reference when the block decays by at most ``SAFE``;
3. diagonal blocks that decay faster are computed element by element with exponents summed term by
   term (slower, exact, cannot overflow).

All three are tested (the thresholds can be set to 0 to force paths 2 and 3). Path 1's products
(A, and dA's two in the backward) take operands in the dot dtype when ``LOWP`` (bf16 for 16-bit inputs,
with A and dA stored in it; ``hgrn2_triton.INTRA_DOT``), else fp32 (tf32 on the GPU); paths 2 and 3
always run in fp32 (the forward's four block products of path 2 in full fp32: see ``_intra_A_blocks``).

Paths 2 and 3 are rare with realistic decays but their code doubles the registers of a kernel that
contains it (255 against 128-152 on sm_90, bf16, head dim 128), which halves the occupancy. So the
output and dq/dg kernels can run in two launches (``FAST_ONLY``, then ``REDO``): path 1 alone for every
chunk, the forward appending the chunks that need another path to a small list, then a few programs
that take the listed chunks again with every path. ``hgrn2_triton`` uses this for heads of at least
``SPLIT_MIN_HEAD`` and one launch with every path otherwise.

Kernels (``BH`` = batch * heads, ``NT`` = chunks):

* ``fwd_states``  sequential over chunks, grid (K/BK, V/BV, BH): the state at the start of each chunk
  (stored in the dot dtype), and the final state (fp32). (``hgrn2_state_kernels`` has the split
  version: chunk-parallel products, then a scan.)
* ``fwd_output``  grid (NT, BH): ``A`` (stored for the backward when training) and ``o`` (plus a REDO
  launch, see above).
* ``bwd_dstates`` sequential in reverse, grid (K/BK, V/BV, BH): the gradient of the state at the end
  of each chunk, and of the initial state (fp32).
* ``bwd_dv``      grid (NT, BH): ``dv`` and ``dA = dO v^T`` (masked).
* ``bwd_dqdg``    grid (K/BK, NT, BH): ``dq`` and ``dg`` (``dk`` folds into ``dg`` since k = 1 - exp(g));
  REDO launch over the forward's list.

Memory layout: q, g ``[B, T, H, K]``, v, o ``[B, T, H, V]`` (batch-first, contiguous); states
``[BH, NT, K, V]``; A, dA ``[BH, NT, BT, BT]``. ``reverse`` maps step t to position T-1-t in every
load and store. Offsets that can pass 2**31 are computed in int64; T is never a compile-time constant.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _one_minus(g, lam):
    """k = 1 - lam with lam = exp(g) <= 1, without cancellation when g is close to 0."""
    poly = -g * (1.0 + g * (0.5 + g * (0.16666666666666666 + g * (0.041666666666666664 + g * 0.008333333333333333))))
    return tl.where(g > -0.0625, poly, 1.0 - lam)


@triton.jit
def _neg_expm1(g):
    """1 - exp(g) for g <= 0, without cancellation when g is close to 0."""
    return _one_minus(g, tl.exp(g))


@triton.jit
def _cast(x, DT: tl.constexpr, EMU: tl.constexpr):
    """Operand of a matrix product: x in the dot dtype DT. EMU (the CPU interpreter, whose bf16 dot is
    unreliable) keeps fp32 storage but rounds to bf16 like the GPU path does."""
    if EMU:
        return x.to(tl.bfloat16).to(tl.float32)
    else:
        return x.to(DT)


@triton.jit
def _chunk_rows(i_n, T, BT: tl.constexpr, REVERSE: tl.constexpr):
    """Sequence positions (int64) of the rows of chunk ``i_n`` and their validity mask."""
    t = i_n * BT + tl.arange(0, BT)
    valid = t < T
    if REVERSE:
        pos = T - 1 - t
    else:
        pos = t
    pos = tl.where(valid, pos, 0)
    return pos.to(tl.int64), valid


@triton.jit
def _row_pos(t, T, REVERSE: tl.constexpr):
    """Sequence positions (int64) of arbitrary steps ``t`` (gathers) and their validity mask."""
    valid = t < T
    if REVERSE:
        pos = T - 1 - t
    else:
        pos = t
    pos = tl.where(valid, pos, 0)
    return pos.to(tl.int64), valid


@triton.jit
def _tile(base, pos, valid, stride, o_c, m_c):
    """Rows ``pos`` (valid ones) by channels ``o_c`` (``m_c``) of a ``[.., T, H, C]`` tensor whose time
    stride is ``stride``, in its own dtype; masked elements are 0."""
    return tl.load(base + pos[:, None] * stride + o_c[None, :], mask=valid[:, None] & m_c[None, :], other=0.0)


@triton.jit
def _shifted_g(g_base, i_n, T, H, K: tl.constexpr, o_k, m_k, BT: tl.constexpr, REVERSE: tl.constexpr):
    """g of chunk i_n shifted up by one row (row j holds step j + 1; the last row and steps past T are 0)."""
    o_t = tl.arange(0, BT)
    posn, validn = _row_pos(i_n * BT + o_t + 1, T, REVERSE)
    return _tile(g_base, posn, validn & (o_t + 1 < BT), H * K, o_k, m_k)


@triton.jit
def _suffix_sums(b_gn):
    """Exclusive suffix sums from the shifted rows of ``_shifted_g``: row j gets sum_{m > j} g_m (the log
    of the decay from step j to the chunk end), rather than B - b_j, which would cancel when the decay
    is steep."""
    return tl.cumsum(b_gn.to(tl.float32), axis=0, reverse=True)


@triton.jit
def _suffix_decay(g_base, i_n, T, H, K: tl.constexpr, o_k, m_k, BT: tl.constexpr, REVERSE: tl.constexpr):
    """Exclusive suffix sums of g inside chunk i_n (see ``_suffix_sums``)."""
    return _suffix_sums(_shifted_g(g_base, i_n, T, H, K, o_k, m_k, BT, REVERSE))


@triton.jit
def _triangle_sums(b_g, SUFFIX: tl.constexpr, EMU: tl.constexpr):
    """Sums down the rows of a 16-bit ``[BT, BK]`` tile as one product with a triangular 0/1 matrix on
    the tensor cores (exact products, fp32 accumulation): SUFFIX=False, inclusive prefix sums; True,
    exclusive suffix sums. EMU: the product in fp32 (the interpreter; same values)."""
    o_t = tl.arange(0, b_g.shape[0])
    if SUFFIX:
        tri = o_t[:, None] < o_t[None, :]
    else:
        tri = o_t[:, None] >= o_t[None, :]
    if EMU:
        return tl.dot(tri.to(tl.float32), b_g.to(tl.float32))
    else:
        return tl.dot(tri.to(b_g.dtype), b_g)


@triton.jit
def _prefix_decay(b_g, EMU: tl.constexpr):
    """Cumulative log decay b (fp32, inclusive) of a chunk's ``[BT, BK]`` tile of g in its loaded dtype:
    16-bit tiles through ``_triangle_sums`` (a scan's shuffles and cross-warp shared-memory steps stall
    the kernels), fp32 tiles through tl.cumsum (a tf32 product would round g)."""
    if b_g.dtype == tl.float32:
        return tl.cumsum(b_g, axis=0)
    else:
        return _triangle_sums(b_g, False, EMU)


@triton.jit
def _suffix_decay_of(b_g, g_base, i_n, T, H, K: tl.constexpr, o_k, m_k, BT: tl.constexpr, REVERSE: tl.constexpr,
                     EMU: tl.constexpr):
    """``_suffix_decay`` given the chunk's g tile in its loaded dtype: 16-bit tiles through
    ``_triangle_sums`` (no second load, no scan), fp32 ones as ``_suffix_decay``."""
    if b_g.dtype == tl.float32:
        return _suffix_decay(g_base, i_n, T, H, K, o_k, m_k, BT, REVERSE)
    else:
        return _triangle_sums(b_g, True, EMU)


@triton.jit
def _state_tile(s0, i_k, i_v, i_bh, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                HAS_S0: tl.constexpr):
    """Tile (i_k, i_v) of head i_bh's K x V state for the sequential state passes: its key and value
    channels and masks, its offsets and mask inside a state, and its starting value in fp32 (``s0``'s
    tile when HAS_S0, else zeros)."""
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    o_s = o_k[:, None] * V + o_v[None, :]
    m_s = m_k[:, None] & m_v[None, :]
    if HAS_S0:
        b_s = tl.load(s0 + i_bh.to(tl.int64) * K * V + o_s, mask=m_s, other=0.0).to(tl.float32)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)
    return o_k, o_v, m_k, m_v, o_s, m_s, b_s


@triton.jit
def _fwd_states_loads(g_base, v_base, i_n, T, H, K: tl.constexpr, V: tl.constexpr, o_k, m_k, o_v, m_v,
                      BT: tl.constexpr, REVERSE: tl.constexpr):
    """Chunk ``i_n``'s tiles for the forward state pass, in the input dtype: g, v and ``_shifted_g``.
    A chunk past the end loads nothing (all masked: zeros)."""
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    return (_tile(g_base, pos, valid, H * K, o_k, m_k), _tile(v_base, pos, valid, H * V, o_v, m_v),
            _shifted_g(g_base, i_n, T, H, K, o_k, m_k, BT, REVERSE))


@triton.jit(do_not_specialize=["T"])
def hgrn2_fwd_states_kernel(
    g, v, h, h0, ht,
    T, H, NT, BH,  # BH = B * H: only an autotune key
    K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, EMU: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """PREFETCH: the loads of chunk n+1 are issued before chunk n is computed (they do not depend on
    the state), so their latency hides behind the chunk's work instead of adding to it."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    DT = h.dtype.element_ty
    o_k, o_v, m_k, m_v, o_s, m_s, b_s = _state_tile(h0, i_k, i_v, i_bh, K, V, BK, BV, HAS_H0)
    g_base = g + (i_b * T * H + i_h) * K
    v_base = v + (i_b * T * H + i_h) * V
    h_base = h + i_bh.to(tl.int64) * NT * K * V
    if PREFETCH:
        n_g, n_v, n_gn = _fwd_states_loads(g_base, v_base, 0, T, H, K, V, o_k, m_k, o_v, m_v, BT, REVERSE)
    for i_n in range(NT):
        tl.store(h_base + i_n * K * V + o_s, _cast(b_s, DT, EMU), mask=m_s)
        if PREFETCH:
            b_g, b_v, b_gn = n_g, n_v, n_gn
            n_g, n_v, n_gn = _fwd_states_loads(g_base, v_base, i_n + 1, T, H, K, V, o_k, m_k, o_v, m_v, BT,
                                               REVERSE)
        else:
            b_g, b_v, b_gn = _fwd_states_loads(g_base, v_base, i_n, T, H, K, V, o_k, m_k, o_v, m_v, BT, REVERSE)
        b_g = b_g.to(tl.float32)
        b_B = tl.sum(b_g, axis=0)
        b_kt = _neg_expm1(b_g) * tl.exp(_suffix_sums(b_gn))
        b_s = b_s * tl.exp(b_B)[:, None] + tl.dot(tl.trans(_cast(b_kt, DT, EMU)), _cast(b_v, DT, EMU))
    if STORE_HT:
        tl.store(ht + i_bh.to(tl.int64) * K * V + o_s, b_s, mask=m_s)


@triton.jit
def _row_of(b_b, o_t, row: tl.constexpr):
    """Row ``row`` of a [BT, BK] tile, as a [BK] vector."""
    return tl.sum(tl.where((o_t == row)[:, None], b_b, 0.0), axis=0)


@triton.jit
def _block_refs(b_b, o_t, blk, BC: tl.constexpr, SAFE: tl.constexpr):
    """The four blocks of a chunk (BT = 4 * BC). r1, r2, r3: the cumulative decay at the end of blocks
    0, 1, 2, i.e. the references of blocks 1, 2, 3 (block 0's is 0); r4: at the chunk end (= B).
    s0..s3 (int32 scalars): 1 where the block's decay stays within SAFE in every channel.
    Per row: r_blk ([BT, BK], its block's reference) and safe_row ([BT])."""
    r1 = _row_of(b_b, o_t, BC - 1)
    r2 = _row_of(b_b, o_t, 2 * BC - 1)
    r3 = _row_of(b_b, o_t, 3 * BC - 1)
    r4 = _row_of(b_b, o_t, 4 * BC - 1)
    s0 = (tl.min(r1, axis=0) >= -SAFE).to(tl.int32)
    s1 = (tl.min(r2 - r1, axis=0) >= -SAFE).to(tl.int32)
    s2 = (tl.min(r3 - r2, axis=0) >= -SAFE).to(tl.int32)
    s3 = (tl.min(r4 - r3, axis=0) >= -SAFE).to(tl.int32)
    r_blk = tl.where((blk == 1)[:, None], r1[None, :],
                     tl.where((blk == 2)[:, None], r2[None, :], tl.where((blk == 3)[:, None], r3[None, :], 0.0)))
    safe_row = tl.where(blk == 0, s0, tl.where(blk == 1, s1, tl.where(blk == 2, s2, s3)))
    return r1, r2, r3, r4, s0, s1, s2, s3, r_blk, safe_row


@triton.jit
def _intra_cols(b_b, r, blk, I: tl.constexpr, safe):
    """For rows of block I (reference r): exp(r - b_j) for the columns j it multiplies through the
    factorisation (earlier blocks, and block I itself when safe), 0 elsewhere. <= 1 for earlier
    blocks, <= exp(SAFE) inside a safe block; masked before exp, so nothing overflows."""
    cols = (blk < I) | ((blk == I) & ((blk * 0 + safe) > 0))
    return tl.exp(tl.where(cols[:, None], r[None, :] - b_b, float("-inf")))


@triton.jit
def _intra_A_blocks(b_q, b_k, b_b, o_t, blk, off, i_n, T, H, K: tl.constexpr, g_base, o_k, m_k,
                    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, SAFE: tl.constexpr,
                    REVERSE: tl.constexpr):
    """Intra-chunk A (lower triangle, these channels) through four block references, with exact
    element-by-element diagonal blocks where a block decays by more than SAFE."""
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    r1, r2, r3, r4, s0, s1, s2, s3, r_blk, safe_row = _block_refs(b_b, o_t, blk, BC, SAFE)
    unsafe = 1 - safe_row
    # q scaled to the start of its own block: exponent b - r_blk <= 0
    b_qh = b_q * tl.exp(b_b - r_blk)
    # The four products below run in full fp32 ("ieee"), not tf32: with Triton 3.6 on the GPU (BK 32,
    # 8 warps) this chain of four tf32 products accumulating into one tile returned wrong rows for
    # blocks 0-2 (errors of order 1 in A). Full fp32 products are right in every configuration tested.
    b_A += tl.dot(tl.where((blk == 0)[:, None], b_qh, 0.0),
                  tl.trans(b_k * _intra_cols(b_b, r1 * 0.0, blk, 0, s0)), input_precision="ieee")
    b_A += tl.dot(tl.where((blk == 1)[:, None], b_qh, 0.0),
                  tl.trans(b_k * _intra_cols(b_b, r1, blk, 1, s1)), input_precision="ieee")
    b_A += tl.dot(tl.where((blk == 2)[:, None], b_qh, 0.0),
                  tl.trans(b_k * _intra_cols(b_b, r2, blk, 2, s2)), input_precision="ieee")
    b_A += tl.dot(tl.where((blk == 3)[:, None], b_qh, 0.0),
                  tl.trans(b_k * _intra_cols(b_b, r3, blk, 3, s3)), input_precision="ieee")

    if tl.sum(unsafe, axis=0) > 0:
        # exact diagonal blocks where the decay is too steep to factor, one column offset jj at a
        # time (from the block end down): b_f[i] = sum_{m=j+1}^{i} g_m for j = block start + jj,
        # summed term by term so that it stays accurate however steep the decay is
        b_f = tl.zeros([BT, BK], dtype=tl.float32)
        for it in range(BC):
            jj = BC - 1 - it
            jrow = blk * BC + jj
            posj, validj = _row_pos(i_n * BT + jrow, T, REVERSE)
            b_gj = tl.load(g_base + posj[:, None] * (H * K) + o_k[None, :],
                           mask=validj[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            m = (off >= jj) & (unsafe > 0)
            b_e = tl.exp(tl.where(m[:, None], b_f, float("-inf")))
            b_a = tl.sum(b_q * _neg_expm1(b_gj) * b_e, axis=1)
            b_A += tl.where((o_t[None, :] == jrow[:, None]) & m[:, None], b_a[:, None], 0.0)
            b_f = tl.where((off >= jj)[:, None], b_f + b_gj, 0.0)

    return b_A


@triton.jit
def _output_loads(q_base, g_base, h, chunk, pos, valid, i_k, H, K: tl.constexpr, V: tl.constexpr, o_v, m_v,
                  BK: tl.constexpr):
    """Channels ``i_k * BK ..`` of one chunk for ``fwd_output``: g and q ``[BT, BK]`` (input dtype) and
    the state rows ``[BK, BV]``. Past the last channel every load is masked."""
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    b_h = tl.load(h + chunk * (K * V) + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
    return _tile(g_base, pos, valid, H * K, o_k, m_k), _tile(q_base, pos, valid, H * K, o_k, m_k), b_h


@triton.jit
def _mid_rows(b_b, o_t, BT: tl.constexpr):
    """Path 1's reference r (the cumulative decay at the middle of the chunk) and the chunk's total B
    (at its last row), as [BK] vectors of a [BT, BK] tile of cumulative decays."""
    return _row_of(b_b, o_t, BT // 2 - 1), _row_of(b_b, o_t, BT - 1)


@triton.jit
def _mid_ref_ok(r_mid, r_end, CSAFE: tl.constexpr):
    """1 (int32) when path 1 can take these channels (``_mid_rows``): each half chunk decays by at most
    CSAFE in every channel, so that every factor through the mid-chunk reference stays within
    exp(+-CSAFE)."""
    return (tl.min(r_mid, axis=0) >= -CSAFE).to(tl.int32) * (tl.min(r_end - r_mid, axis=0) >= -CSAFE).to(tl.int32)


@triton.jit
def _mid_ref_A(b_q, b_k, b_b, r_mid, DT: tl.constexpr, EMU: tl.constexpr, LOWP: tl.constexpr):
    """Path 1's product ``(q * exp(b - r)) (k * exp(r - b))^T`` with r the cumulative decay at the
    middle of the chunk; operands in the dot dtype (LOWP) or fp32. Entries above the diagonal may
    overflow (they are masked later)."""
    b_qx = b_q * tl.exp(b_b - r_mid[None, :])
    b_ky = b_k * tl.exp(r_mid[None, :] - b_b)
    if LOWP:
        return tl.dot(_cast(b_qx, DT, EMU), tl.trans(_cast(b_ky, DT, EMU)))
    else:
        return tl.dot(b_qx, tl.trans(b_ky))


@triton.jit
def _output_chunk(q, v, g, h, o, A, i_n, i_bh, T, H, NT,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, SAFE: tl.constexpr, CSAFE: tl.constexpr, REVERSE: tl.constexpr,
                  STORE_A: tl.constexpr, EMU: tl.constexpr, PREFETCH: tl.constexpr, LOWP: tl.constexpr,
                  FAST_ONLY: tl.constexpr, ACCUM: tl.constexpr):
    """Chunk ``i_n`` of head ``i_bh``: A = sum over channels (BK at a time) of the intra-chunk products,
    then o = (q * exp(b)) S_n + A v. PREFETCH: the next BK channels' tiles are loaded before the current
    ones are computed. FAST_ONLY: path 1 only; when some channels need another path nothing is stored
    and 0 is returned (otherwise 1). ACCUM: o is added to what ``o`` holds (the other scan direction's
    output) instead of overwriting it."""
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    DT = h.dtype.element_ty
    tl.static_assert(BT == 4 * BC, "the intra-chunk code is written for four blocks per chunk")
    NK: tl.constexpr = (K + BK - 1) // BK
    o_t = tl.arange(0, BT)
    o_v = tl.arange(0, BV)
    m_v = o_v < V
    blk = o_t // BC
    off = o_t % BC
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    q_base = q + (i_b * T * H + i_h) * K
    g_base = g + (i_b * T * H + i_h) * K
    chunk = i_bh.to(tl.int64) * NT + i_n

    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    done = i_n * 0 + 1
    if PREFETCH:
        n_g, n_q, n_h = _output_loads(q_base, g_base, h, chunk, pos, valid, 0, H, K, V, o_v, m_v, BK)
    for i_k in range(NK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        if PREFETCH:
            b_g, b_q, b_hk = n_g, n_q, n_h
            n_g, n_q, n_h = _output_loads(q_base, g_base, h, chunk, pos, valid, i_k + 1, H, K, V, o_v, m_v,
                                            BK)
        else:
            b_g, b_q, b_hk = _output_loads(q_base, g_base, h, chunk, pos, valid, i_k, H, K, V, o_v, m_v, BK)
        b_b = _prefix_decay(b_g, EMU)
        b_g = b_g.to(tl.float32)
        b_q = b_q.to(tl.float32)
        b_k = _neg_expm1(b_g)
        b_o += tl.dot(_cast(b_q * tl.exp(b_b), DT, EMU), b_hk)
        r_mid, r_end = _mid_rows(b_b, o_t, BT)
        if FAST_ONLY:
            done = done * _mid_ref_ok(r_mid, r_end, CSAFE)
            b_A += _mid_ref_A(b_q, b_k, b_b, r_mid, DT, EMU, LOWP)
        else:
            # one reference (mid-chunk) for the whole chunk when every factor stays within exp(+-CSAFE);
            # otherwise the four-block path. Only the lower triangle of A is kept: the upper one may
            # overflow.
            if _mid_ref_ok(r_mid, r_end, CSAFE) > 0:
                b_A += _mid_ref_A(b_q, b_k, b_b, r_mid, DT, EMU, LOWP)
            else:
                b_A += _intra_A_blocks(b_q, b_k, b_b, o_t, blk, off, i_n, T, H, K, g_base, o_k, m_k, BT, BC, BK,
                                       SAFE, REVERSE)

    if done > 0:
        b_A = tl.where(o_t[:, None] >= o_t[None, :], b_A, 0.0)
        if STORE_A:
            tl.store(A + chunk * (BT * BT) + o_t[:, None] * BT + o_t[None, :], b_A.to(A.dtype.element_ty))
        m_tv = valid[:, None] & m_v[None, :]
        p_tv = pos[:, None] * (H * V) + o_v[None, :]
        b_v = _cast(tl.load(v + (i_b * T * H + i_h) * V + p_tv, mask=m_tv, other=0.0), DT, EMU)
        b_o += tl.dot(_cast(b_A, DT, EMU), b_v)
        p_o = o + (i_b * T * H + i_h) * V + p_tv
        if ACCUM:
            b_o += tl.load(p_o, mask=m_tv, other=0.0).to(tl.float32)
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_tv)
    return done


@triton.jit(do_not_specialize=["T"])
def hgrn2_fwd_output_kernel(
    q, v, g, h, o, A, redo,
    T, H, NT, CAP,
    K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SAFE: tl.constexpr, CSAFE: tl.constexpr, REVERSE: tl.constexpr, STORE_A: tl.constexpr, EMU: tl.constexpr,
    PREFETCH: tl.constexpr, LOWP: tl.constexpr, FAST_ONLY: tl.constexpr, REDO: tl.constexpr,
    ACCUM: tl.constexpr = False,
):
    """A and o, one chunk per program, grid (NT, BH), every path available (FAST_ONLY=False, REDO=False);
    or in two launches over ``redo``, an int32 list ``[count, chunk ids...]`` (chunk id =
    i_bh * NT + i_n) with room for CAP ids, whose count starts at 0:

    * FAST_ONLY=True, grid (NT, BH): every chunk through path 1 alone. A chunk with channels that need
      another path stores nothing and appends its id to ``redo``. (Compiled with the other paths,
      this kernel takes twice the registers and runs at half the occupancy.)
    * REDO=True, any grid (P,): the listed chunks, every path available.

    ACCUM: o += this direction's output (``_output_chunk``); with the two launches too, since a chunk
    the first launch lists stores nothing there.
    """
    if REDO:
        n = tl.minimum(tl.load(redo), CAP)
        for i in range(tl.program_id(0), n, tl.num_programs(0)):
            p = tl.load(redo + 1 + i)
            _output_chunk(q, v, g, h, o, A, p % NT, p // NT, T, H, NT, K, V, BT, BC, BK, BV, SAFE, CSAFE, REVERSE,
                          STORE_A, EMU, PREFETCH, LOWP, False, ACCUM)
    else:
        i_n, i_bh = tl.program_id(0), tl.program_id(1)
        done = _output_chunk(q, v, g, h, o, A, i_n, i_bh, T, H, NT, K, V, BT, BC, BK, BV, SAFE, CSAFE, REVERSE,
                             STORE_A, EMU, PREFETCH, LOWP, FAST_ONLY, ACCUM)
        if done == 0:
            slot = tl.atomic_add(redo, 1)
            tl.store(redo + 1 + slot, i_bh * NT + i_n, mask=slot < CAP)


@triton.jit
def _dstates_loads(q_base, g_base, do_base, i_n, T, H, K: tl.constexpr, V: tl.constexpr, o_k, m_k, o_v, m_v,
                   BT: tl.constexpr, REVERSE: tl.constexpr):
    """Chunk ``i_n``'s q, g and dO tiles for the backward state pass, in the input dtype."""
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    return (_tile(q_base, pos, valid, H * K, o_k, m_k), _tile(g_base, pos, valid, H * K, o_k, m_k),
            _tile(do_base, pos, valid, H * V, o_v, m_v))


@triton.jit(do_not_specialize=["T"])
def hgrn2_bwd_dstates_kernel(
    q, g, do, dh, dht, dh0,
    T, H, NT, BH,  # BH = B * H: only an autotune key
    K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, EMU: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """PREFETCH: as in ``hgrn2_fwd_states_kernel`` (the next chunk down is loaded ahead)."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    DT = dh.dtype.element_ty
    o_k, o_v, m_k, m_v, o_s, m_s, b_ds = _state_tile(dht, i_k, i_v, i_bh, K, V, BK, BV, HAS_DHT)
    q_base = q + (i_b * T * H + i_h) * K
    g_base = g + (i_b * T * H + i_h) * K
    do_base = do + (i_b * T * H + i_h) * V
    dh_base = dh + i_bh.to(tl.int64) * NT * K * V
    if PREFETCH:
        n_q, n_g, n_do = _dstates_loads(q_base, g_base, do_base, NT - 1, T, H, K, V, o_k, m_k, o_v, m_v, BT,
                                        REVERSE)
    for i in range(NT):
        i_n = NT - 1 - i
        tl.store(dh_base + i_n * K * V + o_s, _cast(b_ds, DT, EMU), mask=m_s)
        if PREFETCH:
            b_q, b_g, b_do = n_q, n_g, n_do
            # (after chunk 0 there is none: chunk NT lies past the end and loads nothing, whereas chunk
            # -1 would map to valid rows)
            n_q, n_g, n_do = _dstates_loads(q_base, g_base, do_base, tl.where(i_n > 0, i_n - 1, NT), T, H, K,
                                            V, o_k, m_k, o_v, m_v, BT, REVERSE)
        else:
            b_q, b_g, b_do = _dstates_loads(q_base, g_base, do_base, i_n, T, H, K, V, o_k, m_k, o_v, m_v, BT,
                                            REVERSE)
        b_q = b_q.to(tl.float32)
        b_g = b_g.to(tl.float32)
        b_b = tl.cumsum(b_g, axis=0)
        b_B = tl.sum(b_g, axis=0)
        b_qt = _cast(b_q * tl.exp(b_b), DT, EMU)
        b_ds = b_ds * tl.exp(b_B)[:, None] + tl.dot(tl.trans(b_qt), _cast(b_do, DT, EMU))
    if STORE_DH0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + o_s, b_ds, mask=m_s)


@triton.jit(do_not_specialize=["T"])
def hgrn2_bwd_dv_kernel(
    v, g, do, dh, A, dv, dA,
    T, H, NT,
    K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REVERSE: tl.constexpr, EMU: tl.constexpr, LOWP: tl.constexpr, ACCUM: tl.constexpr = False,
):
    """One chunk: dA = dO v^T (causal mask), then dv = A^T dO + (k * exp(B - b)) dS_{n+1} (ACCUM: added to
    what ``dv`` holds, the other scan direction's dv)."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    DT = dh.dtype.element_ty
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    g_base = g + (i_b * T * H + i_h) * K
    m_tv = valid[:, None] & m_v[None, :]
    p_tv = pos[:, None] * (H * V) + o_v[None, :]
    chunk = i_bh.to(tl.int64) * NT + i_n
    o_a = o_t[:, None] * BT + o_t[None, :]

    b_do = _cast(tl.load(do + (i_b * T * H + i_h) * V + p_tv, mask=m_tv, other=0.0), DT, EMU)
    b_v = _cast(tl.load(v + (i_b * T * H + i_h) * V + p_tv, mask=m_tv, other=0.0), DT, EMU)
    b_dA = tl.dot(b_do, tl.trans(b_v))
    tl.store(dA + chunk * (BT * BT) + o_a, tl.where(o_t[:, None] >= o_t[None, :], b_dA, 0.0).to(dA.dtype.element_ty))

    # (the suffix sums by a scan: with _suffix_decay_of's triangular product this kernel's dv is 12-15%
    # off on the GPU at V = 16 and 32 in bf16 with Triton 3.6, while V = 64 and 128 are right; the cause
    # was not found)
    b_g = tl.load(g_base + pos[:, None] * (H * K) + o_k[None, :],
                  mask=valid[:, None] & m_k[None, :], other=0.0).to(tl.float32)
    b_kt = _cast(_neg_expm1(b_g) * tl.exp(_suffix_decay(g_base, i_n, T, H, K, o_k, m_k, BT, REVERSE)), DT, EMU)
    b_dh = tl.load(dh + chunk * (K * V) + o_k[:, None] * V + o_v[None, :],
                   mask=m_k[:, None] & m_v[None, :], other=0.0)
    b_dv = tl.dot(b_kt, b_dh)
    b_A = tl.load(A + chunk * (BT * BT) + o_a)
    if LOWP:
        b_dv += tl.dot(tl.trans(_cast(b_A, DT, EMU)), b_do)
    else:
        b_dv += tl.dot(tl.trans(b_A), b_do.to(tl.float32))
    p_dv = dv + (i_b * T * H + i_h) * V + p_tv
    if ACCUM:
        b_dv += tl.load(p_dv, mask=m_tv, other=0.0).to(tl.float32)
    tl.store(p_dv, b_dv.to(dv.dtype.element_ty), mask=m_tv)


@triton.jit
def _intra_grad_blocks(b_q, b_k, b_b, b_dA, dA_base, o_t, blk, off, i_n, T, H, K: tl.constexpr, q_base, g_base,
                       o_k, m_k, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, SAFE: tl.constexpr,
                       REVERSE: tl.constexpr):
    """Intra-chunk parts of dq and dk through four block references (see _intra_A_blocks)."""
    r1, r2, r3, r4, s0, s1, s2, s3, r_blk, safe_row = _block_refs(b_b, o_t, blk, BC, SAFE)
    unsafe = 1 - safe_row
    b_x = tl.exp(b_b - r_blk)
    b_qh = b_q * b_x
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_e = _intra_cols(b_b, r1 * 0.0, blk, 0, s0)
    b_dAI = tl.where((blk == 0)[:, None], b_dA, 0.0)
    b_dqh = tl.dot(b_dAI, b_k * b_e)
    b_dk += tl.dot(tl.trans(b_dAI), tl.where((blk == 0)[:, None], b_qh, 0.0)) * b_e
    b_e = _intra_cols(b_b, r1, blk, 1, s1)
    b_dAI = tl.where((blk == 1)[:, None], b_dA, 0.0)
    b_dqh += tl.dot(b_dAI, b_k * b_e)
    b_dk += tl.dot(tl.trans(b_dAI), tl.where((blk == 1)[:, None], b_qh, 0.0)) * b_e
    b_e = _intra_cols(b_b, r2, blk, 2, s2)
    b_dAI = tl.where((blk == 2)[:, None], b_dA, 0.0)
    b_dqh += tl.dot(b_dAI, b_k * b_e)
    b_dk += tl.dot(tl.trans(b_dAI), tl.where((blk == 2)[:, None], b_qh, 0.0)) * b_e
    b_e = _intra_cols(b_b, r3, blk, 3, s3)
    b_dAI = tl.where((blk == 3)[:, None], b_dA, 0.0)
    b_dqh += tl.dot(b_dAI, b_k * b_e)
    b_dk += tl.dot(tl.trans(b_dAI), tl.where((blk == 3)[:, None], b_qh, 0.0)) * b_e
    b_dq += b_dqh * b_x

    if tl.sum(unsafe, axis=0) > 0:
        # exact diagonal blocks (see the forward kernel): dq pairs row i with column j = block start + jj
        # (jj from the block end down), dk pairs column j with row i = block start + ii (ii upwards);
        # the exponents are running sums of g
        b_f = tl.zeros([BT, BK], dtype=tl.float32)
        for it in range(BC):
            jj = BC - 1 - it
            prow = blk * BC + jj
            posp, validp = _row_pos(i_n * BT + prow, T, REVERSE)
            b_gp = tl.load(g_base + posp[:, None] * (H * K) + o_k[None, :],
                           mask=validp[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            m = (off >= jj) & (unsafe > 0)
            b_a = tl.load(dA_base + o_t * BT + prow).to(tl.float32)
            b_e = tl.exp(tl.where(m[:, None], b_f, float("-inf")))
            b_dq += b_a[:, None] * _neg_expm1(b_gp) * b_e
            b_f = tl.where((off >= jj)[:, None], b_f + b_gp, 0.0)
        b_f = tl.zeros([BT, BK], dtype=tl.float32)
        for ii in range(BC):
            prow = blk * BC + ii
            posp, validp = _row_pos(i_n * BT + prow, T, REVERSE)
            m_p = validp[:, None] & m_k[None, :]
            b_gp = tl.load(g_base + posp[:, None] * (H * K) + o_k[None, :], mask=m_p, other=0.0).to(tl.float32)
            b_qp = tl.load(q_base + posp[:, None] * (H * K) + o_k[None, :], mask=m_p, other=0.0).to(tl.float32)
            b_f = tl.where((off < ii)[:, None], b_f + b_gp, 0.0)
            m = (off <= ii) & (unsafe > 0)
            b_a = tl.load(dA_base + prow * BT + o_t).to(tl.float32)
            b_e = tl.exp(tl.where(m[:, None], b_f, float("-inf")))
            b_dk += b_a[:, None] * b_qp * b_e
    return b_dq, b_dk


@triton.jit
def _dqdg_slice(q, v, g, h, do, dh, dA, dq, dg, i_k, i_n, i_bh, T, H, NT,
                K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, SAFE: tl.constexpr, CSAFE: tl.constexpr, REVERSE: tl.constexpr, EMU: tl.constexpr,
                LOWP: tl.constexpr, FAST_ONLY: tl.constexpr, ACCUM: tl.constexpr):
    """Chunk ``i_n`` of head ``i_bh``, channels ``i_k * BK ..``: dq, dk (folded into dg, since
    k = 1 - exp(g)) and dg. FAST_ONLY: path 1 only, stored whatever the decay (the forward listed the
    chunks that need the other paths; the REDO launch overwrites them). ACCUM: dq and dg added to what
    ``dq`` / ``dg`` hold (the other scan direction's); not with FAST_ONLY, whose stores the REDO launch
    overwrites (the caller keeps ACCUM to the one-launch scheme)."""
    i_b = (i_bh // H).to(tl.int64)
    i_h = i_bh % H
    DT = dh.dtype.element_ty
    tl.static_assert(BT == 4 * BC, "the intra-chunk code is written for four blocks per chunk")
    o_t = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    blk = o_t // BC
    off = o_t % BC
    pos, valid = _chunk_rows(i_n, T, BT, REVERSE)
    q_base = q + (i_b * T * H + i_h) * K
    g_base = g + (i_b * T * H + i_h) * K
    m_qk = valid[:, None] & m_k[None, :]
    m_tv = valid[:, None] & m_v[None, :]
    p_qk = pos[:, None] * (H * K) + o_k[None, :]
    p_tv = pos[:, None] * (H * V) + o_v[None, :]
    chunk = i_bh.to(tl.int64) * NT + i_n
    o_s = o_k[:, None] * V + o_v[None, :]
    m_s = m_k[:, None] & m_v[None, :]
    dA_base = dA + chunk * (BT * BT)

    b_graw = tl.load(g_base + p_qk, mask=m_qk, other=0.0)
    b_b = _prefix_decay(b_graw, EMU)
    b_g = b_graw.to(tl.float32)
    b_k = _neg_expm1(b_g)
    r_mid, b_B = _mid_rows(b_b, o_t, BT)

    # inter-chunk terms first: dO, v and the two states are dead before the intra-chunk loop
    b_do = _cast(tl.load(do + (i_b * T * H + i_h) * V + p_tv, mask=m_tv, other=0.0), DT, EMU)
    b_h = tl.load(h + chunk * (K * V) + o_s, mask=m_s, other=0.0)
    b_dq = tl.dot(b_do, tl.trans(b_h)) * tl.exp(b_b)
    b_v = _cast(tl.load(v + (i_b * T * H + i_h) * V + p_tv, mask=m_tv, other=0.0), DT, EMU)
    b_dh = tl.load(dh + chunk * (K * V) + o_s, mask=m_s, other=0.0)
    b_dk = tl.dot(b_v, tl.trans(b_dh)) * tl.exp(_suffix_decay_of(b_graw, g_base, i_n, T, H, K, o_k, m_k, BT, REVERSE,
                                                                   EMU))
    # gradient of the chunk's total decay B: S_{n+1} = exp(B) S_n + sum_j k_j exp(B - b_j) v_j
    b_dB = tl.exp(b_B) * tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1) + tl.sum(b_k * b_dk, axis=0)

    # intra-chunk terms, factorised as in the forward (one mid-chunk reference, or four blocks)
    b_q = tl.load(q_base + p_qk, mask=m_qk, other=0.0).to(tl.float32)
    b_dA = tl.load(dA_base + o_t[:, None] * BT + o_t[None, :])
    if FAST_ONLY:
        # path 1 even where the decay is too steep for it: the forward listed those chunks and the REDO
        # launch overwrites them
        fast = 1
    else:
        fast = _mid_ref_ok(r_mid, b_B, CSAFE)
    if fast > 0:
        b_x = tl.exp(b_b - r_mid[None, :])
        b_y = tl.exp(r_mid[None, :] - b_b)
        if LOWP:
            b_dAc = _cast(b_dA, DT, EMU)
            b_dq += tl.dot(b_dAc, _cast(b_k * b_y, DT, EMU)) * b_x
            b_dk += tl.dot(tl.trans(b_dAc), _cast(b_q * b_x, DT, EMU)) * b_y
        else:
            b_dq += tl.dot(b_dA, b_k * b_y) * b_x
            b_dk += tl.dot(tl.trans(b_dA), b_q * b_x) * b_y
    else:
        d_dq, d_dk = _intra_grad_blocks(b_q, b_k, b_b, b_dA.to(tl.float32), dA_base, o_t, blk, off, i_n, T, H, K, q_base, g_base,
                                        o_k, m_k, BT, BC, BK, SAFE, REVERSE)
        b_dq += d_dq
        b_dk += d_dk

    b_db = b_q * b_dq - b_k * b_dk
    b_dg = tl.cumsum(b_db, axis=0, reverse=True) + b_dB[None, :] - tl.exp(b_g) * b_dk
    p_dq = dq + (i_b * T * H + i_h) * K + p_qk
    p_dg = dg + (i_b * T * H + i_h) * K + p_qk
    if ACCUM:
        b_dq += tl.load(p_dq, mask=m_qk, other=0.0).to(tl.float32)
        b_dg += tl.load(p_dg, mask=m_qk, other=0.0).to(tl.float32)
    tl.store(p_dq, b_dq.to(dq.dtype.element_ty), mask=m_qk)
    tl.store(p_dg, b_dg.to(dg.dtype.element_ty), mask=m_qk)


@triton.jit(do_not_specialize=["T"])
def hgrn2_bwd_dqdg_kernel(
    q, v, g, h, do, dh, dA, dq, dg, redo,
    T, H, NT, CAP,
    K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SAFE: tl.constexpr, CSAFE: tl.constexpr, REVERSE: tl.constexpr, EMU: tl.constexpr, LOWP: tl.constexpr,
    FAST_ONLY: tl.constexpr, REDO: tl.constexpr, ACCUM: tl.constexpr = False,
):
    """dq and dg, grid (K/BK, NT, BH), every path available; or, as in ``hgrn2_fwd_output_kernel``, in
    two launches over the forward's ``redo`` list: FAST_ONLY=True, grid (K/BK, NT, BH), every chunk and
    slice of channels through path 1 alone; REDO=True, grid (P,), every slice of the listed chunks
    again, every path available."""
    if REDO:
        NK: tl.constexpr = (K + BK - 1) // BK
        n = tl.minimum(tl.load(redo), CAP)
        for i in range(tl.program_id(0), n, tl.num_programs(0)):
            p = tl.load(redo + 1 + i)
            for i_k in range(NK):
                _dqdg_slice(q, v, g, h, do, dh, dA, dq, dg, i_k, p % NT, p // NT, T, H, NT, K, V, BT, BC, BK, BV,
                            SAFE, CSAFE, REVERSE, EMU, LOWP, False, False)
    else:
        _dqdg_slice(q, v, g, h, do, dh, dA, dq, dg, tl.program_id(0), tl.program_id(1), tl.program_id(2), T, H,
                    NT, K, V, BT, BC, BK, BV, SAFE, CSAFE, REVERSE, EMU, LOWP, FAST_ONLY, ACCUM)
