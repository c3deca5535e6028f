#!/usr/bin/env python3
"""Validation curves of LRA runs trained in slices, side by side at the same update counts.

    python bench/lra_curves.py DIR NAME=GLOB [NAME=GLOB ...] [--every 2500] [--upto N]

Each GLOB (relative to DIR) picks one run's fairseq-train logs, e.g. the slices
``hgrn1_s2_eos_train_slice*.log``. The validation lines (``valid on 'valid' subset | ... accuracy A |
... num_updates N``) of all its logs are merged by update (a later log replaces an update that a slice
cut before saving had logged too); the table gives, for each mark 0 < M <= upto (every ``--every``
updates, and the run's last update), the best validation accuracy reached up to M updates, so runs
that validated at different updates compare at the same budget. "-" where a run has not reached M.
Markdown on stdout.
"""
from __future__ import annotations

import argparse
import glob
import os
import re

VALID = re.compile(r"valid on 'valid' subset \|.*?\| accuracy ([0-9.]+) \|.*?\| num_updates (\d+)")


def curve(paths: list[str]) -> dict[int, float]:
    """{update: validation accuracy} from the logs, in the order given (later ones win)."""
    points: dict[int, float] = {}
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                m = VALID.search(line)
                if m:
                    points[int(m.group(2))] = float(m.group(1))
    return points


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
    args = p.parse_args(argv)
    if args.every < 1:
        p.error("--every must be at least 1")
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
    print(table(runs, args.every, args.upto), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
