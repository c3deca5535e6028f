#!/usr/bin/env python3
"""Training throughput (sequences/s) of the LRA models, and of a Transformer encoder of the same width
and depth, in one harness.

    python3 -m bench.bench_lra --out results/bench_lra                 # the GPU run (a few minutes)
    python3 -m bench.bench_lra --out /tmp/bl --quick --device cpu      # CPU smoke test, tiny shapes

Per task (listops, text, retrieval, image, pathfinder, pathx) the rows are:

* ``hgrn1``: the ``hgrn1_lra_TASK`` arch (modules/lra_encoder.py as fairseq builds it), fp32 as its recipe;
* ``hgrn2``: ``hgrn2_lra_TASK``, weights and activations in bf16 as fairseq's ``--bf16`` runs it;
* ``transformer@hgrn1`` / ``transformer@hgrn2``: the same encoder (input layer, positions, pre-norm
  blocks with the same GLU and norm kind, pooling, head) with softmax self-attention
  (``F.scaled_dot_product_attention``: flash / memory-efficient kernels, head size 32) in place of the
  recurrent mixer, at that model's width, depth and precision. Attention is global, so the 2-D tasks
  are the same sequence of H*W tokens to it.

Inputs are random, every sequence at the task's full length (ListOps 2000, Text 4096, Retrieval 2 x
4000, Image / Pathfinder 1024, Path-X 16384), at the recipe's total batch capped at ``--max-tokens``
positions per step (2^19: Path-X runs 32 sequences, not HGRN2's 256), halved until it fits when memory
runs out; the batch used is in the row, and a model and its Transformer row use the same one. One step = forward, cross entropy,
backward, AdamW step. Steps are timed with CUDA events after two untimed ones (compilation,
autotuning), ``--steps`` steps or ``--seconds-per-row`` per row, whichever ends first; sequences/s =
batch x steps / time. Writes ``bench_lra.json`` (every number, the GPU, versions, date, commit) and
``bench_lra.md`` (with the HGRN / Transformer ratio per task) to ``--out``.
"""
import argparse
import datetime
import json
import os
import sys
import time
import traceback

from bench import provenance

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
LENGTH = {"listops": 2000, "text": 4096, "retrieval": 4000, "image": 1024, "pathfinder": 1024, "pathx": 16384}
GRID = {"image": (32, 32), "pathfinder": (32, 32), "pathx": (128, 128)}
CHANNELS = {"image": 3, "pathfinder": 1, "pathx": 1}
CLASSES = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2, "pathx": 2}
VOCAB = {"listops": 19, "text": 260, "retrieval": 260}
ATTENTION_HEAD_DIM = 32


def build(task, model, device, quick=False):
    """(module, settings dict) for one row; model in hgrn1, hgrn2, transformer@hgrn1, transformer@hgrn2."""
    import torch

    from hgrn_fairseq.models.hgrn_lra import arch_settings
    from hgrn_fairseq.modules.lra_encoder import LraClassifier, LraEncoder, LraPairClassifier

    base = model.split("@")[-1]
    s = arch_settings(base, task)
    if quick:
        s.update(encoder_embed_dim=16, encoder_layers=2, expand_ratio=min(s.get("expand_ratio", 1), 4))
    d = s["encoder_embed_dim"]
    mixer = "attention" if model.startswith("transformer") else s["token_mixer"]
    kind = "pixels" if task in CHANNELS else "tokens"
    enc = LraEncoder(
        mixer=mixer, dim=d, num_layers=s["encoder_layers"], glu_multiple=s["glu_multiple"],
        norm=s["norm"],
        input=kind, vocab_size=VOCAB.get(task), padding_idx=1 if kind == "tokens" else None,
        in_channels=CHANNELS.get(task), positions=s["positions"], dropout=s["dropout"],
        expand_ratio=s.get("expand_ratio", 1), num_heads=max(1, d // ATTENTION_HEAD_DIM),
        scan_2d="none" if mixer == "attention" else s["scan_2d"], max_len=LENGTH[task],
    )
    head = LraPairClassifier if task == "retrieval" else LraClassifier
    net = head(enc, CLASSES[task]).to(device)
    bf16 = base == "hgrn2"
    if bf16:
        net = net.to(torch.bfloat16)
    info = dict(s, mixer=mixer, precision="bf16" if bf16 else "fp32", parameters=sum(p.numel() for p in net.parameters()))
    return net, info


def make_batch(task, batch, length, device, dtype):
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    target = torch.randint(0, CLASSES[task], (batch,), generator=g).to(device)
    if task in CHANNELS:
        x = torch.randn(batch, length, CHANNELS[task], generator=g).to(device=device, dtype=dtype)
        return (x,), target
    tokens = torch.randint(4, VOCAB[task], (batch, length), generator=g).to(device)
    if task == "retrieval":
        other = torch.randint(4, VOCAB[task], (batch, length), generator=g).to(device)
        return (tokens, None, other, None), target
    return (tokens,), target


def time_row(task, model, batch, device, steps, seconds, quick):
    import torch
    import torch.nn.functional as F

    net, info = build(task, model, device, quick)
    length = 64 if quick else LENGTH[task]
    if quick and task in GRID:
        length = 64  # 8 x 8
    grid = None
    if task in GRID and info["mixer"] != "attention":
        grid = (8, 8) if quick else GRID[task]
    dtype = torch.bfloat16 if info["precision"] == "bf16" else torch.float32
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=device == "cuda")
    inputs, target = make_batch(task, batch, length, device, dtype)

    def step():
        opt.zero_grad(set_to_none=True)
        if task in GRID:
            logits = net(inputs[0], None, grid)
        else:
            logits = net(*inputs)
        loss = F.cross_entropy(logits.float(), target)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    n, elapsed = 0, 0.0
    start_wall = time.perf_counter()
    while n < steps and time.perf_counter() - start_wall < seconds:
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            elapsed += a.elapsed_time(b) / 1000.0
        else:
            t0 = time.perf_counter()
            step()
            elapsed += time.perf_counter() - t0
        n += 1
    row = dict(task=task, model=model, batch=batch, length=length, steps=n, seconds=round(elapsed, 4),
               ms_per_step=round(1000 * elapsed / max(n, 1), 3), seq_per_s=round(batch * n / elapsed, 2),
               **{k: info[k] for k in ("mixer", "precision", "parameters", "encoder_layers", "encoder_embed_dim",
                                       "norm", "scan_2d")})
    if device == "cuda":
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    del net, opt
    return row


def run_row(task, model, batch, device, steps, seconds, quick):
    """Time one row, halving the batch on out-of-memory errors."""
    import torch

    while True:
        try:
            return time_row(task, model, batch, device, steps, seconds, quick)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            if batch == 1:
                return dict(task=task, model=model, error="out of memory at batch 1")
            batch //= 2
        except Exception as e:  # noqa: BLE001 - one failing row must not take the others down
            traceback.print_exc()
            return dict(task=task, model=model, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()


def markdown(rows, env):
    lines = [f"LRA training throughput, {env['device']}, torch {env['torch']}, triton {env.get('triton')}, "
             f"{env['date']}, commit {env['commit']}", "",
             "| task | model | mixer | precision | L x d | batch | length | ms/step | seq/s | vs Transformer | peak GiB |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    by = {(r["task"], r["model"]): r for r in rows}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['task']} | {r['model']} | - | - | - | - | - | - | {r['error']} | - | - |")
            continue
        ratio = "-"
        if not r["model"].startswith("transformer"):
            t = by.get((r["task"], f"transformer@{r['model']}"))
            if t and "error" not in t:
                ratio = f"{r['seq_per_s'] / t['seq_per_s']:.2f}x"
        lines.append(f"| {r['task']} | {r['model']} | {r['mixer']} | {r['precision']} | {r['encoder_layers']} x "
                     f"{r['encoder_embed_dim']} | {r['batch']} | {r['length']} | {r['ms_per_step']} | {r['seq_per_s']} | "
                     f"{ratio} | {r.get('peak_mem_gib', '-')} |")
    lines.append("")
    lines.append("seq/s = training sequences per second (forward, loss, backward, AdamW step), every sequence at the "
                 "task's full length; retrieval rows count document pairs. 'vs Transformer': this model's seq/s over "
                 "the attention encoder of the same width, depth and precision.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--models", default="hgrn1,hgrn2,transformer@hgrn1,transformer@hgrn2")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seconds-per-row", type=float, default=8.0)
    p.add_argument("--budget-s", type=float, default=400.0, help="stop starting rows after this many seconds")
    p.add_argument("--batch", type=int, default=None, help="batch for every row (default: the recipe's total batch)")
    p.add_argument("--max-tokens", type=int, default=2**19, help="cap on batch x length (x 2 for retrieval)")
    p.add_argument("--quick", action="store_true", help="tiny models and lengths (smoke test)")
    args = p.parse_args(argv)
    import torch

    import hgrn_fairseq
    hgrn_fairseq.register()
    from hgrn_fairseq.recipes.lra import recipe

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    env = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
           "commit": provenance.git_version()}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        env["triton"] = None
    os.makedirs(args.out, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for task in args.tasks.split(","):
        for model in args.models.split(","):
            if time.perf_counter() - t0 > args.budget_s:
                rows.append(dict(task=task, model=model, error="not run: --budget-s spent"))
                continue
            base = model.split("@")[-1]
            docs = 2 if task == "retrieval" else 1
            batch = args.batch or (2 if args.quick else
                                   max(1, min(recipe(task, base).batch, args.max_tokens // (LENGTH[task] * docs))))
            row = run_row(task, model, batch, device, args.steps, args.seconds_per_row, args.quick)
            print(json.dumps(row), flush=True)
            rows.append(row)
            with open(os.path.join(args.out, "bench_lra.json"), "w") as f:
                json.dump({"env": env, "rows": rows}, f, indent=1)
    text = markdown(rows, env)
    with open(os.path.join(args.out, "bench_lra.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
