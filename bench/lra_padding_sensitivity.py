"""Does an LRA text model's prediction for an example depend on how much padding the batch gives it?

With the recipe's masked padding it must not (tests/modules/test_lra_encoder.py checks the encoder); the
official code's unmasked padding (`--unmasked-padding`, docs/lra.md) lets the pads into the scans and the
norms, so an example's prediction can change with the other examples of its batch. This scores the first
N examples of a split twice: each alone (no padding) and each padded to --pad-to tokens (the task's
longest by default), and reports both accuracies and how many predictions differ.

    python -m bench.lra_padding_sensitivity CHECKPOINT [--data DIR] [--split test] [--n 200] [--cpu]
        [--padded-only] [--pad-by 1,16,128] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys

from scripts.lra_eval import load  # the checkpoint as scripts/lra_eval.py scores it


def measure(checkpoint: str, data: str | None, split: str, n: int, pad_to: int | None, cpu: bool,
            batch_size: int = 32, alone: bool = True, pad_by: tuple[int, ...] = ()) -> dict:
    import torch
    from fairseq import utils

    model, cfg, task, use_cuda, _ = load(checkpoint, data, cpu)
    task.load_dataset(split)
    dataset = task.dataset(split)
    if getattr(dataset, "input1", None) is not None:
        raise SystemExit("lra_padding_sensitivity.py: pair tasks (retrieval) are not supported; use a single-input task")
    n = min(n, len(dataset))
    if n < 1:
        raise SystemExit(f"lra_padding_sensitivity.py: --n must be at least 1 (the split has {len(dataset)} examples)")
    items = [dataset[i] for i in range(n)]
    longest = max(len(it["source"]) for it in items)
    pad_to = pad_to or int(task.max_positions())  # (the stored maximum, + 1 with --append-eos)
    if pad_to < longest:
        raise SystemExit(f"lra_padding_sensitivity.py: --pad-to {pad_to} is shorter than an example ({longest} tokens); "
                         f"give at least {longest}")

    if pad_by and longest + max(pad_by) > pad_to:
        raise SystemExit(f"lra_padding_sensitivity.py: --pad-by {max(pad_by)} makes the longest example ({longest} tokens) "
                         f"longer than the task's {pad_to}; give at most {pad_to - longest} or a smaller --n")

    def run(batch, length=None):  # logits of the examples, padded to `length` tokens (None: the collater's)
        sample = dataset.collater(batch)
        if length is not None:
            tokens = sample["net_input"]["src_tokens"]
            wide = tokens.new_full((tokens.shape[0], length), dataset.pad)
            wide[:, : tokens.shape[1]] = tokens
            sample["net_input"]["src_tokens"] = wide
            sample["net_input"]["padded"] = bool(wide.eq(dataset.pad).any())
        if use_cuda:
            sample = utils.move_to_cuda(sample)
        with torch.no_grad():
            return model(**sample["net_input"]).float().cpu()

    # batch of one: no pad position (slow on a CPU: ~1.5 s per ListOps example; alone=False skips it)
    single = torch.cat([run([it]) for it in items]) if alone else None
    padded = torch.cat([run(items[i:i + batch_size], pad_to) for i in range(0, n, batch_size)])
    target = torch.tensor([it["label"] for it in items])
    by = {}
    for k in pad_by:  # each example alone with exactly k pads behind it
        logits = torch.cat([run([it], len(it["source"]) + k) for it in items])
        by[str(k)] = round(100.0 * float(logits.argmax(-1).eq(target).float().mean()), 2)
    pp = padded.argmax(-1)
    pa = single.argmax(-1) if alone else None
    return {
        "checkpoint": checkpoint,
        "split": split,
        "examples": n,
        "pad_to": pad_to,
        "example_lengths": [min(len(it["source"]) for it in items), longest],
        "unmasked_padding": bool(getattr(cfg.model, "unmasked_padding", False)),
        "append_eos": bool(getattr(cfg.task, "append_eos", False)),  # (the example lengths include its token)
        "accuracy_alone": round(100.0 * float(pa.eq(target).float().mean()), 2) if alone else None,
        "accuracy_padded": round(100.0 * float(pp.eq(target).float().mean()), 2),
        "predictions_changed": int(pa.ne(pp).sum()) if alone else None,
        "max_abs_logit_diff": float((single - padded).abs().max()) if alone else None,
        "accuracy_padded_by": by,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", help="data directory (default: the one the checkpoint trained on)")
    p.add_argument("--split", default="test")
    p.add_argument("--n", type=int, default=200, help="the first N examples of the split")
    p.add_argument("--pad-to", type=int, help="length to pad each example to (default: the task's maximum)")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--padded-only", action="store_true", help="score only the padded examples (fast: whole splits)")
    p.add_argument("--pad-by", default="", help="comma-separated K: also score each example alone with exactly K pads")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    try:
        pad_by = tuple(int(k) for k in args.pad_by.split(",") if k.strip())
    except ValueError:
        p.error(f"--pad-by {args.pad_by!r}: give comma-separated whole numbers of pads, e.g. 1,16,128")
    if any(k < 0 for k in pad_by):
        p.error(f"--pad-by {args.pad_by!r}: a number of pads cannot be negative")
    r = measure(args.checkpoint, args.data, args.split, args.n, args.pad_to, args.cpu, alone=not args.padded_only,
                pad_by=pad_by)
    if args.padded_only:
        print(f"lra_padding_sensitivity: {r['examples']} {r['split']} examples, unmasked_padding="
              f"{r['unmasked_padding']}: accuracy padded to {r['pad_to']} {r['accuracy_padded']:.2f}")
    else:
        print(f"lra_padding_sensitivity: {r['examples']} {r['split']} examples ({r['example_lengths'][0]}-"
              f"{r['example_lengths'][1]} tokens), unmasked_padding={r['unmasked_padding']}: accuracy alone "
              f"{r['accuracy_alone']:.2f}, padded to {r['pad_to']} {r['accuracy_padded']:.2f}, predictions changed "
              f"{r['predictions_changed']}, max |logit diff| {r['max_abs_logit_diff']:.3g}")
    for k, acc in r["accuracy_padded_by"].items():
        print(f"lra_padding_sensitivity: each example alone with {k} pad(s) behind it: accuracy {acc:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
