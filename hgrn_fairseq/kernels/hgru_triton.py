"""Triton kernels for the HGRU recurrences: real scan, complex scan and the fused HGRU (gates + scan).

Public ops (batch-first; complex numbers are a trailing dimension of size 2, as in ``reference.py``):

* ``real_scan(x, a, initial_state=None, reverse=False) -> (h, final_state)``:
  ``h_t = a_t * h_{t-1} + x_t``; ``x, a: [B, T, D]``, ``initial_state: [B, D]``.
* ``complex_scan(x, a, theta, initial_state=None, reverse=False) -> (h, final_state)``:
  ``h_t = a_t * exp(i theta) * h_{t-1} + x_t``; ``x: [B, T, D, 2]``, ``a: [B, T, D]``,
  ``theta: [D]``, ``initial_state: [B, D, 2]``.
* ``hgru_fused(forget_logits, inputs, theta=None, lower_bound=None, initial_state=None, reverse=False)``:
  ``lambda = gamma + (1 - gamma) * sigmoid(f)`` and ``x = (1 - lambda) * SiLU(inputs)`` computed in
  registers (never written to memory; the backward recomputes them), then the real scan
  (``inputs: [B, T, D]``, ``theta=None``) or the complex one (``inputs: [B, T, D, 2]``, ``theta: [D]``).

All are autograd Functions with gradients for every tensor input (including ``initial_state``,
``theta`` and a tensor ``lower_bound``) and for both outputs. Inputs may be bf16, fp16 or fp32 and may
be strided views (the kernels take strides, so the usual contiguous case costs no copy); outputs come
in the dtype of ``x`` / ``inputs``; the recurrence is carried in fp32.

How the kernels work
--------------------
The recurrence is memory-bound. A program is one warp; its 32 lanes own 32 channels of one sequence
and each thread holds a tile of ``BT`` consecutive steps of its channel, so a tile is scanned along
time in registers (``tl.associative_scan`` on an axis that lives inside each thread). Loads and
stores stay coalesced along channels. (Triton picks that layout only because the kernels hide the
rows' alignment from it: see ``_load_pair``.)

The complex rotation is constant per channel, so a tile is scanned in a rotating frame: with
``F_k = exp(i (k+1) theta)`` (k the row inside the tile, computed once per program),
``h_k = F_k * z_k`` where ``z`` is a *real-decay* scan of ``conj(F_k) x_k``. The complex scan is thus
two real scans sharing the decay, and no angle larger than ``BT * theta`` is ever formed.

Parallelism over time comes in these modes (``_plan`` picks one per launch; ``tuning`` overrides):

* ``seq``: one program per 32 channels walks the whole sequence, tile by tile (prefetching the next
  tile). Best when B * D alone gives enough programs to hide memory latency.
* ``lookback``: one program per tile, single pass over the data: each tile publishes the affine map
  ``h -> M h + S`` of its steps and finds its incoming state by decoupled look-back over its
  predecessors (values travel with tags in 64-bit words; see ``_lookback``), reading a window of
  ``tuning["lookback_window"]`` predecessors per round trip (``_lookback_window``).
* ``twopass``: time is cut into NC chunks; one kernel computes each chunk's map, a second one
  composes the maps before its chunk and runs the chunk. It reads the inputs twice.
* ``chunklb`` (forwards only): the chunks of ``twopass`` in one launch. Each program builds its chunk's
  map (walking back from the chunk's end), finds its incoming state by look-back over the chunk maps,
  then runs the chunk, whose second read mostly hits L2 (``_hgru_fwd_lbc_kernel``).
* ``stream`` (real scans): one program per channel block walks the whole sequence through a software
  pipeline of tiles (``_hgru_stream_fwd_kernel``), for many channel blocks.
* ``block`` (real forwards): one CTA per channel block walks the sequence in blocks of ``R * NW``
  steps, each cut into ``NW`` segments of ``R`` steps that threads scan in registers and a short scan
  across the CTA joins (``_hgru_block_fwd_kernel``). Parallel over time inside the CTA, so 64-channel
  columns need only number about half the SMs; every input is read once and no program waits for
  another.

The backward of ``h_t = A_t h_{t-1} + x_t`` is the same scan run in the other direction:
``g_t = dh_t + conj(A_{t+1}) g_{t+1}`` (``g_T`` = gradient of the final state), ``dx_t = g_t``,
``da_t = Re(conj(g_t) exp(i theta) h_{t-1})``, ``dtheta = sum a_t Re(conj(g_t) i exp(i theta) h_{t-1})``,
``dh_0 = conj(A_0) g_0``. It reads the saved output ``h`` (shifted by one step) instead of
recomputing it; sums over batch and time (``dtheta``, ``dgamma``) are written per program and
reduced with one ``torch.sum``.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
from typing import Optional, Tuple, Union

import torch
import triton
import triton.language as tl

Tensor = torch.Tensor

# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this module is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETED:
    from triton.language.extra import libdevice  # accurate sin/cos (tl.sin/cos may be approximate)
else:  # the interpreter has no libdevice; numpy's sin/cos are exact enough
    libdevice = None

# kernel modes: one pass over a whole sequence; chunk maps only; chunks from composed maps
MODE_SEQ, MODE_AGG, MODE_APPLY = 0, 1, 2
_MODE_AGG = tl.constexpr(MODE_AGG)
_MODE_APPLY = tl.constexpr(MODE_APPLY)
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Launch parameters. ``tuning`` may be edited (tests force small tiles and chunking on CPU; the
# bench sweeps it). ``None`` means "let ``_plan`` decide".
tuning = {
    "block_t": None,  # BT, time steps per tile
    "block_d": None,  # BD, channels per program (at least 32)
    "num_warps": None,
    "mode": None,  # "seq", "lookback", "twopass", "chunklb", "stream" or "block" (see _plan)
    "num_chunks": None,  # NC for "twopass"
    "min_programs": None,  # below this many (batch, channel-block) programs, split time
    "publish_inclusive": None,  # False (tests only): look-back walks always reach chunk 0
    "prefetch": None,  # load tile j+1 while scanning tile j
    "fold": None,  # add the incoming state before the tile's scan (True) or after it (False)
    "agg_reverse": None,  # two-pass chunk maps walk their chunk from its end (see _walk_step)
    "programs_per_sm": None,  # "twopass" / "chunklb": chunks per column from this many programs per SM
    "vec": None,  # "chunklb", real scans: channels per load/store where alignment allows (see _vec_width)
    "lookback_window": None,  # predecessors read per look-back round trip (a power of two; 1: one)
    "stages": None,  # "stream" / "block": software-pipeline depth (tiles whose loads are in flight, plus one)
    "segment_steps": None,  # "block": R, consecutive steps a thread scans
    "segments": None,  # "block": NW, segments per block (a block is R * NW steps)
}


@contextlib.contextmanager
def tuned(**cfg):
    """``tuning`` updated with ``cfg`` inside the ``with`` block and restored after it (the tests and
    benches force launch parameters this way)."""
    saved = dict(tuning)
    tuning.update(cfg)
    try:
        yield
    finally:
        tuning.clear()
        tuning.update(saved)


# ----------------------------------------------------------------------------------------------
# small device helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _combine_real(a1, y1, a2, y2):
    return a1 * a2, a2 * y1 + y2


@triton.jit
def _combine_pair(a1, yr1, yi1, a2, yr2, yi2):
    # real decay shared by two components (the complex scan in the rotating frame)
    return a1 * a2, a2 * yr1 + yr2, a2 * yi1 + yi2


@triton.jit
def _combine_cmul(ar1, ai1, ar2, ai2):
    return ar1 * ar2 - ai1 * ai2, ar1 * ai2 + ai1 * ar2


@triton.jit
def _combine_affine_complex(mr1, mi1, sr1, si1, mr2, mi2, sr2, si2):
    # composition of h -> M1 h + S1, then h -> M2 h + S2 (complex M, S)
    mr = mr2 * mr1 - mi2 * mi1
    mi = mr2 * mi1 + mi2 * mr1
    sr = mr2 * sr1 - mi2 * si1 + sr2
    si = mr2 * si1 + mi2 * sr1 + si2
    return mr, mi, sr, si


@triton.jit
def _sigmoid_pair(f):
    """(sigmoid(f), 1 - sigmoid(f)) without cancellation or overflow."""
    z = tl.exp(-tl.abs(f))
    inv = 1.0 / (1.0 + z)
    zi = z * inv
    pos = f >= 0
    return tl.where(pos, inv, zi), tl.where(pos, zi, inv)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _cos_sin(THETA, d, dm, PRECISE: tl.constexpr):
    th = tl.load(THETA + d, mask=dm, other=0.0).to(tl.float32)
    if PRECISE:
        cs = libdevice.cos(th)
        sn = libdevice.sin(th)
    else:
        cs = tl.cos(th)
        sn = tl.sin(th)
    return cs, sn


@triton.jit
def _extract_row(v, rows, r):
    """Row ``r`` (a scalar) of the [BT, BD] tile ``v``, as a [BD] vector."""
    return tl.sum(tl.where((rows == r)[:, None], v, 0.0), axis=0)


@triton.jit
def _scan_carry(lam, x, h, rows, BT: tl.constexpr):
    """One [BT, BD] tile of the real scan ``h_k = lam_k h_{k-1} + x_k`` entered with state ``h`` ([BD]):
    the tile's states and the state after its last row."""
    p, z = tl.associative_scan((lam, x), 0, _combine_real)
    out = z + p * h[None, :]
    return out, _extract_row(out, rows, BT - 1)


@triton.jit
def _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE: tl.constexpr):
    if GAMMA_MODE == 2:
        gam = tl.load(GAMMA + d, mask=dm, other=0.0).to(tl.float32)
    elif GAMMA_MODE == 1:
        gam = tl.zeros_like(d.to(tl.float32)) + gamma_val
    else:
        gam = tl.zeros_like(d.to(tl.float32))
    return gam


@triton.jit
def _gate_decay(f, gam):
    """Fused HGRU gates from forget logits ``f``: (lambda, 1 - lambda) with
    ``lambda = gamma + (1 - gamma) sigmoid(f)``; ``1 - lambda`` without cancellation."""
    mu, omu = _sigmoid_pair(f)
    return gam + (1.0 - gam) * mu, (1.0 - gam) * omu


@triton.jit
def _first_decay(Ab, sat, T, d, m, gam, FUSED: tl.constexpr, REVERSE: tl.constexpr):
    """Decay of the forward's first step (its time is T - 1 when REVERSE), from the row pointer
    ``Ab`` of the decay (or, FUSED, forget-logit) tensor: ``dh0 = conj(A_first) g_first``."""
    if REVERSE:
        t_off = (T - 1).to(tl.int64) * sat
    else:
        t_off = 0
    a0 = tl.load(Ab + t_off + d, mask=m, other=0.0).to(tl.float32)
    if FUSED:
        a0, unused = _gate_decay(a0, gam)
    return a0


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
        # VEC * (x // VEC) == x here; written so because Triton dropped tl.multiple_of hints on these
        # scalars (sm_90 compile, 2026-11-21) and then loaded 2-byte elements
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
def _rotation_tiles(THETA, d, dm, SIGN: tl.constexpr, PRECISE: tl.constexpr, BT: tl.constexpr,
                    BD: tl.constexpr):
    """cos/sin of theta and the tile ``F_k = exp(i SIGN (k+1) theta)``, k = 0..BT-1."""
    cs, sn = _cos_sin(THETA, d, dm, PRECISE)
    fr, fi = tl.associative_scan(
        (tl.zeros([BT, BD], tl.float32) + cs[None, :], tl.zeros([BT, BD], tl.float32) + SIGN * sn[None, :]),
        0, _combine_cmul)
    return cs, sn, fr, fi


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------
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
        off = (c.to(tl.int64) * B + b) * D + d
        if COMPLEX:
            plane = (NC - 1).to(tl.int64) * B * D
            tl.store(AGG_M + off, mr, mask=dm)
            tl.store(AGG_M + plane + off, mi, mask=dm)
            tl.store(AGG_S + off, hr, mask=dm)
            tl.store(AGG_S + plane + off, hi, mask=dm)
        else:
            tl.store(AGG_M + off, mr, mask=dm)
            tl.store(AGG_S + off, hr, mask=dm)
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
# backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bwd_load(X, sxb, sxt: tl.constexpr, A, sab, sat: tl.constexpr, H, H0r, H0i, DH, sgb, sgt: tl.constexpr,
              b64, t_ref, rel, q, s_hi, T, d0, D, DW: tl.constexpr, COMPLEX: tl.constexpr, FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_DH: tl.constexpr,
              NEED_A_T: tl.constexpr, LOAD_ALL: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Everything one backward tile reads. Row r (backward step ``q[r]``) is time ``t_ref + rel[r]``.
    The backward scan's previous row is the forward's next step (whose decay carries the
    gradient back), its next row the forward's previous step (whose state ``h`` feeds the gradient
    of the decay)."""
    if REVERSE:  # the forward ran T-1 -> 0, so its backward runs 0 -> T-1
        sgn = 1
    else:
        sgn = -1
    valid = q < s_hi
    t64 = t_ref.to(tl.int64)
    abase = b64 * sab + t64 * sat
    a_prev, unused = _load_pair(A, abase, (rel - sgn) * sat, (q >= 1) & valid, d0, D, False, BT, BD, 1)
    if NEED_A_T and LOAD_ALL:
        a_t, unused = _load_pair(A, abase, rel * sat, valid, d0, D, False, BT, BD, 1)
    else:
        a_t = a_prev
    if FUSED and LOAD_ALL:
        ur, ui = _load_pair(X, b64 * sxb + t64 * sxt, rel * sxt, valid, d0, D, COMPLEX, BT, BD, 1)
    else:
        ur = a_prev
        ui = a_prev
    if HAS_DH:
        gr, gi = _load_pair(DH, b64 * sgb + t64 * sgt, rel * sgt, valid, d0, D, COMPLEX, BT, BD, 1)
    else:
        gr = tl.zeros_like(a_prev)
        gi = gr
    if LOAD_ALL:
        hpr, hpi = _load_pair(H, (b64 * T + t64) * DW, (rel + sgn) * DW, (q + 1 < T) & valid, d0, D, COMPLEX,
                              BT, BD, 1)
        at_start = (q + 1 >= T)[:, None]  # the forward's first step: its previous state is h0
        hpr = tl.where(at_start, H0r[None, :], hpr)
        if COMPLEX:
            hpi = tl.where(at_start, H0i[None, :], hpi)
    else:
        hpr = a_prev
        hpi = a_prev
    return a_prev, a_t, ur, ui, gr, gi, hpr, hpi


@triton.jit
def _bwd_grads(gr, gi, hpr, hpi, a_t, ur, ui, cs, sn, gam, m2,
               COMPLEX: tl.constexpr, FUSED: tl.constexpr, NEED_DTHETA: tl.constexpr, NEED_DGAMMA: tl.constexpr):
    """Input gradients of one tile from ``g`` (gradient of the state, true frame) and the previous
    state ``h_prev``. Returns (dx real, dx imaginary, d decay-or-forget-logit, the tile's dtheta and
    dgamma contributions)."""
    if COMPLEX:
        # v = exp(i theta) h_prev = d h_t / d a_t
        vr = cs[None, :] * hpr - sn[None, :] * hpi
        vi = sn[None, :] * hpr + cs[None, :] * hpi
        da = gr * vr + gi * vi
        cross = gi * vr - gr * vi  # Re(conj(g) i v): d h_t / d theta, per unit decay
    else:
        da = gr * hpr
        cross = da
    th_c = da * 0.0
    g_c = da * 0.0
    if FUSED:
        mu, omu = _sigmoid_pair(a_t)
        if COMPLEX and NEED_DTHETA:
            th_c = tl.where(m2, (gam + (1.0 - gam) * mu) * cross, 0.0)
        om = (1.0 - gam) * omu  # 1 - lambda
        sr = _sigmoid(ur)
        dlam = da - gr * (ur * sr)
        dxr = gr * om * (sr * (1.0 + ur * (1.0 - sr)))
        if COMPLEX:
            si = _sigmoid(ui)
            dlam -= gi * (ui * si)
            dxi = gi * om * (si * (1.0 + ui * (1.0 - si)))
        else:
            dxi = dxr
        dgate = dlam * (1.0 - gam) * (mu * omu)
        if NEED_DGAMMA:
            g_c = tl.where(m2, dlam * omu, 0.0)
    else:
        if COMPLEX and NEED_DTHETA:
            th_c = tl.where(m2, a_t * cross, 0.0)
        dxr = gr
        dxi = gi
        dgate = da
    return dxr, dxi, dgate, th_c, g_c


@triton.jit(do_not_specialize=["sxb", "sab", "sgb", "B", "T", "D", "NC", "CL", "bd_rt"])
def _hgru_bwd_kernel(
    X, sxb, sxt: tl.constexpr,  # fused: input pre-activations (unused by the plain scans)
    A, sab, sat: tl.constexpr,  # decay a or forget-gate logits
    THETA, GAMMA, gamma_val,
    H0, s0b, s0d, s0c,
    H,  # saved forward output, contiguous
    DH, sgb, sgt: tl.constexpr,  # gradient of h
    DHT, stb, std, stc,  # gradient of the final state
    DX, DA,  # gradients of x / a (contiguous)
    DH0, DTHETA_P, DGAMMA_P,  # dh0; per-program partial sums, fp32 [B * NC, D]
    AGG_M, AGG_S,
    B, T, D, NC, CL, bd_rt, DW: tl.constexpr,
    COMPLEX: tl.constexpr, FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
    HAS_DH: tl.constexpr, HAS_DHT: tl.constexpr, GAMMA_MODE: tl.constexpr, NEED_DGAMMA: tl.constexpr,
    NEED_DTHETA: tl.constexpr, NEED_DH0: tl.constexpr, NEED_A_T: tl.constexpr, MODE: tl.constexpr,
    PRECISE: tl.constexpr, PREFETCH: tl.constexpr, FOLD: tl.constexpr, NCP: tl.constexpr,
    AGG_REV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):
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
    n_tiles = tl.cdiv(s_hi - s_lo, BT)
    IS_AGG: tl.constexpr = MODE == _MODE_AGG
    LOAD_ALL: tl.constexpr = MODE != _MODE_AGG

    gam1 = _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE)
    gam = gam1[None, :]
    cs, sn, fr, fi, ffr, ffi = _frame(THETA, d, dm, rows, -1.0, COMPLEX, PRECISE, BT, BD)  # backward: exp(-i theta)

    h0r = tl.zeros([BD], tl.float32)
    h0i = tl.zeros([BD], tl.float32)
    if HAS_H0 and LOAD_ALL:
        h0r, h0i = _load_state(H0, b64, s0b, s0d, s0c, d, dm, COMPLEX)

    # Gradient entering the chunk. The final state's gradient enters the first backward step
    # without a transition, but the tile rotates the incoming state by exp(-i theta): pre-rotate.
    gcr = tl.zeros([BD], tl.float32)
    gci = tl.zeros([BD], tl.float32)
    if not IS_AGG:
        if HAS_DHT:
            tr = tl.load(DHT + b64 * stb + d * std, mask=dm, other=0.0).to(tl.float32)
            if COMPLEX:
                ti = tl.load(DHT + b64 * stb + d * std + stc, mask=dm, other=0.0).to(tl.float32)
                gcr = cs * tr - sn * ti
                gci = sn * tr + cs * ti
            else:
                gcr = tr
        if MODE == _MODE_APPLY:
            gcr, gci = _carry_in(AGG_M, AGG_S, gcr, gci, b, c, d, dm, B, D, NC, COMPLEX, NCP)
    mr = tl.zeros([BD], tl.float32) + 1.0
    mi = tl.zeros([BD], tl.float32)

    if NEED_DTHETA:
        acc_th = tl.zeros([BT, BD], tl.float32)
    if NEED_DGAMMA:
        acc_g = tl.zeros([BT, BD], tl.float32)

    d0 = db * bd_rt  # = db * BD; runtime, so rows are not known to be aligned (see _load_pair)
    if REVERSE:  # the backward runs forward in time
        rel = rows
        t_first = s_lo
        step = BT
    else:
        rel = -rows
        t_first = T - 1 - s_lo
        step = -BT
    BACK: tl.constexpr = IS_AGG and AGG_REV  # the walk, see _walk_step
    if PREFETCH:
        s0, q, t_ref = _walk_step(0, n_tiles, s_lo, t_first, step, rows, BT, BACK)
        n_ap, n_at, n_ur, n_ui, n_dhr, n_dhi, n_hpr, n_hpi = _bwd_load(
            X, sxb, sxt, A, sab, sat, H, h0r, h0i, DH, sgb, sgt, b64, t_ref, rel, q, s_hi, T, d0, D, DW,
            COMPLEX, FUSED, REVERSE, HAS_DH, NEED_A_T, LOAD_ALL, BT, BD)
    for j in range(0, n_tiles):
        s0, q, t_ref = _walk_step(j, n_tiles, s_lo, t_first, step, rows, BT, BACK)
        if PREFETCH:
            a_prev, a_t, ur, ui, dhr, dhi, hpr, hpi = n_ap, n_at, n_ur, n_ui, n_dhr, n_dhi, n_hpr, n_hpi
            qn, tn = _walk_next(q, t_ref, j, n_tiles, s_hi, step, BT, BACK)
            n_ap, n_at, n_ur, n_ui, n_dhr, n_dhi, n_hpr, n_hpi = _bwd_load(
                X, sxb, sxt, A, sab, sat, H, h0r, h0i, DH, sgb, sgt, b64, tn, rel, qn, s_hi, T, d0, D, DW,
                COMPLEX, FUSED, REVERSE, HAS_DH, NEED_A_T, LOAD_ALL, BT, BD)
        else:
            a_prev, a_t, ur, ui, dhr, dhi, hpr, hpi = _bwd_load(
                X, sxb, sxt, A, sab, sat, H, h0r, h0i, DH, sgb, sgt, b64, t_ref, rel, q, s_hi, T, d0, D, DW,
                COMPLEX, FUSED, REVERSE, HAS_DH, NEED_A_T, LOAD_ALL, BT, BD)
        valid = q < s_hi
        m2 = valid[:, None] & dm[None, :]
        mp = ((q >= 1) & valid)[:, None] & dm[None, :]
        if FUSED:
            mu_p, omu_p = _sigmoid_pair(a_prev)
            dec = gam + (1.0 - gam) * mu_p
        else:
            dec = a_prev
        dec = tl.where(mp, dec, 1.0)
        # g = dh + conj(A_next) g_next, scanned in the frame rotating with exp(-i theta)
        last = tl.minimum(s_hi - s0, BT) - 1
        gr, gi, gcr, gci, mr, mi = _walk_scan(dec, dhr, dhi, gcr, gci, mr, mi, fr, fi, ffr, ffi, rows, last,
                                              IS_AGG, BACK, COMPLEX, FOLD, BT)
        if not IS_AGG:
            t64 = t_ref.to(tl.int64)
            dxr, dxi, dgate, th_c, g_c = _bwd_grads(gr, gi, hpr, hpi, a_t, ur, ui, cs, sn, gam, m2,
                                                    COMPLEX, FUSED, NEED_DTHETA, NEED_DGAMMA)
            if NEED_DTHETA:
                acc_th += th_c
            if NEED_DGAMMA:
                acc_g += g_c
            _store_pair(DX, (b64 * T + t64) * DW, rel * DW, valid, d0, D, dxr, dxi, COMPLEX, BT, BD, 1)
            _store_pair(DA, (b64 * T + t64) * D, rel * (DW // (1 + COMPLEX)), valid, d0, D, dgate, dgate, False,
                        BT, BD, 1)

    if IS_AGG:
        off = (c.to(tl.int64) * B + b) * D + d
        if COMPLEX:
            plane = (NC - 1).to(tl.int64) * B * D
            tl.store(AGG_M + off, mr, mask=dm)
            tl.store(AGG_M + plane + off, mi, mask=dm)
            tl.store(AGG_S + off, gcr, mask=dm)
            tl.store(AGG_S + plane + off, gci, mask=dm)
        else:
            tl.store(AGG_M + off, mr, mask=dm)
            tl.store(AGG_S + off, gcr, mask=dm)
    else:
        prow = (b64 * NC + c) * D + d
        if NEED_DTHETA:
            tl.store(DTHETA_P + prow, tl.sum(acc_th, axis=0), mask=dm)
        if NEED_DGAMMA:
            tl.store(DGAMMA_P + prow, tl.sum(acc_g, axis=0), mask=dm)
        if NEED_DH0:
            fm = dm & ((d * 0 + c) == NC - 1)
            a0 = _first_decay(A + b64 * sab, sat, T, d, fm, gam1, FUSED, REVERSE)
            off = b64 * D + d
            if COMPLEX:
                tl.store(DH0 + 2 * off, (a0 * (cs * gcr + sn * gci)).to(DH0.dtype.element_ty), mask=fm)
                tl.store(DH0 + 2 * off + 1, (a0 * (cs * gci - sn * gcr)).to(DH0.dtype.element_ty), mask=fm)
            else:
                tl.store(DH0 + off, (a0 * gcr).to(DH0.dtype.element_ty), mask=fm)


# ----------------------------------------------------------------------------------------------
# "stream" (real scans): one program per channel block walks the whole sequence through a software
# pipeline. Launch arguments are left to Triton's specialisation (strides and D divisible by 16 are
# recognised), so that aligned rows get 16-byte loads, which the pipeline stages in shared memory.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _stream_column(D, BD: tl.constexpr, BT: tl.constexpr):
    """The program's (batch row, as int64; channels; channel mask; tile rows)."""
    pid = tl.program_id(0)
    ndb = tl.cdiv(D, BD)
    d = (pid % ndb) * BD + tl.arange(0, BD)
    return (pid // ndb).to(tl.int64), d, d < D, tl.arange(0, BT)


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


@triton.jit
def _hgru_stream_bwd_kernel(
    X, sxb, sxt, A, sab, sat, GAMMA, gamma_val, H0, s0b, s0d, H, DH, sgb, sgt, DHT, stb, std,
    DX, DA, DH0, DGAMMA_P, T, D,
    FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr, HAS_DH: tl.constexpr,
    HAS_DHT: tl.constexpr, GAMMA_MODE: tl.constexpr, NEED_DGAMMA: tl.constexpr, NEED_DH0: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
):
    """Backward of the stream forward: ``g_t = dh_t + lambda_{next} g_{next}`` walked against the
    forward's direction (row s of the walk is the forward's step T-1-s); ``dx``, ``da`` (or the
    fused gates' gradients) per tile from ``g`` and the saved previous state."""
    b, d, dm, rows = _stream_column(D, BD, BT)
    gam1 = _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE)
    gam = gam1[None, :]
    h0 = tl.zeros([BD], tl.float32)
    if HAS_H0:
        h0, unused_h0 = _load_state(H0, b, s0b, s0d, 0, d, dm, False)
    g = tl.zeros([BD], tl.float32)
    if HAS_DHT:
        g, unused_g = _load_state(DHT, b, stb, std, 0, d, dm, False)
    if REVERSE:  # the forward ran T-1 -> 0: its next step is t - 1, its previous one t + 1
        rel = rows
        sf = -1
    else:
        rel = -rows
        sf = 1
    if NEED_DGAMMA:
        acc_g = tl.zeros([BT, BD], tl.float32)
    xb = X + b * sxb
    ab = A + b * sab
    gb = DH + b * sgb
    hb = H + b * T * D
    ob = b * T * D
    for j in tl.range(0, T, BT, num_stages=STAGES):
        if REVERSE:
            t0 = b * 0 + j  # int64
        else:
            t0 = b * 0 + (T - 1 - j)  # int64
        s = j + rows
        valid = (s < T)[:, None]
        m = valid & dm[None, :]
        m_next = ((s >= 1) & (s < T))[:, None] & dm[None, :]  # the forward's next step exists
        m_prev = (s + 1 < T)[:, None] & dm[None, :]  # the forward's previous step exists
        dd = d[None, :]
        an = tl.load(ab + t0 * sat + ((rel + sf) * sat)[:, None] + dd, mask=m_next, other=1.0).to(tl.float32)
        if HAS_DH:
            dh = tl.load(gb + t0 * sgt + (rel * sgt)[:, None] + dd, mask=m, other=0.0).to(tl.float32)
        else:
            dh = tl.zeros([BT, BD], tl.float32)
        hp = tl.load(hb + t0 * D + ((rel - sf) * D)[:, None] + dd, mask=m_prev, other=0.0).to(tl.float32)
        hp = tl.where(m_prev, hp, h0[None, :])
        if FUSED:
            # (a name of its own: one also assigned before the loop would be loop-carried, and its
            # shape would change inside the loop, which Triton rejects)
            dec, unused_dec = _gate_decay(an, gam)
            dec = tl.where(m_next, dec, 1.0)
            a_t = tl.load(ab + t0 * sat + (rel * sat)[:, None] + dd, mask=m, other=0.0).to(tl.float32)
            u = tl.load(xb + t0 * sxt + (rel * sxt)[:, None] + dd, mask=m, other=0.0).to(tl.float32)
        else:
            dec = an
            a_t = an
            u = an
        gt, g = _scan_carry(dec, dh, g, rows, BT)
        dxr, dxi, dgate, th_c, g_c = _bwd_grads(gt, gt, hp, hp, a_t, u, u, 1.0, 0.0, gam, m,
                                                False, FUSED, False, NEED_DGAMMA)
        if NEED_DGAMMA:
            acc_g += g_c
        tl.store(DX + ob + t0 * D + (rel * D)[:, None] + dd, dxr.to(DX.dtype.element_ty), mask=m)
        tl.store(DA + ob + t0 * D + (rel * D)[:, None] + dd, dgate.to(DA.dtype.element_ty), mask=m)
    if NEED_DGAMMA:
        tl.store(DGAMMA_P + b * D + d, tl.sum(acc_g, axis=0), mask=dm)
    if NEED_DH0:
        a0 = _first_decay(ab, sat, T, d, dm, gam1, FUSED, REVERSE)
        tl.store(DH0 + b * D + d, (a0 * g).to(DH0.dtype.element_ty), mask=dm)


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
# single pass over time chunks: decoupled look-back
# ----------------------------------------------------------------------------------------------
_MAX_SPINS = tl.constexpr(1 << 20)  # a wait never lasts this long unless something is broken


@triton.jit
def _pack(v, tag):
    """(tag, fp32 value) in one 64-bit word: a reader that sees the tag also sees the value."""
    return (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (tag.to(tl.int64) << 32)


@triton.jit
def _unpack(w):
    return (w >> 32).to(tl.int32), (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _lookback(LBUF, c, NC, B, D, b, d, dm, mr, mi, sr, si, ir, ii, E,
              COMPLEX: tl.constexpr, PUBLISH_INC: tl.constexpr, LBW: tl.constexpr):
    """State entering chunk ``c`` of one (batch, channel-block) column, by decoupled look-back
    (Merrill and Garland's single-pass scan).

    Chunk ``c`` maps the state entering it to the state leaving it, ``h -> M h + S`` (complex M, S:
    ``(mr, mi, sr, si)``). It publishes that map at once (tag ``E + 1``), then walks back over its
    predecessors: one that has published the state leaving it (tag ``E + 2``) ends the walk, one that
    has only published its map is composed and skipped. Programs run chunk-major, so every
    predecessor was launched earlier and is resident: the waits end. Chunk 0 starts from
    ``(ir, ii)``. Finally the chunk publishes the state leaving it, over its ``S`` (as CUB keeps a
    tile's aggregate and inclusive prefix in one slot): a reader that finds a chunk's state needs
    no more of it, and one that finds neither a whole map nor a whole state (a store half seen)
    reads again.

    ``LBW`` predecessors are read per round trip (a window, as in CUB): see ``_lookback_window``.
    ``LBW == 1`` walks back one predecessor per round trip (``_lookback_single``).

    Each channel's value travels with its tag in one 64-bit word (stored and polled through L2), so
    no fence is needed between data and flag, and ``E`` (from the launch epoch) tells this launch's
    words from older ones: the buffer is never cleared. LBUF holds four planes of [NC, B, D] words:
    Re M, Re S-or-state, Im M, Im S-or-state (the real scans use the first two).
    """
    plane = NC.to(tl.int64) * B * D
    row = (c.to(tl.int64) * B + b) * D + d
    cr = ir
    ci = ii
    if c > 0:
        tl.store(LBUF + row, _pack(mr, E + 1), mask=dm, cache_modifier=".cg")
        tl.store(LBUF + plane + row, _pack(sr, E + 1), mask=dm, cache_modifier=".cg")
        if COMPLEX:
            tl.store(LBUF + 2 * plane + row, _pack(mi, E + 1), mask=dm, cache_modifier=".cg")
            tl.store(LBUF + 3 * plane + row, _pack(si, E + 1), mask=dm, cache_modifier=".cg")
        if LBW == 1:
            cr, ci = _lookback_single(LBUF, plane, c, B, D, b, d, dm, mr, ir, ii, E, COMPLEX)
        else:
            cr, ci = _lookback_window(LBUF, plane, c, B, D, b, d, dm, mr, ir, ii, E, COMPLEX, LBW)
    if PUBLISH_INC:
        publish = c < NC
    else:  # tests: only chunk 0 publishes its state, so the walks cross every predecessor
        publish = c == 0
    if publish:  # over the S words: same address, same thread, so never older than the map
        tl.store(LBUF + plane + row, _pack(mr * cr - mi * ci + sr, E + 2), mask=dm, cache_modifier=".cg")
        if COMPLEX:
            tl.store(LBUF + 3 * plane + row, _pack(mr * ci + mi * cr + si, E + 2), mask=dm,
                     cache_modifier=".cg")
    return cr, ci


@triton.jit
def _lookback_single(LBUF, plane, c, B, D, b, d, dm, mr, cr, ci, E, COMPLEX: tl.constexpr):
    """The walk of ``_lookback`` one predecessor per round trip (``LBW == 1``). Returns the state
    entering chunk ``c`` (``(cr, ci)`` is returned unchanged only if the walk gives up)."""
    amr = mr * 0.0 + 1.0  # the composed map of the chunks skipped so far (identity)
    ami = mr * 0.0
    asr = mr * 0.0
    asi = mr * 0.0
    k = c - 1
    go = (k >= 0).to(tl.int32)
    spins = 0
    off = ~dm  # channels past D are always "ready"
    while go == 1:
        krow = (k.to(tl.int64) * B + b) * D + d
        tm, kmr = _unpack(tl.load(LBUF + krow, mask=dm, other=0, cache_modifier=".cg"))
        ts, ksr = _unpack(tl.load(LBUF + plane + krow, mask=dm, other=0, cache_modifier=".cg"))
        pr = ksr  # the chunk's S (tag E + 1) or its state (tag E + 2)
        inc_ok = (ts == E + 2) | off
        agg_ok = ((tm == E + 1) & (ts == E + 1)) | off
        if COMPLEX:
            tmi, kmi = _unpack(tl.load(LBUF + 2 * plane + krow, mask=dm, other=0, cache_modifier=".cg"))
            tsi, ksi = _unpack(tl.load(LBUF + 3 * plane + krow, mask=dm, other=0, cache_modifier=".cg"))
            pi = ksi
            inc_ok = inc_ok & ((tsi == E + 2) | off)
            agg_ok = agg_ok & (((tmi == E + 1) & (tsi == E + 1)) | off)
        else:
            kmi = kmr * 0.0
            ksi = kmr * 0.0
            pi = pr * 0.0
        if tl.min(inc_ok.to(tl.int32), axis=0) == 1:
            cr = amr * pr - ami * pi + asr
            ci = amr * pi + ami * pr + asi
            go = go * 0
        elif tl.min(agg_ok.to(tl.int32), axis=0) == 1:
            # running map := running map o chunk k's map (the chunk's map applies first)
            amr, ami, asr, asi = _combine_affine_complex(kmr, kmi, ksr, ksi, amr, ami, asr, asi)
            k -= 1
            go = (k >= 0).to(tl.int32)
        else:
            spins += 1
            go = (spins < _MAX_SPINS).to(tl.int32)  # never reached unless something is broken
    return cr, ci


@triton.jit
def _lookback_window(LBUF, plane, c, B, D, b, d, dm, mr, cr, ci, E, COMPLEX: tl.constexpr,
                     LBW: tl.constexpr):
    """The walk of ``_lookback``, ``LBW`` predecessors per round trip (CUB's windowed look-back).

    One round trip loads the words of chunks ``k - LBW + 1 .. k`` (row ``w`` is chunk
    ``k - LBW + 1 + w``, oldest first; rows below chunk 0 are masked) as [LBW, BD] tiles. A row
    counts as published only when all channels of the program have its tag (so that the program
    takes one branch). With ``j`` the newest row holding an inclusive state: if every row after
    ``j`` holds its map, the state entering chunk ``c`` is (maps after the window) o (maps of rows
    ``j+1 ..``) applied to row ``j``'s state, and the walk ends; with no inclusive row and every map
    present, the window's maps are composed into the running map and the window moves back by
    ``LBW``; otherwise the same window is read again. The window is composed by an associative scan
    along the rows (earlier chunk first), row ``j`` as the constant map ``h -> state_j`` and the
    rows before it as the identity. Chunk 0 never publishes a map, so a window reaching it waits for
    its state. Returns the state entering chunk ``c``."""
    amr = mr * 0.0 + 1.0  # the composed map of the chunks after the window (identity)
    ami = mr * 0.0
    asr = mr * 0.0
    asi = mr * 0.0
    w = tl.arange(0, LBW)
    dead = (~dm)[None, :]  # channels past D are always "ready"
    k = c - 1  # the newest chunk of the window
    go = (k >= 0).to(tl.int32)
    spins = 0
    while go == 1:
        kk = k - (LBW - 1) + w
        live = kk >= 0
        wrow = ((kk.to(tl.int64) * B + b) * D)[:, None] + d[None, :]
        wm = live[:, None] & dm[None, :]
        tm, kmr = _unpack(tl.load(LBUF + wrow, mask=wm, other=0, cache_modifier=".cg"))
        ts, ksr = _unpack(tl.load(LBUF + plane + wrow, mask=wm, other=0, cache_modifier=".cg"))
        inc_ok = (ts == E + 2) | dead  # then ksr is the chunk's state, else its S
        agg_ok = ((tm == E + 1) & (ts == E + 1)) | dead
        if COMPLEX:
            tmi, kmi = _unpack(tl.load(LBUF + 2 * plane + wrow, mask=wm, other=0, cache_modifier=".cg"))
            tsi, ksi = _unpack(tl.load(LBUF + 3 * plane + wrow, mask=wm, other=0, cache_modifier=".cg"))
            inc_ok = inc_ok & ((tsi == E + 2) | dead)
            agg_ok = agg_ok & (((tmi == E + 1) & (tsi == E + 1)) | dead)
        inc_row = (tl.min(inc_ok.to(tl.int32), axis=1) == 1) & live
        agg_row = (tl.min(agg_ok.to(tl.int32), axis=1) == 1) | (~live)
        j = tl.max(tl.where(inc_row, w, -1), axis=0)  # -1: no inclusive state in the window
        ready = tl.min(tl.where(w > j, agg_row.to(tl.int32), 1), axis=0)
        if ready == 1:
            after = (w > j)[:, None]
            at = (w == j)[:, None]
            wmr = tl.where(after, kmr, tl.where(at, 0.0, 1.0))
            wsr = tl.where(after | at, ksr, 0.0)
            if COMPLEX:
                wmi = tl.where(after, kmi, 0.0)
                wsi = tl.where(after | at, ksi, 0.0)
                wmr, wmi, wsr, wsi = tl.associative_scan((wmr, wmi, wsr, wsi), 0, _combine_affine_complex)
                gmr = _extract_row(wmr, w, LBW - 1)
                gmi = _extract_row(wmi, w, LBW - 1)
                gsr = _extract_row(wsr, w, LBW - 1)
                gsi = _extract_row(wsi, w, LBW - 1)
            else:
                wmr, wsr = tl.associative_scan((wmr, wsr), 0, _combine_real)
                gmr = _extract_row(wmr, w, LBW - 1)
                gsr = _extract_row(wsr, w, LBW - 1)
                gmi = gmr * 0.0
                gsi = gmr * 0.0
            # running map := running map o window map
            amr, ami, asr, asi = _combine_affine_complex(gmr, gmi, gsr, gsi, amr, ami, asr, asi)
            if j >= 0:  # the window map was constant: asr, asi is the state
                cr = asr
                ci = asi
                go = go * 0
            else:
                k -= LBW
                go = (k >= 0).to(tl.int32)
        else:
            spins += 1
            go = (spins < _MAX_SPINS).to(tl.int32)  # never reached unless something is broken
    return cr, ci


@triton.jit
def _lb_program(D, B, BD: tl.constexpr):
    """This program's place in a look-back kernel's chunk-major grid: its chunk, the number of (batch,
    channel-block) columns, its channel block and its batch."""
    pid = tl.program_id(0)
    ndb = tl.cdiv(D, BD)
    n_cols = ndb * B
    col = pid % n_cols
    return pid // n_cols, n_cols, col % ndb, col // ndb


@triton.jit
def _launch_tag(STATE):
    """Base of this launch's look-back tags (``E + 1``: a chunk's map, ``E + 2``: the state leaving
    it), from the launch epoch (see ``_epoch_done``)."""
    return (tl.load(STATE, cache_modifier=".cg") & 0x0FFFFFFF) * 4


@triton.jit
def _epoch_done(STATE, c, NC, n_cols):
    """Advance the launch epoch once every program has read it: a last-chunk program finishes only
    after every chunk of its column has published, i.e. has started, so when all ``n_cols`` of them
    are done the epoch can move (the next launch on the stream reads it)."""
    if c == NC - 1:
        ticket = tl.atomic_add(STATE + 1, 1, sem="acq_rel", scope="gpu")
        if ticket == n_cols - 1:
            tl.atomic_xchg(STATE + 1, 0, sem="relaxed", scope="gpu")
            tl.atomic_add(STATE, 1, sem="release", scope="gpu")


@triton.jit
def _chunk_map(p, zr, zi, fr, fi, rows, last, COMPLEX: tl.constexpr):
    """The tile's map h -> M h + S (true frame) from its zero-start scan (p, z) in the rotating frame."""
    pl = _extract_row(p, rows, last)
    zlr = _extract_row(zr, rows, last)
    if COMPLEX:
        zli = _extract_row(zi, rows, last)
        flr = _extract_row(fr, rows, last)
        fli = _extract_row(fi, rows, last)
        mr = pl * flr
        mi = pl * fli
        sr = flr * zlr - fli * zli
        si = flr * zli + fli * zlr
    else:
        mr = pl
        mi = pl * 0.0
        sr = zlr
        si = pl * 0.0
    return mr, mi, sr, si


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
    c, n_cols, db, b = _lb_program(D, B, BD)
    b64 = b.to(tl.int64)
    d0 = db * bd_rt  # = db * BD; runtime, so rows are not known to be aligned (see _load_pair)
    d = d0 + tl.arange(0, BD)
    dm = d < D
    rows = tl.arange(0, BT)
    E = _launch_tag(STATE)

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
        yr = fr * xr + fi * xi
        yi = fr * xi - fi * xr
        p, zr, zi = tl.associative_scan((lam, yr, yi), 0, _combine_pair)
    else:
        fr = 0.0
        fi = 0.0
        p, zr = tl.associative_scan((lam, xr), 0, _combine_real)
        zi = zr
    last = tl.minimum(T - c * BT, BT) - 1
    mr, mi, sr, si = _chunk_map(p, zr, zi, fr, fi, rows, last, COMPLEX)

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


@triton.jit(do_not_specialize=["sxb", "sab", "sgb", "B", "T", "D", "NC", "bd_rt"])
def _hgru_bwd_lb_kernel(
    X, sxb, sxt: tl.constexpr, A, sab, sat: tl.constexpr, THETA, GAMMA, gamma_val, H0, s0b, s0d, s0c, H,
    DH, sgb, sgt: tl.constexpr, DHT, stb, std, stc, DX, DA, DH0, DTHETA_P, DGAMMA_P,
    LBUF, STATE,
    B, T, D, NC, bd_rt, DW: tl.constexpr,
    COMPLEX: tl.constexpr, FUSED: tl.constexpr, REVERSE: tl.constexpr, HAS_H0: tl.constexpr,
    HAS_DH: tl.constexpr, HAS_DHT: tl.constexpr, GAMMA_MODE: tl.constexpr, NEED_DGAMMA: tl.constexpr,
    NEED_DTHETA: tl.constexpr, NEED_DH0: tl.constexpr, NEED_A_T: tl.constexpr, PRECISE: tl.constexpr,
    PUBLISH_INC: tl.constexpr, LBW: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):
    """The backward over one tile per program, single pass (see ``_hgru_fwd_lb_kernel``); chunks are
    numbered in the backward scan's order."""
    c, n_cols, db, b = _lb_program(D, B, BD)
    b64 = b.to(tl.int64)
    d0 = db * bd_rt  # = db * BD; runtime, so rows are not known to be aligned (see _load_pair)
    d = d0 + tl.arange(0, BD)
    dm = d < D
    rows = tl.arange(0, BT)
    E = _launch_tag(STATE)

    gam1 = _gamma(GAMMA, gamma_val, d, dm, GAMMA_MODE)
    gam = gam1[None, :]
    if COMPLEX:
        cs, sn, fr, fi = _rotation_tiles(THETA, d, dm, -1.0, PRECISE, BT, BD)
    else:
        cs = 1.0
        sn = 0.0
        fr = 0.0
        fi = 0.0
    h0r = tl.zeros([BD], tl.float32)
    h0i = tl.zeros([BD], tl.float32)
    if HAS_H0:
        h0r, h0i = _load_state(H0, b64, s0b, s0d, s0c, d, dm, COMPLEX)

    q = c * BT + rows
    valid = q < T
    m2 = valid[:, None] & dm[None, :]
    mp = ((q >= 1) & valid)[:, None] & dm[None, :]
    if REVERSE:  # the backward runs forward in time
        rel = rows
        t_ref = c * BT
    else:
        rel = -rows
        t_ref = T - 1 - c * BT
    a_prev, a_t, ur, ui, dhr, dhi, hpr, hpi = _bwd_load(
        X, sxb, sxt, A, sab, sat, H, h0r, h0i, DH, sgb, sgt, b64, t_ref, rel, q, T, T, d0, D, DW,
        COMPLEX, FUSED, REVERSE, HAS_DH, NEED_A_T, True, BT, BD)
    if FUSED:
        mu_p, omu_p = _sigmoid_pair(a_prev)
        dec = gam + (1.0 - gam) * mu_p
    else:
        dec = a_prev
    dec = tl.where(mp, dec, 1.0)
    if COMPLEX:
        yr = fr * dhr + fi * dhi
        yi = fr * dhi - fi * dhr
        p, zr, zi = tl.associative_scan((dec, yr, yi), 0, _combine_pair)
    else:
        p, zr = tl.associative_scan((dec, dhr), 0, _combine_real)
        zi = zr
    last = tl.minimum(T - c * BT, BT) - 1
    mr, mi, sr, si = _chunk_map(p, zr, zi, fr, fi, rows, last, COMPLEX)

    # the final state's gradient enters the first backward step without a transition, but the
    # tile rotates the incoming state by exp(-i theta): pre-rotate it
    ir = tl.zeros([BD], tl.float32)
    ii = tl.zeros([BD], tl.float32)
    if HAS_DHT:
        tr = tl.load(DHT + b64 * stb + d * std, mask=dm, other=0.0).to(tl.float32)
        if COMPLEX:
            ti = tl.load(DHT + b64 * stb + d * std + stc, mask=dm, other=0.0).to(tl.float32)
            ir = cs * tr - sn * ti
            ii = sn * tr + cs * ti
        else:
            ir = tr
    cr, ci = _lookback(LBUF, c, NC, B, D, b, d, dm, mr, mi, sr, si, ir, ii, E,
                       COMPLEX, PUBLISH_INC, LBW)

    if COMPLEX:
        wr = zr + p * cr[None, :]
        wi = zi + p * ci[None, :]
        gr = fr * wr - fi * wi
        gi = fr * wi + fi * wr
    else:
        gr = zr + p * cr[None, :]
        gi = gr
    dxr, dxi, dgate, th_c, g_c = _bwd_grads(gr, gi, hpr, hpi, a_t, ur, ui, cs, sn, gam, m2,
                                            COMPLEX, FUSED, NEED_DTHETA, NEED_DGAMMA)
    t64 = t_ref.to(tl.int64)
    _store_pair(DX, (b64 * T + t64) * DW, rel * DW, valid, d0, D, dxr, dxi, COMPLEX, BT, BD, 1)
    _store_pair(DA, (b64 * T + t64) * D, rel * (DW // (1 + COMPLEX)), valid, d0, D, dgate, dgate, False, BT, BD, 1)
    prow = (b64 * NC + c) * D + d
    if NEED_DTHETA:
        tl.store(DTHETA_P + prow, tl.sum(th_c, axis=0), mask=dm)
    if NEED_DGAMMA:
        tl.store(DGAMMA_P + prow, tl.sum(g_c, axis=0), mask=dm)
    if NEED_DH0:
        # dh0 = conj(A_first) g_first, g_first the state leaving the last backward chunk
        fm = dm & ((d * 0 + c) == NC - 1)
        a0 = _first_decay(A + b64 * sab, sat, T, d, fm, gam1, FUSED, REVERSE)
        glr = mr * cr - mi * ci + sr
        gli = mr * ci + mi * cr + si
        off = b64 * D + d
        if COMPLEX:
            tl.store(DH0 + 2 * off, (a0 * (cs * glr + sn * gli)).to(DH0.dtype.element_ty), mask=fm)
            tl.store(DH0 + 2 * off + 1, (a0 * (cs * gli - sn * glr)).to(DH0.dtype.element_ty), mask=fm)
        else:
            tl.store(DH0 + off, (a0 * glr).to(DH0.dtype.element_ty), mask=fm)
    _epoch_done(STATE, c, NC, n_cols)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------
_SM_COUNT = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small, so that the tests exercise the chunked path
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# Default launch parameters per kernel, (complex, fused, backward) ->
#   (mode when B * D / 32 programs are too few to cover the memory latency, BT of the look-back
#    kernels, (BT, prefetch) of the sequential and two-pass kernels).
# One warp per program: its 32 lanes own 32 channels and each thread holds all BT steps of its
# channel, so the scan along time runs in registers. Chosen from bench_scan.py --sweep on an H200
# (2026-11-21): for few (batch, channel-block) columns the real kernels are fastest as two passes
# (backward too, once the sweep timed GPU time without launch overhead: real fwd+bwd 0.159 ms at
# (8, 2048, 1024) against 0.214 with the look-back backward; complex backward 0.153 against 0.261),
# except the plain complex forward (look-back: 0.077 ms against 0.094), and the plain real forward,
# which takes the chunks of two passes in one launch ("chunklb", see CHUNKLB_PROGRAMS_PER_SM); with many
# columns the sequential kernels win (or "stream", see _STREAM).
_DEFAULTS = {
    (False, False, False): ("chunklb", 16, (16, True)),
    (False, False, True): ("twopass", 16, (8, True)),
    (False, True, False): ("twopass", 16, (16, True)),
    (False, True, True): ("twopass", 8, (8, True)),
    (True, False, False): ("lookback", 32, (16, True)),
    (True, False, True): ("twopass", 8, (8, True)),
    (True, True, False): ("twopass", 8, (8, True)),
    (True, True, True): ("twopass", 8, (8, False)),
}
_MODES = ("seq", "lookback", "twopass", "stream", "chunklb", "block")
# "stream" (real scans; ``_hgru_stream_fwd/bwd_kernel``): one warp per channel block walks the whole
# sequence, with a software pipeline of STREAM_STAGES tiles (the loads of the next tiles wait in
# shared memory; 16-byte loads when Triton sees aligned rows). The default for the plain real scan
# when B * D gives at least STREAM_WIDE_PROGRAMS 64-channel programs per SM (64 x 16 tiles). H200,
# 2026-11-21, bf16, graphed GPU times (bench_scan.py --sweep): at (32, 512, 1536) forward 0.052 ms,
# fwd+bwd 0.121 (the sequential kernel: 0.056 / 0.17); with fewer programs (B * D = 8192) the two-pass
# kernels win (16-channel stream programs: 0.073 ms forward, 0.170 fwd+bwd, against 0.061 / 0.159), and
# the fused kernels, whose tiles carry more work, are faster in the other modes at every size tried.
# A lone streaming kernel with 16 x 64 tiles reached 0.052 ms at (8, 2048, 1024)
# (bench/explore_scan_stream.py, do_bench of direct launches), the same tiles inside these kernels
# 0.098 (graphed; 0.100 with do_bench): not understood.
_STREAM = {(False, False): True, (False, True): True, (True, False): False, (True, True): False}  # (fused, bwd)
STREAM_STAGES = 3
STREAM_WIDE_PROGRAMS = 4  # per SM, with 64-channel programs
# "block" (real forward; ``_hgru_block_fwd_kernel``): one CTA of BLOCK_FWD["num_warps"] warps per 64-channel
# column walks the sequence in blocks of R * NW = 128 steps, 3-deep software pipeline. The default for the
# plain real forward when the columns number at least BLOCK_MIN_COLUMNS_PER_SM per SM. H200, 2026-11-21,
# graphed GPU times, forward / floor (bench/explore_scan_block.py, session 11; results/explore_scan_block_*):
# 1.16-1.19x at (8, 2048, 1024), 1.12-1.15x at (8, 4096, 1024), 1.09-1.10x at (32, 512, 1536), 1.20x at
# (16, 2048, 1024) (chunklb: 1.71x / 1.64x; stream: 1.35x at (32, 512, 1536)); with 64 columns,
# (4, 2048, 1024), 1.72x against chunklb's 1.80x; with 32, (1, 8192, 2048) and (2, 16384, 1024), 3.4-3.6x
# against 1.75-1.81x (most SMs idle). Other launches of the same sweep: 4 stages within 3% either way;
# 32-channel CTAs 1.21-1.42x at B * D = 8192; 128-channel CTAs 1.10x at (16, 2048, 1024) but 1.50x at
# B * D = 8192. The fused forward was slower this way (2.8-4.9x the floor against 1.5-2.8x for its
# default plans: the gates' registers), so it keeps them.
BLOCK_FWD = dict(R=8, NW=16, BD=64, num_warps=4, STAGES=3)
BLOCK_MIN_COLUMNS_PER_SM = 0.45
# Predecessors the look-back reads per round trip, real / complex (``tuning["lookback_window"]``
# overrides; 1 is the walk of one predecessor per round trip). Measured with bench_scan.py --sweep on
# an H200 (2026-11-21, bf16, (8, 2048, 1024) and (1, 8192, 2048)): 1 is the fastest for every kernel
# and tile size; windows of 4 to 32 are 1.1-3.6x slower (real fwd+bwd 0.218 ms at W = 1, 0.280 at 4,
# 0.390 at 8, 0.629 at 16). The walks are short (a predecessor has usually published its state by
# the time a tile looks), so a window only adds L2 reads and registers. Kept for experiments.
_LOOKBACK_WINDOW = {False: 1, True: 1}
# Programs per SM the two-pass kernels aim for (chunks per column = this * SMs / columns, at most 32),
# real / complex. H200, 2026-11-21, graphed bench_scan.py --sweep over num_chunks at (8, 2048, 1024) and
# (8, 4096, 1024) (256 columns): real fwd+bwd 0.139 / 0.268 ms with 8 chunks (16 per SM) against
# 0.160 / 0.303 with 5 (8 per SM); 12 chunks 0.154 / 0.296. The complex kernels, which hold twice the
# state per program, were slower with 8 chunks (0.259 / 0.496 against 0.229 / 0.437).
TWOPASS_PROGRAMS_PER_SM = {False: 16, True: 8}
# The same for the one-launch chunked forward ("chunklb", the plain real forward's default where it
# used to take two passes), real / complex. H200, 2026-11-21, graphed bench_scan.py --sweep of
# programs_per_sm at (8, 2048, 1024), (1, 8192, 2048), (8, 4096, 1024) and (2, 16384, 1024), real forward:
# 16: 0.0594 / 0.0588 / 0.1234 / 0.1210 ms; 32: 0.0558 / 0.0554 / 0.1121 / 0.1130; 64: 0.0530 / 0.0535 /
# 0.1043 / 0.1053 (32-channel programs of one warp); two passes (16 per SM): 0.0583 / 0.0600 / 0.1169 /
# 0.1172. The complex and fused forwards were not faster this way
# (bench/results/bench_scan_sweep_h200_2026-11-21_s8.md).
CHUNKLB_PROGRAMS_PER_SM = {False: 64, True: 48}
CHUNKLB_VEC = 2
# Channels and warps per "chunklb" program (each thread still owns one channel). Same sweep, 64 programs
# per SM: 64 channels / 2 warps 0.0486 / 0.0510 / 0.0897 / 0.0951 ms against 0.0530 / 0.0535 / 0.1043 /
# 0.1053 with 32 / 1 (and 0.0533 / 0.0534 / 0.0999 / 0.1008 with 32 / 1 at 96 programs per SM).
# With two channels per access (CHUNKLB_VEC below) one warp per 64 channels keeps the time scan in
# registers.
CHUNKLB_BLOCK = (64, 1)
# tuning['vec'] (default CHUNKLB_VEC): chunklb programs of the real forward read and write VEC channels
# per access (VEC in _load_pair / _store_pair) where _vec_width allows (else one). H200, 2026-11-21,
# graphed bench_scan.py --sweep (bench/results/bench_scan_sweep_h200_2026-11-21_s9.md), real forward at
# (8, 2048, 1024) / (8, 4096, 1024) / (1, 8192, 2048) / (2, 16384, 1024): VEC 1 with 64 channels / 2
# warps 0.0489 / 0.0880 / 0.0510 / 0.0945 ms; VEC 2 with 64 / 1: 0.0448 / 0.0808 / 0.0487 / 0.0891
# (taken); VEC 2 with 128 / 2: 0.0454 / 0.0806 / 0.0490 / 0.0884; VEC 4 with 64 / 1: 0.0504 / 0.0907 /
# 0.0539 / 0.0962; VEC 8 with 64 / 1: 0.0739 / 0.1361 / 0.0778 / 0.1420. With VEC = 2
# each thread owns two channels and the time scan stays in registers; offline sm_90 compiles: 64 channels
# / 1 warp take 153 registers and no shared memory, 128 / 2 warps 148, while 64 / 2 warps split the tile's
# rows over the warps (the scan then goes through shared memory): give it 32 * VEC channels per warp.
# With VEC = 8 (16-byte accesses, as the stream kernels) lanes share a channel's time steps and the
# tile's scan runs across lanes.
# Kernels whose mode differs from _DEFAULTS' when their columns number at most half the SMs, (complex,
# fused, backward) -> mode: the fused complex backward takes the look-back kernel. H200, 2026-11-21,
# graphed bench_scan.py --sweep: with 64 columns, (1, 8192, 2048) and (2, 16384, 1024), the look-back
# backward took 0.42 / 0.82 ms against 0.51 / 1.04 for two passes; with 256 columns, (8, 2048, 1024),
# two passes won (0.29 against 0.37 ms).
_FEW_COLUMNS_MODE = {(True, True, True): "lookback"}
# The two-pass chunk-map kernels walk each chunk from its end (``_walk_step``) unless they are fused
# (tuning['agg_reverse'] overrides): the second pass then starts on the tiles the first one read last,
# which L2 may still hold. H200, 2026-11-21, graphed bench_scan.py --sweep at (8, 2048, 1024), (8, 4096, 1024),
# (1, 8192, 2048) and (2, 16384, 1024), against the forward walk: real forward 3.5-8% faster (0.0581 /
# 0.1166 / 0.0596 / 0.1168 ms against 0.0631 / 0.1220 / 0.0620 / 0.1210), real fwd+bwd 1-3%, complex
# fwd+bwd 5-6% (0.218 / 0.416 / 0.242 / 0.470 against 0.230 / 0.438 / 0.258 / 0.498); the fused kernels,
# which carry the gates' registers too, were slower walking backwards (fused complex forward 0.183 /
# 0.353 / 0.202 / 0.400 against 0.148 / 0.281 / 0.160 / 0.314; fused real 2-4%).


def _plan(B: int, T: int, D: int, is_complex: bool, device: torch.device, fused: bool = False,
          backward: bool = False) -> dict:
    """Launch parameters for one kernel launch.

    ``mode``: "seq" (one program per 32 channels of a sequence walks the whole sequence; used when
    that alone gives enough programs to cover the GPU's memory latency), "lookback" (one program
    per tile of BT steps, single pass with decoupled look-back; the default otherwise) or "twopass"
    (time chunks of CL steps: chunk maps, then the chunks; reads the inputs twice), "chunklb" (forward
    only: the chunks of "twopass" in one launch, each program's carry by look-back over the chunk maps;
    see ``_hgru_fwd_lbc_kernel``).
    """
    cfg = tuning
    key = (bool(is_complex), bool(fused), bool(backward))
    small_mode, bt_lb, (bt_seq, pf_default) = _DEFAULTS[key]
    # at least 32 channels per program, so that the lanes of a warp never split the time axis (with
    # 16-channel blocks the complex look-back backward gave wrong gradients for a few elements on an
    # H200, 2026-11-21, in tests/kernels; not understood, and that layout is no longer used)
    bd = max(32, cfg["block_d"] or 32)
    num_warps = cfg["num_warps"] or 1
    programs = B * triton.cdiv(D, bd)
    mode = cfg["mode"]
    sms = _sm_count(device)
    wide = D % 64 == 0 and B * D // 64 >= STREAM_WIDE_PROGRAMS * sms  # enough 64-channel stream programs
    block_cols = B * triton.cdiv(D, BLOCK_FWD["BD"])
    if mode is None:
        if not is_complex and not fused and not backward and block_cols >= BLOCK_MIN_COLUMNS_PER_SM * sms:
            mode = "block"
        elif not is_complex and _STREAM[(bool(fused), bool(backward))] and wide and T > 16:
            mode = "stream"
        else:
            min_programs = cfg["min_programs"] or 8 * sms
            mode = "seq" if programs >= min_programs or T <= bt_seq else small_mode
            if mode == small_mode and 2 * programs <= sms:
                mode = _FEW_COLUMNS_MODE.get(key, mode)
    if mode not in _MODES:
        raise ValueError(f"tuning['mode']={mode!r} is not one of {_MODES}")
    if mode in ("chunklb", "block") and backward:  # forward kernels only: their backward takes two passes
        mode = "twopass"
    if mode == "block":
        if is_complex:
            raise ValueError("tuning['mode']='block' is for the real scans only")
        r, nw = int(cfg["segment_steps"] or BLOCK_FWD["R"]), int(cfg["segments"] or BLOCK_FWD["NW"])
        bd, warps = int(cfg["block_d"] or BLOCK_FWD["BD"]), int(cfg["num_warps"] or BLOCK_FWD["num_warps"])
        if any(v < 1 or v & (v - 1) for v in (r, nw, bd, warps)) or bd > 256 or nw * bd < 256 * warps:
            raise ValueError(
                f"tuning: the block forward needs powers of two with block_d <= 256 and segments * block_d >= "
                f"256 * num_warps (got segment_steps={r}, segments={nw}, block_d={bd}, num_warps={warps}): with "
                "8 channels per access, a warp's lanes must all fit on (segment, channel) pairs, or Triton spreads "
                "a segment's steps over lanes or warps, which is slow and gave wrong results on an H200 "
                "(Triton 3.6, 2026-11-21)")
        return dict(mode=mode, R=r, NW=nw, BD=bd, num_warps=warps, STAGES=int(cfg["stages"] or BLOCK_FWD["STAGES"]),
                    NC=1, CL=T, LBW=1)
    if mode == "chunklb":  # wider programs (CHUNKLB_BLOCK)
        bd = cfg["block_d"] or CHUNKLB_BLOCK[0]
        num_warps = cfg["num_warps"] or CHUNKLB_BLOCK[1]
        programs = B * triton.cdiv(D, bd)
    if mode == "stream":
        if is_complex:
            raise ValueError("tuning['mode']='stream' is for the real scans only")
        bd = cfg["block_d"] or (64 if wide else 16)
        bt = max(2, min(cfg["block_t"] or (16 if wide else 64), _pow2_at_least(T)))
        return dict(mode=mode, BT=bt, BD=bd, num_warps=num_warps, NC=1, CL=T, LBW=1,
                    STAGES=int(cfg["stages"] or STREAM_STAGES))
    bt = cfg["block_t"] or (bt_lb if mode == "lookback" else bt_seq)
    bt = max(2, min(bt, _pow2_at_least(T)))
    if mode == "lookback":
        nc = triton.cdiv(T, bt)
        cl = bt
    elif mode == "seq":
        nc, cl = 1, triton.cdiv(T, bt) * bt
    else:
        nc = cfg["num_chunks"]
        if nc is None:  # programs per SM from the tables (at most 32 chunks for two passes), chunks of >= 4 tiles
            per_sm = cfg.get("programs_per_sm") or (
                TWOPASS_PROGRAMS_PER_SM if mode == "twopass" else CHUNKLB_PROGRAMS_PER_SM)[bool(is_complex)]
            nc = min(triton.cdiv(per_sm * sms, programs), triton.cdiv(T, 4 * bt),
                     32 if mode == "twopass" else 1024)
        nc = max(1, min(int(nc), triton.cdiv(T, bt), 1024))
        cl = triton.cdiv(triton.cdiv(T, nc), bt) * bt
        nc = triton.cdiv(T, cl)
    prefetch = cfg["prefetch"] if cfg["prefetch"] is not None else pf_default
    fold = cfg["fold"] if cfg["fold"] is not None else True
    lbw = cfg.get("lookback_window")
    lbw = _LOOKBACK_WINDOW[bool(is_complex)] if lbw is None else lbw
    if isinstance(lbw, bool) or not isinstance(lbw, numbers.Integral) or lbw < 1 or lbw & (lbw - 1):
        raise ValueError(f"tuning['lookback_window']={lbw!r} is not a power of two >= 1 "
                         "(predecessors read per look-back round trip)")
    agg_rev = cfg.get("agg_reverse")
    agg_rev = not fused if agg_rev is None else agg_rev
    vec = int(cfg.get("vec") or CHUNKLB_VEC) if mode == "chunklb" and not is_complex else 1
    if vec < 1 or vec & (vec - 1) or vec > 8:
        raise ValueError(f"tuning['vec']={cfg.get('vec')!r} is not 1, 2, 4 or 8 (channels per load/store)")
    return dict(mode=mode, BT=bt, BD=bd, num_warps=num_warps, NC=nc, CL=cl, PREFETCH=bool(prefetch),
                FOLD=bool(fold), NCP=max(2, _pow2_at_least(nc - 1)), LBW=int(lbw), AGG_REV=bool(agg_rev),
                VEC=vec)


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
                lbuf, state = _lookback_buffers(dev, (4 if is_complex else 2) * nc * B * D)
                _hgru_fwd_lb_kernel[(n_cols * nc,)](
                    *args, lbuf, state, B, T, D, nc, plan["BD"], dw, PUBLISH_INC=tuning["publish_inclusive"] is not False,
                    LBW=lbw, BT=plan["BT"], BD=plan["BD"], num_warps=plan["num_warps"], **flags)
            else:
                agg_m, agg_s, kmode = dummy, dummy, MODE_SEQ
                if nc > 1:
                    agg_m, agg_s = _agg_buffers(nc, B, D, is_complex, dev)
                    _hgru_fwd_kernel[(n_cols * (nc - 1),)](
                        *args, agg_m, agg_s, B, T, D, nc, cl, plan["BD"], dw, MODE=MODE_AGG, **flags, **plan)
                    kmode = MODE_APPLY
                _hgru_fwd_kernel[(n_cols * nc,)](*args, agg_m, agg_s, B, T, D, nc, cl, plan["BD"], dw, MODE=kmode, **flags, **plan)
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
                lbuf, state = _lookback_buffers(dev, (4 if is_complex else 2) * nc * B * D)
                _hgru_bwd_lb_kernel[(n_cols * nc,)](
                    *args, lbuf, state, B, T, D, nc, plan["BD"], dw, PUBLISH_INC=tuning["publish_inclusive"] is not False,
                    LBW=lbw, BT=plan["BT"], BD=plan["BD"], num_warps=plan["num_warps"], **flags)
            else:
                agg_m, agg_s, kmode = dummy, dummy, MODE_SEQ
                if nc > 1:
                    agg_m, agg_s = _agg_buffers(nc, B, D, is_complex, dev)
                    _hgru_bwd_kernel[(n_cols * (nc - 1),)](
                        *args, agg_m, agg_s, B, T, D, nc, cl, plan["BD"], dw, MODE=MODE_AGG, **flags, **plan)
                    kmode = MODE_APPLY
                _hgru_bwd_kernel[(n_cols * nc,)](*args, agg_m, agg_s, B, T, D, nc, cl, plan["BD"], dw, MODE=kmode, **flags, **plan)
        dtheta = dtheta_p.sum(0).to(theta.dtype) if need_theta else None
        dgamma = dgamma_p.sum(0).to(gamma.dtype) if need_gamma else None
        return (dx if need_x else None, da if need_a else None, dtheta, dgamma,
                dh0 if need_h0 else None, None, None, None)


def _gamma_mode(gamma: Optional[Tensor], gamma_val: Optional[float]) -> int:
    return 2 if gamma is not None else (1 if gamma_val is not None else 0)


def _agg_buffers(nc: int, B: int, D: int, is_complex: bool, device: torch.device):
    shape = (2, nc - 1, B, D) if is_complex else (nc - 1, B, D)  # complex: real plane, imaginary plane
    return (torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device))


# ----------------------------------------------------------------------------------------------
# public ops
# ----------------------------------------------------------------------------------------------
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
