"""The papers' LRA recipes, the one source of the model archs ``{model}_lra_{task}``, ``scripts/train_lra.sh``,
the hydra configs (``configs/lra/*.yaml``, generated here) and the results table.

    python scripts/lra_recipes.py args TASK MODEL [--nproc N] [--max-update N]   # fairseq-train flags
    python scripts/lra_recipes.py show TASK MODEL                                # the recipe as JSON
    python scripts/lra_recipes.py write-configs [--dir configs/lra]             # (re)write the yaml files

Both papers: AdamW (``--optimizer torch_adamw``, hgrn_fairseq/optim.py: fairseq's adam rule, decoupled
weight decay, betas 0.9/0.999, as one fused kernel; without apex fairseq's own adam loops over the
parameters in Python), a linear warm-up from 0 to the peak learning rate, then a cosine decay to 0 at the total step count, seed 2222, the
run capped at the papers' epochs as well. HGRN1 trains in fp32, HGRN2 in bf16. "batch" is the total
over all GPUs; per-GPU batch = batch / GPUs (must divide). A shortened run (``--max-update N``
smaller than the total) compresses the schedule: warm-up
``round(warmup * N / total)``, cosine to 0 at N, no epoch cap. With ``--truncate`` it runs the recipe's
own schedule instead and stops at N (the paper's warm-up and cosine period, ``--lr-period-updates``): the
learning rate of every update is the paper's run's, the run is that run's first N updates. Pathfinder
needs this: compressed, its 2e-3 peak arrives within a few hundred updates, a rate at which the 2-D
models do not learn, where the paper's 50,000-update warm-up keeps the rate under 5e-4 for the first
12,500 updates (docs/lra.md, Findings, "Pathfinder: the learning rate").

Token tasks (ListOps, Text, Retrieval) end every sequence with ``<eos>`` (``--append-eos``), as the
official harness's data do (its ListOps / IMDB / AAN configs: ``append_eos: True`` within lengths 2,048 /
4,096 / 4,000); ``--no-eos`` (``NO_EOS=1`` for train_lra.sh) leaves it out.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # (an editable install's checkout)
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
MODELS = ("hgrn1", "hgrn2")
PIXEL_TASKS = ("image", "pathfinder", "pathx")
SEED = 2222
OPTIMIZER = "torch_adamw"  # both papers' AdamW (hgrn_fairseq/optim.py)
LR_SCHEDULER = "cosine"  # with linear warm-up from 0, to 0


# Per-task model settings (the papers' tables), which the archs {model}_lra_{task} set (hgrn_fairseq/models/hgrn_lra.py).
#            layers, d, norm, dropout, glu multiple, positions, 2-D scan, max positions (token tasks: the
#            official harness's lengths, its appended <eos> included: ListOps 2,000 tokens + <eos> fit 2,048;
#            Text and Retrieval are prepared to 4,095 / 3,999 so that + <eos> they fill 4,096 / 4,000)
_HGRN1 = {
    "listops": (6, 32, "syncbatch", 0.0, 1, "sin", "none", 2048),
    "text": (4, 128, "syncbatch", 0.1, 1, "sin", "none", 4096),
    "retrieval": (2, 64, "batch", 0.0, 2, "sin", "none", 4000),
    "image": (6, 512, "batch", 0.0, 1, "sin", "parallel", 1024),
    "pathfinder": (6, 128, "batch", 0.0, 1, "none", "parallel", 1024),
    "pathx": (6, 64, "syncbatch", 0.0, 1, "none", "parallel", 16384),
}
#            ... as above, plus the expand ratio
_HGRN2 = {
    "listops": (5, 64, "syncbatch", 0.0, 1, "sin", "none", 2048, 4),
    "text": (4, 128, "layer", 0.1, 1, "none", "none", 4096, 8),
    "retrieval": (2, 256, "syncbatch", 0.0, 2, "sin", "none", 4000, 2),
    "image": (6, 512, "syncbatch", 0.0, 1, "sin", "parallel", 1024, 2),
    "pathfinder": (6, 128, "batch", 0.0, 1, "none", "parallel", 1024, 2),
    "pathx": (6, 32, "batch", 0.0, 1, "sin", "series", 16384, 1),
}


def arch_settings(model: str, task: str) -> dict:
    """The model options the arch ``{model}_lra_{task}`` sets (model: hgrn1 or hgrn2)."""
    if model == "hgrn1":
        L, d, norm, drop, mult, pos, scan, max_pos = _HGRN1[task]
        extra = {"token_mixer": "hgru"}
    elif model == "hgrn2":
        L, d, norm, drop, mult, pos, scan, max_pos, expand = _HGRN2[task]
        extra = {"token_mixer": "hgru2", "expand_ratio": expand}
    else:
        raise ValueError(f"model {model!r} is not hgrn1 or hgrn2")
    return dict(extra, encoder_layers=L, encoder_embed_dim=d, norm=norm, dropout=drop, glu_multiple=float(mult),
                positions=pos, scan_2d=scan, max_positions=max_pos)


@dataclass(frozen=True)
class Recipe:
    lr: float
    weight_decay: float
    warmup: int
    total: int
    epochs: int
    batch: int
    clip: float
    precision: str  # fp32 | bf16
    paper_accuracy: float
    augment: bool = False


def _recipes() -> Dict[Tuple[str, str], Recipe]:
    hgrn1 = {  # lr, wd, warm-up, total, epochs, batch, clip, paper test accuracy (HGRN paper)
        "listops": (5e-4, 0.01, 5000, 50000, 50, 128, 0.0, 59.95),
        "text": (5e-3, 0.0, 10000, 50000, 32, 32, 0.0, 88.14),
        "retrieval": (5e-3, 0.0, 312, 50000, 20, 64, 0.0, 94.23),
        "image": (3e-3, 0.0, 30000, 50000, 100, 50, 0.0, 88.69),
        "pathfinder": (2e-3, 0.0, 50000, 500000, 200, 128, 0.0, 92.92),
        "pathx": (7.5e-4, 0.0, 150000, 500000, 100, 16, 0.0, 97.50),
    }
    hgrn2 = {  # HGRN2 paper
        "listops": (5e-4, 0.0, 5000, 50000, 50, 128, 0.0, 60.52),
        "text": (5e-3, 0.0, 10000, 50000, 40, 64, 0.0, 88.97),
        "retrieval": (5e-3, 0.0, 312, 50000, 20, 128, 1.0, 95.07),
        "image": (3e-3, 0.0, 30000, 50000, 75, 64, 0.0, 89.33),
        "pathfinder": (2e-3, 0.0, 50000, 500000, 100, 128, 0.0, 93.95),
        "pathx": (7.5e-4, 0.0, 150000, 500000, 200, 256, 1.0, 98.12),
    }
    out = {}
    for model, table, precision in (("hgrn1", hgrn1, "fp32"), ("hgrn2", hgrn2, "bf16")):
        for task, (lr, wd, warm, total, ep, batch, clip, acc) in table.items():
            # the HGRN runs trained Image on RGB CIFAR with random crop (pad 4) and flip
            out[(task, model)] = Recipe(lr, wd, warm, total, ep, batch, clip, precision, acc, augment=task == "image")
    return out


RECIPES = _recipes()


def recipe(task: str, model: str) -> Recipe:
    if task not in TASKS:
        raise ValueError(f"unknown TASK {task!r}: use one of {', '.join(TASKS)}")
    if model not in MODELS:
        raise ValueError(f"unknown MODEL {model!r}: use hgrn1 or hgrn2")
    return RECIPES[(task, model)]


def schedule_kind(r: Recipe, max_update: Optional[int], truncate: bool = False) -> str:
    """"full" (the paper's run), "compressed" (a shortened run, warm-up and cosine scaled to it) or "truncated"
    (a shortened run on the paper's own schedule)."""
    if max_update is None or max_update >= r.total:
        return "full"
    return "truncated" if truncate else "compressed"


def schedule(r: Recipe, max_update: Optional[int], truncate: bool = False) -> Tuple[int, int, Optional[int]]:
    """(warm-up, max updates, epoch cap) of a run with ``max_update`` (None: the paper's); ``truncate``: a
    shortened run keeps the paper's warm-up (and its cosine period, ``lr_period``)."""
    if max_update is not None and max_update < 1:
        raise ValueError(f"--max-update {max_update} must be >= 1")
    kind = schedule_kind(r, max_update, truncate)
    if kind == "full":
        return r.warmup, r.total, r.epochs
    if kind == "truncated":
        return r.warmup, max_update, None
    return max(1, round(r.warmup * max_update / r.total)), max_update, None


def lr_period(r: Recipe, max_update: Optional[int], truncate: bool = False) -> Optional[int]:
    """The cosine's length for fairseq's ``--lr-period-updates`` (None: fairseq's default, max updates minus
    warm-up): the paper's ``total - warmup`` for a truncated run, so the rate at update t is the paper's."""
    return r.total - r.warmup if schedule_kind(r, max_update, truncate) == "truncated" else None


def fairseq_args(task: str, model: str, nproc: int = 1, max_update: Optional[int] = None,
                 batch_per_gpu: Optional[int] = None, eos: bool = True, truncate: bool = False) -> List[str]:
    """fairseq-train flags of the recipe (everything except data, save and log locations); ``eos=False``:
    no ``--append-eos`` on a token task (an ablation); ``truncate``: a
    shortened run (``max_update`` under the total) keeps the paper's schedule and stops at ``max_update``."""
    r = recipe(task, model)
    if nproc < 1:
        raise ValueError(f"nproc={nproc} must be >= 1")
    if r.batch % nproc:
        raise ValueError(f"the {task}/{model} batch of {r.batch} cannot be split evenly over {nproc} processes: "
                         f"use a GPU count that divides {r.batch}")
    per_proc = r.batch // nproc
    per_step = batch_per_gpu or per_proc
    if per_proc % per_step:
        raise ValueError(f"BATCH_PER_GPU={per_step} does not divide the {per_proc} sequences each of the {nproc} "
                         f"process(es) handles per update")
    warmup, updates, epochs = schedule(r, max_update, truncate)
    args = [
        "--task", "lra_image" if task in PIXEL_TASKS else "lra_text",
        "--arch", f"{model}_lra_{task}",
        "--criterion", "classification_accuracy",
        "--optimizer", OPTIMIZER, "--adam-betas", "(0.9, 0.999)", "--adam-eps", "1e-08",
        "--weight-decay", repr(r.weight_decay),
        "--lr", repr(r.lr), "--lr-scheduler", LR_SCHEDULER, "--warmup-updates", str(warmup),
        "--warmup-init-lr", "0", "--min-lr", "0",
        "--max-update", str(updates),
        "--clip-norm", repr(r.clip),
        "--batch-size", str(per_step), "--update-freq", str(per_proc // per_step),
        "--batch-size-valid", str(per_step), "--required-batch-size-multiple", "1",
        "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
        "--seed", str(SEED),
    ]
    period = lr_period(r, max_update, truncate)
    if period is not None:
        args += ["--lr-period-updates", str(period)]
    if task not in PIXEL_TASKS and eos:
        args += ["--append-eos"]
    if epochs is not None:
        args += ["--max-epoch", str(epochs)]
    if r.augment:
        args += ["--augment"]
    if r.precision == "bf16":
        args += ["--bf16"]
    return args


def write_configs(directory: str) -> List[str]:
    """One hydra config per (task, model): the recipe on one GPU, model section written out in full
    (fairseq-hydra-train does not run the arch functions)."""
    from hgrn_fairseq.models.hgrn_lra import HgrnLraConfig, arch_settings

    os.makedirs(directory, exist_ok=True)
    written = []
    defaults = {k: v for k, v in HgrnLraConfig().__dict__.items() if not k.startswith("_")}
    for task in TASKS:
        for model in MODELS:
            r = recipe(task, model)
            name = f"{task}_{model}"
            run = f"checkpoints/lra/{name}"
            model_cfg = dict(defaults, **arch_settings(model, task))
            lines = [
                f"# LRA {task}, {model.upper()}: the run of `bash scripts/train_lra.sh {task} {model}` on one GPU.",
                "#",
                f"#   fairseq-hydra-train --config-dir configs/lra --config-name {name}",
                "#",
                "# Run from the repository root, or override the paths (task.data=..., common.user_dir=...).",
                f"# Batch {r.batch} per update; on N GPUs add distributed_training.distributed_world_size=N and",
                f"# dataset.batch_size={r.batch}/N. Written by scripts/lra_recipes.py write-configs (tested to match).",
                "hydra:",
                "  run:",
                f"    dir: {run}/logs",
                "  job:",
                "    chdir: false",
                "  output_subdir: null",
                "",
                "common:",
                "  user_dir: hgrn_fairseq",
                f"  seed: {SEED}",
                f"  bf16: {'true' if r.precision == 'bf16' else 'false'}",
                "  log_format: simple",
                "  log_interval: 100",
                f"  tensorboard_logdir: {run}/logs/tensorboard",
                "",
                "checkpoint:",
                f"  save_dir: {run}",
                "  no_epoch_checkpoints: true",
                "  best_checkpoint_metric: accuracy",
                "  maximize_best_checkpoint_metric: true",
                "",
                "task:",
                f"  _name: {'lra_image' if task in PIXEL_TASKS else 'lra_text'}",
                f"  data: data-bin/lra/{task}",
            ]
            if task in PIXEL_TASKS:
                lines.append(f"  augment: {'true' if r.augment else 'false'}")
            else:
                lines.append("  append_eos: true")
            lines += [
                "",
                "dataset:",
                f"  batch_size: {r.batch}",
                f"  batch_size_valid: {r.batch}",
                "  required_batch_size_multiple: 1",
                "",
                "distributed_training:",
                "  distributed_world_size: 1",
                "",
                "criterion:",
                "  _name: classification_accuracy",
                "",
                "optimizer:",
                f"  _name: {OPTIMIZER}",
                "  adam_betas: (0.9, 0.999)",
                "  adam_eps: 1.0e-08",
                f"  weight_decay: {r.weight_decay!r}",
                "",
                "lr_scheduler:",
                f"  _name: {LR_SCHEDULER}",
                f"  warmup_updates: {r.warmup}",
                "  warmup_init_lr: 0.0",
                "  min_lr: 0.0",
                "",
                "optimization:",
                f"  lr: [{r.lr!r}]",
                f"  max_update: {r.total}",
                f"  max_epoch: {r.epochs}",
                f"  clip_norm: {r.clip!r}",
                "",
                "model:",
                "  _name: hgrn_lra",
            ]
            for key, value in model_cfg.items():
                if isinstance(value, bool):
                    value = "true" if value else "false"
                lines.append(f"  {key}: {value}")
            path = os.path.join(directory, f"{name}.yaml")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            written.append(path)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("args", help="print the fairseq-train flags of a recipe, shell-quoted")
    a.add_argument("task")
    a.add_argument("model")
    a.add_argument("--nproc", type=int, default=1)
    a.add_argument("--max-update", type=int, default=None)
    a.add_argument("--batch-per-gpu", type=int, default=None)
    a.add_argument("--no-eos", action="store_true", help="token tasks: no <eos> after each sequence (an ablation)")
    a.add_argument("--truncate", action="store_true", help="with --max-update under the recipe's total: keep the "
                   "paper's warm-up and cosine and stop at --max-update (default: compress them to it)")
    s = sub.add_parser("show", help="the recipe as JSON")
    s.add_argument("task")
    s.add_argument("model")
    w = sub.add_parser("write-configs", help="write configs/lra/TASK_MODEL.yaml")
    w.add_argument("--dir", default=os.path.join(REPO, "configs", "lra"))
    args = p.parse_args(argv)
    try:
        if args.cmd == "args":
            print(" ".join(shlex.quote(x) for x in fairseq_args(args.task, args.model, args.nproc, args.max_update,
                                                                 args.batch_per_gpu, eos=not args.no_eos,
                                                                 truncate=args.truncate)))
        elif args.cmd == "show":
            print(json.dumps(asdict(recipe(args.task, args.model))))
        else:
            for path in write_configs(args.dir):
                print(path)
    except ValueError as e:
        print(f"lra_recipes.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
