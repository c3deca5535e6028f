#!/usr/bin/env python3
"""Training and inference speed of the HGRN image models against timm's DeiT.

For each resolution (224 and 448 px: 4x the tokens) and size (tiny, small), in one process on one GPU:
hgrn1d_vit_*, hgrn2_vit_* and deit_*_patch16_224 (built at that resolution), bf16 autocast, AdamW.

* training: one step = forward, cross-entropy, backward, optimiser step, ``--train-batch`` images at
  224 px (a quarter at 448 px, so that every step sees the same number of pixels);
* inference: a forward under ``torch.no_grad`` in eval mode, ``--infer-batch`` images (a quarter at 448);
* timing: ``triton.testing.do_bench`` (median; L2 flushed between calls) on CUDA, wall clock on CPU;
* peak memory: ``torch.cuda.max_memory_allocated`` over the timed calls.

Ratios are images/s of each model over the DeiT of the same size, resolution and mode. The report marks
two targets as met or not: training at least DeiT's at 224 px and at least 1.5x it at 448 px. Results:
OUT/bench_image.json and OUT/bench_image.md (GPU, versions, commit, date with the numbers).
``--modes eager,compile,graphs`` picks rows where both sides run eagerly, through torch.compile (the
HGRN blocks' option against the whole DeiT compiled), or as CUDA graphs (training step and inference call).

    python -m bench.bench_image --out results/bench_image
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import os
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from bench import provenance

SIZES = {"tiny": ["hgrn1d_vit_tiny", "hgrn2_vit_tiny", "deit_tiny_patch16_224"],
         "small": ["hgrn1d_vit_small", "hgrn2_vit_small", "deit_small_patch16_224"]}


def time_ms(fn: Callable[[], None], device: str, warmup: int, rep: int) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    for _ in range(2):
        fn()
    n, t0 = 0, time.perf_counter()
    while n < 3 or (time.perf_counter() - t0) * 1000 < rep:
        fn()
        n += 1
    return (time.perf_counter() - t0) * 1000 / n


def build(name: str, res: int, device: str, mode: str = "eager"):
    """``(model, net)``: the timm model with 1000 classes at ``res`` px (drop-path 0.1) and the callable a
    training step and the inference call run in ``mode`` (eager; compile: the HGRN blocks' option or
    torch.compile of DeiT; graphs: the HGRN models' cuda_graphs option or DeiT through the same CUDA-graph
    caches, training and evaluation)."""
    import timm

    import hgrn_fairseq.image  # noqa: F401  (registers the HGRN models)

    torch.manual_seed(0)
    hgrn = not name.startswith("deit")
    extra = {"compile": {"block_compile": "train"}, "graphs": {"cuda_graphs": True}}.get(mode, {}) if hgrn else {}
    model = timm.create_model(name, pretrained=False, num_classes=1000, img_size=res,
                              drop_path_rate=0.1, **extra).to(device)
    net = model
    if mode == "compile" and not hgrn:
        net = torch.compile(model)
    elif mode == "graphs" and not hgrn:  # the same CUDA-graph caches as the HGRN models' cuda_graphs option
        from hgrn_fairseq.modules.cuda_graph import GraphedCallCache, InferenceGraphCache

        train_cache, eval_cache = GraphedCallCache(model, name=name), InferenceGraphCache(model, name=name)

        def net(t):
            if GraphedCallCache.usable(model, t):
                return train_cache(t)
            return eval_cache(t) if InferenceGraphCache.usable(model, t) else model(t)
    return model, net


# A/B rows of the HGRN2 models: option -> (row suffix, module, attribute in it (HGRU2's class attribute or
# the kernels' module global), value while that row is measured, what the option's rows measure)
SWITCHES = {
    "--ab-hgru2": (":unfused-hgru2", "hgrn_fairseq.modules.hgru2", "HGRU2.fuse_in_gates", False,
                   "HGRU2.fuse_in_gates off (v's SiLU, the split of the in-projection and the LayerNorm in "
                   "PyTorch)"),
    "--ab-accum": (":accum-directions", "hgrn_fairseq.modules.hgru2", "HGRU2.accumulate_directions", True,
                   "HGRU2.accumulate_directions on (the reverse scan adding its output and gradients into the "
                   "forward scan's inside the kernels)"),
    "--ab-split": (":split-head64", "hgrn_fairseq.kernels.hgrn2_triton", "SPLIT_MIN_HEAD", 64,
                   "the chunked kernels' two-launch scheme at head 64 (hgrn2_triton.SPLIT_MIN_HEAD 64: the "
                   "output and dq/dg kernels on the one-reference path alone, then the listed chunks again)"),
    "--ab-chunk64": (":chunk64", "hgrn_fairseq.kernels.hgrn2_triton", "CHUNK", 64,
                     "the chunked kernels in chunks of 64 steps (hgrn2_triton.CHUNK 64) instead of the automatic "
                     "choice (32 at the image models' head 64 up to 1024 steps)"),
    # a callable value is called with the module; a switched attribute's owner that keeps a `cache` dict (an
    # autotuned Triton kernel's choices) has it cleared before and after the row
    "--ab-no-regcap": (":no-regcap", "hgrn_fairseq.kernels.hgrn2_triton", "_fwd_output.configs",
                       lambda ht: [c for c in ht._fwd_output.configs if not c.maxnreg],
                       "the output kernel's autotune space without its register-capped config (maxnreg; kept "
                       "only in chunks of 32 steps at head 64)"),
}


def measure(name: str, res: int, args, device: str, mode: str = "eager") -> Dict[str, float]:
    for suffix, module, path, value, _ in SWITCHES.values():
        if name.endswith(suffix):
            owner = mod = importlib.import_module(module)
            *outer, attr = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            was = getattr(owner, attr)
            cache = getattr(owner, "cache", None)
            setattr(owner, attr, value(mod) if callable(value) else value)
            if isinstance(cache, dict):
                cache.clear()
            try:
                out = measure(name[:-len(suffix)], res, args, device, mode)
            finally:
                setattr(owner, attr, was)
                if isinstance(cache, dict):
                    cache.clear()
            out["model"] = name
            return out
    model, net = build(name, res, device, mode)
    params = sum(p.numel() for p in model.parameters())
    scale = (224 * 224) / (res * res)
    tb, ib = max(1, int(args.train_batch * scale)), max(1, int(args.infer_batch * scale))
    x = torch.randn(tb, 3, res, res, device=device)
    y = torch.randint(0, 1000, (tb,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32

    def train_step():
        with torch.autocast(device, dtype=dtype, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out: Dict[str, float] = {"model": name, "mode": mode, "res": res, "params": params, "train_batch": tb,
                             "infer_batch": ib}
    model.train()
    train_step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ms = time_ms(train_step, device, args.warmup, args.rep)
    out["train_ms"], out["train_img_s"] = ms, tb * 1000 / ms
    if device == "cuda":
        out["train_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    opt.zero_grad(set_to_none=True)
    del opt
    model.eval()
    xi = torch.randn(ib, 3, res, res, device=device)

    @torch.no_grad()
    def infer():
        with torch.autocast(device, dtype=dtype, enabled=args.precision == "bf16"):
            net(xi)

    infer()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ms = time_ms(infer, device, args.warmup, args.rep)
    out["infer_ms"], out["infer_img_s"] = ms, ib * 1000 / ms
    if device == "cuda":
        out["infer_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model, x, xi
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def environment(device: str) -> Dict[str, str]:
    import timm

    env = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
           "timm": timm.__version__, "git": provenance.git_version(REPO), "device": device}
    if device == "cuda":
        import triton

        env["gpu"] = torch.cuda.get_device_name()
        env["triton"] = triton.__version__
    return env


def ab_lines(rows: List[Dict]) -> List[str]:
    """One line per A/B row (``MODEL:switch``): its training and inference images/s over those of
    ``MODEL`` at the same resolution and mode, e.g. "hgrn2_vit_tiny:chunk64 @ 224 (graphs): training
    0.93x (-7.5%), inference 0.96x (-4.3%) of hgrn2_vit_tiny's". A/B rows whose base row is missing are
    named as such."""
    base = {(r["model"], r["res"], r["mode"]): r for r in rows if ":" not in r["model"]}
    out = []
    for r in rows:
        if ":" not in r["model"]:
            continue
        name = r["model"].split(":")[0]
        b = base.get((name, r["res"], r["mode"]))
        head = f"{r['model']} @ {r['res']} ({r['mode']}): "
        if b is None:
            out.append(head + f"no {name} row to compare with")
            continue
        parts = []
        for what, key in (("training", "train_img_s"), ("inference", "infer_img_s")):
            x = r[key] / b[key]
            parts.append(f"{what} {x:.2f}x ({(x - 1) * 100:+.1f}%)")
        out.append(head + ", ".join(parts) + f" of {name}'s")
    return out


def markdown(rows: List[Dict], env: Dict, goals: List[str]) -> str:
    lines = [f"# Image models: training and inference speed ({env.get('gpu', env['device'])})", "",
             ", ".join(f"{k} {v}" for k, v in env.items()), "",
             "| res | model | mode | params | train img/s | vs DeiT | train peak GiB | infer img/s | vs DeiT | infer peak GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['res']} | {r['model']} | {r['mode']} | {r['params'] / 1e6:.2f}M | {r['train_img_s']:.0f} | "
                     f"{r['train_vs_deit']:.2f}x | {r.get('train_peak_gib', float('nan')):.2f} | "
                     f"{r['infer_img_s']:.0f} | {r['infer_vs_deit']:.2f}x | {r.get('infer_peak_gib', float('nan')):.2f} |")
    ab = ab_lines(rows)
    if ab:
        lines += ["", "A/B rows against their base rows of the same run:", ""] + [f"- {x}" for x in ab]
    lines += ["", "Goals: " + "; ".join(goals), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for bench_image.json and bench_image.md")
    p.add_argument("--sizes", default="tiny,small")
    p.add_argument("--resolutions", default="224,448")
    p.add_argument("--train-batch", type=int, default=128, help="images per training step at 224 px")
    p.add_argument("--infer-batch", type=int, default=256, help="images per inference call at 224 px")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--warmup", type=int, default=100, help="do_bench warm-up (ms)")
    p.add_argument("--rep", type=int, default=500, help="do_bench measuring time (ms)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="eager", help="eager, compile, graphs (comma-separated). compile: the HGRN "
                   "blocks' torch.compile option (block_compile='train'; the scans stay ours) against "
                   "torch.compile of the whole DeiT; graphs: training forward and backward, and the inference "
                   "forward, replayed as CUDA graphs (the HGRN models' cuda_graphs option; DeiT through the "
                   "same caches)")
    for option, (suffix, *_, what) in SWITCHES.items():
        p.add_argument(option, action="store_true", help=f"also measure each HGRN2 model with {what}: rows named "
                       f"MODEL{suffix}")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    env = environment(args.device)
    print(json.dumps(env), flush=True)
    rows = []
    resolutions = [int(r) for r in args.resolutions.split(",")]
    for mode, res, size in itertools.product(args.modes.split(","), resolutions, args.sizes.split(",")):
        names = SIZES[size]
        for option, (suffix, *_) in SWITCHES.items():
            if getattr(args, option[2:].replace("-", "_")):
                names = [n for m in names for n in ([m, m + suffix] if m.startswith("hgrn2") and ":" not in m
                                                     else [m])]
        group = [measure(name, res, args, args.device, mode) for name in names]
        deit = group[-1]  # the ratios are against the DeiT of the same size, resolution and mode
        for r in group:
            r["size"] = size
            r["train_vs_deit"] = r["train_img_s"] / deit["train_img_s"]
            r["infer_vs_deit"] = r["infer_img_s"] / deit["infer_img_s"]
            print(json.dumps(r), flush=True)
        rows += group
    goals = []
    for r in rows:
        if r["model"].startswith("deit"):
            continue
        need = 1.0 if r["res"] <= 224 else 1.5
        ok = r["train_vs_deit"] >= need
        goals.append(f"{r['model']} ({r['mode']}) @ {r['res']}: train {r['train_vs_deit']:.2f}x DeiT (goal >= {need}x: "
                     f"{'met' if ok else 'NOT met'})")
    with open(os.path.join(args.out, "bench_image.json"), "w") as f:
        json.dump({"env": env, "args": vars(args), "rows": rows, "goals": goals}, f, indent=1)
    md = markdown(rows, env, goals)
    with open(os.path.join(args.out, "bench_image.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
