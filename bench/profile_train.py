#!/usr/bin/env python3
"""Where does a training step of the WikiText-103-sized LMs spend its time? (GPU machine)

    python3 -m bench.profile_train --out $OUT [--models hgrn_lm_base,transformer_lm] [--shapes 16x512,1x8192]

For each model and shape, the training step of ``bench/bench_train.py`` (same models, same loss, autocast
bf16, fused Adam) is run and measured three ways:

* wall ms per step: 20 back-to-back steps after warm-up, then one synchronisation;
* CPU ms per step: the time the Python thread needs to *issue* one step (``perf_counter`` around the
  step with no synchronisation, median). When it is close to the wall time the step is bound by
  kernel-launch overhead, not by the GPU;
* GPU busy ms per step and kernel launches per step, from a ``torch.profiler`` trace of 5 steps (sum of
  the kernel, memcpy and memset durations), and the kernels that take the most GPU time.

Writes ``profile_train.md`` and ``profile_train.json`` to ``--out``. Each model runs in its own subprocess
(a failing peer does not take the others down).
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from bench import bench_train, provenance  # same models and loss as the throughput bench


def short_kernel_name(name, width=70):
    name = re.sub(r"<.*", "", name)  # drop template arguments
    name = name.replace("void ", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def profile_one(name, shapes, kernel_backend, loss, out, device="cuda"):
    import torch

    cuda = device == "cuda"
    tiny = not cuda  # CPU: the smoke-test sizes of bench_train
    vocab = bench_train.VOCAB if cuda else 1000
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    torch.manual_seed(0)
    if name.startswith("fla_"):
        model, loss_fn, _, _ = bench_train.build_fla(name, tiny, vocab, device, torch)
    else:
        model, loss_fn, _, _ = bench_train.build_fairseq(name, tiny, kernel_backend, vocab, device, torch,
                                                          loss=loss)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), fused=cuda)
    results = []
    for batch, length in shapes:
        tokens = bench_train.random_tokens(torch, vocab, device, batch, length)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16):
                value = loss_fn(tokens)
            value.backward()
            optimizer.step()

        for _ in range(5):
            step()
        sync()
        n = 20 if cuda else 3
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        wall = 1e3 * (time.perf_counter() - t0) / n
        cpu = []
        for _ in range(10 if cuda else 3):
            sync()
            t0 = time.perf_counter()
            step()
            cpu.append(1e3 * (time.perf_counter() - t0))
        sync()
        cpu_ms = sorted(cpu)[len(cpu) // 2]

        steps = 5 if cuda else 1
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            sync()
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            trace_path = f.name
        prof.export_chrome_trace(trace_path)
        with open(trace_path) as f:
            trace = json.load(f)
        os.remove(trace_path)
        busy = collections.Counter()
        count = collections.Counter()
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "X" and event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                key = short_kernel_name(event.get("name", "?"))
                busy[key] += event.get("dur", 0) / 1e3
                count[key] += 1
        gpu_ms = sum(busy.values()) / steps
        launches = sum(count.values()) / steps
        top = [{"kernel": k, "ms_per_step": round(v / steps, 4), "calls_per_step": count[k] / steps,
                "share": round(v / steps / gpu_ms, 4) if gpu_ms else None} for k, v in busy.most_common(15)]
        row = {"model": name, "batch": batch, "seq": length, "loss": loss, "wall_ms": round(wall, 3),
               "cpu_issue_ms": round(cpu_ms, 3), "gpu_busy_ms": round(gpu_ms, 3), "launches": launches,
               "tokens_per_s": round(batch * length / wall * 1e3), "top": top}
        print(json.dumps(row), flush=True)
        results.append(row)
        del tokens
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(results, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="hgrn_lm_base,hgrn2_lm_base,transformer_lm")
    parser.add_argument("--shapes", default="16x512,1x8192")
    parser.add_argument("--kernel-backend", default="auto", help="auto: Triton on CUDA, reference on CPU")
    parser.add_argument("--loss", default="fairseq", choices=bench_train.LOSSES,
                        help="loss of the fairseq models (see bench_train.py --loss)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: tiny models, no GPU numbers (a smoke test of this script)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--timeout-s", type=float, default=240)
    args = parser.parse_args()
    shapes = bench_train.parse_shapes(args.shapes)
    if args.worker:
        profile_one(args.worker, shapes, args.kernel_backend, args.loss, args.result, args.device)
        return
    os.makedirs(args.out, exist_ok=True)
    rows, status = [], {}
    for name in args.models.split(","):
        result = os.path.join(args.out, f"profile_{name}.json")
        cmd = [sys.executable, "-m", "bench.profile_train", "--out", args.out, "--worker", name, "--result", result,
               "--shapes", args.shapes, "--kernel-backend", args.kernel_backend, "--loss", args.loss, "--device", args.device]
        try:
            proc = subprocess.run(cmd, timeout=args.timeout_s, capture_output=True, text=True,
                                  env=provenance.child_env())
            status[name] = "ok" if proc.returncode == 0 else "failed: " + proc.stderr[-600:]
        except subprocess.TimeoutExpired:
            status[name] = f"timed out after {args.timeout_s} s"
        if os.path.exists(result):
            with open(result) as f:
                rows += json.load(f)
            os.remove(result)
        print(name, status[name], flush=True)
    lines = ["# Training step profile (bench/profile_train.py)", "",
             f"loss of the fairseq models: {args.loss}; kernel backend: {args.kernel_backend}", "",
             "| model | shape | tok/s | wall ms | CPU issue ms | GPU busy ms | launches |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']}x{r['seq']} | {r['tokens_per_s']:,} | {r['wall_ms']} | "
                     f"{r['cpu_issue_ms']} | {r['gpu_busy_ms']} | {r['launches']:.0f} |")
    for r in rows:
        lines += ["", f"## {r['model']} {r['batch']}x{r['seq']}: top kernels", "",
                  "| kernel | ms/step | calls/step | share |", "| --- | --- | --- | --- |"]
        lines += [f"| `{t['kernel']}` | {t['ms_per_step']} | {t['calls_per_step']:.0f} | {t['share']:.1%} |"
                  for t in r["top"]]
    lines += ["", "Status: " + json.dumps(status)]
    with open(os.path.join(args.out, "profile_train.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "profile_train.json"), "w") as f:
        json.dump({"rows": rows, "status": status}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
