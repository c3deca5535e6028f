"""Element-wise math of the HGRU scans, as ``triton.jit`` helpers every kernel inlines: the associative
combines of ``tl.associative_scan``, the HGRU gates, the rotation of the complex scan, and the scan of one
[BT, BD] tile entered with a state.

The complex rotation is constant per channel, so a tile is scanned in a rotating frame: with
``F_k = exp(i (k+1) theta)`` (k the row inside the tile, computed once per program, ``_rotation_tiles``),
``h_k = F_k * z_k`` where ``z`` is a *real-decay* scan of ``conj(F_k) x_k``. The complex scan is thus
two real scans sharing the decay (``_combine_pair``), and no angle larger than ``BT * theta`` is ever
formed.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this module is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETED:
    from triton.language.extra import libdevice  # accurate sin/cos (tl.sin/cos may be approximate)
else:  # the interpreter has no libdevice; numpy's sin/cos are exact enough
    libdevice = None


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
def _rotation_tiles(THETA, d, dm, SIGN: tl.constexpr, PRECISE: tl.constexpr, BT: tl.constexpr,
                    BD: tl.constexpr):
    """cos/sin of theta and the tile ``F_k = exp(i SIGN (k+1) theta)``, k = 0..BT-1."""
    cs, sn = _cos_sin(THETA, d, dm, PRECISE)
    fr, fi = tl.associative_scan(
        (tl.zeros([BT, BD], tl.float32) + cs[None, :], tl.zeros([BT, BD], tl.float32) + SIGN * sn[None, :]),
        0, _combine_cmul)
    return cs, sn, fr, fi
