#!/usr/bin/env python3
"""Where does a training step of the image models spend its GPU time?

    python3 -m bench.profile_image --out $OUT [--models hgrn1d_vit_tiny,deit_tiny_patch16_224] [--res 224,448]
    python3 -m bench.profile_image --out $OUT --phase infer --batch 256   # bench_image.py's inference call

The training step of ``bench/bench_image.py`` (same models, batch 128 at 224 px scaled by the pixel
count, bf16 autocast, AdamW) is traced with ``torch.profiler`` for 5 steps after warm-up. Per model and
resolution: wall ms per step, GPU busy ms per step, kernel launches per step, the busy time by kind of
kernel (matrix products, our scans, attention, norms, element-wise and the rest) and the top kernels.
Writes ``profile_image.md`` / ``profile_image.json`` to ``--out``. ``--phase infer`` traces the inference
call of ``bench_image.py`` instead: eval mode, a forward under ``torch.no_grad`` with bf16 autocast (give
``--batch 256``, its inference batch).
"""
import argparse
import collections
import json
import os
import re
import tempfile
import time

from bench import bench_image  # same models and modes as the speed bench
from bench.profile_train import short_kernel_name

KINDS = (  # first match wins
    ("matmul", r"gemm|cutlass|sm90_xmma|nvjet|cublas|Kernel2|splitK"),
    ("block ops (ours)", r"_ln_fwd|_ln_bwd|_gated_|_scaled_add|_scale_kernel|norm_gate"),
    ("scan (ours)", r"hgru|hgrn2|_scan|chunk|_fwd_kernel|_bwd_kernel|recurrent"),
    ("attention", r"flash|fmha|attention|efficient"),
    ("norm", r"norm|layer_norm|rms"),
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("conv (patches)", r"conv|implicit|wgrad|dgrad"),
    ("reduction", r"reduce|sum|mean"),
    ("element-wise", r"elementwise|vectorized|unrolled|copy|fill|cat|index|triton_"),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def profile(name: str, res: int, batch: int, mode: str, phase: str = "train"):
    import torch
    import torch.nn.functional as F

    model, net = bench_image.build(name, res, "cuda", mode)
    model.train(phase == "train")
    tb = max(1, int(batch * (224 * 224) / (res * res)))
    x = torch.randn(tb, 3, res, res, device="cuda")
    y = torch.randint(0, 1000, (tb,), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)

    def train_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def infer_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            net(x)

    step = train_step if phase == "train" else infer_step

    for _ in range(8):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    wall = 1e3 * (time.perf_counter() - t0) / 20
    steps = 5
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    ops = sorted(((e.key, e.self_device_time_total / 1e3 / steps, e.count / steps, str(e.input_shapes)[:120])
                  for e in prof.key_averages(group_by_input_shape=True) if e.self_device_time_total > 0),
                 key=lambda t: -t[1])[:30]
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.remove(path)
    busy, count, by_kind = collections.Counter(), collections.Counter(), collections.Counter()
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            key = short_kernel_name(ev.get("name", "?"), width=90)
            busy[key] += ev.get("dur", 0) / 1e3 / steps
            count[key] += 1 / steps
            by_kind[kind_of(ev.get("name", "?"))] += ev.get("dur", 0) / 1e3 / steps
    gpu = sum(busy.values())
    row = {"model": name, "res": res, "mode": mode, "phase": phase, "batch": tb, "wall_ms": round(wall, 3),
           "img_s": round(tb * 1e3 / wall, 1), "gpu_busy_ms": round(gpu, 3), "launches": round(sum(count.values())),
           "by_kind": {k: round(v, 3) for k, v in by_kind.most_common()},
           "top": [{"kernel": k, "ms": round(v, 3), "calls": round(count[k]), "share": round(v / gpu, 4)}
                   for k, v in busy.most_common(25)],
           "ops": [{"op": k, "ms": round(v, 3), "calls": round(c), "shapes": sh} for k, v, c, sh in ops]}
    del model, opt, x
    torch.cuda.empty_cache()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="hgrn1d_vit_tiny,hgrn2_vit_tiny,deit_tiny_patch16_224")
    p.add_argument("--res", default="224,448")
    p.add_argument("--batch", type=int, default=128, help="at 224 px; scaled by the pixel count")
    p.add_argument("--modes", default="eager")
    p.add_argument("--phase", choices=("train", "infer"), default="train",
                   help="train: a training step; infer: bench_image.py's inference call (eval, no_grad)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for mode in args.modes.split(","):
        for res in [int(r) for r in args.res.split(",")]:
            for name in args.models.split(","):
                try:
                    row = profile(name, res, args.batch, mode, args.phase)
                except Exception as e:  # one failing model must not hide the others' numbers
                    row = {"model": name, "res": res, "mode": mode, "error": f"{type(e).__name__}: {e}"[:400]}
                print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
                rows.append(row)
    what = "training step" if args.phase == "train" else "inference call (eval, no_grad)"
    lines = [f"# Image {what} profile (bench/profile_image.py --phase {args.phase})", "",
             "| res | model | mode | batch | img/s | wall ms | GPU busy ms | launches | busy by kind (ms) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['res']} | {r['model']} | {r['mode']} | failed: {r['error']} | | | | | |")
            continue
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in r["by_kind"].items())
        lines.append(f"| {r['res']} | {r['model']} | {r['mode']} | {r['batch']} | {r['img_s']:.0f} | {r['wall_ms']:.1f} | "
                     f"{r['gpu_busy_ms']:.1f} | {r['launches']} | {kinds} |")
    for r in rows:
        if "error" in r:
            continue
        lines += ["", f"## {r['model']} {r['res']} px {r['mode']}: top kernels", "",
                  "| kernel | ms/step | calls/step | share |", "| --- | --- | --- | --- |"]
        lines += [f"| `{t['kernel']}` | {t['ms']} | {t['calls']} | {t['share']:.1%} |" for t in r["top"]]
        lines += ["", f"### {r['model']} {r['res']} px {r['mode']}: operators by own GPU time", "",
                  "| operator | ms/step | calls/step | input shapes |", "| --- | --- | --- | --- |"]
        lines += [f"| `{o['op']}` | {o['ms']} | {o['calls']} | {o['shapes']} |" for o in r["ops"]]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "profile_image.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "profile_image.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
