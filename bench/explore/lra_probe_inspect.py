#!/usr/bin/env python3
"""Inspect a grid-probe model saved with ``lra_grid_toy_probe.py --save``: per block, the spread of each part's output
(all values, over positions, and of the position-mean across examples: the signal the head can read), and per
parameter its norm and gradient norm on one batch. Run on the weights before and after a collapse, it shows what
changed (docs/lra.md, "The learning rate": the GLUs' outputs blow up and drown the mixers' long-range signal).

    python bench/explore/lra_probe_inspect.py MODEL.pt --side 16 [--dim 32 --layers 4] [--json out.json]

The model is rebuilt as the probe builds its default encoder (HGRN2, batch norms, expand ratio 2, PyTorch path).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), os.path.dirname(HERE), HERE]
import lra_grid_toy_probe as probe  # noqa: E402
from hgrn_fairseq.modules.lra_encoder import LraClassifier  # noqa: E402


def inspect(state: dict, side: int, dim: int, layers: int, batch: int = 64, seed: int = 123) -> dict:
    model = LraClassifier(probe.build_encoder(side, dim=dim, layers=layers), 2)
    model.load_state_dict(state)
    x, y = probe.batch("path", batch, side, 1, 0, np.random.default_rng(seed))
    outputs = {}
    for name, mod in model.named_modules():
        if name and name.count(".") <= 3:
            mod.register_forward_hook(lambda m, i, o, name=name: outputs.__setitem__(
                name, (o[0] if isinstance(o, tuple) else o).detach()))
    model.train()  # (batch statistics, as in training)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    parts = {n: {"std": round(a.std().item(), 4), "std_over_positions": round(a.std(1).mean().item(), 4),
                 "pooled_std_over_examples": round(a.mean(1).std(0).mean().item(), 5)}
             for n, a in outputs.items() if a.dim() == 3}
    params = {n: {"norm": round(p.norm().item(), 4),
                  "grad_norm": round(p.grad.norm().item(), 6) if p.grad is not None else None}
              for n, p in model.named_parameters()}
    return {"loss": round(loss.item(), 4), "accuracy": round((logits.argmax(1) == y).float().mean().item() * 100, 2),
            "logit_std_over_examples": [round(v, 4) for v in logits.detach().std(0).tolist()],
            "parts": parts, "parameters": params}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--side", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if not os.path.isfile(args.model):
        raise SystemExit(f"lra_probe_inspect.py: {args.model} does not exist (write one with lra_grid_toy_probe.py --save)")
    r = inspect(torch.load(args.model), args.side, args.dim, args.layers)
    print(f"loss {r['loss']}  accuracy {r['accuracy']}  logit std over examples {r['logit_std_over_examples']}")
    for n, s in r["parts"].items():
        print(f"{n:36s} std {s['std']:9.4f}  over positions {s['std_over_positions']:9.4f}  "
              f"pooled, over examples {s['pooled_std_over_examples']:9.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
