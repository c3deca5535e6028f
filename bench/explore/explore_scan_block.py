#!/usr/bin/env python3
"""Exploration of the "block" mode: the real scan's forward as one CTA per channel block that walks
the sequence in blocks of ``R * NW`` steps, with the block's time split over ``NW`` segments of ``R``
consecutive steps (the tile is [NW, R, BD]: a thread owns ``R`` steps of its channels, so each
segment's scan runs in registers, and the segments are joined by a scan of their ``NW`` maps).

Why: at B * D = 8192 there are only 128 64-channel columns, so parallelism must come from time. The
look-back kernels (one program per chunk) pay an L2 round trip per chunk and read each chunk twice
(``chunklb``) or keep it resident in few warps; here one CTA per SM keeps ``STAGES`` blocks of loads
in flight (the software pipeline stages them in shared memory), reads every input once and has no
inter-CTA dependency at all.

Times, in one run on the GPU: the floor (bench_scan's elementwise kernel), ``real_scan``'s default
forward, and the block kernel (``hgru_triton._hgru_block_fwd_kernel``, launched directly, so that
launches ``_plan`` refuses can be tried too) over a grid of (R, NW, BD, warps, stages, vec). Every
result is checked against ``real_scan`` before it is timed. ``--library`` times ``real_scan`` and
``hgru_fused`` forwards under ``tuning`` dicts instead.

(The first sweep and the layout diagnosis in ``bench/results/explore_scan_block/`` ran an earlier copy
of the kernel that could also shift the segment states by a masked sum instead of ``tl.gather``: its
rows name that ``shift`` option.)

    python3 -m bench.explore.explore_scan_block --out DIR [--shapes 8x2048x1024,...] [--configs JSON | --library JSON]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton


from hgrn_fairseq.kernels import hgru_triton as K


def launch_block(x, a, cfg, h=None, ht=None):
    """The block forward of contiguous [B, T, D] x and a, launched with ``cfg`` (R, NW, BD, warps,
    stages, vec) as given."""
    B, T, D = x.shape
    vec = cfg.get("vec", 8)
    if D % vec:
        raise ValueError(f"D = {D} is not a multiple of vec = {vec}")
    h = torch.empty_like(x) if h is None else h
    ht = torch.empty(B, D, dtype=x.dtype, device=x.device) if ht is None else ht
    K._hgru_block_fwd_kernel[(B * triton.cdiv(D, cfg["BD"]),)](
        x, T * D, D, a, T * D, D, a, 0.0, a, 0, 0, h, ht, T, D, FUSED=False, REVERSE=False, HAS_H0=False,
        GAMMA_MODE=0, R=cfg["R"], NW=cfg["NW"], BD=cfg["BD"], STAGES=cfg.get("stages", 2), VEC=vec,
        num_warps=cfg.get("warps", 4))
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
    from bench import graph_timing
    from bench.bench_scan import floor_op

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
                try:
                    with K.tuned(**tun):
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
