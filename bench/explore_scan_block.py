#!/usr/bin/env python3
"""Exploration (issue 3, session 11): the real scan's forward as one CTA per channel block that walks
the sequence in blocks of ``R * NW`` steps, with the block's time split over ``NW`` segments of ``R``
consecutive steps (the tile is [NW, R, BD]: a thread owns ``R`` steps of its channels, so each
segment's scan runs in registers, and the segments are joined by a scan of their ``NW`` maps).

Why: at B * D = 8192 there are only 128 64-channel columns, so parallelism must come from time. The
look-back kernels (one program per chunk) pay an L2 round trip per chunk and read each chunk twice
(``chunklb``) or keep it resident in few warps; here one CTA per SM keeps ``STAGES`` blocks of loads
in flight (the software pipeline stages them in shared memory), reads every input once and has no
inter-CTA dependency at all.

Times, in one run on the GPU: the floor (bench_scan's elementwise kernel), ``real_scan``'s default
forward, and the block kernel over a grid of (R, NW, BD, warps, stages, chunks). Every result is
checked against ``real_scan`` before it is timed.

    python3 bench/explore_scan_block.py --out DIR [--shapes 8x2048x1024,...] [--configs JSON]
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hgrn_fairseq.kernels.hgru_triton import _combine_real  # noqa: E402


@triton.jit
def _last_of(v, seg, NW: tl.constexpr):
    """Row NW - 1 of a [NW, BD] tensor, as [BD]."""
    return tl.sum(tl.where(seg == NW - 1, v, 0.0), axis=0)


@triton.jit(do_not_specialize=["T", "D", "bd_rt"])
def block_fwd(X, A, H, HT, T, D, bd_rt, R: tl.constexpr, NW: tl.constexpr, BD: tl.constexpr,
              STAGES: tl.constexpr, VEC: tl.constexpr, SHIFT: tl.constexpr):
    """h_t = a_t h_{t-1} + x_t over [B, T, D] (contiguous), one program per (batch, BD channels)."""
    pid = tl.program_id(0)
    ndb = tl.cdiv(D, BD)
    b = (pid // ndb).to(tl.int64)
    d0 = tl.multiple_of((pid % ndb) * bd_rt, VEC)
    ch = d0 + tl.arange(0, BD)
    w = tl.arange(0, NW)[:, None, None]
    r = tl.arange(0, R)[None, :, None]
    seg = tl.arange(0, NW)[:, None]  # [NW, 1]: segment index of the reduced maps
    cc = ch[None, None, :]
    rel = w * R + r  # [NW, R, 1]: step of each tile row within the block
    # rows start at multiples of VEC elements (D % VEC == 0, checked by the launcher), written so
    # that Triton sees it (and no more: VEC channels per access)
    DV = D // VEC
    base = b * T * DV * VEC
    h = tl.zeros([BD], tl.float32)
    for t0 in tl.range(0, T, R * NW, num_stages=STAGES):
        t = t0 + rel
        m = (t < T) & (cc < DV * VEC)
        off = base + (t.to(tl.int64) * DV) * VEC + cc
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        a = tl.load(A + off, mask=m, other=1.0).to(tl.float32)
        # each segment's map h -> P h + S (in-thread along r)
        P, S = tl.reduce((a, x), 1, _combine_real)  # [NW, BD]
        # state leaving each segment, given the state h entering the block
        Pi, Si = tl.associative_scan((P, S), 0, _combine_real)
        leave = Si + Pi * h[None, :]
        # state entering each segment: the previous segment's leaving state (h for the first)
        if SHIFT == 0:
            idx = tl.maximum(seg - 1, 0) + tl.zeros([NW, BD], tl.int32)
            enter = tl.gather(leave, idx, 0)
        else:
            enter = tl.sum(tl.where((seg[:, None, :] - 1) == seg[None, :, :], leave[None, :, :], 0.0), axis=1)
        enter = tl.where(seg == 0, h[None, :], enter)
        # fold the entering state into each segment's first step and scan in-thread
        xf = x + tl.where(r == 0, a * enter[:, None, :], 0.0)
        p, z = tl.associative_scan((a, xf), 1, _combine_real)
        tl.store(H + off, z.to(H.dtype.element_ty), mask=m)
        h = _last_of(leave, seg, NW)
    tl.store(HT + b * D + ch, h.to(HT.dtype.element_ty), mask=ch < D)


def launch_block(x, a, cfg, h=None, ht=None):
    B, T, D = x.shape
    if D % cfg.get("vec", 8) or False:
        raise ValueError(f"D = {D} is not a multiple of vec = {cfg.get('vec', 8)}")
    R, NW, BD = cfg["R"], cfg["NW"], cfg["BD"]
    h = torch.empty_like(x) if h is None else h
    ht = torch.empty(B, D, dtype=x.dtype, device=x.device) if ht is None else ht
    grid = (B * triton.cdiv(D, BD),)
    block_fwd[grid](x, a, h, ht, T, D, BD, R=R, NW=NW, BD=BD, STAGES=cfg.get("stages", 2),
                    VEC=cfg.get("vec", 8), SHIFT=cfg.get("shift", 0), num_warps=cfg.get("warps", 4))
    return h, ht


def _grid():
    out = []
    for r, nw, wp in [(4, 16, 4), (8, 16, 4), (2, 32, 8), (4, 32, 8), (8, 32, 8), (4, 64, 16), (16, 8, 2), (8, 8, 2)]:
        for st in (2, 3, 4):
            out.append(dict(R=r, NW=nw, BD=64, warps=wp, stages=st, vec=8))
    for r, nw, wp in [(4, 16, 2), (4, 32, 4), (8, 16, 2)]:
        out.append(dict(R=r, NW=nw, BD=32, warps=wp, stages=3, vec=8))
    for r, nw, wp in [(8, 8, 8), (4, 16, 16), (4, 8, 8)]:
        out.append(dict(R=r, NW=nw, BD=64, warps=wp, stages=3, vec=2))
    for r, nw, wp in [(4, 16, 8), (8, 16, 8)]:
        out.append(dict(R=r, NW=nw, BD=64, warps=wp, stages=3, vec=4))
    return out


DEFAULT_CONFIGS = _grid()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/explore_scan_block")
    ap.add_argument("--shapes", default="8x2048x1024,8x4096x1024,32x512x1536,1x8192x2048,2x16384x1024")
    ap.add_argument("--configs", default=None, help="JSON list of configs (default: a built-in grid)")
    ap.add_argument("--library", default=None,
                    help="JSON list of hgru_triton.tuning dicts: time real_scan and hgru_fused forwards (no grad) "
                         "under each instead of the block kernel above")
    args = ap.parse_args()
    import graph_timing
    from bench_scan import floor_op
    from hgrn_fairseq.kernels import hgru_triton as K

    os.makedirs(args.out, exist_ok=True)
    configs = json.loads(args.configs) if args.configs else DEFAULT_CONFIGS
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    lines = [f"# explore_scan_block ({torch.cuda.get_device_name()}, triton {triton.__version__})", "",
             "| shape | op | fwd ms | / floor |", "|---|---|---:|---:|"]
    rows = []

    def say(s):
        print(s, flush=True)

    for (B, T, D) in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(B, T, D, device="cuda", generator=g).to(torch.bfloat16)
        a = (0.6 + 0.4 * torch.rand(B, T, D, device="cuda", generator=g)).to(torch.bfloat16)
        out = torch.empty_like(x)
        ref, ref_t = K.real_scan(x, a)
        fl = graph_timing.gpu_time(lambda: floor_op([x, a], [out]))
        base = graph_timing.gpu_time(lambda: K.real_scan(x, a))
        for name, ms in (("floor", fl), ("real_scan default", base)):
            lines.append(f"| {(B, T, D)} | {name} | {ms:.4f} | {ms / fl:.2f} |")
            rows.append(dict(shape=[B, T, D], op=name, ms=ms))
            say(lines[-1])
        if args.library:
            f = torch.randn(B, T, D, device="cuda", generator=g).to(torch.bfloat16)
            lb = torch.rand(D, device="cuda", generator=g) * 0.9
            for tun in json.loads(args.library):
                saved = dict(K.tuning)
                K.tuning.update(tun)
                try:
                    for name, fn in (("real_scan", lambda: K.real_scan(x, a)),
                                     ("hgru_fused", lambda: K.hgru_fused(f, x, None, lb))):
                        mode = K._plan(B, T, D, False, x.device, name == "hgru_fused")["mode"]
                        ms = graph_timing.gpu_time(fn)
                        lines.append(f"| {(B, T, D)} | {name} {json.dumps(tun)} ({mode}) | {ms:.4f} | {ms / fl:.2f} |")
                        rows.append(dict(shape=[B, T, D], op=name, tuning=tun, mode=mode, ms=ms))
                        say(lines[-1])
                except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                    lines.append(f"| {(B, T, D)} | {json.dumps(tun)} | {type(e).__name__}: {str(e)[:80]} | |")
                    say(lines[-1])
                finally:
                    K.tuning.clear()
                    K.tuning.update(saved)
            continue
        h = torch.empty_like(x)
        ht = torch.empty(B, D, dtype=x.dtype, device=x.device)
        for cfg in configs:
            tag = json.dumps(cfg, sort_keys=True)
            try:
                launch_block(x, a, cfg, h, ht)
                torch.cuda.synchronize()
                err = ((h.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                err_t = ((ht.float() - ref_t.float()).abs().max() / ref_t.float().abs().max()).item()
                if not (err < 2e-2 and err_t < 2e-2):
                    lines.append(f"| {(B, T, D)} | block {tag} | WRONG ({err:.2e}, {err_t:.2e}) | |")
                    say(lines[-1])
                    continue
                ms = graph_timing.gpu_time(lambda: launch_block(x, a, cfg, h, ht))
            except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                lines.append(f"| {(B, T, D)} | block {tag} | {type(e).__name__}: {str(e)[:80]} | |")
                say(lines[-1])
                continue
            lines.append(f"| {(B, T, D)} | block {tag} | {ms:.4f} | {ms / fl:.2f} |")
            rows.append(dict(shape=[B, T, D], op="block", cfg=cfg, ms=ms))
            say(lines[-1])
    with open(os.path.join(args.out, "explore_scan_block.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "explore_scan_block.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
