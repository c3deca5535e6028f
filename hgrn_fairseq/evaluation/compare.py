"""Side-by-side length extrapolation of several models: one table and one plot.

Reads the ``extrapolation.json`` that ``hgrn_fairseq.evaluation.extrapolation`` wrote for each model and
writes ``comparison.md`` (perplexity at every L, one column per model and mode, plus the ratio of the
perplexity at the longest L to the one at the training length), ``comparison.csv``, ``comparison.json`` and
``comparison.png`` (when matplotlib is installed) to ``--out-dir``.

    python -m hgrn_fairseq.evaluation.compare --out-dir results/compare \\
        hgrn=checkpoints/hgrn/extrapolation transformer=checkpoints/tf/extrapolation

Every model must have been evaluated on the same split with the same token count (checked: otherwise the
perplexities are not comparable and the run stops with a message naming the two runs).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from .extrapolation import MODE_LABELS, MODES, REPORT_STEM, log_y_if_wide, pyplot_or_none, save_ppl_plot

COMPARE_STEM = "comparison"


class CompareError(ValueError):
    """Bad input: a missing report, a malformed label, runs on different data."""


def parse_run(spec: str) -> Tuple[str, str]:
    """``LABEL=DIR`` (or just ``DIR``: the label is the arch recorded in the report)."""
    label, sep, path = spec.partition("=")
    if not sep:
        return "", spec
    if not label or not path:
        raise CompareError(f"run {spec!r}: expected LABEL=DIR (e.g. hgrn=checkpoints/hgrn/extrapolation)")
    return label, path


def load_run(path: str) -> dict:
    report = path if path.endswith(".json") else os.path.join(path, f"{REPORT_STEM}.json")
    if not os.path.isfile(report):
        raise CompareError(
            f"{report} not found: run `python -m hgrn_fairseq.evaluation.extrapolation CHECKPOINT DATA "
            f"--out-dir {os.path.dirname(report) or '.'}` first"
        )
    with open(report, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or "results" not in data or "info" not in data:
        raise CompareError(f"{report}: not an extrapolation report (no 'info'/'results')")
    return data


def collect(runs: Sequence[Tuple[str, dict]]) -> Tuple[List[int], Dict[Tuple[str, str], Dict[int, float]], List[dict]]:
    """Lengths (sorted union), {(label, mode): {L: ppl}}, and one summary dict per run."""
    series: Dict[Tuple[str, str], Dict[int, float]] = {}
    lengths = set()
    summaries = []
    expected = None
    for label, data in runs:
        info = data["info"]
        tokens = {int(r["expected_tokens"]) for r in data["results"]}
        if len(tokens) > 1:
            raise CompareError(f"run {label}: results with different token counts {sorted(tokens)}")
        if tokens:
            n = tokens.pop()
            if expected is None:
                expected = (label, n)
            elif expected[1] != n:
                raise CompareError(
                    f"run {label} scored {n:,} tokens per L but run {expected[0]} scored {expected[1]:,}: "
                    f"they were evaluated on different data or splits, so their perplexities are not comparable"
                )
        for r in data["results"]:
            if int(r["scored_tokens"]) != int(r["expected_tokens"]):
                raise CompareError(
                    f"run {label}, L={r['length']}: {r['scored_tokens']} tokens scored of {r['expected_tokens']}"
                )
            series.setdefault((label, r["mode"]), {})[int(r["length"])] = float(r["ppl"])
            lengths.add(int(r["length"]))
        summaries.append(dict(label=label, arch=info.get("arch"), parameters=info.get("parameters"),
                              num_updates=info.get("num_updates"),
                              trained=info.get("trained_tokens_per_sample"),
                              tokens=expected[1] if expected else None))
    return sorted(lengths), series, summaries


def _fmt(v: Optional[float]) -> str:
    if v is None:
        return ""
    return f"{v:.2f}" if math.isfinite(v) and v < 1e6 else (f"{v:.3g}" if math.isfinite(v) else "inf")


def degradation(points: Dict[int, float], trained: Optional[int]) -> Optional[float]:
    """PPL at the longest L over PPL at the training length (or the shortest L evaluated)."""
    if not points:
        return None
    base_len = trained if trained in points else min(points)
    return points[max(points)] / points[base_len]


def format_markdown(lengths, series, summaries, title: str) -> str:
    keys = [(s["label"], m) for s in summaries for m in MODES if (s["label"], m) in series]
    lines = [f"### {title}", ""]
    for s in summaries:
        lines.append(f"- **{s['label']}**: `{s['arch']}`, {s['parameters'] or 0:,} parameters, "
                     f"{s['num_updates']} updates, trained at L={s['trained']}")
    if summaries and summaries[0]["tokens"]:
        lines.append(f"- every model scored all {summaries[0]['tokens']:,} test tokens at every L (checked)")
    for m in MODES:
        if any(k[1] == m for k in keys):
            lines.append(f"- {m}: {MODE_LABELS[m]}")
    head = " | ".join(f"{label} ({mode})" for label, mode in keys)
    lines += ["", f"| L | {head} |", "|---:|" + "---:|" * len(keys)]
    for L in lengths:
        lines.append(f"| {L} | " + " | ".join(_fmt(series[k].get(L)) for k in keys) + " |")
    trained = {s["label"]: s["trained"] for s in summaries}
    avgs = []
    for k in keys:
        vals = list(series[k].values())
        avgs.append(_fmt(sum(vals) / len(vals)) if vals else "")
    lines.append("| **avg** | " + " | ".join(f"**{a}**" for a in avgs) + " |")
    ratios = [degradation(series[k], trained[k[0]]) for k in keys]
    lines.append("| PPL(max L) / PPL(train L) | " + " | ".join(
        (f"{r:.2f}x" if r is not None and math.isfinite(r) and r < 1e6 else _fmt(r)) for r in ratios) + " |")
    return "\n".join(lines) + "\n"


def write_csv(lengths, series, path: str) -> None:
    keys = list(series)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["length"] + [f"{label}:{mode}" for label, mode in keys])
        for L in lengths:
            w.writerow([L] + [series[k].get(L, "") for k in keys])


def write_plot(lengths, series, summaries, path: str, title: str) -> Optional[str]:
    plt = pyplot_or_none()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (label, mode), pts in series.items():
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", markersize=3,
                linestyle="-" if mode == "stateless" else ":", label=f"{label} ({mode})")
    for t in sorted({s["trained"] for s in summaries if s["trained"]}):
        ax.axvline(t, color="grey", linestyle="--", linewidth=1, label=f"training length {t}")
    log_y_if_wide(ax, [v for pts in series.values() for v in pts.values()])
    return save_ppl_plot(plt, fig, ax, path, "test perplexity", title)


def compare(run_specs: Sequence[str], out_dir: str, title: str = "Length extrapolation", plot: bool = True) -> Dict[str, str]:
    if not run_specs:
        raise CompareError("no runs given: pass LABEL=DIR for each model's extrapolation output")
    runs = []
    for spec in run_specs:
        label, path = parse_run(spec)
        data = load_run(path)
        runs.append((label or str(data["info"].get("arch")), data))
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        raise CompareError(f"labels {labels} are not unique: name each run, LABEL=DIR")
    lengths, series, summaries = collect(runs)
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"{COMPARE_STEM}.{k}") for k in ("md", "csv", "json")}
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(format_markdown(lengths, series, summaries, title))
    write_csv(lengths, series, paths["csv"])
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump({"runs": summaries, "series": {f"{l}:{m}": v for (l, m), v in series.items()}}, f, indent=1)
    if plot:
        png = write_plot(lengths, series, summaries, os.path.join(out_dir, f"{COMPARE_STEM}.png"), title)
        if png:
            paths["png"] = png
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hgrn_fairseq.evaluation.compare", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="LABEL=DIR: a directory holding extrapolation.json (or the json itself)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--title", default="Length extrapolation")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    try:
        paths = compare(args.runs, args.out_dir, args.title, plot=not args.no_plot)
    except CompareError as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2
    with open(paths["md"], encoding="utf-8") as f:
        print(f.read())
    print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
