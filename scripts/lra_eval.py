#!/usr/bin/env python3
"""Test accuracy of an LRA checkpoint, printed and written as JSON.

    python scripts/lra_eval.py CHECKPOINT [--data DATA_DIR] [--split test] [--json OUT.json]
                               [--batch-size 64] [--cpu] [--pad-to-length N] [--trust-checkpoint]

Loads the checkpoint with fairseq (model, task and their options from the checkpoint; ``--data``
replaces the data directory it was trained on; ``--pad-to-length N`` pads every batch to N positions
whatever the run trained with: an unmasked-padding model scored that way no longer depends on how the
split is batched), scores every example of the split once, and
refuses to report when the number scored differs from the split's size. Precision: bf16 when the
run trained with --bf16 (as its validation did), else fp32. The JSON holds the accuracy, counts, the
updates the run made (checkpoint_last.pt beside it), the best checkpoint's update and validation
accuracy, the paper's number for the arch
(scripts/lra_recipes.py), whether the data are comparable with LRA's (meta.json), device, versions
and date.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_commit() -> str:
    if os.environ.get("HGRN_GIT_COMMIT"):  # the commit a copied tree (GPU machine) came from
        return os.environ["HGRN_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception:
        return ""


LRA_TASKS = ("lra_text", "lra_image")


def check_lra_checkpoint(checkpoint: str) -> dict:
    """The state of ``checkpoint``, refused (CheckpointError, one line naming the file) when it is damaged,
    not a fairseq checkpoint, or a fairseq checkpoint of another task (a language model's)."""
    from hgrn_fairseq.checkpoint_io import CheckpointError, checkpoint_task, read_fairseq_checkpoint

    state = read_fairseq_checkpoint(checkpoint)
    task = checkpoint_task(state)
    if task not in LRA_TASKS:
        raise CheckpointError(
            f"checkpoint {checkpoint} is not an LRA checkpoint (trained with task {task!r}, not "
            f"{' / '.join(LRA_TASKS)}): pass a checkpoint that scripts/train_lra.sh wrote")
    return state


def load(checkpoint: str, data: str | None = None, cpu: bool = False, pad_to_length: int | None = None,
         kernel_backend: str | None = None):
    """The checkpoint's model in eval mode, in its training precision, on the GPU unless ``cpu``; its
    config and task (on ``data`` when given, else the data it trained on; batches padded to
    ``pad_to_length`` when given, else as the run padded them; the model's ``kernel_backend`` when
    given, e.g. "reference" for the PyTorch path on a GPU). -> (model, cfg, task, use_cuda, bf16)"""
    import torch
    from fairseq import checkpoint_utils

    import hgrn_fairseq

    hgrn_fairseq.register()  # the plugin, and fairseq's checkpoint loading through checkpoint_io

    if not os.path.isfile(checkpoint):
        raise FileNotFoundError(f"checkpoint {checkpoint} not found: train first (bash scripts/train_lra.sh TASK MODEL)")
    check_lra_checkpoint(checkpoint)
    overrides = {"data": data} if data else {}
    if pad_to_length is not None:  # (nested: older checkpoints' task configs have no such key to overwrite)
        overrides = {"task": dict(overrides, pad_to_length=int(pad_to_length))}
    if kernel_backend is not None:
        overrides = dict(overrides, model={"kernel_backend": kernel_backend})
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
    model = models[0]
    use_cuda = torch.cuda.is_available() and not cpu
    bf16 = bool(cfg.common.bf16)
    model = model.bfloat16() if bf16 else model.float()
    if use_cuda:
        model = model.cuda()
    model.eval()
    return model, cfg, task, use_cuda, bf16


def run_schedule(cfg, r) -> str:
    """How the run's schedule relates to its recipe ``r``: "full", "compressed" (a shortened run, warm-up and
    cosine scaled to it: train_lra.sh's MAX_UPDATE) or "truncated" (a shortened run on the paper's schedule:
    SCHEDULE=truncate, told by its --lr-period-updates)."""
    from hgrn_fairseq.recipes.lra import schedule_kind

    period = float(cfg.lr_scheduler.get("lr_period_updates", -1) or -1)
    return schedule_kind(r, int(cfg.optimization.max_update), truncate=period > 0)


def recipe_overrides(cfg, r) -> dict:
    """The training settings of a run that differ from its recipe ``r`` (scripts/lra_recipes.py) at the run's
    own --max-update (a shortened run's warm-up is scaled, as train_lra.sh's MAX_UPDATE does, or kept with
    the paper's cosine period, SCHEDULE=truncate): {name: value}, empty for a run of the recipe. Optimizer,
    schedule, learning rate, weight decay, warm-up, cosine period, clipping, total batch (per step x
    accumulation x processes) and precision; the epoch cap and the update count are recorded apart
    (planned_updates)."""
    from hgrn_fairseq.recipes.lra import LR_SCHEDULER, OPTIMIZER, lr_period, schedule

    from hgrn_fairseq.models.hgrn_lra import same_option

    max_update, truncated = int(cfg.optimization.max_update), run_schedule(cfg, r) == "truncated"
    warmup, _, _ = schedule(r, max_update, truncated)
    want = {"optimizer": OPTIMIZER, "lr_scheduler": LR_SCHEDULER, "lr": r.lr, "weight_decay": r.weight_decay,
            "warmup_updates": warmup, "lr_period_updates": float(lr_period(r, max_update, truncated) or -1),
            "clip_norm": r.clip, "batch": r.batch, "precision": r.precision}
    got = {"optimizer": cfg.optimizer._name, "lr_scheduler": cfg.lr_scheduler._name,
           "lr": float(cfg.optimization.lr[0]), "weight_decay": float(cfg.optimizer.get("weight_decay", 0.0)),
           "warmup_updates": int(cfg.lr_scheduler.get("warmup_updates", 0)),
           "lr_period_updates": float(cfg.lr_scheduler.get("lr_period_updates", -1) or -1),
           "clip_norm": float(cfg.optimization.clip_norm),
           "batch": int(cfg.dataset.batch_size) * int(cfg.optimization.update_freq[0])
           * int(cfg.distributed_training.distributed_world_size),
           "precision": "bf16" if cfg.common.bf16 else "fp32"}
    return {k: got[k] for k in want if not same_option(got[k], want[k])}


def prepare_sample(sample, use_cuda: bool, bf16: bool):
    """A batch on the model's device and in its precision (floating inputs in bf16 for a bf16 run)."""
    import torch
    from fairseq import utils

    if use_cuda:
        sample = utils.move_to_cuda(sample)
    if bf16:
        sample = utils.apply_to_sample(lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t, sample)
    return sample


def score(model, task, split: str, batch_size: int, use_cuda: bool, bf16: bool, logits_out: dict | None = None):
    """Every example of ``split`` once through ``model`` as it is (eval mode): -> (correct, ids seen). An error
    when the number scored differs from the split's size (meta.json). ``logits_out``: a dict that gets each
    example's logits (float32, on the CPU) under its id."""
    import torch

    task.load_dataset(split)
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset, max_sentences=batch_size, required_batch_size_multiple=1,
                                  seed=1, num_workers=0).next_epoch_itr(shuffle=False)
    seen = set()
    correct = 0
    with torch.no_grad():
        for sample in itr:
            if not sample:
                continue
            sample = prepare_sample(sample, use_cuda, bf16)
            logits = model(**sample["net_input"])
            correct += int(logits.argmax(-1).eq(sample["target"]).sum())
            seen.update(sample["id"].tolist())
            if logits_out is not None:
                logits_out.update(zip(sample["id"].tolist(), logits.float().cpu().unbind(0)))
    n = len(dataset)
    expected = task.meta["splits"][split]
    if len(seen) != n or n != expected:
        raise RuntimeError(f"scored {len(seen)} examples of {split} but it has {expected} (dataset {n}): "
                           f"the test accuracy would not cover the split; check the data directory")
    return correct, seen


def evaluate(checkpoint: str, data: str | None = None, split: str = "test", batch_size: int = 64,
             cpu: bool = False, pad_to_length: int | None = None) -> dict:
    import torch
    from fairseq import checkpoint_utils

    model, cfg, task, use_cuda, bf16 = load(checkpoint, data, cpu, pad_to_length)
    correct, seen = score(model, task, split, batch_size, use_cuda, bf16)
    state = check_lra_checkpoint(checkpoint)
    extra = state.get("extra_state", {}) or {}
    last = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "checkpoint_last.pt")
    last_state = check_lra_checkpoint(last) if os.path.isfile(last) else state

    def updates(s):
        return int((s.get("optimizer_history") or [{}])[-1].get("num_updates", 0))

    arch = cfg.model._name
    meta = task.meta
    model_name, _, task_name = arch.partition("_lra_")
    paper = recipe_norm = run_recipe = None
    try:
        from hgrn_fairseq.recipes.lra import recipe

        run_recipe = recipe(task_name, model_name)
        paper = run_recipe.paper_accuracy
    except Exception:  # not a recipe's arch (transformer_lra)
        pass
    try:  # the norm the arch {model}_lra_{task} sets
        from hgrn_fairseq.models.hgrn_lra import arch_settings

        recipe_norm = arch_settings(model_name, task_name)["norm"]
    except (KeyError, ValueError):
        pass
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from hgrn_fairseq.models.hgrn_lra import arch_overrides

    overrides = arch_overrides(cfg.model, arch) if arch in ARCH_CONFIG_REGISTRY else None
    training_changes = recipe_overrides(cfg, run_recipe) if run_recipe is not None else None
    result = {
        "task": meta["task"],
        "arch": arch,
        "split": split,
        "examples": len(seen),
        "correct": correct,
        "accuracy": round(100.0 * correct / max(len(seen), 1), 3),
        "paper_accuracy": paper,
        "data": os.path.abspath(cfg.task.data),
        "data_comparable": bool(meta.get("comparable", True)),
        "data_source": meta.get("source"),
        "contour_length": meta.get("contour_length"),  # Pathfinder / Path-X: LRA's is 14 (prepare_lra.py)
        "checkpoint": os.path.abspath(checkpoint),
        "num_updates": updates(last_state),  # updates the run made (checkpoint_last.pt)
        "best_checkpoint_updates": updates(state),
        "planned_updates": int(cfg.optimization.max_update),
        # full / compressed (warm-up and cosine scaled to planned_updates) / truncated (the paper's schedule, cut)
        "schedule": run_schedule(cfg, run_recipe) if run_recipe is not None else None,
        "seed": int(cfg.common.seed),
        "unmasked_padding": bool(getattr(cfg.model, "unmasked_padding", False)),  # the ablation, not the recipe
        "append_eos": bool(getattr(cfg.task, "append_eos", False)),  # the recipe's on token tasks
        "scratch_positions": int(getattr(cfg.task, "scratch_positions", 0) or 0),  # an experiment, not the recipe
        "pad_to_length": int(getattr(cfg.task, "pad_to_length", 0) or 0),  # 0: each batch to its longest
        "scan_padding": bool(getattr(cfg.model, "scan_padding", False)),  # an experiment, not the recipe
        "norm": getattr(cfg.model, "norm", None),  # another than the arch's (--norm): an experiment
        "recipe_norm": recipe_norm,
        "arch_overrides": overrides,  # other model options than the arch's (--encoder-layers 4, ...): an experiment
        "recipe_overrides": training_changes,  # other training settings than the recipe's (--lr, batch, ...)
        "epoch": int(extra.get("train_iterator", {}).get("epoch", 0)),
        "best_valid_accuracy": extra.get("best"),
        "precision": "bf16" if bf16 else "fp32",
        "device": torch.cuda.get_device_name() if use_cuda else "cpu",
        "torch": torch.__version__,
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return result


def main(argv=None) -> int:
    from hgrn_fairseq.checkpoint_io import TRUST_FLAG, TRUST_HELP, trusted_checkpoints

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", default=None, help="data directory (default: the one the checkpoint trained on)")
    p.add_argument("--split", default="test")
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--pad-to-length", type=int, default=None,
                   help="pad every batch to N positions (default: as the run did; 0 each batch to its longest)")
    p.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args = p.parse_args(argv)
    try:
        with trusted_checkpoints(args.trust_checkpoint):
            result = evaluate(args.checkpoint, args.data, args.split, args.batch_size, args.cpu, args.pad_to_length)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"lra_eval.py: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    paper = f" (paper: {result['paper_accuracy']})" if result["paper_accuracy"] is not None else ""
    print(f"lra_eval: {result['task']} {result['arch']}: {result['split']} accuracy {result['accuracy']:.2f}% "
          f"({result['correct']}/{result['examples']}){paper}, best valid {result['best_valid_accuracy']}, "
          f"checkpoint of update {result['best_checkpoint_updates']}, {result['num_updates']} updates run "
          f"(planned {result['planned_updates']})")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
