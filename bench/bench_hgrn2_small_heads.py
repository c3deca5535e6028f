#!/usr/bin/env python3
"""HGRN2 with small heads (the LRA models' expand ratio 2: heads of 2 x 2): every implementation side by side.

The LRA 2-D models (Image, Pathfinder) scan each row and column of the H x W grid as its own sequence
of 32 steps, so a scan sees tens of thousands of short sequences of many heads of 2 x 2. One run, one
GPU, times (median of ``triton.testing.do_bench``, ms) of:

* ``packed``: ``hgrn2_fused(impl="packed")``, many heads per program (``hgrn2_packed_kernels``);
* ``recurrent``: the one-head-per-program step kernel (what ``auto`` took for T <= 32 before ``packed``);
* ``chunk``: the chunked kernels;
* ``hgru``: ``hgrn2_small_head_scan``, the state's entries as an HGRU scan plus a contraction;

forward under no_grad and forward + backward (gradients of q, v and the log-decay), bf16 inputs, with
each implementation's output checked against ``chunk`` on the same inputs first (norm-relative error).
Ratios are against ``recurrent`` for T <= 32 and against ``chunk`` for longer sequences (what ``auto``
took before). Results: ``<out>/bench_hgrn2_small_heads.{json,md}``.

    python -m bench.bench_hgrn2_small_heads --out results/ [--quick] [--set image] [--impls recurrent,chunk]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F


# (name, B, T, H, K, V): B counts the sequences the scan sees (images x rows for the 2-D tasks)
SHAPES = [
    ("pathfinder rows (128 img x 32, d 128)", 4096, 32, 64, 2, 2),
    ("image rows (64 img x 32, d 512)", 2048, 32, 256, 2, 2),
    ("heads 4 x 4 (4096 x 32, d 128)", 4096, 32, 32, 4, 4),
    ("T 256 (256 seq, d 128)", 256, 256, 64, 2, 2),
    ("T 1024 (128 seq, d 128)", 128, 1024, 64, 2, 2),
    ("retrieval docs (64 x 2, T 4000, d 256)", 128, 4000, 128, 2, 2),
    ("listops (128 seq, T 2048, d 64: heads of 4 x 4)", 128, 2048, 16, 4, 4),
    ("text (32 seq, T 4096, d 128: heads of 8 x 8)", 32, 4096, 16, 8, 8),
    ("path-x series (16 seq, T 16384, d 32: heads of 1 x 1)", 16, 16384, 32, 1, 1),
]
QUICK = [("quick rows", 64, 32, 8, 2, 2), ("quick long", 4, 128, 8, 2, 2)]
# --set image: the HGRN2 vision models' scans (heads of 64, patch 16: 14 x 14 = 196 patches at 224 px, 784 at 448;
# the image bench's batches)
IMAGE = [
    ("hgrn2_vit_tiny 224 px (128 img, T 196, 3 heads of 64)", 128, 196, 3, 64, 64),
    ("hgrn2_vit_small 224 px (128 img, T 196, 6 heads of 64)", 128, 196, 6, 64, 64),
    ("hgrn2_vit_tiny 448 px (32 img, T 784, 3 heads of 64)", 32, 784, 3, 64, 64),
]
IMPLS = ("packed", "recurrent", "chunk", "hgru")


def _fn(impl):
    from hgrn_fairseq.kernels.hgrn2_small_heads import hgrn2_small_head_scan
    from hgrn_fairseq.kernels.hgrn2_triton import hgrn2_fused

    if impl == "hgru":
        return lambda q, v, g: hgrn2_small_head_scan(q, v, g)
    return lambda q, v, g: hgrn2_fused(q, v, g, impl=impl)


def _rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def run(shapes, impls, device):
    import triton.testing

    rows = []
    for name, B, T, H, K, V in shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        q = torch.randn(B, T, H, K, generator=gen).to(device, torch.bfloat16)
        v = torch.randn(B, T, H, V, generator=gen).to(device, torch.bfloat16)
        g = F.logsigmoid(2 * torch.randn(B, T, H, K, generator=gen) + 1).to(device, torch.bfloat16)
        do = torch.randn(B, T, H, V, generator=gen).to(device, torch.bfloat16)
        with torch.no_grad():
            ref, _ = _fn("chunk")(q, v, g)
        base = "recurrent" if T <= 32 else "chunk"
        row = {"shape": name, "B": B, "T": T, "H": H, "K": K, "V": V, "base": base, "impls": {}}
        for impl in impls:
            fn = _fn(impl)
            leaves = [x.detach().clone().requires_grad_() for x in (q, v, g)]

            def fwd():
                with torch.no_grad():
                    fn(q, v, g)

            def fwd_bwd():
                o, _ = fn(*leaves)
                o.backward(do)
                for x in leaves:
                    x.grad = None

            try:
                with torch.no_grad():
                    o, _ = fn(q, v, g)
                err = _rel(o, ref)
                fwd()
                fwd_bwd()
                t_f = triton.testing.do_bench(fwd, warmup=5, rep=50)
                t_fb = triton.testing.do_bench(fwd_bwd, warmup=5, rep=50)
                row["impls"][impl] = {"fwd_ms": t_f, "fwd_bwd_ms": t_fb, "rel_err_vs_chunk": err}
            except Exception as e:  # noqa: BLE001 - one failing implementation must not lose the row
                row["impls"][impl] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        print(_md_row(row, impls), flush=True)
    return rows


def _md_row(row, impls):
    cells = []
    b = row["impls"].get(row["base"], {})
    for impl in impls:
        r = row["impls"].get(impl, {})
        if "error" in r:
            cells.append("error")
            continue
        ratio = ""
        if "fwd_bwd_ms" in b and impl != row["base"]:
            ratio = f" ({b['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}x)"
        cells.append(f"{r['fwd_ms']:.3f} / {r['fwd_bwd_ms']:.3f}{ratio}")
    errs = ", ".join(f"{i} {row['impls'][i]['rel_err_vs_chunk']:.1e}" for i in impls
                     if "rel_err_vs_chunk" in row["impls"].get(i, {}) and i != "chunk")
    return f"| {row['shape']} | {row['base']} | " + " | ".join(cells) + f" | {errs} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--quick", action="store_true", help="two tiny shapes (smoke test)")
    ap.add_argument("--set", default="lra", choices=("lra", "image"),
                    help="shapes: the LRA models' (default) or the HGRN2 vision models' (heads of 64)")
    args = ap.parse_args(argv)
    impls = [i for i in args.impls.split(",") if i]
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        raise SystemExit(f"bench_hgrn2_small_heads: unknown --impls {bad}; choose from {IMPLS}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_hgrn2_small_heads: needs a CUDA GPU (the Triton kernels are timed for real)")
    os.makedirs(args.out, exist_ok=True)
    header = ("| shape | ratio against | " + " | ".join(f"{i} fwd / fwd+bwd ms" for i in impls)
              + " | output error against chunk |\n|---|---|" + "---:|" * len(impls) + "---|")
    print(header, flush=True)
    rows = run(QUICK if args.quick else IMAGE if args.set == "image" else SHAPES, impls, "cuda")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "commit": os.environ.get("HGRN_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "bench_hgrn2_small_heads.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "bench_hgrn2_small_heads.md"), "w") as f:
        f.write(f"{meta['device']}, torch {meta['torch']}, bf16, {meta['date']}, commit {meta['commit']}; "
                "ms (median of triton.testing.do_bench); (Nx) = fwd+bwd speed-up over the 'ratio against' column\n\n")
        f.write(header + "\n" + "\n".join(_md_row(r, impls) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
