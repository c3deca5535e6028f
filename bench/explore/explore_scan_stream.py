#!/usr/bin/env python3
"""Exploration (issue 3): can one program per channel block, streaming the whole sequence with a deep
software pipeline (``tl.range(num_stages=S)``: the loads of S-1 future tiles in flight, staged in
shared memory), run the real scan near the memory floor when B * D gives only ~2 programs per SM?

Times, in one run on the GPU: the floor (an elementwise kernel moving the same bytes over a fully
parallel grid), the same streaming loop doing no scan (``copy``: the streaming ceiling of the grid),
and the streaming scan, forward and backward, over a grid of (BT, BD, stages, warps). Each scan result
is checked against ``hgru_triton.real_scan`` (forward) and autograd (backward) before it is timed.

    python3 bench/explore/explore_scan_stream.py --out DIR [--shapes 8x2048x1024,8x4096x1024]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

_BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/ (this file is in bench/explore/)
sys.path.insert(0, os.path.dirname(_BENCH))
sys.path.insert(0, _BENCH)

from bench_scan import floor_op  # noqa: E402  (the floor of the table: an elementwise kernel)
from hgrn_fairseq.kernels.hgru_triton import _combine_real, _extract_row, _scan_carry, _stream_column  # noqa: E402


@triton.jit
def stream_fwd(X, A, H, T, D, BT: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
               COPY: tl.constexpr):
    b, d, dm, rows = _stream_column(D, BD, BT)
    base = b * T * D
    h = tl.zeros([BD], tl.float32)
    for t0 in tl.range(0, T, BT, num_stages=STAGES):
        t = t0 + rows
        m = (t < T)[:, None] & dm[None, :]
        off = base + t[:, None] * D + d[None, :]
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        a = tl.load(A + off, mask=m, other=1.0).to(tl.float32)
        if COPY:
            out = x + a
        else:
            out, h = _scan_carry(a, x, h, rows, BT)
        tl.store(H + off, out.to(H.dtype.element_ty), mask=m)


@triton.jit
def stream_bwd(DH, A, HS, DX, DA, DHT, T, D, BT: tl.constexpr, BD: tl.constexpr,
               STAGES: tl.constexpr, COPY: tl.constexpr):
    """g_t = dh_t + a_{t+1} g_{t+1} (g after the last step = DHT), dx = g, da_t = g_t h_{t-1}
    (h_{-1} = 0). Tiles walk time backwards; row r of a tile is time t_hi - r."""
    b, d, dm, rows = _stream_column(D, BD, BT)
    base = b * T * D
    g = tl.load(DHT + b * D + d, mask=dm, other=0.0).to(tl.float32)
    for j in tl.range(0, T, BT, num_stages=STAGES):
        t = T - 1 - j - rows
        valid = t >= 0
        m = valid[:, None] & dm[None, :]
        off = base + t[:, None] * D + d[None, :]
        dh = tl.load(DH + off, mask=m, other=0.0).to(tl.float32)
        an = tl.load(A + off + D, mask=(valid & (t + 1 < T))[:, None] & dm[None, :], other=1.0).to(tl.float32)
        hp = tl.load(HS + off - D, mask=(valid & (t >= 1))[:, None] & dm[None, :], other=0.0).to(tl.float32)
        if COPY:
            gg = dh + an
        else:
            gg, g = _scan_carry(an, dh, g, rows, BT)
        tl.store(DX + off, gg.to(DX.dtype.element_ty), mask=m)
        tl.store(DA + off, (gg * hp).to(DA.dtype.element_ty), mask=m)


@triton.jit
def _column_vec(D, bd_rt, BD: tl.constexpr, BT: tl.constexpr, VEC: tl.constexpr):
    """As _stream_column, with only VEC-element alignment known for the channel block."""
    pid = tl.program_id(0)
    ndb = tl.cdiv(D, BD)
    d = tl.multiple_of((pid % ndb) * bd_rt, VEC) + tl.arange(0, BD)
    return (pid // ndb).to(tl.int64), d, tl.arange(0, BT)


@triton.jit(do_not_specialize=["T", "D", "bd_rt"])
def stream2_fwd(X, A, H, T, D, bd_rt, BT: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
                VEC: tl.constexpr):
    """As stream_fwd, but Triton is told only VEC-element alignment (so each thread loads VEC
    channels of a row, and with BD = 32 * VEC one warp's lanes own whole channels: the scan along
    time is in-thread), and the carry is the tile's last row (h <- P_last h + z_last)."""
    b, d, rows = _column_vec(D, bd_rt, BD, BT, VEC)
    base = b * T * D
    h = tl.zeros([BD], tl.float32)
    for t0 in tl.range(0, T, BT, num_stages=STAGES):
        t = t0 + rows
        m = (t < T)[:, None]
        off = tl.multiple_of(base + t.to(tl.int64) * D, VEC)[:, None] + d[None, :]
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        a = tl.load(A + off, mask=m, other=1.0).to(tl.float32)
        p, z = tl.associative_scan((a, x), 0, _combine_real)
        out = z + p * h[None, :]
        h = _extract_row(p, rows, BT - 1) * h + _extract_row(z, rows, BT - 1)
        tl.store(H + off, out.to(H.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["T", "D", "bd_rt"])
def stream2_bwd(DH, A, HS, DX, DA, DHT, T, D, bd_rt, BT: tl.constexpr, BD: tl.constexpr,
                STAGES: tl.constexpr, VEC: tl.constexpr):
    b, d, rows = _column_vec(D, bd_rt, BD, BT, VEC)
    base = b * T * D
    g = tl.load(DHT + b * D + d).to(tl.float32)
    for j in tl.range(0, T, BT, num_stages=STAGES):
        t = T - 1 - j - rows
        valid = t >= 0
        off = tl.multiple_of(base + t.to(tl.int64) * D, VEC)[:, None] + d[None, :]
        dh = tl.load(DH + off, mask=valid[:, None], other=0.0).to(tl.float32)
        an = tl.load(A + off + D, mask=(valid & (t + 1 < T))[:, None], other=1.0).to(tl.float32)
        hp = tl.load(HS + off - D, mask=(valid & (t >= 1))[:, None], other=0.0).to(tl.float32)
        p, z = tl.associative_scan((an, dh), 0, _combine_real)
        gg = z + p * g[None, :]
        g = _extract_row(p, rows, BT - 1) * g + _extract_row(z, rows, BT - 1)
        tl.store(DX + off, gg.to(DX.dtype.element_ty), mask=valid[:, None])
        tl.store(DA + off, (gg * hp).to(DA.dtype.element_ty), mask=valid[:, None])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8x2048x1024,8x4096x1024,32x512x1536")
    ap.add_argument("--bt", default="16,32,64")
    ap.add_argument("--bd", default="16,32,64")
    ap.add_argument("--stages", default="1,3,5,8")
    ap.add_argument("--warps", default="1,2,4")
    ap.add_argument("--v2", default="", help="VEC:BD:BT:STAGES:WARPS;... for stream2 (no stream1 grid if set)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from triton.testing import do_bench

    from hgrn_fairseq.kernels import hgru_triton

    ints = lambda s: [int(v) for v in s.split(",")]
    results = []
    log = open(os.path.join(args.out, "explore_scan_stream.log"), "w")

    def say(*a):
        s = " ".join(str(v) for v in a)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    say(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for shape in args.shapes.split(","):
        B, T, D = (int(v) for v in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(B, T, D, device="cuda", generator=g).bfloat16()
        a = torch.rand(B, T, D, device="cuda", generator=g).mul(0.2).add(0.8).bfloat16()
        dh = torch.randn(B, T, D, device="cuda", generator=g).bfloat16()
        dht = torch.randn(B, D, device="cuda", generator=g).float()
        h = torch.empty_like(x)
        dx = torch.empty_like(x)
        da = torch.empty_like(x)
        ref_h, _ = hgru_triton.real_scan(x, a)
        xr = x.detach().clone().requires_grad_()
        ar = a.detach().clone().requires_grad_()
        hh, hT = hgru_triton.real_scan(xr, ar)
        torch.autograd.backward([hh, hT], [dh, dht])
        ref_dx, ref_da = xr.grad, ar.grad
        f_fwd = do_bench(lambda: floor_op([x, a], [h]))
        f_bwd = do_bench(lambda: floor_op([dh, a, ref_h], [dx, da]))
        t_ours_f = do_bench(lambda: hgru_triton.real_scan(x, a))
        say(f"\n## {B}x{T}x{D}: floor fwd {f_fwd:.4f} ms, floor bwd {f_bwd:.4f} ms, "
            f"current real_scan fwd {t_ours_f:.4f} ms")
        def measure(row, tag, fw, bw, check):
            """Run fw/bw once (checked against the module's kernels when ``check``), then time them."""
            fw()
            bw()
            torch.cuda.synchronize()
            if check:
                row.update(err_h=(h.float() - ref_h.float()).abs().max().item(),
                           err_dx=(dx.float() - ref_dx.float()).abs().max().item(),
                           err_da=(da.float() - ref_da.float()).abs().max().item())
            row[f"{tag}_fwd"] = do_bench(fw)
            row[f"{tag}_bwd"] = do_bench(bw)

        def record(row, fill):
            try:
                fill()
                row["fwd_over_floor"] = row["scan_fwd"] / f_fwd
                row["bwd_over_floor"] = row["scan_bwd"] / f_bwd
            except Exception as e:  # compile failures (shared memory) are part of the answer
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            results.append(row)
            say(json.dumps(row))

        for spec in [v for v in args.v2.split(";") if v]:
            vec, bd, bt, st, nw = (int(v) for v in spec.split(":"))
            grid = (B * triton.cdiv(D, bd),)
            fw = lambda: stream2_fwd[grid](x, a, h, T, D, bd, BT=bt, BD=bd, STAGES=st, VEC=vec,  # noqa: E731
                                           num_warps=nw)
            bw = lambda: stream2_bwd[grid](dh, a, ref_h, dx, da, dht, T, D, bd, BT=bt, BD=bd,  # noqa: E731
                                           STAGES=st, VEC=vec, num_warps=nw)

            row = dict(shape=shape, v2=spec, programs=grid[0])

            def fill():
                measure(row, "scan", fw, bw, True)
                k_f, k_b = fw(), bw()  # a launch returns the compiled kernel
                row["fwd_regs_spills"] = (k_f.n_regs, k_f.n_spills)
                row["bwd_regs_spills"] = (k_b.n_regs, k_b.n_spills)

            record(row, fill)
        for bt, bd, st, nw in ([] if args.v2 else itertools.product(ints(args.bt), ints(args.bd),
                                                                     ints(args.stages), ints(args.warps))):
            if bt * bd < 32 * nw or nw * 32 > bt * bd // 4 and nw > 1:
                continue
            grid = (B * triton.cdiv(D, bd),)
            row = dict(shape=shape, BT=bt, BD=bd, stages=st, warps=nw, programs=grid[0])

            def fill():
                for copy in (True, False):
                    measure(row, "copy" if copy else "scan",
                            lambda: stream_fwd[grid](x, a, h, T, D, BT=bt, BD=bd, STAGES=st, COPY=copy,
                                                     num_warps=nw),
                            lambda: stream_bwd[grid](dh, a, ref_h, dx, da, dht, T, D, BT=bt, BD=bd,
                                                     STAGES=st, COPY=copy, num_warps=nw),
                            not copy)

            record(row, fill)
        results.append(dict(shape=shape, floor_fwd=f_fwd, floor_bwd=f_bwd, current_fwd=t_ours_f))
    with open(os.path.join(args.out, "explore_scan_stream.json"), "w") as f:
        json.dump(results, f, indent=1)
    ok = [r for r in results if "scan_fwd" in r]
    for shape in args.shapes.split(","):
        rs = [r for r in ok if r["shape"] == shape]
        if rs:
            bf = min(rs, key=lambda r: r["scan_fwd"])
            bb = min(rs, key=lambda r: r["scan_bwd"])
            say(f"best {shape}: fwd {bf}\n   bwd {bb}")


if __name__ == "__main__":
    main()
