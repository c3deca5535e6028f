"""How many rows should one program of block_ops' LayerNorm backward take?

    python -m bench.explore.block_ops_ln_rows --out DIR [--rows 8,16,32,64,128] [--widths 192,384]

The LayerNorm backward of the image models (`kernels/block_ops.py`) writes one row of partial weight and
bias gradients per program (`_ROWS_PER_PROGRAM` = 16 rows each) and sums them with PyTorch's column sum.
In a profile of hgrn2_vit_tiny (224 px, batch 128, CUDA graphs) that backward kernel and those column
sums took about 7% of the step's GPU time, twice what their traffic needs.

For each ROWS (module constant monkeypatched) and width, the LayerNorm's forward + backward under bf16
autocast on an fp32 input of N = 25,088 rows (128 images x 196 patches, or 32 x 784 at 448 px) is timed
under CUDA graphs (bench/graph_timing.py), with PyTorch's own LayerNorm beside it, and dx / dw / db are
compared with float64. Writes DIR/block_ops_ln_rows.{json,md}; the result docs/design.md cites is in
bench/results/block_ops_ln_rows/. As a stage of bench/gpu_session.sh: `OUT=$OUT bash bench/gpu_session.sh ln_rows:200`.
"""
import argparse
import json
import os
import sys

N_ROWS = 25088


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="8,16,32,64,128")
    p.add_argument("--widths", default="192,384")
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from bench.graph_timing import timeit
    from hgrn_fairseq.kernels import block_ops

    if not torch.cuda.is_available():
        sys.exit("block_ops_ln_rows.py: needs a CUDA GPU (it times kernels)")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    default_rows = block_ops._ROWS_PER_PROGRAM
    for C in map(int, args.widths.split(",")):
        g = torch.Generator().manual_seed(C)
        x0 = torch.randn(N_ROWS, C, generator=g)
        w0 = 1 + 0.1 * torch.randn(C, generator=g)
        b0 = 0.1 * torch.randn(C, generator=g)
        dy0 = torch.randn(N_ROWS, C, generator=g)
        # float64 reference of what the op computes: the bf16 output's gradient dy, in float64
        ref = [t.double().requires_grad_() for t in (x0, w0, b0)]
        F.layer_norm(ref[0], (C,), ref[1], ref[2], 1e-5).backward(dy0.to(torch.bfloat16).double())
        leaves = [t.cuda().requires_grad_() for t in (x0, w0, b0)]
        dy = dy0.to(torch.bfloat16).cuda()
        cases = [(f"block_ops, {r} rows a program", r) for r in map(int, args.rows.split(","))]
        cases.append(("PyTorch F.layer_norm", None))
        for label, r in cases:
            if r is not None:
                block_ops._ROWS_PER_PROGRAM = r

            def step():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    if r is None:
                        y = F.layer_norm(leaves[0], (C,), leaves[1], leaves[2], 1e-5)
                    else:
                        y = block_ops.layer_norm(leaves[0], leaves[1], leaves[2], 1e-5)
                y.backward(dy.to(y.dtype))

            for t in leaves:
                t.grad = None
            step()
            torch.cuda.synchronize()
            err = {n: float((t.grad.double().cpu() - rt.grad).norm() / rt.grad.norm())
                   for n, t, rt in zip(("dx", "dw", "db"), leaves, ref)}
            ms, how = timeit(step, leaves, log=lambda m: print(m, file=sys.stderr))
            row = {"width": C, "rows": N_ROWS, "case": label, "rows_per_program": r, "ms": ms, "how": how, "err": err,
                   "current": r == default_rows}
            rows.append(row)
            print(json.dumps(row), flush=True)
        block_ops._ROWS_PER_PROGRAM = default_rows
    dev = torch.cuda.get_device_name()
    with open(os.path.join(args.out, "block_ops_ln_rows.json"), "w") as f:
        json.dump({"device": dev, "torch": torch.__version__, "rows": rows}, f, indent=1)
    lines = [f"# block_ops LayerNorm forward + backward by rows per program ({dev}, torch {torch.__version__})", "",
             "| width | case | ms (fwd + bwd) | err dx / dw / db |", "|---:|---|---:|---|"]
    for r in rows:
        e = r["err"]
        mark = " (current)" if r["current"] else ""
        lines.append(f"| {r['width']} | {r['case']}{mark} | {r['ms']:.4f} ({r['how']}) | "
                     f"{e['dx']:.1e} / {e['dw']:.1e} / {e['db']:.1e} |")
    with open(os.path.join(args.out, "block_ops_ln_rows.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
