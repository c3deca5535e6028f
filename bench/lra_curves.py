#!/usr/bin/env python3
"""Validation curves of LRA runs trained in slices, side by side at the same update counts.

    python -m bench.lra_curves DIR NAME=GLOB [NAME=GLOB ...] [--every 2500] [--upto N]

Each GLOB (relative to DIR) picks one run's fairseq-train logs, e.g. the slices
``hgrn1_s2222_eos_train_slice*.log``. The validation lines (``valid on 'valid' subset | ... accuracy A |
... num_updates N``) of all its logs are merged by update (a later log replaces an update that a slice
cut before saving had logged too); the table gives, for each mark 0 < M <= upto (every ``--every``
updates, and the run's last update), the best validation accuracy reached up to M updates, so runs
that validated at different updates compare at the same budget. "-" where a run has not reached M.
Markdown on stdout.

``--fit-gap W`` prints instead, for each run, how well it fits its training data against how well it
validates: fairseq's training accuracy and loss (``train_inner`` lines: training mode, the weights moving)
averaged over the lines of the run's last W updates (W = 750 is one ListOps epoch), its best validation,
and training minus best validation. A run whose batch norms overfit shows a positive gap (docs/lra.md).
"""
from __future__ import annotations

import argparse
import glob
import os
import re

VALID = re.compile(r"valid on 'valid' subset \|.*?\| accuracy ([0-9.]+) \|.*?\| num_updates (\d+)")
TRAIN = re.compile(r"\| train_inner \|.*? loss=([0-9.]+),.*? accuracy=([0-9.]+),.*? num_updates=(\d+)")


def read_points(paths: list[str], pattern: re.Pattern, value) -> dict:
    """{update: value(match)} for the lines of the logs that ``pattern`` matches (its last group is the
    update), in the order given: a later log replaces an update an earlier one logged too."""
    points = {}
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                m = pattern.search(line)
                if m:
                    points[int(m.group(m.re.groups))] = value(m)
    return points


def curve(paths: list[str]) -> dict[int, float]:
    """{update: validation accuracy} from the logs, in the order given (later ones win)."""
    return read_points(paths, VALID, lambda m: float(m.group(1)))


def train_points(paths: list[str]) -> dict[int, tuple[float, float]]:
    """{update: (training loss, training accuracy)} from the logs' ``train_inner`` lines (later logs win)."""
    return read_points(paths, TRAIN, lambda m: (float(m.group(1)), float(m.group(2))))


def fit_gap(runs: dict[str, tuple[dict, dict]], window: int) -> str:
    """Markdown: per run, the training accuracy / loss over its last ``window`` updates, best valid, the gap."""
    lines = [f"| run | last update | training lines in the last {window:,} | training accuracy | training loss "
             "| best valid | training - best valid |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, (valid, train) in runs.items():
        last = max(max(train, default=0), max(valid, default=0))
        near = [train[u] for u in train if last - window < u <= last]
        best = best_up_to(valid, last) if valid else None
        if not near or best is None:
            lines.append(f"| {name} | {last:,} | {len(near)} | - | - | {'-' if best is None else f'{best:.2f}'} | - |")
            continue
        acc = sum(a for _, a in near) / len(near)
        loss = sum(l for l, _ in near) / len(near)
        lines.append(f"| {name} | {last:,} | {len(near)} | {acc:.1f} | {loss:.3f} | {best:.2f} | {acc - best:+.1f} |")
    return "\n".join(lines) + "\n"


def best_up_to(points: dict[int, float], mark: int) -> float | None:
    seen = [acc for upd, acc in points.items() if upd <= mark]
    return max(seen) if seen else None


def slice_order(path: str):
    """Slice logs sort by their slice number (slice10 after slice9), anything else by name."""
    m = re.search(r"slice(\d+)", os.path.basename(path))
    return (int(m.group(1)) if m else -1, os.path.basename(path))


def table(runs: dict[str, dict[int, float]], every: int, upto: int | None = None) -> str:
    last = max((max(p) for p in runs.values() if p), default=0)
    upto = upto or last
    marks = list(range(every, upto + 1, every))
    names = list(runs)
    lines = ["| best valid up to update | " + " | ".join(names) + " |",
             "| ---: | " + " | ".join("---:" for _ in names) + " |"]
    for mark in marks:
        cells = []
        for name in names:
            points = runs[name]
            cells.append("-" if not points or max(points) < mark else f"{best_up_to(points, mark):.2f}")
        lines.append(f"| {mark:,} | " + " | ".join(cells) + " |")
    ends = [f"{max(p):,}: {best_up_to(p, max(p)):.2f}" if p else "-" for p in runs.values()]
    lines.append("| run's last update: best | " + " | ".join(ends) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("runs", nargs="+", metavar="NAME=GLOB")
    p.add_argument("--every", type=int, default=2500)
    p.add_argument("--upto", type=int, default=None)
    p.add_argument("--fit-gap", type=int, default=None, metavar="W",
                   help="instead of the curves: training accuracy over each run's last W updates against its best valid")
    args = p.parse_args(argv)
    if args.every < 1:
        p.error("--every must be at least 1")
    if args.fit_gap is not None and args.fit_gap < 1:
        p.error("--fit-gap must be at least 1 (updates)")
    trains = {}
    runs = {}
    for spec in args.runs:
        name, sep, pattern = spec.partition("=")
        if not sep or not name or not pattern:
            p.error(f"{spec!r}: give each run as NAME=GLOB (e.g. eos=hgrn1_s2222_eos_train_slice*.log)")
        paths = sorted(glob.glob(os.path.join(args.dir, pattern)), key=slice_order)
        if not paths:
            p.error(f"{name}: no log matches {os.path.join(args.dir, pattern)}")
        runs[name] = curve(paths)
        if not runs[name]:
            p.error(f"{name}: the {len(paths)} logs matching {pattern} have no validation line")
        trains[name] = train_points(paths) if args.fit_gap is not None else {}
    if args.fit_gap is not None:
        print(fit_gap({n: (runs[n], trains[n]) for n in runs}, args.fit_gap), end="")
        return 0
    print(table(runs, args.every, args.upto), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
