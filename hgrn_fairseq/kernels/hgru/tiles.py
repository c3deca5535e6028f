"""Tile I/O and the walk of a chunk, as ``triton.jit`` helpers of the forward and backward kernels.

A program owns BD channels of one sequence; each thread holds a tile of ``BT`` consecutive steps of its
channel(s), so a tile is scanned along time in registers and loads stay coalesced along channels
(``_load_pair`` says why Triton picks that layout). A chunk of the sequence is walked tile by tile
(``_walk_step``, ``_walk_scan``), either for its outputs (entered with a state) or for its map
``h -> M h + S`` (the chunk-map pass of the two-pass mode; ``_carry_in`` composes those maps).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .scan_math import _combine_affine_complex, _combine_pair, _combine_real, _extract_row, _rotation_tiles

# modes of the chunk kernels (_hgru_fwd_kernel, _hgru_bwd_kernel): one pass over a whole sequence; chunk
# maps only; chunks from composed maps
MODE_SEQ, MODE_AGG, MODE_APPLY = 0, 1, 2
_MODE_AGG = tl.constexpr(MODE_AGG)
_MODE_APPLY = tl.constexpr(MODE_APPLY)


@triton.jit
def _carry_in(AGG_M, AGG_S, ir, ii, b, c, d, dm, B, D, NC, COMPLEX: tl.constexpr, NCP: tl.constexpr):
    """State entering chunk ``c``: the affine maps of chunks 0..c-1 applied to the start state."""
    k = tl.arange(0, NCP)
    m2 = (k < c)[:, None] & dm[None, :]
    base = (k[:, None].to(tl.int64) * B + b) * D + d[None, :]
    if COMPLEX:  # complex maps are stored as a real plane and an imaginary plane, NC-1 rows apart
        plane = (NC - 1).to(tl.int64) * B * D
        mr = tl.load(AGG_M + base, mask=m2, other=1.0)
        mi = tl.load(AGG_M + plane + base, mask=m2, other=0.0)
        sr = tl.load(AGG_S + base, mask=m2, other=0.0)
        si = tl.load(AGG_S + plane + base, mask=m2, other=0.0)
        first = (k == 0)[:, None]
        sr += tl.where(first, mr * ir[None, :] - mi * ii[None, :], 0.0)
        si += tl.where(first, mr * ii[None, :] + mi * ir[None, :], 0.0)
        mr, mi, sr, si = tl.associative_scan((mr, mi, sr, si), 0, _combine_affine_complex)
        hr = tl.where(c == 0, ir, _extract_row(sr, k, c - 1))
        hi = tl.where(c == 0, ii, _extract_row(si, k, c - 1))
    else:
        mr = tl.load(AGG_M + base, mask=m2, other=1.0)
        sr = tl.load(AGG_S + base, mask=m2, other=0.0)
        sr += tl.where((k == 0)[:, None], mr * ir[None, :], 0.0)
        mr, sr = tl.associative_scan((mr, sr), 0, _combine_real)
        hr = tl.where(c == 0, ir, _extract_row(sr, k, c - 1))
        hi = ir * 0.0
    return hr, hi


@triton.jit
def _chunk_program(B, T, D, CL, BD: tl.constexpr, BT: tl.constexpr):
    """This program's place in the grid of a chunk kernel (``_hgru_fwd_kernel``, ``_hgru_bwd_kernel``; channel
    blocks fastest, then batch rows, then chunks): batch row (also as int64), chunk, channel block,
    channels, channel mask, tile rows, and the scan steps ``s_lo .. s_hi - 1`` of its chunk of CL steps."""
    pid = tl.program_id(0)
    ndb = tl.cdiv(D, BD)
    db = pid % ndb
    bc = pid // ndb
    b = bc % B
    c = bc // B
    b64 = b.to(tl.int64)
    d = db * BD + tl.arange(0, BD)
    dm = d < D
    rows = tl.arange(0, BT)

    s_lo = c * CL
    s_hi = tl.minimum(s_lo + CL, T)
    return b, b64, c, db, d, dm, rows, s_lo, s_hi


@triton.jit
def _store_chunk_map(AGG_M, AGG_S, b, c, B, D, NC, d, dm, mr, mi, sr, si, COMPLEX: tl.constexpr):
    """Chunk ``c``'s map ``h -> M h + S`` into the fp32 [NC-1, B, D] buffers that ``_carry_in`` reads (complex:
    a real plane, then an imaginary plane, NC-1 rows apart)."""
    off = (c.to(tl.int64) * B + b) * D + d
    if COMPLEX:
        plane = (NC - 1).to(tl.int64) * B * D
        tl.store(AGG_M + off, mr, mask=dm)
        tl.store(AGG_M + plane + off, mi, mask=dm)
        tl.store(AGG_S + off, sr, mask=dm)
        tl.store(AGG_S + plane + off, si, mask=dm)
    else:
        tl.store(AGG_M + off, mr, mask=dm)
        tl.store(AGG_S + off, sr, mask=dm)


# Tile I/O. Every [B, T, D] (or [B, T, D, 2]) tensor the kernels touch has unit channel stride (and,
# when complex, interleaved real/imaginary parts): the host copies anything else. The batch and time
# strides, and D, are never specialised by the JIT, so Triton knows the channels are contiguous but not
# that rows are 16-byte aligned. It then gives each thread one channel (one complex pair) and spreads
# the 32 lanes of a warp over channels, the warps over time: loads stay coalesced along channels and
# each thread holds consecutive time steps, so most of the scan along time runs in registers. (With
# aligned rows, Triton vectorises along channels and moves every tile through shared memory to scan
# it; with no contiguity information at all, some versions spread the lanes over time instead, which
# uncoalesces every access.)
@triton.jit
def _load_pair(P, base, roff, vrow, d0, D, COMPLEX: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
               VEC: tl.constexpr):
    """Load channels ``d0 .. d0 + BD - 1`` of BT rows as fp32 [BT, BD] tiles (complex tensors come
    back as (real, imaginary)). Row r starts at element ``base + roff[r]``: the 64-bit ``base`` is
    uniform across the program and ``roff`` (a multiple of a compile-time row stride) becomes an
    immediate offset of each load, so addressing costs nothing per element. ``vrow`` masks rows."""
    if COMPLEX:
        Pb = P + tl.multiple_of(base, 2)
        j = 2 * d0 + tl.arange(0, 2 * BD)  # interleaved (re, im) pairs: one 4-byte pair per thread
        m = vrow[:, None] & (j < 2 * D)[None, :]
        v = tl.load((Pb + j)[None, :] + tl.multiple_of(roff, 2)[:, None], mask=m, other=0.0)
        vr, vi = tl.split(tl.reshape(v.to(tl.float32), [BT, BD, 2]))
    elif VEC > 1:  # rows start at a multiple of VEC channels (strides, D and d0): VEC channels per access
        # VEC * (x // VEC) == x here; written so because Triton 3.6 drops tl.multiple_of hints on these
        # scalars (sm_90 compiles) and then loads 2-byte elements
        Pb = P + VEC * (base // VEC)
        d = VEC * (d0 // VEC) + tl.arange(0, BD)
        vr = tl.load((Pb + d)[None, :] + roff[:, None],
                     mask=vrow[:, None] & (d < VEC * (D // VEC))[None, :], other=0.0)
        vr = vr.to(tl.float32)
        vi = vr
    else:
        Pb = P + base
        d = d0 + tl.arange(0, BD)
        vr = tl.load((Pb + d)[None, :] + roff[:, None], mask=vrow[:, None] & (d < D)[None, :], other=0.0)
        vr = vr.to(tl.float32)
        vi = vr
    return vr, vi


@triton.jit
def _store_pair(P, base, roff, vrow, d0, D, vr, vi, COMPLEX: tl.constexpr, BT: tl.constexpr,
                BD: tl.constexpr, VEC: tl.constexpr):
    """Store [BT, BD] tiles (a real one, or a complex (vr, vi) pair); addressing as ``_load_pair``."""
    if COMPLEX:
        Pb = P + tl.multiple_of(base, 2)
        j = 2 * d0 + tl.arange(0, 2 * BD)
        m = vrow[:, None] & (j < 2 * D)[None, :]
        v = tl.reshape(tl.join(vr, vi), [BT, 2 * BD]).to(P.dtype.element_ty)
        tl.store((Pb + j)[None, :] + tl.multiple_of(roff, 2)[:, None], v, mask=m)
    elif VEC > 1:  # as in _load_pair
        Pb = P + VEC * (base // VEC)
        d = VEC * (d0 // VEC) + tl.arange(0, BD)
        tl.store((Pb + d)[None, :] + roff[:, None], vr.to(P.dtype.element_ty),
                 mask=vrow[:, None] & (d < VEC * (D // VEC))[None, :])
    else:
        Pb = P + base
        d = d0 + tl.arange(0, BD)
        tl.store((Pb + d)[None, :] + roff[:, None], vr.to(P.dtype.element_ty),
                 mask=vrow[:, None] & (d < D)[None, :])


@triton.jit
def _scan_tile(lam, yr, yi, cr, ci, fr, fi, ffr, ffi, rows, last,
               COMPLEX: tl.constexpr, FOLD: tl.constexpr, NEED_MAP: tl.constexpr, BT: tl.constexpr):
    """One tile of ``h_k = lam_k R h_{k-1} + x_k`` (R = exp(i theta), or 1 when real).

    ``y`` is ``conj(F) x`` (complex; ``F_k = R^(k+1)``) or ``x`` (real); ``(cr, ci)`` is the state
    entering the tile. Returns the tile's states, the state after row ``last`` and, when
    ``NEED_MAP``, the tile's multiplier ``P_last F_last`` (so that ``h_last = M c + h_last(c=0)``).

    ``FOLD`` adds the incoming state to the first row before the scan (fewest operations); otherwise
    the scan runs from zero and the state is added afterwards, which keeps the scan off the
    loop-carried dependency chain.
    """
    if FOLD:
        first = (rows == 0)[:, None]
        yr += tl.where(first, lam * cr[None, :], 0.0)
        if COMPLEX:
            yi += tl.where(first, lam * ci[None, :], 0.0)
            p, zr, zi = tl.associative_scan((lam, yr, yi), 0, _combine_pair)
            outr = fr * zr - fi * zi
            outi = fr * zi + fi * zr
            ncr = _extract_row(outr, rows, last)
            nci = _extract_row(outi, rows, last)
        else:
            p, zr = tl.associative_scan((lam, yr), 0, _combine_real)
            outr = zr
            outi = zr
            ncr = _extract_row(outr, rows, last)
            nci = ncr
        mr = ncr
        mi = nci
        if NEED_MAP:
            pl = _extract_row(p, rows, last)
            if COMPLEX:
                mr = pl * _extract_row(fr, rows, last)
                mi = pl * _extract_row(fi, rows, last)
            else:
                mr = pl
                mi = pl
    else:
        if COMPLEX:
            p, zr, zi = tl.associative_scan((lam, yr, yi), 0, _combine_pair)
            wr = zr + p * cr[None, :]
            wi = zi + p * ci[None, :]
            outr = fr * wr - fi * wi
            outi = fr * wi + fi * wr
            pl = _extract_row(p, rows, last)
            zlr = _extract_row(zr, rows, last)
            zli = _extract_row(zi, rows, last)
            if last == BT - 1:
                flr = ffr
                fli = ffi
            else:
                flr = _extract_row(fr, rows, last)
                fli = _extract_row(fi, rows, last)
            mr = pl * flr
            mi = pl * fli
            ncr = flr * zlr - fli * zli + mr * cr - mi * ci
            nci = flr * zli + fli * zlr + mr * ci + mi * cr
        else:
            p, zr = tl.associative_scan((lam, yr), 0, _combine_real)
            outr = zr + p * cr[None, :]
            outi = outr
            pl = _extract_row(p, rows, last)
            ncr = _extract_row(zr, rows, last) + pl * cr
            nci = ncr
            mr = pl
            mi = pl
    return outr, outi, ncr, nci, mr, mi


@triton.jit
def _walk_step(j, n_tiles, s_lo, t_first, step, rows, BT: tl.constexpr, BACKWARDS: tl.constexpr):
    """Tile visited at step ``j`` of a chunk's walk: its first scan step, its rows' scan steps and the
    time of its row 0 (``t_first + tile * step``). Forwards for the outputs; a two-pass chunk-map
    program (AGG_REV) walks from the chunk's end instead, prepending each tile's map
    (``_prepend_map``), so that the tiles it reads last, the chunk's first ones, are those the second
    pass reads first: L2 may still hold them."""
    if BACKWARDS:
        jt = n_tiles - 1 - j
    else:
        jt = j
    s0 = s_lo + jt * BT
    return s0, s0 + rows, t_first + jt * step


@triton.jit
def _walk_next(q, t_ref, j, n_tiles, s_hi, step, BT: tl.constexpr, BACKWARDS: tl.constexpr):
    """Rows (scan steps) and row-0 time of the tile after ``(q, t_ref)`` in the walk (``_walk_step``).
    A backwards walk must not reach before its chunk: past its end the rows are all ``>= s_hi``
    (nothing to load)."""
    if BACKWARDS:
        return tl.where(j + 1 < n_tiles, q - BT, s_hi + q * 0), t_ref - step
    else:
        return q + BT, t_ref + step


@triton.jit
def _prepend_map(mr, mi, sr, si, tmr, tmi, tsr, tsi, COMPLEX: tl.constexpr):
    """Map ``h -> M h + S`` of the steps after a tile, preceded by the tile's own map (``tm``, ``ts``):
    ``M tm`` and ``M ts + S`` (complex products when COMPLEX)."""
    if COMPLEX:
        return (mr * tmr - mi * tmi, mr * tmi + mi * tmr,
                mr * tsr - mi * tsi + sr, mr * tsi + mi * tsr + si)
    else:
        return mr * tmr, mi, mr * tsr + sr, si


@triton.jit
def _walk_scan(lam, xr, xi, hr, hi, mr, mi, fr, fi, ffr, ffi, rows, last, AGG: tl.constexpr, BACK: tl.constexpr,
               COMPLEX: tl.constexpr, FOLD: tl.constexpr, BT: tl.constexpr):
    """One tile of a chunk's walk (``_walk_step``) with decay ``lam`` and input ``x`` (turned into the
    rotating frame, ``conj(F) x``, when COMPLEX): its outputs (``_scan_tile``) and the walk's running
    values. Outputs: ``(hr, hi)`` is the state entering the tile and becomes the one leaving it. AGG
    (chunk map) walking forwards: the same, from zero, while ``(mr, mi)`` multiplies the tiles'
    multipliers; BACK (AGG walking from the chunk's end): the tile's own map is prepended to the map
    ``(mr, mi, hr, hi)`` of the steps after it (``_prepend_map``)."""
    if COMPLEX:
        yr = fr * xr + fi * xi
        yi = fr * xi - fi * xr
    else:
        yr = xr
        yi = xr
    if BACK:
        zero = tl.zeros_like(mr)
        outr, outi, tsr, tsi, tmr, tmi = _scan_tile(lam, yr, yi, zero, zero, fr, fi, ffr, ffi, rows, last,
                                                    COMPLEX, FOLD, True, BT)
        mr, mi, hr, hi = _prepend_map(mr, mi, hr, hi, tmr, tmi, tsr, tsi, COMPLEX)
    else:
        outr, outi, hr, hi, tmr, tmi = _scan_tile(lam, yr, yi, hr, hi, fr, fi, ffr, ffi, rows, last,
                                                  COMPLEX, FOLD, AGG, BT)
        if AGG:
            if COMPLEX:
                mr, mi = tmr * mr - tmi * mi, tmr * mi + tmi * mr
            else:
                mr = mr * tmr
    return outr, outi, hr, hi, mr, mi


@triton.jit
def _load_state(S, b64, sb, sd, sc, d, dm, COMPLEX: tl.constexpr):
    """Channels ``d`` of batch row ``b64`` of a [B, D] (complex: [B, D, 2]) state with strides
    (sb, sd, sc), in fp32: (real, imaginary), the imaginary part 0 for the real scans."""
    re = tl.load(S + b64 * sb + d * sd, mask=dm, other=0.0).to(tl.float32)
    im = tl.zeros_like(re)
    if COMPLEX:
        im = tl.load(S + b64 * sb + d * sd + sc, mask=dm, other=0.0).to(tl.float32)
    return re, im


@triton.jit
def _store_final(HT, b64, D, d, dm, c, NC, hr, hi, COMPLEX: tl.constexpr):
    """The final state (contiguous [B, D] or [B, D, 2]), from the programs of the last chunk."""
    fm = dm & ((d * 0 + c) == NC - 1)
    off = b64 * D + d
    if COMPLEX:
        tl.store(HT + 2 * off, hr.to(HT.dtype.element_ty), mask=fm)
        tl.store(HT + 2 * off + 1, hi.to(HT.dtype.element_ty), mask=fm)
    else:
        tl.store(HT + off, hr.to(HT.dtype.element_ty), mask=fm)


@triton.jit
def _frame(THETA, d, dm, rows, SIGN: tl.constexpr, COMPLEX: tl.constexpr, PRECISE: tl.constexpr,
           BT: tl.constexpr, BD: tl.constexpr):
    """The rotating frame of a complex chunk program: cos/sin of theta, the tile ``F`` of
    ``_rotation_tiles`` and its last row; (1, 0, 0, 0, 0, 0) for the real scans (unused there)."""
    if COMPLEX:
        cs, sn, fr, fi = _rotation_tiles(THETA, d, dm, SIGN, PRECISE, BT, BD)
        return cs, sn, fr, fi, _extract_row(fr, rows, BT - 1), _extract_row(fi, rows, BT - 1)
    else:
        return 1.0, 0.0, 0.0, 0.0, 0.0, 0.0


@triton.jit
def _stream_column(D, BD: tl.constexpr, BT: tl.constexpr):
    """The program's (batch row, as int64; channels; channel mask; tile rows)."""
    pid = tl.program_id(0)
    ndb = tl.cdiv(D, BD)
    d = (pid % ndb) * BD + tl.arange(0, BD)
    return (pid // ndb).to(tl.int64), d, d < D, tl.arange(0, BT)
