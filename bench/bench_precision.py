#!/usr/bin/env python3
"""Training speed of the WikiText-103 recipes at each precision, through the real entry point.

    python3 -m bench.bench_precision --out results/precision            # GPU, about 4 minutes
    python3 -m bench.bench_precision --out /tmp/p --quick --cpu         # smoke test (tiny, CPU)

For each recipe and each of ``PRECISION=fp32|tf32|bf16``, ``scripts/train_wt103.sh RECIPE`` (the
paper's recipe: 128 x 512 tokens per update, fused loss, CUDA graphs for HGRN) trains ``--updates``
updates on a synthetic corpus of uniformly random token ids over GPT-2's 50,264-entry dictionary
(speed does not depend on the text). Tokens/s is fairseq's own ``wps``, the median over the log lines
after the first ``--skip`` updates (compilation, graph capture, autotuning). Writes
``bench_precision.json`` and ``bench_precision.md`` (device, versions, date, commit) to ``--out``.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from bench import provenance

GPT2_DICT_SIZE = 50264  # with fairseq's 4 specials
TOKENS_PER_UPDATE = 128 * 512


def write_synthetic_corpus(dest: str, train_tokens: int, vocab: int, seed: int = 0) -> None:
    """dict.txt of ``vocab`` entries (fairseq's 4 specials + vocab - 4 symbols) and train/valid splits of
    random ids, binarised as fairseq's mmap datasets."""
    import torch
    from fairseq.data import indexed_dataset

    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "dict.txt"), "w") as f:
        for i in range(vocab - 4):
            f.write(f"w{i} 1\n")
    rng = np.random.default_rng(seed)
    for split, tokens in (("train", train_tokens), ("valid", 4 * 512)):
        builder = indexed_dataset.make_builder(os.path.join(dest, f"{split}.bin"), impl="mmap", vocab_size=vocab)
        line = 1024
        for start in range(0, tokens, line):
            ids = rng.integers(4, vocab, size=min(line, tokens - start) - 1)
            builder.add_item(torch.from_numpy(np.append(ids, 2).astype(np.int64)))  # 2: </s>
        builder.finalize(os.path.join(dest, f"{split}.idx"))


def run(recipe: str, precision: str, data: str, out: str, updates: int, skip: int, cpu: bool, quick: bool):
    save = os.path.join(out, "runs", f"{recipe}_{precision}")
    env = dict(os.environ, PRECISION=precision, SAVE_DIR=save, LOG_DIR=save, NUM_GPUS="0" if cpu else "1",
               PYTHON=sys.executable)
    extra = ["--max-update", str(updates), "--log-interval", "5", "--disable-validation", "--no-save",
             "--seed", "1", "--num-workers", "2"]
    if quick:
        extra += ["--batch-size", "2", "--update-freq", "1", "--tokens-per-sample", "64", "--arch",
                  "hgrn_lm_tiny" if recipe.startswith("hgrn") else "transformer_lm"]
    if cpu:
        extra.append("--cpu")
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "train_wt103.sh"), recipe, data, *extra],
                          capture_output=True, text=True, env=env, cwd=REPO)
    text = proc.stdout + proc.stderr
    with open(os.path.join(out, f"{recipe}_{precision}.log"), "w") as f:
        f.write(text)
    points = [(int(m.group(2)), float(m.group(1)))  # fairseq's train_inner lines: wps=..., num_updates=...
              for m in re.finditer(r"wps=([\d.]+),.*?num_updates=(\d+),", text)]
    later = [wps for step, wps in points if step > skip] or [wps for _, wps in points]
    return {"recipe": recipe, "precision": precision, "rc": proc.returncode,
            "tokens_per_s": statistics.median(later) if later else None, "log_points": points,
            "error": None if proc.returncode == 0 else text[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--recipes", default="hgrn_lm_base,transformer_lm_wt103_small")
    parser.add_argument("--precisions", default="fp32,tf32,bf16")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--skip", type=int, default=10, help="updates left out of the median")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny models and batches (smoke test)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data = os.path.join(args.out, "data")
    tokens = (args.updates + 2) * (2 * 64 if args.quick else TOKENS_PER_UPDATE)
    if not os.path.exists(os.path.join(data, "train.idx")):
        write_synthetic_corpus(data, tokens, 1000 if args.quick else GPT2_DICT_SIZE)
    rows = []
    for recipe in args.recipes.split(","):
        for precision in args.precisions.split(","):
            row = run(recipe, precision, data, args.out, args.updates, args.skip, args.cpu, args.quick)
            print(f"{recipe} {precision}: {row['tokens_per_s']} tokens/s (rc {row['rc']})", flush=True)
            rows.append(row)
    import torch

    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.cpu else platform.processor(),
            "torch": torch.__version__, "python": platform.python_version(), "commit": provenance.git_version(),
            "updates": args.updates, "skip": args.skip, "quick": args.quick}
    with open(os.path.join(args.out, "bench_precision.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    lines = [f"# Training speed by precision ({info['device']}, torch {info['torch']}, {info['date']}, "
             f"commit {info['commit']})", "",
             f"`scripts/train_wt103.sh RECIPE` with `PRECISION=...`, 128 x 512 tokens per update, synthetic "
             f"corpus over a {GPT2_DICT_SIZE}-entry dictionary; fairseq's wps, median after update {args.skip} "
             f"of {args.updates}.", "", "| recipe | precision | tokens/s | vs fp32 |", "|---|---|---|---|"]
    for row in rows:
        base = next((r["tokens_per_s"] for r in rows if r["recipe"] == row["recipe"] and r["precision"] == "fp32"), None)
        ratio = f"{row['tokens_per_s'] / base:.2f}x" if base and row["tokens_per_s"] else "-"
        tps = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] else f"failed (rc {row['rc']})"
        lines.append(f"| {row['recipe']} | {row['precision']} | {tps} | {ratio} |")
    with open(os.path.join(args.out, "bench_precision.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
