"""Decoupled look-back (Merrill and Garland's single-pass scan) for the HGRU kernels, as ``triton.jit``
helpers: a chunk publishes its map ``h -> M h + S``, finds the state entering it from its predecessors'
published maps and states (``_lookback``), and publishes the state leaving it. Values travel with tags
in 64-bit words (``_pack``), tagged by a launch epoch (``_launch_tag``, ``_epoch_done``), so the buffer is
never cleared. Used by the "lookback" kernels (one tile per program) and the "chunklb" forward.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .scan_math import _combine_affine_complex, _combine_pair, _combine_real, _extract_row

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
def _spin(spins):
    """One more poll that found its predecessor unpublished: the walk goes on until ``_MAX_SPINS`` polls
    (never reached unless something is broken). Returns the count and whether to go on (int32)."""
    spins += 1
    return spins, (spins < _MAX_SPINS).to(tl.int32)


@triton.jit
def _read_published(LBUF, plane, row, mask, ready, E, COMPLEX: tl.constexpr):
    """What chunks published at ``row`` of LBUF (loads under ``mask``): Re M, Im M, Re S-or-state and
    Im S-or-state (the imaginary parts 0 for the real scans), and per element whether the chunk's state
    (tag E + 2) or its whole map (tag E + 1) is there; elements in ``ready`` (channels past D) count as
    both."""
    tm, kmr = _unpack(tl.load(LBUF + row, mask=mask, other=0, cache_modifier=".cg"))
    ts, ksr = _unpack(tl.load(LBUF + plane + row, mask=mask, other=0, cache_modifier=".cg"))
    inc_ok = (ts == E + 2) | ready
    agg_ok = ((tm == E + 1) & (ts == E + 1)) | ready
    if COMPLEX:
        tmi, kmi = _unpack(tl.load(LBUF + 2 * plane + row, mask=mask, other=0, cache_modifier=".cg"))
        tsi, ksi = _unpack(tl.load(LBUF + 3 * plane + row, mask=mask, other=0, cache_modifier=".cg"))
        inc_ok = inc_ok & ((tsi == E + 2) | ready)
        agg_ok = agg_ok & (((tmi == E + 1) & (tsi == E + 1)) | ready)
    else:
        kmi = kmr * 0.0
        ksi = kmr * 0.0
    return kmr, kmi, ksr, ksi, inc_ok, agg_ok


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
        kmr, kmi, ksr, ksi, inc_ok, agg_ok = _read_published(LBUF, plane, krow, dm, off, E, COMPLEX)
        pr = ksr  # the chunk's S (tag E + 1) or its state (tag E + 2)
        if COMPLEX:
            pi = ksi
        else:
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
            spins, go = _spin(spins)
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
        # (inc_ok: ksr is the chunk's state, else its S)
        kmr, kmi, ksr, ksi, inc_ok, agg_ok = _read_published(LBUF, plane, wrow, wm, dead, E, COMPLEX)
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
            spins, go = _spin(spins)
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
def _tile_program(STATE, B, D, bd_rt, BD: tl.constexpr, BT: tl.constexpr):
    """A "lookback" kernel's program (one tile of BT steps; ``_lb_program``): its chunk (tile), the number
    of columns, its batch row (also as int64), its first channel ``d0``, channels, channel mask, tile
    rows, and this launch's tag base (``_launch_tag``)."""
    c, n_cols, db, b = _lb_program(D, B, BD)
    b64 = b.to(tl.int64)
    d0 = db * bd_rt  # = db * BD; runtime, so rows are not known to be aligned (see _load_pair)
    d = d0 + tl.arange(0, BD)
    dm = d < D
    rows = tl.arange(0, BT)
    E = _launch_tag(STATE)
    return c, n_cols, b, b64, d0, d, dm, rows, E


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
def _tile_scan(lam, xr, xi, fr, fi, COMPLEX: tl.constexpr):
    """A look-back tile scanned from zero with decay ``lam`` and input ``x`` (complex: in the frame
    rotating with ``F``, ``(fr, fi)``): ``(p, zr, zi)``, from which ``_chunk_map`` takes the tile's map."""
    if COMPLEX:
        yr = fr * xr + fi * xi
        yi = fr * xi - fi * xr
        p, zr, zi = tl.associative_scan((lam, yr, yi), 0, _combine_pair)
    else:
        p, zr = tl.associative_scan((lam, xr), 0, _combine_real)
        zi = zr
    return p, zr, zi


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
