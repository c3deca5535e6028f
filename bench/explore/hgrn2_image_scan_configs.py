"""Which chunk-kernel configs are fastest at the HGRN2 image models' scans (head 64, 196 or 784 steps)?

    python -m bench.explore.hgrn2_image_scan_configs --out DIR [--shapes tiny224,small224,tiny448]
                                                             [--kernels dqdg,output,dv]

For each kernel and each candidate config (the autotune space plus the extras below), in its own process
(an illegal address poisons the CUDA context), that kernel's autotuner is pinned to the one config and the
model's bidirectional pair is run as HGRU2 runs it: o = scan(q, v, g) + scan(q, v, g, reverse), bf16, then
the backward of sum(o * w). Reported per config: the GPU time of that forward + backward under CUDA graphs
(bench/graph_timing.py: launches and host work left out, as in a graphed training step), its ratio to the
unpinned autotuner's choice, and the gradients' norm-relative errors against the float64 reference for the
first REF_SEQS sequences (each sequence's gradients depend on that sequence alone). A config is worth
adopting only if it is faster on every shape, its errors are those of the current choice, and the GPU
tests pass with it. Writes DIR/hgrn2_image_scan_configs.{json,md}.

`--extras-only` times the unpinned autotuner and EXTRA alone (~3 minutes for two kernels); without it every
config of the autotune spaces is timed too (~25 s a process). `--split-min-head 64 --no-extras` times the
two-launch scheme at head 64 against the package's one launch. `--chunk 64` / `--chunk 32` time every
candidate at that chunk size beside the package's automatic choice (hgrn2_triton.chunk_size); `--chunk 32`
also times EXTRA_CHUNK32. Findings: docs/image.md.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# (name, images per step, steps, heads): the bench_image.py training batches, patch 16
SHAPES = {"tiny224": (128, 196, 3), "small224": (128, 196, 6), "tiny448": (32, 784, 3)}
REF_SEQS = 4

K = 64  # the image models' head size (the child's K)
# extra candidates beyond each autotune space (the space itself comes from hgrn2_triton): register caps
# on the BK 64 / 4-warp configs (more programs an SM for more instructions; no spills at 168 or 128 in
# offline sm_90 compiles, `python -m tests.kernels.sm90_compile --match K=64 --resources --maxnreg 168`)
EXTRA = {
    "dqdg": [dict(kwargs={"BK": 64}, num_warps=4, maxnreg=168), dict(kwargs={"BK": 64}, num_warps=4, maxnreg=128)],
    "output": [dict(kwargs={"BK": 64, "PREFETCH": False}, num_warps=4, maxnreg=168),
               dict(kwargs={"BK": 64, "PREFETCH": False}, num_warps=4, maxnreg=128)],
    "dv": [dict(kwargs={}, num_warps=4)],
}
# Left out at head 64: dq/dg with 4 warps and BK < 64 (illegal addresses from Triton's layout conversions,
# see hgrn2_head64_configs.py; a fault costs a process and says nothing about speed).
# In chunks of 32 steps (--chunk 32) also 2 warps, timed whether or not --no-extras is set.
EXTRA_CHUNK32 = {
    "dqdg": [dict(kwargs={"BK": 64}, num_warps=2)],
    "output": [dict(kwargs={"BK": 64, "PREFETCH": False}, num_warps=2)],
    "dv": [dict(kwargs={}, num_warps=4)],
}
TUNERS = {"dqdg": "_bwd_dqdg", "output": "_fwd_output", "dv": "_bwd_dv"}

CHILD = r'''
import json, sys
import torch, triton
import torch.nn.functional as F
from hgrn_fairseq.kernels import hgrn2_triton as ht
from hgrn_fairseq.kernels.reference import hgrn2_scan_reference
from bench.graph_timing import timeit
tuners, name, spec = json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])  # tuners: TUNERS' names
shapes, nref, overrides = json.loads(sys.argv[5]), int(sys.argv[6]), json.loads(sys.argv[7])
for attr, value in (overrides or {}).items():  # e.g. SPLIT_MIN_HEAD (launch scheme), CHUNK (steps a chunk)
    setattr(ht, attr, value)
tuner = getattr(ht, name)
if spec is not None:
    extra = {k: spec[k] for k in ("num_stages", "maxnreg") if spec.get(k) is not None}
    tuner.configs = [triton.Config(spec["kwargs"], num_warps=spec["num_warps"], **extra)]
K = 64


def one(B, T, H):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g); v = torch.randn(B, T, H, K, generator=g)
    lg = F.logsigmoid(2 * torch.randn(B, T, H, K, generator=g) + 1)
    w = torch.randn(B, T, H, K, generator=g)
    leaves = [x.to(torch.bfloat16).cuda().requires_grad_() for x in (q, v, lg)]
    wc = w.to(torch.bfloat16).cuda()

    def pair():
        o = ht.hgrn2_fused(*leaves, None, False, impl="chunk")[0] + ht.hgrn2_fused(*leaves, None, True, impl="chunk")[0]
        (o.float() * wc.float()).sum().backward()

    for t in leaves:
        t.grad = None
    pair()
    torch.cuda.synchronize()
    grads = [t.grad[:nref].double().cpu() for t in leaves]
    chosen = {t: str(getattr(ht, t).best_config) for t in tuners
              if getattr(getattr(ht, t), "best_config", None) is not None}
    ref = [x[:nref].to(torch.bfloat16).double().requires_grad_() for x in (q, v, lg)]
    ro = hgrn2_scan_reference(*ref, None, False)[0] + hgrn2_scan_reference(*ref, None, True)[0]
    (ro * w[:nref].to(torch.bfloat16).double()).sum().backward()
    err = {n: float((a - r.grad).norm() / r.grad.norm()) for n, a, r in zip("qvg", grads, ref)}
    ms, how = timeit(pair, leaves, log=lambda m: print(m, file=sys.stderr))
    return {"ms": ms, "how": how, "err": err, "chosen": chosen}


for B, T, H in shapes:  # one line per shape; one compile serves them all
    print(json.dumps(one(B, T, H)), flush=True)
'''


def candidates(kernel, extras_only=False, overrides=None, no_extras=False):
    """[(label, spec or None, overrides)]: the unpinned autotuner with the package's settings first, then
    (``overrides``: hgrn2_triton attributes set in the child, e.g. ``{"SPLIT_MIN_HEAD": 64}``, the two-launch
    scheme at head 64, or ``{"CHUNK": 32}``; their own autotuner first) its space (unless extras_only), then
    the extras (unless no_extras)."""
    import triton

    from hgrn_fairseq.kernels import hgrn2_triton as ht

    space = ht._FULL_SPACES[id(getattr(ht, TUNERS[kernel]).configs)]
    specs = [] if extras_only else [
        dict(kwargs=dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.maxnreg) for c in space]
    default = triton.Config({})
    chunk32 = (overrides or {}).get("CHUNK") == 32
    for extra in ([] if no_extras else EXTRA[kernel]) + (EXTRA_CHUNK32[kernel] if chunk32 else []):
        spec = dict(dict(num_stages=default.num_stages, maxnreg=None), **extra)
        if spec not in specs:
            specs.append(spec)
    # dq/dg with 4 warps (or fewer) and BK < 64 at head 64 fault (hgrn2_head64_configs.py); the
    # autotuner's prune keeps neither there
    specs = [s for s in specs if s["kwargs"].get("BK", 64) >= 32
             and not (kernel == "dqdg" and s["kwargs"]["BK"] < 64 and s["num_warps"] <= 4)]
    if (overrides or {}).get("SPLIT_MIN_HEAD", 10**9) <= K and kernel == "output":
        # the path-1-only output launch with one step over the channels (BK >= K) is a known fault
        # (hgrn2_triton._prune_output, which a pinned config bypasses)
        specs = [s for s in specs if s["kwargs"]["BK"] < K]
    out = [("autotuned", None, None)]
    if overrides:
        out.append(("autotuned", None, overrides))
    return out + [(label(s), s, overrides) for s in specs]


def label(spec):
    parts = [f"{k} {v}" for k, v in spec["kwargs"].items()] + [f"{spec['num_warps']} warps"]
    parts.append(f"{spec['num_stages']} stages")
    if spec.get("maxnreg"):
        parts.append(f"maxnreg {spec['maxnreg']}")
    return ", ".join(parts)


def rows_from_log(path):
    """The rows a run printed (one JSON object per line) before it ended or was killed."""
    return [json.loads(x) for x in open(path) if x.startswith('{"kernel"')]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--kernels", default="dqdg,output,dv")
    p.add_argument("--timeout", type=int, default=240, help="seconds per config (all shapes)")
    p.add_argument("--split-min-head", type=int, default=None,
                   help="also time every candidate with hgrn2_triton.SPLIT_MIN_HEAD set to this (64: the two-launch "
                   "scheme, path 1 alone then the listed chunks, at the image models' head 64); speeds are "
                   "against the package's scheme")
    p.add_argument("--chunk", type=int, default=None,
                   help="also time every candidate with hgrn2_triton.CHUNK set to this (64 or 32 steps a chunk: 4 or 7 "
                   "chunks for a 196-step scan); speeds are against the package's automatic choice (32 at these "
                   "shapes, hgrn2_triton.chunk_size)")
    p.add_argument("--no-extras", action="store_true", help="leave out EXTRA (the register caps)")
    p.add_argument("--extras-only", action="store_true",
                   help="time the unpinned autotuner and EXTRA only, not every config of the autotune space")
    args = p.parse_args(argv)
    for s in args.shapes.split(","):
        if s not in SHAPES:
            p.error(f"--shapes: {s!r} is not one of {', '.join(SHAPES)}")
    for k in args.kernels.split(","):
        if k not in TUNERS:
            p.error(f"--kernels: {k!r} is not one of {', '.join(TUNERS)}")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    shapes = args.shapes.split(",")
    overrides = {}
    if args.split_min_head is not None:
        overrides["SPLIT_MIN_HEAD"] = args.split_min_head
    if args.chunk is not None:
        overrides["CHUNK"] = args.chunk
    # the kernels not pinned are autotuned in every process: keep Triton's autotune results on disk
    # (keyed by the config list too, so a pinned kernel's single config does not reuse another's)
    env = dict(os.environ, TRITON_CACHE_AUTOTUNING="1")
    for kernel in args.kernels.split(","):
        base = {}
        for lab, spec, over in candidates(kernel, args.extras_only, overrides or None, args.no_extras):
            first = lab == "autotuned" and over is None
            if over:
                lab += " (" + ", ".join({"SPLIT_MIN_HEAD": "split >= {}", "CHUNK": "chunk {}"}.get(k, k + " {}").format(v)
                                        for k, v in over.items()) + ")"
            # one process per config (a fault poisons its CUDA context), every shape in it (one compile)
            try:
                r = subprocess.run([sys.executable, "-c", CHILD, REPO, json.dumps(list(TUNERS.values())),
                                    TUNERS[kernel], json.dumps(spec),
                                    json.dumps([SHAPES[s] for s in shapes]), str(REF_SEQS), json.dumps(over)],
                                   capture_output=True, text=True, timeout=args.timeout, env=env, cwd=REPO)  # (-c imports from the working directory)
                outs = [json.loads(x) for x in r.stdout.strip().splitlines() if x.startswith("{")]
                error = None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:200]
            except subprocess.TimeoutExpired as e:
                outs = [json.loads(x) for x in (e.stdout or b"").decode().strip().splitlines() if x.startswith("{")]
                error = f"timed out after {args.timeout} s"
            for i, shape in enumerate(shapes):
                ok = i < len(outs)
                info = outs[i] if ok else {"error": error or "no result"}
                row = {"kernel": kernel, "shape": shape, "config": lab, "ok": ok, **info}
                if first and ok:
                    base[shape] = info["ms"]
                if ok and base.get(shape):
                    row["vs_autotuned"] = base[shape] / info["ms"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    write(rows, args.out)


def write(rows, out, header=""):
    """DIR/hgrn2_image_scan_configs.{json,md} from the rows (also: a killed call's rows, read back from its log)."""
    with open(os.path.join(out, "hgrn2_image_scan_configs.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = ([header, ""] if header else []) + ["| kernel | shape | config | ms (pair, fwd + bwd; graph = GPU time) | speed vs autotuned | err q / v / g | note |",
             "|---|---|---|---:|---:|---|---|"]
    for r in rows:
        if r["ok"]:
            e = r["err"]
            note = ("chose " + "; ".join(f"{k}: {v}" for k, v in r["chosen"].items())) if r["config"].startswith("autotuned") else ""
            lines.append(f"| {r['kernel']} | {r['shape']} | {r['config']} | {r['ms']:.3f} ({r['how']}) | "
                         f"{r.get('vs_autotuned', float('nan')):.2f}x | {e['q']:.1e} / {e['v']:.1e} / {e['g']:.1e} | {note} |")
        else:
            lines.append(f"| {r['kernel']} | {r['shape']} | {r['config']} | - | - | - | FAILED: {r['error']} |")
    with open(os.path.join(out, "hgrn2_image_scan_configs.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
