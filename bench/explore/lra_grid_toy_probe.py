#!/usr/bin/env python3
"""Probe (CPU, or GPU with --device cuda): does the LRA 2-D encoder learn connectivity at all, and at which step of difficulty does it stop?

Why: on generated Pathfinder our HGRN encoders stayed at chance where a small CNN learned the same images
(docs/lra.md, Findings, "Pathfinder: the learning rate"). This probe trains the package's ``LraEncoder``
(PyTorch reference path on the CPU; ``--device cuda --backend triton`` on the GPU) on small synthetic grids whose
difficulty is a knob, so the question "can it trace a path at all?" is answered on clean data;
``--model localcnn`` is the yardstick for local cues that an encoder's score must beat:

* ``rowcol``: two dots on an empty S x S grid; label 1 when they share a row or a column (one hop of the
  row / column scans, no drawing).
* ``path``: two target paths of straight legs (``--turns`` turns, so turns + 1 legs) in every example, as in
  Pathfinder: a positive puts dot A at the start and dot B at the end of one path and leaves the other
  unmarked; a negative puts A at the start of one and B at the end of the other. The label is whether the two
  dots are connected (4-connectivity of the drawn pixels, checked by flood fill, not assumed from the
  construction). Both classes have the same ink and the same number of free path ends, and in neither do
  the two target paths touch (a positive's unmarked path that joins the marked one is drawn again: a
  negative's cannot join, so crossings would tell the classes apart). (With one path for a positive and two
  for a negative, the count of free path ends gives the label away to a local network.) Each example is drawn again until
  the flood fill agrees with the class wanted, so the classes are balanced (half and half in expectation).
  ``--diagonal``: every leg at 45 degrees, connectivity then 8-neighbour (pixels touching at a corner join).
  ``--dash K`` leaves every K-th pixel of a leg blank (Pathfinder's paths are dashed: paddles with gaps); the
  dots are always drawn, and the flood fill then bridges a one-pixel gap (steps of two along the
  connectivity's directions, so that a dashed path counts as connected). ``--distractors N``: N more paths from random points, drawn before the dots (a distractor that
  happens to join the dots makes a positive: the flood fill decides).

What makes a larger grid harder, taken apart: ``--max-leg L`` caps every leg at L pixels on the full grid (the
distances stay short, the grid grows); ``--canvas C`` pastes each ``--side`` example at a random place of a C x C
background (the paths stay those of the small grid, the positions and row / column lengths grow);
``--side-schedule 16:800,24:3000`` is a curriculum: smaller grids first (the encoder reads any square grid), then
``--side``, on which validation always is.

Pixels: background -1, path 0, dots 1 (Pathfinder's markers are brighter than its paddles). Each step
draws a fresh batch (no fixed training set: no memorising). Validation: 1,000 fixed examples, scored three
ways: with the batch norms in training mode (batch statistics), in eval mode (running statistics), and in eval
mode after re-estimating the running statistics with the final weights (30 batches, a cumulative average) --
the last two differ when the running statistics lag the weights.

    python -m bench.explore.lra_grid_toy_probe --task path --turns 3 --steps 300 --out probe.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench import provenance
from bench.explore.forget_gate_bias import add_forget_gate_bias  # no fairseq: the probe needs PyTorch only
from hgrn_fairseq.kernels.dispatch import BACKENDS
from hgrn_fairseq.modules.lra_encoder import LraClassifier, LraEncoder
from hgrn_fairseq.modules.norms import MaskedBatchNorm

BACKGROUND, INK, DOT = -1.0, 0.0, 1.0
MAX_TRIES = 1000


NEIGHBOURS4 = ((1, 0), (-1, 0), (0, 1), (0, -1))
NEIGHBOURS8 = NEIGHBOURS4 + ((1, 1), (1, -1), (-1, 1), (-1, -1))


def neighbours_for(diagonal: bool, dash: int):
    """The steps that join two drawn pixels: 4-connectivity (8 with ``diagonal``); with ``dash`` also the same
    steps doubled, which bridge a one-pixel gap of a dashed leg (without them a dashed path is not connected
    and the only positives the sampler finds are dots a pixel or two apart: the task degenerates to "are the
    dots close?")."""
    base = NEIGHBOURS8 if diagonal else NEIGHBOURS4
    return base + tuple((2 * dr, 2 * dc) for dr, dc in base) if dash else base


def connected(img: np.ndarray, a, b, neighbours=NEIGHBOURS4) -> bool:
    """Whether pixels a and b (both drawn) are joined by drawn pixels (a flood fill; 4-connectivity unless
    ``neighbours`` says otherwise)."""
    S = img.shape[0]
    seen = np.zeros_like(img, dtype=bool)
    stack = [tuple(a)]
    seen[a] = True
    while stack:
        r, c = stack.pop()
        if (r, c) == tuple(b):
            return True
        for rr, cc in ((r + dr, c + dc) for dr, dc in neighbours):
            if 0 <= rr < S and 0 <= cc < S and not seen[rr, cc] and img[rr, cc] > BACKGROUND:
                seen[rr, cc] = True
                stack.append((rr, cc))
    return False


def leg_end(pos, S, rng, max_leg=0):
    """A new coordinate for a leg from ``pos``: anywhere on the row / column, or within ``max_leg`` of ``pos``."""
    if not max_leg:
        return int(rng.integers(0, S))
    return int(rng.integers(max(0, pos - max_leg), min(S, pos + max_leg + 1)))


def draw_path(img, r, c, legs, rng, dash, diagonal=False, max_leg=0):
    """``legs`` straight legs from (r, c), alternating direction (``diagonal``: every leg at 45 degrees, a
    staircase of pixels that touch at their corners); returns the end point. ``max_leg`` (0: no limit) caps
    a leg's length in pixels (the distance a dot's signal must travel, apart from the grid's size)."""
    horizontal = rng.random() < 0.5
    for _ in range(legs):
        S = img.shape[0]
        if diagonal:
            dr, dc = (1 if rng.random() < 0.5 else -1), (1 if rng.random() < 0.5 else -1)
            n = int(rng.integers(1, min(S, max_leg + 1) if max_leg else S))
            cells = [(r, c)]
            while len(cells) <= n and 0 <= r + dr < S and 0 <= c + dc < S:
                r, c = r + dr, c + dc
                cells.append((r, c))
        elif horizontal:
            c2 = leg_end(c, S, rng, max_leg)
            cells = [(r, k) for k in range(min(c, c2), max(c, c2) + 1)]
            c = c2
        else:
            r2 = leg_end(r, S, rng, max_leg)
            cells = [(k, c) for k in range(min(r, r2), max(r, r2) + 1)]
            r = r2
        for i, (rr, cc) in enumerate(cells):
            if not dash or (i + 1) % dash:
                img[rr, cc] = max(img[rr, cc], INK)
        horizontal = not horizontal
    return r, c


def sample(task: str, S: int, turns: int, dash: int, rng, diagonal: bool = False, distractors: int = 0,
           max_leg: int = 0, canvas: int = 0):
    """One example ``(S x S image, label)``; ``canvas`` C > S: the example pasted at a random place of a C x C
    background (more positions and longer rows and columns, the same paths)."""
    img, y = _sample(task, S, turns, dash, rng, diagonal, distractors, max_leg)
    if canvas and canvas > S:
        big = np.full((canvas, canvas), BACKGROUND, np.float32)
        r, c = (int(v) for v in rng.integers(0, canvas - S + 1, 2))
        big[r:r + S, c:c + S] = img
        img = big
    return img, y


def _sample(task: str, S: int, turns: int, dash: int, rng, diagonal: bool, distractors: int, max_leg: int):
    img = np.full((S, S), BACKGROUND, np.float32)
    if task == "rowcol":
        a = tuple(int(v) for v in rng.integers(0, S, 2))
        b = a
        while b == a:
            if rng.random() < 0.5:  # a positive: move b onto a's row or column
                b = (a[0], int(rng.integers(0, S))) if rng.random() < 0.5 else (int(rng.integers(0, S)), a[1])
            else:
                b = tuple(int(v) for v in rng.integers(0, S, 2))
        img[a] = img[b] = DOT
        return img, int(a[0] == b[0] or a[1] == b[1])
    want = int(rng.random() < 0.5)
    for _ in range(MAX_TRIES):  # draw until the flood fill agrees with the class wanted (balanced classes)
        img = np.full((S, S), BACKGROUND, np.float32)
        a = tuple(int(v) for v in rng.integers(0, S, 2))
        # two target paths of turns + 1 legs in both classes, dot A where a path starts and dot B where a path
        # ends: a positive joins them by one path and draws the other unmarked, a negative puts them on
        # different paths. So the classes have the same ink and the same number of free path ends (no line-end
        # count gives the label away) and the same dash phase at each dot (a path's first pixel after its
        # start is always ink; the one before its end is blank for a third of the lengths)
        c = None
        if want:
            b = tuple(draw_path(img, *a, turns + 1, rng, dash, diagonal, max_leg))
            c = tuple(int(v) for v in rng.integers(0, S, 2))
            draw_path(img, *c, turns + 1, rng, dash, diagonal, max_leg)
        else:
            draw_path(img, *a, turns + 1, rng, dash, diagonal, max_leg)
            b = tuple(draw_path(img, *(int(v) for v in rng.integers(0, S, 2)), turns + 1, rng, dash, diagonal, max_leg))
        for _ in range(distractors):  # paths from random points that join the dots only by chance
            draw_path(img, *(int(v) for v in rng.integers(0, S, 2)), max(turns, 1), rng, dash, diagonal, max_leg)
        img[a] = img[b] = DOT
        if b == a:  # one dot only: draw again
            continue
        nb = neighbours_for(diagonal, dash)
        if c is not None and (c in (a, b) or connected(img, a, c, nb)):
            # the unmarked path touches the marked one: draw again (a negative's two paths never touch, or it
            # would be a positive; letting a positive's cross would make crossings a cue for the label)
            continue
        y = int(connected(img, a, b, nb))
        if y == want:
            return img, y
    raise RuntimeError(f"no {'connected' if want else 'unconnected'} example in {MAX_TRIES} draws (side {S}, turns "
                       f"{turns}, dash {dash}): use a larger --side or fewer --turns")


def batch(task, n, S, turns, dash, rng, diagonal=False, distractors=0, max_leg=0, canvas=0):
    xs, ys = zip(*(sample(task, S, turns, dash, rng, diagonal, distractors, max_leg, canvas) for _ in range(n)))
    x = np.stack(xs)
    return torch.from_numpy(x).reshape(n, x.shape[1] * x.shape[2], 1), torch.tensor(ys)


def parse_side_schedule(text: str, final_side: int):
    """``"16:600,24:1500"`` -> ``[(600, 16), (1500, 24)]``: train on side 16 up to step 600, 24 up to 1,500, then
    on ``final_side``; one-line errors for a malformed schedule."""
    if not text:
        return []
    out, last = [], 0
    for item in text.split(","):
        try:
            side, until = (int(v) for v in item.split(":"))
        except ValueError:
            raise SystemExit(f"--side-schedule: {item!r} is not SIDE:UNTIL_STEP (e.g. 16:600,24:1500)") from None
        if until <= last or side < 4 or side > final_side:
            raise SystemExit(f"--side-schedule: {item!r}: steps must grow and sides lie in 4..--side ({final_side})")
        out.append((until, side))
        last = until
    return out


def side_at(schedule, step: int, final_side: int) -> int:
    """The training side at ``step`` (1-based) under ``parse_side_schedule``'s schedule."""
    for until, side in schedule:
        if step <= until:
            return side
    return final_side


class LocalCNN(nn.Module):
    """The yardstick for local cues: ``layers`` 3x3 convs with ReLU (receptive field 2 * layers + 1 pixels), then
    the mean and the max of every feature over the grid, then a Linear. What it scores, the label gives away
    without tracing a path; an encoder's result means path tracing only as far as it is above this."""

    def __init__(self, layers: int = 2, width: int = 32):
        super().__init__()
        convs = []
        for i in range(layers):
            convs += [nn.Conv2d(1 if i == 0 else width, width, 3, padding=1), nn.ReLU()]
        self.convs, self.head = nn.Sequential(*convs), nn.Linear(2 * width, 2)

    def forward(self, x):  # x: [B, S * S, 1] as the encoder reads it (any square S)
        side = int(round(x.shape[1] ** 0.5))
        h = self.convs(x.reshape(-1, 1, side, side))
        return self.head(torch.cat([h.mean((2, 3)), h.amax((2, 3))], 1))


def accuracy(model, x, y) -> float:
    dev = next(model.parameters()).device
    x, y = x.to(dev), y.to(dev)
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item() * 100


def recalibrate(model, task, S, turns, dash, rng, batches=30, size=64, diagonal=False, distractors=0, max_leg=0,
                canvas=0) -> None:
    """Running statistics of every batch norm re-estimated with the current weights (cumulative average)."""
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.running_mean.zero_(), m.running_var.fill_(1.0)
    model.train()
    with torch.no_grad():
        for i in range(batches):
            for m in norms:
                m.momentum = 1.0 / (i + 1)
            x = batch(task, size, S, turns, dash, rng, diagonal, distractors, max_leg, canvas)[0]
            model(x.to(next(model.parameters()).device))
    for m, mom in zip(norms, saved):
        m.momentum = mom


def build_encoder(side: int, mixer: str = "hgru2", dim: int = 32, layers: int = 4, norm: str = "batch", expand: int = 2,
                  backend: str = "reference", pool: str = "mean") -> LraEncoder:
    """The probe's encoder for grids of up to ``side`` x ``side`` pixels."""
    return LraEncoder(mixer=mixer, dim=dim, num_layers=layers, norm=norm, input="pixels", in_channels=1,
                      positions="none", scan_2d="parallel", expand_ratio=expand, backend=backend, max_len=side * side,
                      pool=pool)


def watch_gates(model: nn.Module) -> list:
    """``--diagnose``: every HGRN2 mixer of ``model`` keeps the statistics of the forget gates (decay = exp(log-decay))
    of its last forward in the returned list, a dict per mixer in layer order: mean, share above 0.99 (a memory
    that hardly fades) and below 0.05 (none)."""
    from hgrn_fairseq.modules.hgru2 import HGRU2

    stats = []
    for m in (m for m in model.modules() if isinstance(m, HGRU2)):
        slot = {}
        stats.append(slot)

        def gates(x, lower_bound, _inner=m._gates, _slot=slot):
            q, v, log_decay = _inner(x, lower_bound)
            with torch.no_grad():
                d = log_decay.float().exp()
                _slot.update(mean=round(d.mean().item(), 4), above_099=round((d > 0.99).float().mean().item(), 4),
                             below_005=round((d < 0.05).float().mean().item(), 4))
            return q, v, log_decay

        m._gates = gates
    return stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=("rowcol", "path"), default="path")
    p.add_argument("--turns", type=int, default=1)
    p.add_argument("--dash", type=int, default=0, help="leave every K-th pixel of a leg blank (0: solid legs)")
    p.add_argument("--diagonal", action="store_true", help="legs at 45 degrees (8-connectivity): a staircase of "
                   "pixels that touch at their corners, never along a row or a column")
    p.add_argument("--distractors", type=int, default=0, help="extra paths from random points (Pathfinder's "
                   "distractor snakes); the flood fill still decides the label")
    p.add_argument("--side", type=int, default=16)
    p.add_argument("--max-leg", type=int, default=0, help="cap every leg at this many pixels (0: a leg may cross "
                   "the grid): the distance a dot's signal must travel, apart from the grid's size")
    p.add_argument("--canvas", type=int, default=0, help="paste each --side example at a random place of a C x C "
                   "background: the grid's size apart from the paths' lengths")
    p.add_argument("--side-schedule", default="", help="a curriculum: SIDE:UNTIL_STEP,... (e.g. 16:600,24:1500) "
                   "trains on smaller grids first, then on --side; validation is always on --side")
    p.add_argument("--model", choices=("encoder", "localcnn"), default="encoder", help="localcnn: the yardstick "
                   "for local cues (--layers 3x3 convs, global mean and max pooling)")
    p.add_argument("--mixer", default="hgru2")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--expand", type=int, default=2)
    p.add_argument("--norm", default="batch")
    p.add_argument("--pool", choices=("mean", "max"), default="mean", help="the encoder's pooling over the grid "
                   "(max: the two dots' features are not averaged with 1,022 others on a 32 x 32 grid)")
    p.add_argument("--gate-bias", type=float, default=0.0, help="added to the initial forget-gate logits (HGRN2): "
                   "3 starts every gate at sigmoid 0.95, a long memory")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay")
    p.add_argument("--warmup", type=int, default=0, help="linear warm-up of the rate from 0 over this many steps "
                   "(then constant)")
    p.add_argument("--diagnose", action="store_true", help="log at every evaluation the forget gates' statistics of "
                   "each layer (last training step), the gradient norm (median and maximum since the last evaluation) "
                   "and the largest logit: what changes when a run collapses")
    p.add_argument("--clip", type=float, default=0.0, help="clip the gradients' global norm to this (0: no clipping)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu or cuda (the batches are drawn on the CPU either way)")
    p.add_argument("--backend", choices=BACKENDS, default="reference", help="the mixers' kernels: reference (PyTorch) or triton "
                   "(CUDA only)")
    p.add_argument("--out", default="")
    p.add_argument("--save", default="", help="write the model's state_dict here at the end (to inspect a collapsed "
                   "run)")
    args = p.parse_args(argv)
    if args.dash == 1:
        p.error("--dash 1 would blank every pixel of a leg: give 0 (solid) or K >= 2 (every K-th pixel blank)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.canvas and args.canvas <= args.side:
        p.error(f"--canvas {args.canvas} must be larger than --side {args.side} (or 0: no canvas)")
    if args.canvas and args.side_schedule:
        p.error("--canvas and --side-schedule together: give one")
    S = args.side
    schedule = parse_side_schedule(args.side_schedule, S)
    G = args.canvas or S  # the grid the encoder reads
    enc = build_encoder(G, args.mixer, args.dim, args.layers, args.norm, args.expand, args.backend, args.pool)
    dev = torch.device(args.device)
    add_forget_gate_bias(enc, args.gate_bias)
    model = (LraClassifier(enc, 2) if args.model == "encoder" else LocalCNN(args.layers)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    gate_stats, grad_norms = (watch_gates(model) if args.diagnose else None), []
    rng = np.random.default_rng(args.seed)
    shape = dict(diagonal=args.diagonal, distractors=args.distractors, max_leg=args.max_leg, canvas=args.canvas)
    xv, yv = batch(args.task, 1000, S, args.turns, args.dash, np.random.default_rng(10_000 + args.seed), **shape)
    result = {"settings": vars(args), "valid_positive_share": round(yv.float().mean().item(), 3),
              "git": provenance.git_version(), "date": datetime.date.today().isoformat(), "evals": []}
    print(f"{args.task} turns {args.turns} dash {args.dash} diagonal {args.diagonal} distractors {args.distractors}: "
          f"valid positives {result['valid_positive_share']:.3f}",
          flush=True)
    t0, accs = time.time(), []
    for step in range(1, args.steps + 1):
        side = side_at(schedule, step, S)
        x, y = batch(args.task, args.batch, side, args.turns, args.dash, rng, **shape)
        x, y = x.to(dev), y.to(dev)
        model.train()
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        if args.diagnose or args.clip > 0:  # (the norm before clipping; inf: measured, not clipped)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip if args.clip > 0 else float("inf"))
            if args.diagnose:
                grad_norms.append(norm.item())
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / args.warmup) if args.warmup else args.lr
        opt.step()
        accs.append((logits.argmax(1) == y).float().mean().item() * 100)
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            running = accuracy(model, xv, yv)
            buffers = {k: v.clone() for k, v in model.state_dict().items() if "running_" in k or "num_batches" in k}
            model.train()
            batch_stats = accuracy(model, xv, yv)
            model.load_state_dict(buffers, strict=False)  # (the validation batch leaves no trace in them)
            rec = {"step": step, "train_side": side, "lr": opt.param_groups[0]["lr"], "loss": round(loss.item(), 4), "train_acc": round(float(np.mean(accs[-50:])), 2),
                   "valid_batch_stats": round(batch_stats, 2), "valid_eval": round(running, 2),
                   "seconds": round(time.time() - t0, 1)}
            if args.diagnose:
                rec.update(grad_norm_median=round(float(np.median(grad_norms)), 4),
                           grad_norm_max=round(float(np.max(grad_norms)), 4),
                           logit_abs_max=round(logits.detach().abs().max().item(), 2),
                           gates=[dict(g) for g in gate_stats])
                grad_norms.clear()
            result["evals"].append(rec)
            print(rec, flush=True)
            if args.out:  # (after every evaluation: a run cut short by a time limit keeps what it measured)
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)
    if args.norm in ("batch", "syncbatch") and args.model == "encoder":
        recalibrate(model, args.task, S, args.turns, args.dash, np.random.default_rng(20_000 + args.seed), **shape)
        model.eval()
        result["valid_eval_recalibrated"] = round(accuracy(model, xv, yv), 2)
        print(f"eval mode after re-estimating the running statistics: {result['valid_eval_recalibrated']:.2f}",
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.save:
        torch.save(model.state_dict(), args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
