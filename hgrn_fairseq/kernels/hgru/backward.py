"""Backward kernels of the HGRU scans (the forward's modes less "chunklb" and "block", whose backward
takes two passes):

* ``_hgru_bwd_kernel``: "seq" and the two passes of "twopass" (chunk maps, then the chunks);
* ``_hgru_bwd_lb_kernel``: "lookback", one tile per program, single pass;
* ``_hgru_stream_bwd_kernel``: "stream" (real scans).

The backward of ``h_t = A_t h_{t-1} + x_t`` is the same scan run in the other direction:
``g_t = dh_t + conj(A_{t+1}) g_{t+1}`` (``g_T`` = gradient of the final state), ``dx_t = g_t``,
``da_t = Re(conj(g_t) exp(i theta) h_{t-1})``, ``dtheta = sum a_t Re(conj(g_t) i exp(i theta) h_{t-1})``,
``dh_0 = conj(A_0) g_0``. It reads the saved output ``h`` (shifted by one step) instead of
recomputing it; sums over batch and time (``dtheta``, ``dgamma``) are written per program and
reduced with one ``torch.sum``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .lookback import _chunk_map, _epoch_done, _lookback, _tile_program, _tile_scan
from .scan_math import _first_decay, _gamma, _gate_decay, _rotation_tiles, _scan_carry, _sigmoid, _sigmoid_pair
from .tiles import (_carry_in, _chunk_program, _frame, _load_pair, _load_state, _MODE_AGG, _MODE_APPLY,
                    _store_chunk_map, _store_pair, _stream_column, _walk_next, _walk_scan, _walk_step)


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
def _final_grad_in(DHT, b64, stb, std, stc, d, dm, cs, sn, gr, gi, COMPLEX: tl.constexpr):
    """``(gr, gi)`` set to the gradient of the final state (channels ``d`` of batch row ``b64``; strides
    stb, std, stc), in fp32. It enters the first backward step without a transition, but the tile
    rotates the incoming state by exp(-i theta): pre-rotated (``gi`` is left as given for the real scans)."""
    tr = tl.load(DHT + b64 * stb + d * std, mask=dm, other=0.0).to(tl.float32)
    if COMPLEX:
        ti = tl.load(DHT + b64 * stb + d * std + stc, mask=dm, other=0.0).to(tl.float32)
        gr = cs * tr - sn * ti
        gi = sn * tr + cs * ti
    else:
        gr = tr
    return gr, gi


@triton.jit
def _store_dh0(DH0, A, b64, sab, sat, T, D, c, NC, d, dm, gam1, cs, sn, gr, gi, FUSED: tl.constexpr,
               REVERSE: tl.constexpr, COMPLEX: tl.constexpr):
    """``dh0 = conj(A_first) g_first`` (contiguous [B, D] or [B, D, 2]), from the programs of the last
    backward chunk; ``(gr, gi)``: g_first, the gradient state leaving that chunk."""
    fm = dm & ((d * 0 + c) == NC - 1)
    a0 = _first_decay(A + b64 * sab, sat, T, d, fm, gam1, FUSED, REVERSE)
    off = b64 * D + d
    if COMPLEX:
        tl.store(DH0 + 2 * off, (a0 * (cs * gr + sn * gi)).to(DH0.dtype.element_ty), mask=fm)
        tl.store(DH0 + 2 * off + 1, (a0 * (cs * gi - sn * gr)).to(DH0.dtype.element_ty), mask=fm)
    else:
        tl.store(DH0 + off, (a0 * gr).to(DH0.dtype.element_ty), mask=fm)


@triton.jit
def _bwd_decay(a_prev, gam, mp, FUSED: tl.constexpr):
    """The decay carrying the gradient back to a backward tile's rows: the forward's next step's (the
    loaded decay, or the gate lambda of its forget logits when FUSED); 1 outside ``mp`` (no next step)."""
    if FUSED:
        mu_p, omu_p = _sigmoid_pair(a_prev)
        dec = gam + (1.0 - gam) * mu_p
    else:
        dec = a_prev
    return tl.where(mp, dec, 1.0)


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


# ----------------------------------------------------------------------------------------------
# "seq" and "twopass" (MODE_SEQ / MODE_AGG / MODE_APPLY)
# ----------------------------------------------------------------------------------------------
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
    b, b64, c, db, d, dm, rows, s_lo, s_hi = _chunk_program(B, T, D, CL, BD, BT)
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
            gcr, gci = _final_grad_in(DHT, b64, stb, std, stc, d, dm, cs, sn, gcr, gci, COMPLEX)
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
        dec = _bwd_decay(a_prev, gam, mp, FUSED)
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
        _store_chunk_map(AGG_M, AGG_S, b, c, B, D, NC, d, dm, mr, mi, gcr, gci, COMPLEX)
    else:
        prow = (b64 * NC + c) * D + d
        if NEED_DTHETA:
            tl.store(DTHETA_P + prow, tl.sum(acc_th, axis=0), mask=dm)
        if NEED_DGAMMA:
            tl.store(DGAMMA_P + prow, tl.sum(acc_g, axis=0), mask=dm)
        if NEED_DH0:
            _store_dh0(DH0, A, b64, sab, sat, T, D, c, NC, d, dm, gam1, cs, sn, gcr, gci, FUSED, REVERSE, COMPLEX)




# ----------------------------------------------------------------------------------------------
# "stream" (real scans): one program per channel block walks the whole sequence through a software
# pipeline. Launch arguments are left to Triton's specialisation (strides and D divisible by 16 are
# recognised), so that aligned rows get 16-byte loads, which the pipeline stages in shared memory.
# ----------------------------------------------------------------------------------------------
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
# "lookback": single pass over tiles of BT steps, one per program (decoupled look-back, lookback.py)
# ----------------------------------------------------------------------------------------------
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
    c, n_cols, b, b64, d0, d, dm, rows, E = _tile_program(STATE, B, D, bd_rt, BD, BT)

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
    dec = _bwd_decay(a_prev, gam, mp, FUSED)
    p, zr, zi = _tile_scan(dec, dhr, dhi, fr, fi, COMPLEX)
    mr, mi, sr, si = _chunk_map(p, zr, zi, fr, fi, rows, tl.minimum(T - c * BT, BT) - 1, COMPLEX)  # (last row)

    # the final state's gradient enters the first backward step without a transition, but the
    # tile rotates the incoming state by exp(-i theta): pre-rotate it
    ir = tl.zeros([BD], tl.float32)
    ii = tl.zeros([BD], tl.float32)
    if HAS_DHT:
        ir, ii = _final_grad_in(DHT, b64, stb, std, stc, d, dm, cs, sn, ir, ii, COMPLEX)
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
    if NEED_DH0:  # g_first: the state leaving the last backward chunk
        _store_dh0(DH0, A, b64, sab, sat, T, D, c, NC, d, dm, gam1, cs, sn, mr * cr - mi * ci + sr,
                   mr * ci + mi * cr + si, FUSED, REVERSE, COMPLEX)
    _epoch_done(STATE, c, NC, n_cols)
