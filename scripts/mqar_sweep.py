#!/usr/bin/env python3
"""MQAR sweep (HGRN2 paper Fig. 3, SPEC 9): HGRN1 vs HGRN2 over model width and learning rate.

For every (seq_len, kv pairs) setting, model (``hgrn1_mqar`` / ``hgrn2_mqar``), width d and learning
rate, runs ``fairseq-train --user-dir hgrn_fairseq --task mqar`` (AdamW -- fairseq's ``adam`` decays
weights decoupled -- weight decay 0.1, cosine schedule with linear warm-up, no dropout), reads the
validation accuracy on the held-out set from its JSON log, keeps the best learning rate per
(setting, model, d) and writes into ``--out``:

* ``runs.csv``: every run (final and best validation accuracy, updates, wall time, status), the
  selected learning rates marked;
* ``table.md``: per setting, the best accuracy per d for each model and whether HGRN2 beats HGRN1;
* ``plot.png``: accuracy vs d, one line per model, one panel per setting;
* ``runs/<name>.json`` and ``logs/<name>.log``: per-run results and fairseq logs.

A learning rate is selected by the *final* validation accuracy (the end of the cosine schedule;
ties by the best one), so nothing is picked by peeking at the held-out set mid-run.

The reports are rewritten after every finished run, so a sweep cut short still leaves a table of
what finished; a rerun with the same ``--out`` skips runs whose result exists (``--force`` redoes).

Example (a few minutes on CPU, for trying the pipeline)::

    python scripts/mqar_sweep.py --out /tmp/mqar --settings 32:4 --vocab-size 64 --dims 32,64 \\
        --lrs 3e-3 --train-size 2000 --test-size 300 --epochs 2 --models hgrn1

``scripts/run_mqar.sh`` wraps this with the GPU settings.
"""
import argparse
import csv
import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, "hgrn_fairseq")
ARCHS = {"hgrn1": "hgrn1_mqar", "hgrn2": "hgrn2_mqar"}
LABELS = {"hgrn1": "HGRN1", "hgrn2": "HGRN2"}
VALID_LINE = re.compile(r"\|\s*valid\s*\|\s*(\{.*\})\s*$")
TRAIN_INNER_LINE = re.compile(r"\|\s*train_inner\s*\|\s*(\{.*\})\s*$")


@dataclass
class Setting:
    seq_len: int
    num_kv_pairs: int

    @property
    def name(self) -> str:
        return f"seq{self.seq_len}_kv{self.num_kv_pairs}"

    @property
    def title(self) -> str:
        return f"seq {self.seq_len}, {self.num_kv_pairs} kv pairs"


@dataclass
class Run:
    setting: Setting
    model: str
    d: int
    lr: float

    @property
    def name(self) -> str:
        return f"{self.setting.name}_{self.model}_d{self.d}_lr{self.lr:g}"


@dataclass
class RunResult:
    name: str
    seq_len: int
    num_kv_pairs: int
    model: str
    d: int
    lr: float
    status: str  # ok | failed | timeout (--run-timeout) | skipped (--time-budget)
    final_acc: Optional[float] = None
    best_acc: Optional[float] = None
    final_loss: Optional[float] = None
    epochs: int = 0
    updates: int = 0
    wall_s: float = 0.0
    valid_acc_per_epoch: List[float] = field(default_factory=list)
    error: str = ""


def parse_list(text: str, cast):
    return [cast(x) for x in text.replace(" ", "").split(",") if x]


def parse_settings(text: str) -> List[Setting]:
    settings = []
    for item in parse_list(text, str):
        m = re.fullmatch(r"(\d+):(\d+)", item)
        if not m:
            raise SystemExit(f"--settings: {item!r} is not SEQ_LEN:KV_PAIRS (e.g. 256:16,512:64)")
        settings.append(Setting(int(m.group(1)), int(m.group(2))))
    return settings


def parse_fairseq_log(text: str) -> Dict:
    """Validation accuracy per epoch, the last validation loss and the last update from a JSON log."""
    accs, loss, updates = [], None, 0
    for line in text.splitlines():
        m = VALID_LINE.search(line)
        if m:
            stats = json.loads(m.group(1))
            if "valid_accuracy" in stats:
                accs.append(float(stats["valid_accuracy"]))
                loss = float(stats["valid_loss"])
                updates = int(float(stats.get("valid_num_updates", updates)))
            continue
        m = TRAIN_INNER_LINE.search(line)
        if m:
            updates = max(updates, int(float(json.loads(m.group(1)).get("num_updates", 0))))
    return {"accs": accs, "loss": loss, "updates": updates}


def updates_per_epoch(args) -> int:
    return math.ceil(args.train_size / args.batch_size)


def fairseq_command(run: Run, args, use_cpu: bool) -> List[str]:
    total = updates_per_epoch(args) * args.epochs
    warmup = max(1, int(round(args.warmup_frac * total)))
    cmd = [
        sys.executable, "-m", "fairseq_cli.train",
        "--user-dir", PLUGIN, "--task", "mqar",
        "--vocab-size", args.vocab_size, "--seq-len", run.setting.seq_len,
        "--num-kv-pairs", run.setting.num_kv_pairs,
        "--train-size", args.train_size, "--test-size", args.test_size, "--data-seed", args.data_seed,
        "--arch", ARCHS[run.model], "--decoder-embed-dim", run.d,
        "--criterion", "mqar_cross_entropy",
        "--optimizer", "adam", "--weight-decay", args.weight_decay, "--clip-norm", args.clip_norm,
        "--lr", run.lr, "--lr-scheduler", "cosine", "--warmup-updates", warmup,
        "--max-update", total, "--max-epoch", args.epochs, "--batch-size", args.batch_size,
        "--no-save", "--save-dir", os.path.join(args.out, "checkpoints", run.name),  # only probed, per run
        "--num-workers", 0, "--log-format", "json",
        "--log-interval", args.log_interval, "--seed", args.seed,
    ]
    if use_cpu:
        cmd.append("--cpu")
    cmd += shlex.split(args.fairseq_args)
    return [str(c) for c in cmd]


def run_one(run: Run, args, use_cpu: bool, deadline: Optional[float] = None) -> RunResult:
    if deadline is not None and time.time() > deadline:
        return RunResult(run.name, run.setting.seq_len, run.setting.num_kv_pairs, run.model, run.d, run.lr,
                         status="skipped", error="--time-budget spent before it started")
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    log_path = os.path.join(logs, run.name + ".log")
    env = dict(os.environ)
    if use_cpu:
        env.setdefault("OMP_NUM_THREADS", "1")  # parallel jobs on few cores: threads only contend
    elif args.tf32:
        env.setdefault("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    cmd = fairseq_command(run, args, use_cpu)
    start = time.time()
    status = "ok"
    with open(log_path, "w") as log:
        log.write("# " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        try:
            proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            status = "timeout"
    wall = time.time() - start
    try:  # fairseq probes the (per-run, so parallel runs cannot race) save dir even with --no-save
        os.removedirs(os.path.join(args.out, "checkpoints", run.name))
    except OSError:
        pass
    text = open(log_path, errors="replace").read()
    parsed = parse_fairseq_log(text)
    if status == "ok" and proc.returncode != 0:
        status = "failed"
    error = ""
    if status != "ok":
        lines = [ln for ln in text.splitlines() if ln.strip()]
        error = " / ".join(lines[-3:])[-500:]
    accs = parsed["accs"]
    return RunResult(
        name=run.name, seq_len=run.setting.seq_len, num_kv_pairs=run.setting.num_kv_pairs,
        model=run.model, d=run.d, lr=run.lr, status=status,
        final_acc=accs[-1] if accs and status == "ok" else None,
        best_acc=max(accs) if accs else None,
        final_loss=parsed["loss"], epochs=len(accs), updates=parsed["updates"],
        wall_s=round(wall, 1), valid_acc_per_epoch=accs, error=error,
    )


# ------------------------------------------------------------------------------------------------
# Reports


def select_best(results: List[RunResult]) -> Dict:
    """(seq_len, kv, model, d) -> the run with the best final accuracy (ties: best accuracy)."""
    best = {}
    for r in results:
        if r.final_acc is None:
            continue
        key = (r.seq_len, r.num_kv_pairs, r.model, r.d)
        score = (r.final_acc, r.best_acc or 0.0, -r.lr)
        if key not in best or score > best[key][0]:
            best[key] = (score, r)
    return {k: v[1] for k, v in best.items()}


def write_csv(path: str, results: List[RunResult], best: Dict) -> None:
    chosen = {r.name for r in best.values()}
    columns = ["seq_len", "num_kv_pairs", "model", "d", "lr", "final_acc", "best_acc", "final_loss",
               "epochs", "updates", "wall_s", "status", "selected"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for r in sorted(results, key=lambda r: (r.seq_len, r.num_kv_pairs, r.model, r.d, r.lr)):
            row = asdict(r)
            row["selected"] = int(r.name in chosen)
            writer.writerow(["" if row[c] is None else row[c] for c in columns])


def fmt_acc(r: Optional[RunResult]) -> str:
    return "-" if r is None else f"{r.final_acc:.1f} (lr {r.lr:g})"


def write_table(path: str, results: List[RunResult], best: Dict, settings, models, dims, args) -> None:
    lines = [
        "# MQAR: validation accuracy (%) on query positions, best learning rate per cell",
        "",
        f"vocab {args.vocab_size}, {args.train_size} train / {args.test_size} held-out examples, "
        f"{args.epochs} epoch(s), batch {args.batch_size}, learning rates {args.lrs}, AdamW wd "
        f"{args.weight_decay}, gradient clip {getattr(args, 'clip_norm', '-')}, cosine with "
        f"{args.warmup_frac:g} warm-up; 2 layers, no MLP, no positions. "
        f"Chance: {100.0 / (args.vocab_size - 1 - (args.vocab_size - 1) // 2):.3g}%.",
        "",
    ]
    for s in settings:
        lines += [f"## {s.title}", ""]
        header = "| d | " + " | ".join(LABELS[m] for m in models)
        sep = "|---|" + "---|" * len(models)
        both = "hgrn1" in models and "hgrn2" in models
        if both:
            header += " | HGRN2 > HGRN1"
            sep += "---|"
        lines += [header + " |", sep]
        wins = compared = 0
        for d in dims:
            cells = [best.get((s.seq_len, s.num_kv_pairs, m, d)) for m in models]
            row = f"| {d} | " + " | ".join(fmt_acc(c) for c in cells)
            if both:
                a = best.get((s.seq_len, s.num_kv_pairs, "hgrn1", d))
                b = best.get((s.seq_len, s.num_kv_pairs, "hgrn2", d))
                if a is not None and b is not None:
                    compared += 1
                    wins += b.final_acc > a.final_acc
                    row += " | " + ("yes" if b.final_acc > a.final_acc else "no")
                else:
                    row += " | -"
            lines.append(row + " |")
        if both:
            verdict = f"HGRN2 beats HGRN1 at {wins} of {compared} widths measured"
            if compared < len(dims):
                verdict += f" ({len(dims) - compared} not measured)"
            lines += ["", verdict + "."]
        failed = [r for r in results if (r.seq_len, r.num_kv_pairs) == (s.seq_len, s.num_kv_pairs) and r.status != "ok"]
        if failed:
            lines += ["", "Runs without a final result: " + ", ".join(f"{r.name} ({r.status})" for r in failed)]
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(path: str, best: Dict, settings, models, dims) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6), squeeze=False)
    for ax, s in zip(axes[0], settings):
        for m in models:
            points = [(d, best[(s.seq_len, s.num_kv_pairs, m, d)].final_acc) for d in dims
                      if (s.seq_len, s.num_kv_pairs, m, d) in best]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=LABELS[m])
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims)
        ax.set_xticklabels([str(d) for d in dims])
        ax.set_ylim(-2, 102)
        ax.set_xlabel("model dimension d")
        ax.set_title(s.title)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (%)")
    axes[0][0].legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(results, settings, models, dims, args) -> None:
    best = select_best(results)
    write_csv(os.path.join(args.out, "runs.csv"), results, best)
    write_table(os.path.join(args.out, "table.md"), results, best, settings, models, dims, args)
    if not args.no_plot:
        try:
            write_plot(os.path.join(args.out, "plot.png"), best, settings, models, dims)
        except ImportError as e:  # a sweep must not die on a missing plotting library
            args.no_plot = True
            print(f"warning: no plot.png ({e}); pip install matplotlib, then rerun with --report-only",
                  flush=True)


# ------------------------------------------------------------------------------------------------


PREFLIGHT = r"""
import argparse, sys, types, torch
import hgrn_fairseq
from fairseq.models import ARCH_CONFIG_REGISTRY
from hgrn_fairseq.models.hgrn_lm import HgrnLanguageModel
from hgrn_fairseq.tasks.mqar import build_mqar_dictionary
device = sys.argv[1]
for arch in sys.argv[2:]:
    args = argparse.Namespace(decoder_embed_dim=64)
    ARCH_CONFIG_REGISTRY[arch](args)
    task = types.SimpleNamespace(target_dictionary=build_mqar_dictionary(64))
    model = HgrnLanguageModel.build_model(args, task).to(device)
    out, _ = model(torch.randint(4, 68, (2, 16), device=device))
    out.float().sum().backward()
    print(f"preflight: {arch} forward/backward ok on {device}")
"""


def preflight(models, use_cpu: bool) -> None:
    """Build each arch and run one step on the target device, so a missing module or kernel fails
    the sweep in seconds instead of in every run."""
    device = "cpu" if use_cpu else "cuda"
    cmd = [sys.executable, "-c", PREFLIGHT, device] + [ARCHS[m] for m in models]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"preflight failed (models {models} on {device}):\n{proc.stderr[-3000:]}")
    print(proc.stdout.strip(), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--settings", default="256:16,512:64", help="SEQ_LEN:KV_PAIRS list")
    p.add_argument("--models", default="hgrn1,hgrn2", help="subset of hgrn1,hgrn2")
    p.add_argument("--dims", default="64,128,256,512")
    p.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3", help="learning-rate grid")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--train-size", type=int, default=100_000)
    p.add_argument("--test-size", type=int, default=3_000)
    p.add_argument("--epochs", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup-frac", type=float, default=0.1, help="warm-up share of all updates")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1, help="model seed")
    p.add_argument("--data-seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (they share the device)")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds before a run is killed")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds after which no new run starts (those left are reported as skipped)")
    p.add_argument("--cpu", action="store_true", help="train on CPU even if CUDA is available")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="keep fp32 matmuls exact on GPU (default: TF32 via TORCH_ALLOW_TF32_CUBLAS_OVERRIDE)")
    p.add_argument("--fairseq-args", default="", help="extra fairseq-train arguments, e.g. '--bf16'")
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--force", action="store_true", help="rerun runs whose result already exists")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--report-only", action="store_true", help="rewrite the reports from runs/*.json")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = p.parse_args(argv)

    settings = parse_settings(args.settings)
    models = parse_list(args.models, str)
    for m in models:
        if m not in ARCHS:
            raise SystemExit(f"--models: {m!r} is not one of {sorted(ARCHS)}")
    dims = parse_list(args.dims, int)
    lrs = parse_list(args.lrs, float)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    import torch  # noqa: E402 (only to see whether CUDA is there)

    use_cpu = args.cpu or not torch.cuda.is_available()

    runs = [Run(s, m, d, lr) for s in settings for m in models for d in dims for lr in lrs]
    # Per setting, the biggest runs first so parallel jobs end together.
    runs.sort(key=lambda r: (settings.index(r.setting), -r.d, r.model, r.lr))
    if args.dry_run:
        for run in runs:
            print(" ".join(shlex.quote(c) for c in fairseq_command(run, args, use_cpu)))
        return

    results: Dict[str, RunResult] = {}
    todo = []
    for run in runs:
        path = os.path.join(args.out, "runs", run.name + ".json")
        if os.path.exists(path) and not args.force:
            results[run.name] = RunResult(**json.load(open(path)))
        else:
            todo.append(run)
    if args.report_only:
        write_reports(list(results.values()), settings, models, dims, args)
        print(f"reports from {len(results)} runs written to {args.out}")
        return

    device = "CPU" if use_cpu else torch.cuda.get_device_name(0)
    print(f"MQAR sweep: {len(runs)} runs ({len(runs) - len(todo)} already done), {args.jobs} at a time on "
          f"{device}; {updates_per_epoch(args) * args.epochs} updates each; output in {args.out}", flush=True)
    if todo:
        preflight(sorted({r.model for r in todo}), use_cpu)
    start, lock, finished = time.time(), threading.Lock(), [0]

    def done(result: RunResult):
        with lock:
            finished[0] += 1
            results[result.name] = result
            if result.status != "skipped":  # a rerun with the same --out does the skipped ones
                with open(os.path.join(args.out, "runs", result.name + ".json"), "w") as f:
                    json.dump(asdict(result), f, indent=1)
            write_reports(list(results.values()), settings, models, dims, args)
            elapsed = time.time() - start
            eta = elapsed / finished[0] * (len(todo) - finished[0])
            acc = "-" if result.final_acc is None else f"{result.final_acc:.1f}%"
            extra = f" [{result.status}: {result.error[-200:]}]" if result.status != "ok" else ""
            print(f"[{finished[0]}/{len(todo)}] {result.name}: acc {acc} after {result.updates} updates, "
                  f"{result.wall_s:.0f}s (elapsed {elapsed:.0f}s, eta {eta:.0f}s){extra}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        deadline = None if args.time_budget is None else start + args.time_budget
        futures = [pool.submit(run_one, run, args, use_cpu, deadline) for run in todo]
        for future in as_completed(futures):
            done(future.result())
    write_reports(list(results.values()), settings, models, dims, args)
    print(f"done in {time.time() - start:.0f}s: {args.out}/runs.csv, table.md" + ("" if args.no_plot else ", plot.png"))
    print(open(os.path.join(args.out, "table.md")).read())


if __name__ == "__main__":
    main()
