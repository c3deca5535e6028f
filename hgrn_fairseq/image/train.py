"""DeiT-style ImageNet training and evaluation of timm models (the HGRN ones included).

    python -m hgrn_fairseq.image.train [--config-name hgrn1] [--config-dir DIR] [--dry-run] KEY=VALUE ...
    torchrun --nproc_per_node 8 -m hgrn_fairseq.image.train --config-name hgrn1 data.path=/data/imagenet

The recipe is a hydra config (``configs/image/``: ``deit``, ``hgrn1``, ``hgrn2_tiny``, ``hgrn2_small``);
any key is overridden as ``section.key=value``. Everything that exists in timm comes from timm:
transforms (RandomResizedCrop, RandAugment, colour jitter, random erasing; the evaluation's resize
and centre crop), Mixup/CutMix, the losses, RepeatAugSampler, the optimiser, the cosine schedule,
ModelEmaV3 and the accuracy. This file adds the loop: gradient accumulation, clipping, bf16
autocast, DDP, evaluation, logs, and checkpoints that a rerun resumes from.

Rerunning the same command resumes from ``OUTPUT_DIR/checkpoint_last.pt`` (written at every epoch
end and every ``train.save_every_minutes`` inside an epoch, as a temporary file renamed into
place, so a kill never leaves a half-written checkpoint). A second run on an output folder in use
is refused.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from ..checkpoint_io import TRUST_FLAG, TRUST_HELP

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "image"
CHECKPOINT = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"


class UsageError(ValueError):
    """A problem with the command or the data: printed as one line, exit status 1."""


# ---------------------------------------------------------------------------------------------- config
def load_config(config_name: str, config_dir: Optional[str], overrides: Sequence[str]):
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    logging.getLogger("hydra").setLevel(logging.WARNING)  # fairseq's import may have set the root to DEBUG
    directory = Path(config_dir).resolve() if config_dir else CONFIG_DIR
    if not (directory / f"{config_name}.yaml").is_file():
        names = sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
        raise UsageError(f"no config {config_name!r} in {directory} (there: {names or 'none'}); "
                         "pass --config-name NAME and, outside the repository, --config-dir DIR")
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise UsageError(f"argument {bad[0]!r} is not KEY=VALUE (e.g. data.path=/data/imagenet optim.epochs=100)")
    from hydra.version import VersionBase

    # version_base is process-wide in hydra: left at 1.3, fairseq's own hydra.experimental.initialize
    # (convert_namespace_to_omegaconf) raises ImportError in this process afterwards; put it back
    previous = VersionBase.instance().getbase()
    try:
        with initialize_config_dir(config_dir=str(directory), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0]
        raise UsageError(f"bad override: {first} (--dry-run prints every key)") from None
    finally:
        VersionBase.instance().version_base = previous  # (setbase refuses the "unspecified" marker)
    return cfg


# ------------------------------------------------------------------------------------------ processes
class Runtime:
    """Rank, world size and device of this process (torchrun's environment, or a single process)."""

    def __init__(self, device: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            if not torch.cuda.is_available():
                raise UsageError("train.device=cuda but no CUDA device is visible: use train.device=cpu or auto")
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device(device)
        self.main = self.rank == 0

    def init_distributed(self) -> None:
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(minutes=30))

    def shutdown(self, ok: bool) -> None:
        """End the process group before the process exits: a process that exits with gloo's group still
        alive can abort in its threads' destructors ("terminate called without an active exception",
        SIGABRT after a successful run). The barrier, on success only, lets no process leave early."""
        if self.world > 1 and dist.is_initialized():
            if ok:
                dist.barrier()
            dist.destroy_process_group()

    def sum(self, values: List[float]) -> List[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()


def plan_batches(total: int, max_per_gpu: int, world: int) -> Tuple[int, int]:
    """(per-GPU batch, accumulation steps) with per_gpu * world * accumulation == total."""
    if total < 1 or max_per_gpu < 1:
        raise UsageError(f"optim.batch_size={total} and optim.max_batch_per_gpu={max_per_gpu} must be >= 1")
    if total % world:
        raise UsageError(f"optim.batch_size={total} is not divisible by the {world} processes: "
                         f"use a multiple of {world}")
    per_process = total // world
    accumulation = math.ceil(per_process / max_per_gpu)
    while per_process % accumulation:
        accumulation += 1
    return per_process // accumulation, accumulation


class RunLock:
    """An exclusive lock on the output folder for the life of the process (released by the kernel
    when the process ends, so a killed run leaves no stale lock)."""

    def __init__(self, directory: Path):
        from ..checkpoint_safety import LockHeld, hold_lock

        self.path = directory / "train.lock"
        try:
            self.file = hold_lock(str(self.path), f"pid {os.getpid()} on {os.uname().nodename} since "
                                                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        except LockHeld as e:
            raise UsageError(f"output folder {directory} is in use by another training run "
                             f"({e.holder or 'another process'}): wait for it to end, or pass a different "
                             "train.output_dir") from None

    def release(self) -> None:
        self.file.close()  # closing the descriptor drops the lock


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temporary file in the same folder, fsync, then rename over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ data
class SkipSampler(Sampler):
    """``base``'s indices for the epoch, without the first ``skip`` (to resume inside an epoch)."""

    def __init__(self, base: Sampler):
        self.base, self.skip = base, 0

    def set_epoch(self, epoch: int) -> None:
        self.base.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        it = iter(self.base)
        for _ in range(self.skip):
            next(it, None)
        return it

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)


class ShardSampler(Sampler):
    """Every ``world``-th index from ``rank``, no padding: each image is evaluated exactly once."""

    def __init__(self, n: int, rank: int, world: int):
        self.indices = list(range(rank, n, world))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def build_data(cfg, rt: Runtime, per_gpu: int, eval_batch: int):
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
    from timm.data.distributed_sampler import RepeatAugSampler

    from .data import DataError, ImageFolderDataset, find_unreadable, scan_image_folder

    try:
        train_split, val_split = scan_image_folder(str(cfg.data.path), cfg.data.train_split, cfg.data.val_split)
        if cfg.data.verify_images:
            bad = find_unreadable(train_split.samples + val_split.samples) if rt.main else []
            if bad:
                raise DataError(f"{len(bad)} unreadable images (first: {bad[0][0]}: {bad[0][1]}); list them with "
                                f"`python -m hgrn_fairseq.image.data {cfg.data.path} --decode` and replace or "
                                "delete them")
    except DataError as e:
        raise UsageError(str(e)) from None
    size = int(cfg.model.img_size)
    a = cfg.aug
    train_tf = create_transform(
        input_size=size, is_training=True, scale=tuple(a.scale), hflip=a.hflip, color_jitter=a.color_jitter,
        auto_augment=a.auto_augment or None, interpolation=a.interpolation, re_prob=a.reprob, re_mode=a.remode,
        re_count=a.recount, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    eval_tf = create_transform(
        input_size=size, is_training=False, interpolation=a.interpolation, crop_pct=a.eval_crop_pct,
        mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    train_set = ImageFolderDataset(train_split, train_tf, on_error="next")
    val_set = ImageFolderDataset(val_split, eval_tf, on_error="mark")
    if int(a.repeated_aug) > 1:
        # selected_round=256 is DeiT's rounding of the per-epoch sample count; tiny data sets skip it
        base = RepeatAugSampler(train_set, num_replicas=rt.world, rank=rt.rank, shuffle=True,
                                num_repeats=int(a.repeated_aug),
                                selected_round=256 if len(train_set) >= 256 * 16 else 0)
    else:
        base = DistributedSampler(train_set, num_replicas=rt.world, rank=rt.rank, shuffle=True,
                                  seed=int(cfg.train.seed), drop_last=True)
    sampler = SkipSampler(base)
    workers = int(cfg.data.workers)
    common = dict(num_workers=workers, pin_memory=rt.device.type == "cuda")
    # persistent training workers: the sampler runs in this process, so set_epoch / skip still apply
    train_loader = DataLoader(train_set, batch_size=per_gpu, sampler=sampler, drop_last=True,
                              persistent_workers=workers > 0, **common)
    val_loader = DataLoader(val_set, batch_size=eval_batch, sampler=ShardSampler(len(val_set), rt.rank, rt.world),
                            shuffle=False, drop_last=False, **common)
    return train_split, val_split, train_loader, val_loader, sampler


# ----------------------------------------------------------------------------------------------- model
def build_model(cfg, num_classes: int):
    import timm

    from . import models  # noqa: F401  (registers the HGRN models with timm)

    kwargs = dict(cfg.model.kwargs or {})
    common = dict(pretrained=False, num_classes=num_classes, drop_rate=float(cfg.model.drop),
                  drop_path_rate=float(cfg.model.drop_path), **kwargs)
    try:
        try:
            model = timm.create_model(cfg.model.name, img_size=int(cfg.model.img_size), **common)
        except TypeError as e:
            if "img_size" not in str(e):
                raise
            model = timm.create_model(cfg.model.name, **common)  # convolutional nets take any size as they are
    except RuntimeError as e:
        if "Unknown model" in str(e):
            raise UsageError(f"model.name={cfg.model.name!r} is not a timm model (HGRN ones: "
                             f"{', '.join(models.ARCHS)})") from None
        raise
    except (TypeError, ValueError) as e:  # a bad model.kwargs entry or value
        raise UsageError(f"model {cfg.model.name} with {kwargs or 'no model.kwargs'}: {e}") from None
    if hasattr(model, "patch_grid"):
        try:
            model.patch_grid(int(cfg.model.img_size), int(cfg.model.img_size))
        except ValueError as e:
            raise UsageError(f"model.img_size={cfg.model.img_size}: {e}") from None
    return model


def cuda_graph_setting(cfg, model, device: torch.device) -> str:
    """Apply ``train.cuda_graphs`` and say what it does (logged in the plan): the HGRN models record
    their training forward and backward, and their evaluation forward under no_grad, as CUDA graphs
    (``HgrnVit(cuda_graphs=...)``; eagerly a step at the recipe's per-GPU batch is bound by the host
    issuing over a thousand kernel launches); other timm models train eagerly."""
    if not cfg.train.get("cuda_graphs", False):
        return "off"
    if not hasattr(model, "cuda_graphs"):
        return f"off: {cfg.model.name} has no CUDA-graph option (the HGRN models have one)"
    if device.type != "cuda":
        return "off: not on CUDA"
    model.cuda_graphs = True
    return "on"


def build_criterion(cfg, num_classes: int):
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    a = cfg.aug
    mixup = None
    if a.mixup > 0 or a.cutmix > 0:
        mixup = Mixup(mixup_alpha=a.mixup, cutmix_alpha=a.cutmix, prob=a.mixup_prob,
                      switch_prob=a.mixup_switch_prob, mode=a.mixup_mode, label_smoothing=a.smoothing,
                      num_classes=num_classes)
        return mixup, SoftTargetCrossEntropy()
    if a.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=a.smoothing)
    return None, torch.nn.CrossEntropyLoss()


def autocast(cfg, device: torch.device):
    if cfg.train.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if cfg.train.precision == "fp32":
        return contextlib.nullcontext()
    raise UsageError(f"train.precision={cfg.train.precision!r} is not bf16 or fp32")


@torch.no_grad()
def evaluate(model, loader, cfg, rt: Runtime, show_progress: bool, desc: str = "eval") -> Dict[str, float]:
    """Top-1 / top-5 (percent) and cross-entropy over the split; unreadable images are left out and
    counted (``unreadable_images``)."""
    from timm.utils import accuracy
    from tqdm import tqdm

    was_training = model.training
    model.eval()
    correct1 = correct5 = loss_sum = n = unreadable = 0.0
    bar = tqdm(loader, desc=desc, disable=not show_progress, dynamic_ncols=True, leave=False,
               mininterval=1.0 if sys.stderr.isatty() else 30.0)
    for images, targets, failures in bar:
        unreadable += float(failures.sum())
        keep = targets >= 0
        if not bool(keep.any()):
            continue
        images, targets = images[keep].to(rt.device, non_blocking=True), targets[keep].to(rt.device)
        with autocast(cfg, rt.device):
            logits = model(images)
        logits = logits.float()
        k = min(5, logits.shape[-1])
        top1, top5 = accuracy(logits, targets, topk=(1, k))
        b = targets.shape[0]
        correct1 += float(top1) * b / 100.0
        correct5 += float(top5) * b / 100.0
        loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
        n += b
    correct1, correct5, loss_sum, n, unreadable = rt.sum([correct1, correct5, loss_sum, n, unreadable])
    model.train(was_training)
    if n == 0:
        raise UsageError("no readable validation image: check the val split with `python -m hgrn_fairseq.image.data`")
    return {"top1": 100.0 * correct1 / n, "top5": 100.0 * correct5 / n, "loss": loss_sum / n, "images": int(n),
            "unreadable_images": int(unreadable)}


# ------------------------------------------------------------------------------------------------- logs
class Log:
    """JSON lines on stdout and in OUTPUT_DIR/log.jsonl, scalars in OUTPUT_DIR/tensorboard (main process)."""

    def __init__(self, directory: Optional[Path], enabled: bool):
        self.enabled = enabled
        self.file = self.writer = None
        if enabled and directory is not None:
            self.file = open(directory / "log.jsonl", "a")
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(directory / "tensorboard"))

    def __call__(self, event: str, step: Optional[int] = None, **fields) -> None:
        if not self.enabled:
            return
        record = {"event": event, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **fields}
        line = json.dumps(record, default=float)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()
        if self.writer is not None and step is not None:
            for k, v in fields.items():
                if isinstance(v, (int, float)) and k not in ("epoch", "update"):
                    self.writer.add_scalar(f"{event}/{k}", v, step)
            self.writer.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.writer is not None:
            self.writer.close()
        self.file = self.writer = None


# --------------------------------------------------------------------------------------------- training
def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def run(cfg, dry_run: bool = False, trust_checkpoint: bool = False) -> int:
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg.data, "path"):
        raise UsageError("data.path is not set: pass data.path=/path/to/imagenet (a folder with train/ and val/)")
    OmegaConf.resolve(cfg)
    rt = Runtime(str(cfg.train.device))
    out = Path(str(cfg.train.output_dir))
    per_gpu, accumulation = plan_batches(int(cfg.optim.batch_size), int(cfg.optim.max_batch_per_gpu), rt.world)
    if cfg.aug.mixup > 0 or cfg.aug.cutmix > 0:
        if per_gpu % 2:
            raise UsageError(f"the per-GPU batch is {per_gpu}, odd: Mixup/CutMix pair samples within a batch, so "
                             "choose optim.batch_size / optim.max_batch_per_gpu to give an even one")
    lr = float(cfg.optim.base_lr) * int(cfg.optim.batch_size) / 512
    eval_batch = 2 * per_gpu
    show = rt.main and not cfg.train.no_progress

    train_split, val_split, train_loader, val_loader, sampler = build_data(cfg, rt, per_gpu, eval_batch)
    num_classes = len(train_split.classes)
    batches_per_epoch = len(sampler.base) // per_gpu
    updates_per_epoch = batches_per_epoch // accumulation
    if updates_per_epoch < 1 and not cfg.train.eval_only:
        raise UsageError(f"{len(train_split.samples)} training images give {batches_per_epoch} batches of {per_gpu} "
                         f"per process, fewer than one update of {accumulation} batches: lower optim.batch_size")
    torch.manual_seed(int(cfg.train.seed))  # the same initial weights on every process and every run
    model = build_model(cfg, num_classes)
    graphs = cuda_graph_setting(cfg, model, rt.device)
    checkpoint_path = Path(cfg.train.checkpoint) if cfg.train.checkpoint else out / CHECKPOINT
    plan = {
        "model": cfg.model.name, "parameters": count_parameters(model), "classes": num_classes,
        "img_size": int(cfg.model.img_size), "processes": rt.world, "device": str(rt.device),
        "batch_per_process": per_gpu, "accumulation": accumulation, "batch_size": int(cfg.optim.batch_size),
        "lr": lr, "updates_per_epoch": updates_per_epoch, "epochs": int(cfg.optim.epochs),
        "train": train_split.summary(), "val": val_split.summary(), "output_dir": str(out),
        "resume_from": str(checkpoint_path) if checkpoint_path.is_file() else None,
        # what the model's outputs mean: checked when a checkpoint is resumed or evaluated
        "classes_sha256": classes_fingerprint(train_split.classes),
        "cuda_graphs": graphs,
    }
    if dry_run:
        if rt.main:
            print(OmegaConf.to_yaml(cfg), end="")
            print("plan: " + json.dumps(plan, indent=1))
            print("dry run: nothing trained")
        return 0

    rt.init_distributed()
    ok = False
    try:
        if cfg.train.eval_only:
            code = run_eval_only(cfg, rt, model, val_loader, checkpoint_path, show, plan["classes_sha256"],
                                 trust_checkpoint)
        else:
            code = train_and_log(cfg, rt, model, train_loader, val_loader, sampler, plan, out, show,
                                 per_gpu, accumulation, lr, batches_per_epoch, updates_per_epoch, num_classes,
                                 trust_checkpoint)
        ok = True
        return code
    finally:
        rt.shutdown(ok)


def train_and_log(cfg, rt, model, train_loader, val_loader, sampler, plan, out, show, *args) -> int:
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out) if rt.main else None
    log = Log(out, rt.main)
    try:
        return train_loop(cfg, rt, model, train_loader, val_loader, sampler, plan, log, out, show, *args)
    finally:
        log.close()
        if lock is not None:
            lock.release()


def classes_fingerprint(names) -> str:
    import hashlib

    return hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()


def check_classes(state: dict, path: Path, classes_sha256: str) -> None:
    """A checkpoint's outputs are indexed by its training classes: refuse data with other class folders."""
    recorded = (state.get("plan") or {}).get("classes_sha256")
    if recorded is None:
        logging.getLogger(__name__).warning("%s records no class list (written before it did): cannot check it "
                                            "against the data's class folders", path)
    elif recorded != classes_sha256:
        raise UsageError(f"{path} was trained on other classes than this data's class folders (names or order "
                         "differ): evaluate or resume on the data set it was trained on")


def read_checkpoint(path: Path, trust: bool) -> dict:
    """``checkpoint_io.load_checkpoint`` of ``path``, its refusal (a damaged file, a type outside the allowlist)
    raised as ``UsageError``."""
    from ..checkpoint_io import CheckpointError, load_checkpoint

    try:
        state = load_checkpoint(path, trust=trust or None)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise UsageError(f"{path} is not a checkpoint of this trainer (no 'model' weights in it): pass train.checkpoint="
                         "PATH of a checkpoint it wrote")
    return state


def run_eval_only(cfg, rt, model, val_loader, checkpoint_path: Path, show: bool, classes_sha256: str,
                  trust_checkpoint: bool = False) -> int:
    if not checkpoint_path.is_file():
        raise UsageError(f"train.eval_only: no checkpoint at {checkpoint_path}; pass train.checkpoint=PATH")
    state = read_checkpoint(checkpoint_path, trust_checkpoint)
    check_classes(state, checkpoint_path, classes_sha256)
    model.to(rt.device)
    log = Log(None, rt.main)
    for key in ("model", "ema"):
        if state.get(key) is None:
            continue
        model.load_state_dict(state[key])
        log("eval", checkpoint=str(checkpoint_path), weights=key, epoch=state.get("epoch"),
            **evaluate(model, val_loader, cfg, rt, show))
    return 0


def train_loop(cfg, rt, model, train_loader, val_loader, sampler, plan, log, out, show, per_gpu, accumulation,
               lr, batches_per_epoch, updates_per_epoch, num_classes, trust_checkpoint: bool = False) -> int:
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from omegaconf import OmegaConf
    from timm.utils import ModelEmaV3
    from tqdm import tqdm

    model.to(rt.device)
    o = cfg.optim
    optimizer = create_optimizer_v2(model, opt=o.opt, lr=lr, weight_decay=o.weight_decay, eps=o.opt_eps,
                                    betas=tuple(o.betas))
    scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=int(o.epochs),
                                       warmup_epochs=int(o.warmup_epochs), warmup_lr=float(o.warmup_lr),
                                       min_lr=float(o.min_lr), step_on_epochs=False,
                                       updates_per_epoch=updates_per_epoch)
    ema = ModelEmaV3(model, decay=float(cfg.ema.decay), use_warmup=bool(cfg.ema.warmup)) if cfg.ema.decay > 0 else None
    mixup, criterion = build_criterion(cfg, num_classes)

    epoch, batch_in_epoch, num_updates, best_top1, unreadable_total = 0, 0, 0, -1.0, 0
    path = out / CHECKPOINT
    if path.is_file():
        state = read_checkpoint(path, trust_checkpoint)
        if state["config"]["model"]["name"] != cfg.model.name:
            raise UsageError(f"{path} holds a {state['config']['model']['name']} run, not {cfg.model.name}: "
                             "pass another train.output_dir")
        check_classes(state, path, plan["classes_sha256"])
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if ema is not None and state.get("ema") is not None:
                ema.module.load_state_dict(state["ema"])
        except (RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0]
            raise UsageError(f"{path} does not fit this model ({first}): the data set or model.kwargs changed; "
                             "pass another train.output_dir") from None
        epoch, batch_in_epoch, num_updates = state["epoch"], state["batch_in_epoch"], state["num_updates"]
        best_top1, unreadable_total = state["best_top1"], state["unreadable_images"]
        # the schedule is a function of the update count: recomputing it (instead of loading the
        # scheduler's saved fields) lets a rerun change optim.epochs, warm-up or lrs
        scheduler.step_update(num_updates)
        changed = sorted(k for k, v in flatten(OmegaConf.to_container(cfg, resolve=True)).items()
                         if flatten(state["config"]).get(k) != v)
        log("resume", checkpoint=str(path), epoch=epoch, batch_in_epoch=batch_in_epoch, update=num_updates,
            changed_settings=changed)
    max_updates = int(cfg.train.max_updates)
    if epoch >= int(o.epochs) or (max_updates and num_updates >= max_updates):
        log("done", message=f"{path} is already at the end of training (epoch {epoch}, update {num_updates}); "
            "evaluate it with train.eval_only=true", epoch=epoch, update=num_updates)
        return 0
    log("start", **plan)

    ddp = model
    if rt.world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
    params = [p for p in model.parameters() if p.requires_grad]

    def checkpoint(best: bool = False) -> None:
        if not rt.main:
            return
        state = {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "ema": ema.module.state_dict() if ema is not None else None, "epoch": epoch,
            "batch_in_epoch": batch_in_epoch, "num_updates": num_updates, "best_top1": best_top1,
            "unreadable_images": unreadable_total, "config": OmegaConf.to_container(cfg, resolve=True),
            "plan": plan,
        }
        save_atomic(state, out / (BEST if best else CHECKPOINT))

    last_save = time.monotonic()
    epoch_batches = updates_per_epoch * accumulation  # a last incomplete accumulation group is left out
    stop = False
    while epoch < int(o.epochs) and not stop:
        seed = int(cfg.train.seed) * 100003 + epoch * rt.world + rt.rank
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)  # timm's Mixup draws from numpy
        sampler.set_epoch(epoch)
        sampler.skip = batch_in_epoch * per_gpu
        ddp.train()
        bar = tqdm(total=epoch_batches, initial=batch_in_epoch, desc=f"epoch {epoch}", disable=not show,
                   dynamic_ncols=True, mininterval=1.0 if sys.stderr.isatty() else 30.0)
        meter_loss = meter_n = 0.0
        t0, images_seen, unreadable_here = time.monotonic(), 0, 0
        batches = iter(train_loader)
        while batch_in_epoch < epoch_batches:
            optimizer.zero_grad(set_to_none=True)
            for micro in range(accumulation):
                images, targets, failures = next(batches)
                unreadable_here += int(failures.sum())
                images = images.to(rt.device, non_blocking=True)
                targets = targets.to(rt.device, non_blocking=True)
                if mixup is not None:
                    images, targets = mixup(images, targets)
                sync = micro == accumulation - 1 or rt.world == 1
                with (contextlib.nullcontext() if sync else ddp.no_sync()):
                    with autocast(cfg, rt.device):
                        loss = criterion(ddp(images), targets)
                    (loss / accumulation).backward()
                loss_value = float(loss.detach())
                if not math.isfinite(loss_value):
                    raise UsageError(f"training loss is {loss_value} at update {num_updates} (epoch {epoch}): lower "
                                     "optim.base_lr or raise optim.warmup_epochs, and rerun to resume from the "
                                     "last checkpoint")
                meter_loss += loss_value * images.shape[0]
                meter_n += images.shape[0]
                images_seen += images.shape[0]
                batch_in_epoch += 1
                bar.update(1)
            grad_norm = None
            if o.clip_grad and o.clip_grad > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, float(o.clip_grad)))
            optimizer.step()
            num_updates += 1
            scheduler.step_update(num_updates)
            if ema is not None:
                ema.update(model, step=num_updates)
            end_of_epoch = batch_in_epoch >= epoch_batches
            stop = bool(max_updates) and num_updates >= max_updates
            if num_updates % int(cfg.train.log_every) == 0 or end_of_epoch or stop:
                # one collective for the log line, the unreadable count and the main process's save decision
                want_save = float(rt.main and time.monotonic() - last_save > 60 * float(cfg.train.save_every_minutes))
                loss_sum, n_sum, unreadable, save_now = rt.sum([meter_loss, meter_n, unreadable_here, want_save])
                unreadable_total += int(unreadable)
                meter_loss = meter_n = 0.0
                unreadable_here = 0
                elapsed = max(time.monotonic() - t0, 1e-9)
                fields = dict(epoch=epoch, update=num_updates, loss=loss_sum / max(n_sum, 1),
                              lr=optimizer.param_groups[0]["lr"], images_per_s=images_seen * rt.world / elapsed,
                              unreadable_images=unreadable_total)
                if grad_norm is not None:
                    fields["grad_norm"] = grad_norm
                log("train", step=num_updates, **fields)
                if unreadable:
                    log("data", unreadable_images=int(unreadable), message="unreadable training images were "
                        "replaced by the next ones (the warnings name them); list all with `python -m "
                        "hgrn_fairseq.image.data DATA --decode`")
                bar.set_postfix(loss=f"{fields['loss']:.3f}", lr=f"{fields['lr']:.2e}")
                if save_now and not end_of_epoch and not stop:
                    checkpoint()
                    last_save = time.monotonic()
            if stop:
                break
        bar.close()
        finished_epoch = batch_in_epoch >= epoch_batches
        if finished_epoch:
            epoch, batch_in_epoch = epoch + 1, 0
        if epoch >= int(o.epochs) or stop or (finished_epoch and epoch % int(cfg.train.eval_every) == 0):
            metrics = evaluate(model, val_loader, cfg, rt, show)
            fields = dict(epoch=epoch, update=num_updates, **metrics)
            if ema is not None:
                ema_metrics = evaluate(ema.module, val_loader, cfg, rt, show, "eval ema")
                fields.update({f"ema_{k}": v for k, v in ema_metrics.items() if k in ("top1", "top5", "loss")})
            improved = metrics["top1"] > best_top1
            best_top1 = max(best_top1, metrics["top1"])
            log("eval", step=num_updates, best_top1=best_top1, **fields)
            if improved:
                checkpoint(best=True)
        checkpoint()
        last_save = time.monotonic()
    log("done", epoch=epoch, update=num_updates, best_top1=best_top1, unreadable_images=unreadable_total)
    return 0


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``."""
    out: Dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hgrn_fairseq.image.train",
        description="DeiT-style training of timm image models (HGRN1/HGRN2 included); rerun to resume.",
        epilog="example: python -m hgrn_fairseq.image.train --config-name hgrn1 data.path=/data/imagenet "
               "optim.epochs=300 train.output_dir=runs/hgrn1_tiny")
    p.add_argument("--config-name", default="hgrn1", help="recipe in the config folder (deit, hgrn1, hgrn2_tiny, "
                   "hgrn2_small)")
    p.add_argument("--config-dir", default=None, help=f"folder of the recipes (default {CONFIG_DIR})")
    p.add_argument("--dry-run", action="store_true", help="check the data and the plan, print them, train nothing")
    p.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    p.add_argument("overrides", nargs="*", help="KEY=VALUE, e.g. model.name=hgrn1d_vit_small optim.epochs=100")
    args = p.parse_args(argv)
    # fairseq's import (through hgrn_fairseq) can leave the root logger at DEBUG: PIL and hydra flood it
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.INFO)
    try:
        cfg = load_config(args.config_name, args.config_dir, args.overrides)
        return run(cfg, dry_run=args.dry_run, trust_checkpoint=args.trust_checkpoint)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
