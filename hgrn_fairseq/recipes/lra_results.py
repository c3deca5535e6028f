"""The LRA results table: our test accuracy beside the papers', markdown and CSV.

    python scripts/lra_results.py [ROOT] [--out-prefix ROOT/results]

Reads every ``ROOT/*/test_result.json`` (written by ``scripts/lra_eval.py``; ``train_lra.sh`` puts
them in ``checkpoints/lra/TASK_MODEL/``) and writes ``results.md`` and ``results.csv``: one row per
(task, model) in the papers' order with our accuracy, the paper's, the difference, the updates that
ran of the recipe's total, whether the data were LRA's own (generated data are marked), and where it
ran. The average over the six tasks is given only when all six were run on comparable data.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys

from hgrn_fairseq.recipes.lra import MODELS, PIXEL_TASKS, REPO, SEED, TASKS, recipe

COLUMNS = ["task", "model", "ours", "paper", "diff", "updates", "planned_updates", "schedule", "recipe_updates", "data",
           "precision", "device", "date", "examples"]


def collect(root: str, others: list = None) -> dict:
    """(task, model) -> the test result of the recipe's run: its seed (results from before the seed was
    recorded count as such), padding masked, and on token tasks <eos> appended (--append-eos). Other runs (other seeds, the unmasked-padding ablation, token tasks without <eos>)
    go to ``others`` (a list, when given) instead."""
    results = {}
    for path in sorted(glob.glob(os.path.join(root, "*", "test_result.json"))):
        with open(path) as f:
            r = json.load(f)
        model, _, task = r.get("arch", "").partition("_lra_")
        if task in TASKS and model in MODELS:
            if is_recipe_run(r, task):
                results[(task, model)] = r
            elif others is not None:
                others.append(r)
    return results


def other_norm(r: dict) -> bool:
    """The run changed its arch's norm (--norm; results from before the norm was recorded did not). Batch
    and sync-batch norm count as one: on one GPU they are the same computation."""
    def kind(n):
        return "batch" if n == "syncbatch" else n
    return bool(r.get("norm") and r.get("recipe_norm")) and kind(r["norm"]) != kind(r["recipe_norm"])


def is_recipe_run(r: dict, task: str) -> bool:
    eos = bool(r.get("append_eos")) == (task not in PIXEL_TASKS)
    variants = ("unmasked_padding", "scratch_positions", "scan_padding")  # ablations and experiments
    return (r.get("seed", SEED) == SEED and eos and not any(r.get(k) for k in variants) and not other_norm(r)
            and not r.get("arch_overrides")  # other model options than the arch's
            and not r.get("recipe_overrides")  # other training settings than the recipe's
            and r.get("contour_length") in (None, 14))  # Pathfinder's easier difficulties are not LRA's task


def rows(results: dict) -> list:
    out = []
    for model in MODELS:
        for task in TASKS:
            rec = recipe(task, model)
            r = results.get((task, model))
            row = {"task": task, "model": model, "paper": rec.paper_accuracy, "recipe_updates": rec.total}
            if r is None:
                row.update(ours=None, diff=None, updates=None, planned_updates=None, schedule=None, data=None, precision=None,
                           device=None, date=None,
                           examples=None)
            else:
                row.update(ours=r["accuracy"], diff=round(r["accuracy"] - rec.paper_accuracy, 2),
                           updates=r.get("num_updates"), planned_updates=r.get("planned_updates"),
                           schedule=r.get("schedule"),
                           data="LRA" if r.get("data_comparable", True) else f"generated ({r.get('data_source') or 'not LRA'})",
                           precision=r.get("precision"), device=r.get("device"), date=(r.get("date") or "")[:10],
                           examples=r.get("examples"))
            out.append(row)
    return out


def other_runs(others: list) -> str:
    """Lines for the runs that are not the recipe's (other seeds, the unmasked-padding ablation, token tasks
    without <eos>, scratch positions): not in the table, which has one run per cell, the recipe's."""
    if not others:
        return ""
    lines = [f"\nOther runs (the table has the recipe's: seed {SEED}, padding masked, <eos> appended on token tasks):"]
    def seed(r):  # results from before the seed was recorded ran with the recipe's
        return r.get("seed", SEED)

    for r in sorted(others, key=lambda r: (r["arch"], seed(r), bool(r.get("unmasked_padding")),
                                           bool(r.get("append_eos")))):
        model, _, task = r["arch"].partition("_lra_")
        no_eos = task not in PIXEL_TASKS and not r.get("append_eos")
        ablation = (", unmasked padding" if r.get("unmasked_padding") else "") + (", no <eos>" if no_eos else "")
        if r.get("scratch_positions"):
            ablation += f", {r['scratch_positions']} scratch positions"
        if r.get("scan_padding"):
            ablation += ", scans see the padding"
        if r.get("pad_to_length"):
            ablation += f", every batch padded to {r['pad_to_length']}"
        if r.get("contour_length") not in (None, 14):
            ablation += f", contour length {r['contour_length']} (an easier Pathfinder than LRA's 14)"
        if other_norm(r):
            ablation += f", {r['norm']} norms instead of {r['recipe_norm']}"
        for name, value in sorted((r.get("arch_overrides") or {}).items()):
            ablation += f", {name} {value} (not the arch's)"
        for name, value in sorted((r.get("recipe_overrides") or {}).items()):
            ablation += f", {name} {value} (not the recipe's)"
        cut = ", the recipe's schedule cut there" if r.get("schedule") == "truncated" else ""
        lines.append(f"- {model.upper()} {task}, seed {seed(r)}{ablation}: {r['accuracy']:.2f} after "
                     f"{r.get('num_updates') or 0:,} updates (planned {r.get('planned_updates') or 0:,}{cut}), "
                     f"{r.get('device', '-')}")
    return "\n".join(lines) + "\n"


def markdown(table: list) -> str:
    def fmt(v, spec="{:.2f}"):
        return "-" if v is None else (spec.format(v) if isinstance(v, float) else str(v))

    lines = ["| model | task | ours | paper | diff | updates run (planned; recipe) | test examples | data | precision | device | date |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---|---|"]
    for r in table:
        planned = "-" if r.get("planned_updates") is None else f"{r['planned_updates']:,}"
        if r.get("schedule") == "truncated":  # (a compressed schedule is the default of a shortened run)
            planned += ", the recipe's schedule cut there"
        upd = "-" if r["updates"] is None else f"{r['updates']:,} ({planned}; {r['recipe_updates']:,})"
        diff = "-" if r["diff"] is None else f"{r['diff']:+.2f}"
        lines.append(f"| {r['model'].upper()} | {r['task']} | {fmt(r['ours'])} | {fmt(r['paper'])} | {diff} | {upd} | "
                     f"{fmt(r['examples'])} | {fmt(r['data'])} | {fmt(r['precision'])} | {fmt(r['device'])} | {fmt(r['date'])} |")
    for model in MODELS:
        mine = [r for r in table if r["model"] == model]
        paper_avg = sum(r["paper"] for r in mine) / len(mine)
        if all(r["ours"] is not None and r["data"] == "LRA" for r in mine):
            ours = f"{sum(r['ours'] for r in mine) / len(mine):.2f}"
        else:
            ours = "- (needs all six tasks on LRA's data)"
        lines.append(f"\n{model.upper()} average: ours {ours}, paper {paper_avg:.2f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", nargs="?", default=os.path.join(REPO, "checkpoints", "lra"))
    p.add_argument("--out-prefix", default=None, help="write PREFIX.md and PREFIX.csv (default ROOT/results)")
    args = p.parse_args(argv)
    others = []
    table = rows(collect(args.root, others))
    prefix = args.out_prefix or os.path.join(args.root, "results")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    text = markdown(table) + other_runs(others)
    with open(prefix + ".md", "w") as f:
        f.write(text)
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in table:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
    print(text, end="")
    print(f"lra_results: wrote {prefix}.md and {prefix}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
