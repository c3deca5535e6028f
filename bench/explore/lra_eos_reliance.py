#!/usr/bin/env python3
"""Does a model trained with --append-eos use the token at test time? (one-off, docs/lra.md "The end token")

    python bench/explore/lra_eos_reliance.py CHECKPOINT [--data DIR] [--n 2000] [--cpu] [--json OUT]

Scores the first N test examples twice in masked batches (the masked models' output does not depend on
the padding: tests and bench/lra_padding_sensitivity.py): as trained (each sequence ending with <eos>) and
with the <eos> removed. A drop to the no-token runs' level says the model reads its answer at / through the
token; no drop says the token helped training only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts"))
from lra_eval import load  # noqa: E402


def main(argv=None) -> int:
    import torch
    from fairseq import utils

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", default=None)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    model, cfg, task, use_cuda, _ = load(a.checkpoint, a.data, a.cpu)
    if not getattr(cfg.task, "append_eos", False):
        raise SystemExit("lra_eos_reliance.py: the checkpoint did not train with --append-eos")
    task.load_dataset("test")
    ds = task.dataset("test")
    eos = task.source_dictionary.eos()
    items = [ds[i] for i in range(min(a.n, len(ds)))]
    if any(int(it["source"][-1]) != eos for it in items):
        raise SystemExit("lra_eos_reliance.py: an example does not end with <eos>")
    stripped = [dict(it, source=it["source"][:-1]) for it in items]
    target = torch.tensor([it["label"] for it in items])

    def predict(batch_items):
        out = []
        for i in range(0, len(batch_items), a.batch_size):
            sample = ds.collater(batch_items[i:i + a.batch_size])
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            with torch.no_grad():
                out.append(model(**sample["net_input"]).float().argmax(-1).cpu())
        return torch.cat(out)

    with_eos, without = predict(items), predict(stripped)
    r = {"checkpoint": a.checkpoint, "examples": len(items),
         "accuracy_with_eos": round(100.0 * float(with_eos.eq(target).float().mean()), 2),
         "accuracy_without_eos": round(100.0 * float(without.eq(target).float().mean()), 2),
         "predictions_changed": int(with_eos.ne(without).sum()),
         "device": "cuda" if use_cuda else "cpu"}
    print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
