"""Forward kernels of the HGRU scans, one per launch mode (see ``plan.py`` for which runs when):

* ``_hgru_fwd_kernel``: "seq" (MODE_SEQ: a program walks a whole sequence) and the two passes of
  "twopass" (MODE_AGG: chunk maps; MODE_APPLY: the chunks entered with the composed maps);
* ``_hgru_fwd_lbc_kernel``: "chunklb", the chunks of two passes in one launch (look-back over chunk maps);
* ``_hgru_fwd_lb_kernel``: "lookback", one tile per program, single pass;
* ``_hgru_stream_fwd_kernel``: "stream" (real scans), a software pipeline over tiles;
* ``_hgru_block_fwd_kernel``: "block" (real scans), blocks of R * NW steps per CTA.

Each computes ``h_t = lambda_t [exp(i theta)] h_{t-1} + x_t`` from x and a (plain scans) or from the
HGRU gates of the forget logits and input pre-activations (FUSED), forwards or in REVERSE.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .lookback import _chunk_map, _epoch_done, _launch_tag, _lb_program, _lookback, _tile_program, _tile_scan
from .scan_math import _combine_real, _extract_row, _gamma, _gate_decay, _rotation_tiles, _scan_carry, _sigmoid
from .tiles import (_carry_in, _chunk_program, _frame, _load_pair, _load_state, _MODE_AGG, _MODE_APPLY,
                    _store_chunk_map, _store_final, _store_pair, _stream_column, _walk_next, _walk_scan, _walk_step)


# ----------------------------------------------------------------------------------------------
# helpers of the chunk programs ("seq", "twopass", "chunklb"; _fwd_gates also of "lookback" and "block",
# _fwd_load of "lookback")
# ----------------------------------------------------------------------------------------------
@triton.jit
def _fwd_setup(THETA, GAMMA, gamma_val, d, dm, rows, T, s_lo, COMPLEX: tl.constexpr, FUSED: tl.constexpr,
               REVERSE: tl.constexpr, GAMMA_MODE: tl.constexpr, PRECISE: tl.constexpr, BT: tl.constexpr,
               BD: tl.constexpr):
    """What a forward chunk program needs before its walks: the lower bound (fused), the rotation tiles
    (complex) and the time of each tile row, ``t_first + j * step + rel`` for tile j of a chunk that
    starts at scan step ``s_lo`` (the scan's direction)."""
    gam = 0.0
    if FUSED:
        gam = _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE)[None, :]
    cs, sn, fr, fi, ffr, ffi = _frame(THETA, d, dm, rows, 1.0, COMPLEX, PRECISE, BT, BD)
    if REVERSE:
        rel = -rows
        t_first = T - 1 - s_lo
        step = -BT
    else:
        rel = rows
        t_first = s_lo
        step = BT
    return gam, fr, fi, ffr, ffi, rel, t_first, step


@triton.jit
def _fwd_gates(av, xr, xi, gam, m2, FUSED: tl.constexpr, COMPLEX: tl.constexpr):
    """A forward tile's decay and scan input from its loads: the decay as loaded (plain scans), or the
    HGRU gates from the forget logits ``av`` and input pre-activations ``x`` (fused: lambda and
    (1 - lambda) SiLU(x)). The decay is 1 outside ``m2`` (rows past the chunk, channels past D)."""
    if FUSED:
        lam, om = _gate_decay(av, gam)
        xr = om * (xr * _sigmoid(xr))
        if COMPLEX:
            xi = om * (xi * _sigmoid(xi))
    else:
        lam = av
    return tl.where(m2, lam, 1.0), xr, xi


@triton.jit
def _fwd_walk(X, sxb, sxt: tl.constexpr, A, sab, sat: tl.constexpr, H, b64, T, s_lo, s_hi, t_first, step, rel,
              rows, d0, D, dm, gam, fr, fi, ffr, ffi, hr, hi, DW: tl.constexpr, AGG: tl.constexpr,
              BACK: tl.constexpr, COMPLEX: tl.constexpr, FUSED: tl.constexpr, PREFETCH: tl.constexpr,
              FOLD: tl.constexpr, VEC: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """One walk of a forward program over the tiles of its chunk (steps ``s_lo .. s_hi - 1``).

    AGG: the chunk's map ``h -> M h + S``, returned as ``(Re M, Im M, Re S, Im S)``; with ``BACK`` (AGG only) the
    walk starts at the chunk's end and prepends each tile's map (``_walk_step``), otherwise it carries
    the state from ``(hr, hi)`` (zeros) and multiplies the tiles' multipliers. Otherwise: the outputs of
    the chunk entered with state ``(hr, hi)``, stored to H; returns ``(.., .., state leaving the chunk)``.
    """
    n_tiles = tl.cdiv(s_hi - s_lo, BT)
    mr = tl.zeros([BD], tl.float32) + 1.0
    mi = tl.zeros([BD], tl.float32)
    if PREFETCH:
        s0, q, t_ref = _walk_step(0, n_tiles, s_lo, t_first, step, rows, BT, BACK)
        n_av, n_xr, n_xi = _fwd_load(X, sxb, sxt, A, sab, sat, b64, t_ref, rel, q < s_hi, d0, D, COMPLEX, BT, BD, VEC)
    for j in range(0, n_tiles):
        s0, q, t_ref = _walk_step(j, n_tiles, s_lo, t_first, step, rows, BT, BACK)
        if PREFETCH:
            av, xr, xi = n_av, n_xr, n_xi
            qn, tn = _walk_next(q, t_ref, j, n_tiles, s_hi, step, BT, BACK)
            n_av, n_xr, n_xi = _fwd_load(X, sxb, sxt, A, sab, sat, b64, tn, rel, qn < s_hi, d0, D, COMPLEX, BT, BD, VEC)
        else:
            av, xr, xi = _fwd_load(X, sxb, sxt, A, sab, sat, b64, t_ref, rel, q < s_hi, d0, D, COMPLEX, BT, BD, VEC)
        valid = q < s_hi
        lam, xr, xi = _fwd_gates(av, xr, xi, gam, valid[:, None] & dm[None, :], FUSED, COMPLEX)
        last = tl.minimum(s_hi - s0, BT) - 1
        outr, outi, hr, hi, mr, mi = _walk_scan(lam, xr, xi, hr, hi, mr, mi, fr, fi, ffr, ffi, rows, last,
                                                AGG, BACK, COMPLEX, FOLD, BT)
        if not AGG:
            _store_pair(H, (b64 * T + t_ref.to(tl.int64)) * DW, rel * DW, valid, d0, D, outr, outi,
                        COMPLEX, BT, BD, VEC)
    return mr, mi, hr, hi


@triton.jit
def _fwd_load(X, sxb, sxt: tl.constexpr, A, sab, sat: tl.constexpr, b64, t_ref, rel, valid, d0, D,
              COMPLEX: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, VEC: tl.constexpr):
    """One forward tile: row r is time ``t_ref + rel[r]``."""
    t64 = t_ref.to(tl.int64)
    av, unused = _load_pair(A, b64 * sab + t64 * sat, rel * sat, valid, d0, D, False, BT, BD, VEC)
    xr, xi = _load_pair(X, b64 * sxb + t64 * sxt, rel * sxt, valid, d0, D, COMPLEX, BT, BD, VEC)
    return av, xr, xi


# ----------------------------------------------------------------------------------------------
# "seq" and "twopass" (MODE_SEQ / MODE_AGG / MODE_APPLY), and "chunklb"
# ----------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["sxb", "sab", "B", "T", "D", "NC", "CL", "bd_rt"])
def _hgru_fwd_kernel(
    X, sxb, sxt: tl.constexpr,  # scan input x (plain scans) or input pre-activations (fused)
    A, sab, sat: tl.constexpr,  # decay a (plain scans) or forget-gate logits (fused)
    THETA, GAMMA, gamma_val,
    H0, s0b, s0d, s0c,
    H, HT,  # outputs, contiguous
    AGG_M, AGG_S,  # fp32 chunk maps [NC-1, B, D(, 2)]
    B, T, D, NC, CL, bd_rt, DW: tl.constexpr,
    COMPLEX: tl.constexpr, FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
    GAMMA_MODE: tl.constexpr, MODE: tl.constexpr, PRECISE: tl.constexpr, PREFETCH: tl.constexpr,
    FOLD: tl.constexpr, NCP: tl.constexpr, AGG_REV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):
    b, b64, c, db, d, dm, rows, s_lo, s_hi = _chunk_program(B, T, D, CL, BD, BT)
    IS_AGG: tl.constexpr = MODE == _MODE_AGG
    gam, fr, fi, ffr, ffi, rel, t_first, step = _fwd_setup(THETA, GAMMA, gamma_val, d, dm, rows, T, s_lo, COMPLEX,
                                                           FUSED, REVERSE, GAMMA_MODE, PRECISE, BT, BD)

    # state entering the chunk
    hr = tl.zeros([BD], tl.float32)
    hi = tl.zeros([BD], tl.float32)
    if not IS_AGG:
        if HAS_H0:
            hr, hi = _load_state(H0, b64, s0b, s0d, s0c, d, dm, COMPLEX)
        if MODE == _MODE_APPLY:
            hr, hi = _carry_in(AGG_M, AGG_S, hr, hi, b, c, d, dm, B, D, NC, COMPLEX, NCP)

    d0 = db * bd_rt  # = db * BD; runtime, so rows are not known to be aligned (see _load_pair)
    mr, mi, hr, hi = _fwd_walk(X, sxb, sxt, A, sab, sat, H, b64, T, s_lo, s_hi, t_first, step, rel, rows, d0, D,
                               dm, gam, fr, fi, ffr, ffi, hr, hi, DW, IS_AGG, IS_AGG and AGG_REV, COMPLEX, FUSED,
                               PREFETCH, FOLD, 1, BT, BD)

    if IS_AGG:
        _store_chunk_map(AGG_M, AGG_S, b, c, B, D, NC, d, dm, mr, mi, hr, hi, COMPLEX)
    else:
        _store_final(HT, b64, D, d, dm, c, NC, hr, hi, COMPLEX)


@triton.jit(do_not_specialize=["sxb", "sab", "B", "T", "D", "NC", "CL", "bd_rt"])
def _hgru_fwd_lbc_kernel(
    X, sxb, sxt: tl.constexpr, A, sab, sat: tl.constexpr, THETA, GAMMA, gamma_val, H0, s0b, s0d, s0c, H, HT,
    LBUF, STATE,
    B, T, D, NC, CL, bd_rt, DW: tl.constexpr,
    COMPLEX: tl.constexpr, FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
    GAMMA_MODE: tl.constexpr, PRECISE: tl.constexpr, PREFETCH: tl.constexpr, FOLD: tl.constexpr,
    AGG_REV: tl.constexpr, PUBLISH_INC: tl.constexpr, LBW: tl.constexpr, VEC: tl.constexpr, BT: tl.constexpr,
    BD: tl.constexpr,
):
    """The forward over one chunk of CL steps per program (chunk-major grid), in one launch ("chunklb"):
    the chunk's map (walking back from its end with AGG_REV), the state entering it by decoupled
    look-back over the maps of the chunks before it (``_lookback``), then its outputs, re-reading the
    chunk while L2 still holds most of it (two passes' work without the second launch, and the second
    read soon after the first)."""
    c, n_cols, db, b = _lb_program(D, B, BD)
    b64 = b.to(tl.int64)
    d = db * BD + tl.arange(0, BD)
    dm = d < D
    rows = tl.arange(0, BT)
    E = _launch_tag(STATE)

    s_lo = c * CL
    s_hi = tl.minimum(s_lo + CL, T)
    gam, fr, fi, ffr, ffi, rel, t_first, step = _fwd_setup(THETA, GAMMA, gamma_val, d, dm, rows, T, s_lo, COMPLEX,
                                                           FUSED, REVERSE, GAMMA_MODE, PRECISE, BT, BD)
    d0 = db * bd_rt  # = db * BD; runtime, so rows are not known to be aligned (see _load_pair)
    ir = tl.zeros([BD], tl.float32)
    ii = tl.zeros([BD], tl.float32)
    mr, mi, sr, si = _fwd_walk(X, sxb, sxt, A, sab, sat, H, b64, T, s_lo, s_hi, t_first, step, rel, rows, d0, D,
                               dm, gam, fr, fi, ffr, ffi, ir, ii, DW, True, AGG_REV, COMPLEX, FUSED, PREFETCH, FOLD,
                               VEC, BT, BD)
    if HAS_H0:
        ir, ii = _load_state(H0, b64, s0b, s0d, s0c, d, dm, COMPLEX)
    cr, ci = _lookback(LBUF, c, NC, B, D, b, d, dm, mr, mi, sr, si, ir, ii, E, COMPLEX, PUBLISH_INC, LBW)
    mr, mi, hr, hi = _fwd_walk(X, sxb, sxt, A, sab, sat, H, b64, T, s_lo, s_hi, t_first, step, rel, rows, d0, D,
                               dm, gam, fr, fi, ffr, ffi, cr, ci, DW, False, False, COMPLEX, FUSED, PREFETCH, FOLD,
                               VEC, BT, BD)
    _store_final(HT, b64, D, d, dm, c, NC, hr, hi, COMPLEX)
    _epoch_done(STATE, c, NC, n_cols)




# ----------------------------------------------------------------------------------------------
# "stream" (real scans): one program per channel block walks the whole sequence through a software
# pipeline. Launch arguments are left to Triton's specialisation (strides and D divisible by 16 are
# recognised), so that aligned rows get 16-byte loads, which the pipeline stages in shared memory.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _hgru_stream_fwd_kernel(
    X, sxb, sxt, A, sab, sat, GAMMA, gamma_val, H0, s0b, s0d, H, HT, T, D,
    FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr, GAMMA_MODE: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
):
    b, d, dm, rows = _stream_column(D, BD, BT)
    gam = _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE)[None, :]
    h = tl.zeros([BD], tl.float32)
    if HAS_H0:
        h, unused = _load_state(H0, b, s0b, s0d, 0, d, dm, False)
    if REVERSE:
        rel = -rows
    else:
        rel = rows
    xb = X + b * sxb
    ab = A + b * sab
    hb = H + b * T * D
    for j in tl.range(0, T, BT, num_stages=STAGES):
        if REVERSE:
            t0 = b * 0 + (T - 1 - j)  # int64
        else:
            t0 = b * 0 + j  # int64
        valid = (j + rows < T)[:, None]
        m = valid & dm[None, :]
        xv = tl.load(xb + t0 * sxt + (rel * sxt)[:, None] + d[None, :], mask=m, other=0.0).to(tl.float32)
        av = tl.load(ab + t0 * sat + (rel * sat)[:, None] + d[None, :], mask=m, other=1.0).to(tl.float32)
        if FUSED:
            lam, om = _gate_decay(av, gam)
            xv = om * (xv * _sigmoid(xv))
        else:
            lam = av
        lam = tl.where(valid, lam, 1.0)  # rows past the end: the identity
        xv = tl.where(valid, xv, 0.0)
        out, h = _scan_carry(lam, xv, h, rows, BT)  # rows past the end are the identity
        tl.store(hb + t0 * D + (rel * D)[:, None] + d[None, :], out.to(H.dtype.element_ty), mask=m)
    tl.store(HT + b * D + d, h.to(HT.dtype.element_ty), mask=dm)


# ----------------------------------------------------------------------------------------------
# "block" (real forward): one CTA per channel block walks the sequence in blocks of R * NW steps.
# A block is a [NW, R, BD] tile: NW segments of R consecutive steps, each thread holding R steps of
# its channels, so a segment scans in registers; the NW segment maps are joined by a short scan
# across the CTA. The software pipeline keeps STAGES - 1 blocks of loads in flight (staged in shared
# memory), every input is read once, and no program waits for another.
# ----------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["sxb", "sxt", "sab", "sat", "s0b", "s0d", "T", "D"])
def _hgru_block_fwd_kernel(
    X, sxb, sxt, A, sab, sat, GAMMA, gamma_val, H0, s0b, s0d, H, HT, T, D,
    FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr, GAMMA_MODE: tl.constexpr,
    R: tl.constexpr, NW: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr, VEC: tl.constexpr,
):
    """Forward of the real scan (plain or fused gates) over blocks of ``R * NW`` steps of one (batch,
    channel block) column. ``VEC`` divides D, the strides and the row starts (``_vec_width``): Triton
    is shown that alignment, and no more, through the ``VEC * (n // VEC)`` forms below, so each access
    moves VEC channels (16 bytes at VEC = 8 in bf16) and lanes never split a segment's steps."""
    pid = tl.program_id(0)
    ndb = tl.cdiv(D, BD)
    b = (pid // ndb).to(tl.int64)
    d = (pid % ndb) * BD + tl.arange(0, BD)
    DV = VEC * (D // VEC)  # == D
    dm = d < DV
    segs = tl.arange(0, NW)
    seg = segs[:, None]  # [NW, 1]
    rr = tl.arange(0, R)[None, :, None]  # [1, R, 1]
    rel = seg[:, :, None] * R + rr  # [NW, R, 1]: scan step within the block
    cc = d[None, None, :]
    cm = dm[None, None, :]
    gam = 0.0
    if FUSED:
        gam = _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE)[None, None, :]
    h = tl.zeros([BD], tl.float32)  # state entering the block
    if HAS_H0:
        h, h_im = _load_state(H0, b, s0b, s0d, 0, d, dm, False)
    xb = X + b * (VEC * (sxb // VEC))
    ab = A + b * (VEC * (sab // VEC))
    hb = H + b * T * DV
    sxt_v = VEC * (sxt // VEC)
    sat_v = VEC * (sat // VEC)
    for s0 in tl.range(0, T, R * NW, num_stages=STAGES):
        s = s0 + rel
        valid = s < T
        if REVERSE:
            t = (T - 1 - s).to(tl.int64)
        else:
            t = s.to(tl.int64)
        m = valid & cm
        xv = tl.load(xb + t * sxt_v + cc, mask=m, other=0.0).to(tl.float32)
        av = tl.load(ab + t * sat_v + cc, mask=m, other=1.0).to(tl.float32)
        # (masked steps: decay 1 and input 0, the identity map)
        lam, xv, x_im = _fwd_gates(av, xv, xv, gam, m, FUSED, False)
        # each segment's map h -> P h + S (in-thread along its R steps)
        P, S = tl.reduce((lam, xv), 1, _combine_real)
        # the state leaving each segment, then the one entering it (the previous segment's; h for the first)
        Pi, Si = tl.associative_scan((P, S), 0, _combine_real)
        leave = Si + Pi * h[None, :]
        enter = tl.gather(leave, tl.maximum(seg - 1, 0) + tl.zeros([NW, BD], tl.int32), 0)
        enter = tl.where(seg == 0, h[None, :], enter)
        # fold the entering state into each segment's first step and scan
        xv += tl.where(rr == 0, lam * enter[:, None, :], 0.0)
        p, z = tl.associative_scan((lam, xv), 1, _combine_real)
        tl.store(hb + t * DV + cc, z.to(H.dtype.element_ty), mask=m)
        h = _extract_row(leave, segs, NW - 1)
    tl.store(HT + b * D + d, h.to(HT.dtype.element_ty), mask=dm)



# ----------------------------------------------------------------------------------------------
# "lookback": single pass over tiles of BT steps, one per program (decoupled look-back, lookback.py)
# ----------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["sxb", "sab", "B", "T", "D", "NC", "bd_rt"])
def _hgru_fwd_lb_kernel(
    X, sxb, sxt: tl.constexpr, A, sab, sat: tl.constexpr, THETA, GAMMA, gamma_val, H0, s0b, s0d, s0c, H, HT,
    LBUF, STATE,
    B, T, D, NC, bd_rt, DW: tl.constexpr,
    COMPLEX: tl.constexpr, FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
    GAMMA_MODE: tl.constexpr, PRECISE: tl.constexpr, PUBLISH_INC: tl.constexpr, LBW: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr,
):
    """The forward over one tile of ``BT`` steps per program (chunk-major grid), in a single pass:
    local scan, look-back for the incoming state, outputs."""
    c, n_cols, b, b64, d0, d, dm, rows, E = _tile_program(STATE, B, D, bd_rt, BD, BT)

    q = c * BT + rows
    valid = q < T
    m2 = valid[:, None] & dm[None, :]
    if REVERSE:
        rel = -rows
        t_ref = T - 1 - c * BT
    else:
        rel = rows
        t_ref = c * BT
    av, xr, xi = _fwd_load(X, sxb, sxt, A, sab, sat, b64, t_ref, rel, valid, d0, D, COMPLEX, BT, BD, 1)
    gam = 0.0
    if FUSED:
        gam = _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE)[None, :]
    lam, xr, xi = _fwd_gates(av, xr, xi, gam, m2, FUSED, COMPLEX)
    if COMPLEX:
        cs, sn, fr, fi = _rotation_tiles(THETA, d, dm, 1.0, PRECISE, BT, BD)
    else:
        fr = 0.0
        fi = 0.0
    p, zr, zi = _tile_scan(lam, xr, xi, fr, fi, COMPLEX)
    mr, mi, sr, si = _chunk_map(p, zr, zi, fr, fi, rows, tl.minimum(T - c * BT, BT) - 1, COMPLEX)  # (last row)

    ir = tl.zeros([BD], tl.float32)
    ii = tl.zeros([BD], tl.float32)
    if HAS_H0:
        ir, ii = _load_state(H0, b64, s0b, s0d, s0c, d, dm, COMPLEX)
    cr, ci = _lookback(LBUF, c, NC, B, D, b, d, dm, mr, mi, sr, si, ir, ii, E,
                       COMPLEX, PUBLISH_INC, LBW)

    if COMPLEX:
        wr = zr + p * cr[None, :]
        wi = zi + p * ci[None, :]
        _store_pair(H, (b64 * T + t_ref.to(tl.int64)) * DW, rel * DW, valid, d0, D, fr * wr - fi * wi,
                    fr * wi + fi * wr, COMPLEX, BT, BD, 1)
    else:
        outr = zr + p * cr[None, :]
        _store_pair(H, (b64 * T + t_ref.to(tl.int64)) * DW, rel * DW, valid, d0, D, outr, outr, COMPLEX, BT, BD, 1)
    _store_final(HT, b64, D, d, dm, c, NC, mr * cr - mi * ci + sr, mr * ci + mi * cr + si, COMPLEX)
    _epoch_done(STATE, c, NC, n_cols)
