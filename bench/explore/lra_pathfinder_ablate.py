#!/usr/bin/env python3
"""Pathfinder ablations of the LRA encoder outside fairseq: which part keeps HGRN at chance?

Why: to find which setting keeps an HGRN 2-D classifier at chance on Pathfinder where a small CNN on
the same prepared files learns (lra_pathfinder_cnn_control.py); the peak learning rate did
(docs/lra.md, Findings, "Pathfinder: the learning rate"). This script trains the package's ``LraEncoder`` (the modules fairseq trains, Triton kernels on CUDA) with
one setting changed per variant, in one plain loop, so that many short runs fit one GPU call.

How to run (B: a prepared pathfinder dir, ``data_prep/prepare_lra.py pathfinder --contour-length 6``)::

    python -m bench.explore.lra_pathfinder_ablate B --out ablate.json --steps 1500 \
        --variant base --variant pool=last --variant norm=layer --variant mixer=hgru,expand=1 ...

A variant is ``key=value,key=value`` over the defaults below (HGRN2's Pathfinder arch and recipe, the
schedule compressed to ``--steps``); ``base`` is the defaults. Keys:

    mixer hgru2|hgru|attention   dim 128   layers 6   expand 2   norm batch|layer   pos none|sin
    pool mean|max|last|center    lb 1|0 (lower bounds)   scan parallel|series|none   lr 2e-3   wd 0
    warmup 0.1 (fraction of the steps)   batch 128   subset 0 (train on the first N images: a
    memorisation test)   augment 0|1 (the CNN control's flips / transposes)   model hgrn|cnn
    precision bf16|fp32 (autocast)   stem none|conv|embed (the input side: ``conv`` puts a 3x3 conv of 32
    channels + BN + ReLU in front of the encoder's Linear; ``embed`` reads the 256 grey levels as tokens)
    backend auto|reference|triton (the mixers' kernels: ``reference`` is the PyTorch path, a loop over one
    row or column on a 2-D grid, so it runs on the GPU too: a control for the Triton kernels)
    gatebias 0 (added to the initial bias of every HGRN2 forget-gate logit: 3 starts each layer's
    sigmoid at 0.95 instead of 0.5, a long memory from the first step, as LRU / S4 initialise theirs)

``--state FILE`` (one variant): a checkpoint written at every evaluation and when ``--minutes`` stops the
variant; rerunning the same command resumes from it (a run longer than one GPU call).

``pool=last`` / ``center``: the features of the last (bottom-right) / the centre position instead of
the mean (the public HGRN LRA config has ``decoder: mode: last``). Nothing here changes the package.

Output: one JSON list, an entry per variant (rewritten after every evaluation): the settings, training
loss / accuracy every ``--log-every`` steps, validation accuracy every ``--eval-every`` steps and at the
end, the share of the validation predictions that are class 1 (1.0 or 0.0: a constant prediction).
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from bench import provenance
from bench.explore.lra_pathfinder_cnn_control import (PathfinderCNN, augment, check_dir, load_split, lr_factor,
                                        normalise, write_json)
from bench.explore.forget_gate_bias import add_forget_gate_bias
from hgrn_fairseq.kernels.dispatch import BACKENDS
from hgrn_fairseq.modules.lra_encoder import LraEncoder

DEFAULTS = dict(model="hgrn", mixer="hgru2", dim=128, layers=6, expand=2, norm="batch", pos="none", pool="mean",
                lb=1, scan="parallel", lr=2e-3, wd=0.0, warmup=0.1, batch=128, subset=0, augment=0,
                precision="bf16", stem="none", backend="auto", gatebias=0.0)
STEMS = ("none", "conv", "embed")
POOLS = ("mean", "max", "last", "center")
STEM_CHANNELS = 32


def parse_variant(spec: str) -> dict:
    """``"key=value,..."`` (or ``base``) over DEFAULTS, values cast to the default's type."""
    cfg = dict(DEFAULTS)
    if spec.strip() in ("", "base"):
        return cfg
    for item in spec.split(","):
        if "=" not in item:
            raise SystemExit(f"variant {spec!r}: {item!r} is not key=value (keys: {', '.join(DEFAULTS)})")
        k, v = (s.strip() for s in item.split("=", 1))
        if k not in DEFAULTS:
            raise SystemExit(f"variant {spec!r}: unknown key {k!r} (keys: {', '.join(DEFAULTS)})")
        cfg[k] = type(DEFAULTS[k])(float(v)) if isinstance(DEFAULTS[k], (int, float)) else v
    if cfg["stem"] not in STEMS:
        raise SystemExit(f"variant {spec!r}: stem {cfg['stem']!r} is not one of {STEMS}")
    if cfg["backend"] not in BACKENDS:
        raise SystemExit(f"variant {spec!r}: backend {cfg['backend']!r} is not one of {BACKENDS}")
    if cfg["pool"] not in POOLS:
        raise SystemExit(f"variant {spec!r}: pool {cfg['pool']!r} is not one of {POOLS}")
    return cfg


class Classifier(nn.Module):
    """LraEncoder features -> pooled (mean / max over all positions, or one position) -> Linear."""

    def __init__(self, cfg: dict, channels: int, num_classes: int, side: int):
        super().__init__()
        self.pool, self.side, self.stem_kind = cfg["pool"], side, cfg["stem"]
        self.stem = None
        if cfg["stem"] == "conv":  # local context (a paddle's orientation) before the scans: 3x3 conv, BN, ReLU
            self.stem = nn.Sequential(nn.Conv2d(channels, STEM_CHANNELS, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(STEM_CHANNELS), nn.ReLU())
            channels = STEM_CHANNELS
        tokens = cfg["stem"] == "embed"  # the 256 grey levels as tokens (LRA's original input), not a Linear
        self.encoder = LraEncoder(
            mixer=cfg["mixer"], dim=cfg["dim"], num_layers=cfg["layers"], norm=cfg["norm"],
            input="tokens" if tokens else "pixels", vocab_size=256 if tokens else None,
            in_channels=None if tokens else channels, positions=cfg["pos"], position_dropout=0.0, scan_2d=cfg["scan"],
            expand_ratio=cfg["expand"], lower_bound=bool(cfg["lb"]), num_heads=4, max_len=side * side,
            pool="max" if cfg["pool"] == "max" else "mean", backend=cfg["backend"])
        self.head = nn.Linear(cfg["dim"], num_classes)
        add_forget_gate_bias(self.encoder, cfg["gatebias"])

    def forward(self, x):  # x: [B, C, H, W] normalised
        if self.stem is not None:
            x = self.stem(x)
        if self.stem_kind == "embed":  # back to the uint8 levels (normalise is (x / 255 - 0.5) / 0.5)
            seq = ((x[:, 0].float() * 0.5 + 0.5) * 255).round().clamp(0, 255).long().flatten(1)
        else:
            seq = x.flatten(2).transpose(1, 2)  # raster order, [B, H*W, C]
        if self.pool in ("mean", "max"):
            pooled = self.encoder(seq)
        else:
            h = self.encoder.features(seq)
            pos = h.shape[1] - 1 if self.pool == "last" else (self.side // 2) * self.side + self.side // 2
            pooled = h[:, pos].float()
        return self.head(pooled.to(self.head.weight.dtype))


@torch.no_grad()
def evaluate(model, x_u8, y, device, amp, batch=500):
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    ones = torch.zeros((), dtype=torch.long, device=device)
    for i in range(0, len(x_u8), batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            pred = model(normalise(x_u8[i:i + batch])).argmax(1)
        correct += (pred == y[i:i + batch]).sum()
        ones += pred.sum()
    model.train()
    return correct.item() / len(x_u8) * 100, ones.item() / len(x_u8)


def run_variant(spec: str, data, meta, args, device, entry: dict, save) -> None:
    cfg = parse_variant(spec)
    X, Y = data
    xtr, ytr = X["train"], Y["train"]
    if cfg["subset"]:
        xtr, ytr = xtr[:cfg["subset"]], ytr[:cfg["subset"]]
    torch.manual_seed(args.seed)
    side = xtr.shape[-1]
    if cfg["model"] == "cnn":
        model = PathfinderCNN(32, in_ch=xtr.shape[1], num_classes=2)
    else:
        model = Classifier(cfg, xtr.shape[1], 2, side)
    model = model.to(device).train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["wd"])
    warm = max(1, int(cfg["warmup"] * args.steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warm, args.steps))
    amp = device.type == "cuda" and cfg["precision"] == "bf16"
    gen = torch.Generator().manual_seed(args.seed)
    aug_gen = torch.Generator().manual_seed(args.seed + 1)
    entry.update(spec=spec, settings=cfg, params=params, train_images=len(xtr), steps=args.steps, log=[],
                 evals=[], status="running")
    print(f"[{spec}] {params:,} parameters, {len(xtr)} training images, {args.steps} steps", flush=True)
    t0, perm, pos, start, spent = time.time(), None, len(xtr), 1, 0.0
    if args.state and os.path.exists(args.state):
        from hgrn_fairseq.checkpoint_io import load_checkpoint

        st = load_checkpoint(args.state, map_location=device)
        if st["spec"] != spec or st["steps"] != args.steps or st["data"] != meta.get("inputs_fingerprint"):
            raise SystemExit(f"--state {args.state} holds {st['spec']!r} with {st['steps']} steps, not {spec!r} "
                             f"with {args.steps} on these data: give another --state path")
        model.load_state_dict(st["model"]), opt.load_state_dict(st["opt"]), sched.load_state_dict(st["sched"])
        gen.set_state(st["gen"].cpu()), aug_gen.set_state(st["aug_gen"].cpu())  # (map_location moved them)
        perm, pos, start, spent = st["perm"].to(device), st["pos"], st["step"] + 1, st["seconds"]
        entry.update(log=st["log"], evals=st["evals"], resumed_at=st["resumed_at"] + [st["step"]],
                     stopped_by_time_at=st["stopped_by_time_at"])
        print(f"[{spec}] resumed from {args.state} after step {st['step']} ({spent:.0f} s trained)", flush=True)
    t0 -= spent

    def checkpoint(step):
        if not args.state:
            return
        torch.save({"spec": spec, "steps": args.steps, "data": meta.get("inputs_fingerprint"), "step": step,
                    "model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "gen": gen.get_state(),
                    "aug_gen": aug_gen.get_state(), "perm": perm.cpu(), "pos": pos, "seconds": time.time() - t0,
                    "log": entry["log"], "evals": entry["evals"], "resumed_at": entry.get("resumed_at", []),
                    "stopped_by_time_at": entry.get("stopped_by_time_at", [])}, f"{args.state}.tmp")
        os.replace(f"{args.state}.tmp", args.state)
    # (the training loss / accuracy of a log line average the steps since the last line; after a resume, the
    # first line averages only the steps since the resume)
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    t_call = time.time()
    for step in range(start, args.steps + 1):
        if pos + cfg["batch"] > len(xtr):
            perm, pos = torch.randperm(len(xtr), generator=gen).to(device), 0
        idx = perm[pos:pos + cfg["batch"]]
        pos += cfg["batch"]
        xb, yb = xtr[idx], ytr[idx]
        if cfg["augment"]:
            xb = augment(xb, aug_gen)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(normalise(xb))
        loss = F.cross_entropy(logits.float(), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()
        sched.step()
        loss_sum += loss.detach() * len(idx)
        correct += (logits.argmax(1) == yb).sum()
        seen += len(idx)
        if step % args.log_every == 0 or step == args.steps:
            rec = {"step": step, "loss_bits": round(loss_sum.item() / seen / math.log(2), 4),
                   "train_acc": round(correct.item() / seen * 100, 2), "gnorm": round(float(gnorm), 4),
                   "seconds": round(time.time() - t0, 1)}
            entry["log"].append(rec)
            print(f"[{spec}] {rec}", flush=True)
            loss_sum.zero_(), correct.zero_()
            seen = 0
        if step % args.eval_every == 0 or step == args.steps:
            acc, ones = evaluate(model, X["valid"], Y["valid"], device, amp)
            entry["evals"].append({"step": step, "valid_acc": round(acc, 2), "pred1_share": round(ones, 3)})
            print(f"[{spec}] step {step}: valid {acc:.2f}% (class-1 share of predictions {ones:.3f})", flush=True)
            save()
            checkpoint(step)
        if args.minutes > 0 and time.time() - t_call > args.minutes * 60:
            entry["stopped_by_time_at"] = entry.get("stopped_by_time_at", []) + [step]
            acc, ones = evaluate(model, X["valid"], Y["valid"], device, amp)
            entry["evals"].append({"step": step, "valid_acc": round(acc, 2), "pred1_share": round(ones, 3)})
            print(f"[{spec}] stopped by time at step {step}: valid {acc:.2f}%", flush=True)
            entry["status"] = "stopped_by_time"
            save()
            checkpoint(step)
            return
    entry.update(status="done", train_seconds=round(time.time() - t0, 1))
    save()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir", help="prepared pathfinder dir (hgrn-lra/1 format)")
    p.add_argument("--out", required=True, help="JSON file for the results (a list, one entry per variant)")
    p.add_argument("--variant", action="append", default=[], help="key=value,... over the defaults (repeatable)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--minutes", type=float, default=0.0, help="stop a variant after this long (0: no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state", default="", help="checkpoint file (one variant): written at every evaluation and when "
                   "stopped by time; a rerun with the same variant and --steps resumes from it")
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    variants = args.variant or ["base"]
    if args.state and len(variants) != 1:
        raise SystemExit("--state holds one variant's run: give exactly one --variant")
    for v in variants:
        parse_variant(v)  # refuse a bad spec before loading anything
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    meta = check_dir(args.data_dir)
    X, Y = {}, {}
    for s in ("train", "valid"):
        x, y = load_split(args.data_dir, s, meta)
        # (copies: the arrays are read-only)
        X[s], Y[s] = torch.tensor(x, device=device), torch.tensor(y, device=device)
    results = []

    def save():
        write_json(args.out, results)

    for v in variants:
        entry = {"data_dir": os.path.abspath(args.data_dir), "contour_length": meta.get("contour_length"),
                 "git": provenance.git_version(), "device": torch.cuda.get_device_name() if device.type == "cuda"
                 else "cpu", "date": datetime.date.today().isoformat()}
        results.append(entry)
        run_variant(v, (X, Y), meta, args, device, entry, save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
