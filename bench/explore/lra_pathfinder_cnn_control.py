#!/usr/bin/env python3
"""Control for LRA Pathfinder: does a plain convolutional network learn the same prepared data?

Why: when a sequence model sits at chance on generated Pathfinder images (32x32 grayscale, label 1
when the two marker dots lie on one dashed path), a small CNN is the standard check that the data
themselves are learnable at this size. It reads the prepared ``hgrn-lra/1``
directory the lra_image task reads (see ``hgrn_fairseq/tasks/lra_format.py``) with the task's
normalisation, (x/255 - 0.5)/0.5, and nothing else.

How to run (G: generated images, B: prepared data)::

    python data_prep/lra_pathfinder.py --dest G --num 40000 --workers 16
    python data_prep/prepare_lra.py pathfinder --source G --dest B
    python -m bench.explore.lra_pathfinder_cnn_control B [B2 ...] --out cnn_control.json \
        [--epochs 30] [--batch 128] [--lr 1e-3] [--minutes 3] [--seed 0] [--width 32] [--device auto]

Each data directory is trained independently (fresh model, same seed and settings, its own
``--minutes`` budget); one line per epoch goes to stdout and all results go into one JSON list
(rewritten after every epoch, so a run killed by an outer time cap still leaves what it had;
an entry's ``status`` is "running" until it is "done").

Model: conv3x3-BN-ReLU blocks, widths w, w | maxpool | 2w, 2w | maxpool | 4w, 4w, then four
more 4w blocks at 8x8; global average pool; linear to the classes. Training: AdamW (weight decay
0.01 on conv/linear weights, none on BN and biases), linear warm-up over the first epoch then
cosine to 0 at ``--epochs``, cross entropy, bf16 autocast on CUDA, the whole data set held on the
device, a seeded shuffle per epoch, and random flips / transposes of the training images (together
these give all flips and 90-degree rotations; Pathfinder's label does not change under them) unless
``--no-augment``. The state of the best valid epoch is kept and scored on test at the end.

What a result means:
  * it learns (valid/test well above chance): the data are learnable at this size, so a sequence
    model at chance on them is an optimisation / budget / architecture question, not a data one;
  * it stays at chance too: the data size or the generator is the limit; fix the data first.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench import provenance
from hgrn_fairseq.tasks import lra_format as fmt

SPLITS = fmt.SPLITS
EXTRA_BLOCKS = 4  # 3x3 blocks at 8x8 after the last pool; see receptive_field()


# --------------------------------------------------------------------------------------------
# data

def check_dir(d: str) -> dict:
    """The task's own check (``lra_format.validate``: every file, shapes, labels) and an image task;
    returns meta.json. Raises ``LraDataError`` (one line: the file and the fix)."""
    meta = fmt.validate(d)
    if meta["input"] != "pixels":
        raise fmt.LraDataError(f"{fmt.meta_path(d)}: input is {meta['input']!r}, not 'pixels'; this control needs "
                               f"an image task such as pathfinder (data_prep/prepare_lra.py pathfinder ...)")
    return meta


def load_split(d: str, split: str, meta: dict):
    """uint8 [N, C, H, W] and int64 [N] as numpy arrays (``lra_format.load_split``, channels first)."""
    data = fmt.load_split(d, split, meta)
    return np.ascontiguousarray(np.asarray(data.pixels).transpose(0, 3, 1, 2)), data.labels


def normalise(x_u8: torch.Tensor) -> torch.Tensor:
    """The lra_image task's normalisation: mean 0.5, std 0.5 on [0, 1] pixels."""
    return (x_u8.float() / 255.0 - 0.5) / 0.5


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Per image, a random element of the square's symmetry group (horizontal flip, vertical flip,
    transpose: their 8 combinations are all flips and 90-degree rotations). x: [B, C, H, H]."""
    m = torch.rand(3, x.shape[0], generator=gen).lt(0.5).to(x.device, non_blocking=True).view(3, -1, 1, 1, 1)
    x = torch.where(m[0], x.flip(-1), x)
    x = torch.where(m[1], x.flip(-2), x)
    if x.shape[-1] == x.shape[-2]:
        x = torch.where(m[2], x.transpose(-1, -2), x)
    return x


# --------------------------------------------------------------------------------------------
# model

def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class PathfinderCNN(nn.Module):
    """Receptive field of one output unit before the global pool (3x3 convs, 2x2 pools):
    32x32: 3, 5 | pool 6 | 16x16: 10, 14 | pool 16 | 8x8: 24, 32, then 40, 48, 56, 64 for the four
    extra blocks. 64 px >= 2*32 - 1, so EVERY 8x8 position (even a corner one) sees the whole 32x32
    image: connectivity between dots anywhere in the image can be resolved before pooling."""

    def __init__(self, width: int = 32, in_ch: int = 1, num_classes: int = 2, extra_blocks: int = EXTRA_BLOCKS):
        super().__init__()
        w = width
        layers = [block(in_ch, w), block(w, w), nn.MaxPool2d(2),
                  block(w, 2 * w), block(2 * w, 2 * w), nn.MaxPool2d(2),
                  block(2 * w, 4 * w), block(4 * w, 4 * w)]
        layers += [block(4 * w, 4 * w) for _ in range(extra_blocks)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(4 * w, num_classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def receptive_field(model: nn.Module) -> int:
    """Receptive field in input pixels of one unit of the last feature map (computed, not assumed)."""
    rf, jump = 1, 1
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            rf += (m.kernel_size[0] - 1) * jump
            jump *= m.stride[0]
        elif isinstance(m, nn.MaxPool2d):
            rf += (m.kernel_size - 1) * jump
            jump *= m.stride
    return rf


# --------------------------------------------------------------------------------------------
# training

@torch.no_grad()
def accuracy(model, x_u8, y, device, amp, batch=1024) -> float:
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for i in range(0, len(x_u8), batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(normalise(x_u8[i:i + batch]))
        correct += (logits.argmax(1) == y[i:i + batch]).sum()
    return correct.item() / len(x_u8) * 100


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))


def write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def train_dir(d: str, meta: dict, args, device: torch.device, entry: dict, save) -> None:
    tag = os.path.basename(os.path.normpath(d)) or d
    num_classes = int(meta.get("num_classes", 2))
    arrays = {s: load_split(d, s, meta) for s in SPLITS}
    X = {s: torch.from_numpy(arrays[s][0]).to(device) for s in SPLITS}
    Y = {s: torch.from_numpy(arrays[s][1]).to(device) for s in SPLITS}
    n_train = len(X["train"])

    torch.manual_seed(args.seed)
    model = PathfinderCNN(args.width, in_ch=X["train"].shape[1], num_classes=num_classes).to(device)
    params = sum(p.numel() for p in model.parameters())
    rf = receptive_field(model)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr)
    # batches per epoch; a last batch of one image is dropped (BatchNorm cannot train on it)
    steps = n_train // args.batch + (1 if n_train % args.batch > 1 else 0)
    steps = max(steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, steps * args.epochs))
    amp = device.type == "cuda"
    shuffle_gen = torch.Generator().manual_seed(args.seed)
    aug_gen = torch.Generator().manual_seed(args.seed + 1)

    counts = np.bincount(arrays["test"][1], minlength=num_classes)
    entry.update({
        "data_dir": os.path.abspath(d), "splits": meta.get("splits"),
        "inputs_fingerprint": meta.get("inputs_fingerprint"), "image_shape": meta.get("image_shape"),
        "comparable": meta.get("comparable"), "params": params, "receptive_field_px": rf,
        "test_majority_acc": round(float(counts.max() / counts.sum() * 100), 3),
        "epochs": [], "best_valid": None, "best_epoch": None, "test_acc_of_best": None,
        "epochs_run": 0, "stopped_by_time": False, "status": "running",
    })
    print(f"[{tag}] {d}: train {n_train}, valid {len(X['valid'])}, test {len(X['test'])} images "
          f"{tuple(X['train'].shape[1:])}; CNN width {args.width}: {params:,} parameters, receptive field "
          f"{rf} px; {steps} steps/epoch", flush=True)

    best_state, best_valid, best_epoch = None, -1.0, None
    t0 = time.time()
    for epoch in range(1, args.epochs + 1):
        te = time.time()
        model.train()
        perm = torch.randperm(n_train, generator=shuffle_gen).to(device)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        seen = 0
        for i in range(steps):
            idx = perm[i * args.batch:(i + 1) * args.batch]
            xb, yb = X["train"][idx], Y["train"][idx]
            if args.augment:
                xb = augment(xb, aug_gen)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = model(normalise(xb))
                loss = F.cross_entropy(logits.float(), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.detach() * len(idx)
            correct += (logits.argmax(1) == yb).sum()
            seen += len(idx)
        train_loss = loss_sum.item() / seen
        train_acc = correct.item() / seen * 100
        valid_acc = accuracy(model, X["valid"], Y["valid"], device, amp)
        if valid_acc > best_valid:
            best_valid, best_epoch = valid_acc, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        secs = time.time() - te
        entry["epochs"].append({"epoch": epoch, "train_loss": round(train_loss, 5), "train_acc": round(train_acc, 3),
                                "valid_acc": round(valid_acc, 3), "seconds": round(secs, 2)})
        entry.update(best_valid=round(best_valid, 3), best_epoch=best_epoch, epochs_run=epoch)
        print(f"[{tag}] epoch {epoch}/{args.epochs}: loss {train_loss:.4f} train {train_acc:.1f}% valid "
              f"{valid_acc:.1f}% (best {best_valid:.1f}% @{best_epoch}) {secs:.1f} s", flush=True)
        save()
        if args.minutes > 0 and time.time() - t0 > args.minutes * 60 and epoch < args.epochs:
            entry["stopped_by_time"] = True
            print(f"[{tag}] stopped by time: {time.time() - t0:.0f} s > --minutes {args.minutes} after "
                  f"{epoch} of {args.epochs} epochs", flush=True)
            break

    model.load_state_dict(best_state)
    test_acc = accuracy(model, X["test"], Y["test"], device, amp)
    entry.update(test_acc_of_best=round(test_acc, 3), status="done", train_seconds=round(time.time() - t0, 1))
    print(f"[{tag}] best valid {best_valid:.1f}% at epoch {best_epoch}; test {test_acc:.1f}% with that state "
          f"(majority class {entry['test_majority_acc']:.1f}%)", flush=True)
    save()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dirs", nargs="+", metavar="DATA_DIR", help="prepared pathfinder dir(s), hgrn-lra/1 format")
    p.add_argument("--out", required=True, help="JSON file for the results (a list, one entry per DATA_DIR)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--minutes", type=float, default=3.0,
                   help="wall-time budget per DATA_DIR, checked after each epoch (<= 0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=32, help="w: channel widths w, 2w, 4w")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--no-augment", dest="augment", action="store_false",
                   help="no random flips / 90-degree rotations of training images")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch < 2 or args.width < 1:
        p.error("--epochs >= 1, --batch >= 2, --width >= 1")

    try:  # check every directory before training any
        metas = [check_dir(d) for d in args.data_dirs]
    except fmt.LraDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    settings = {"epochs": args.epochs, "batch": args.batch, "lr": args.lr, "weight_decay": 0.01,
                "minutes": args.minutes, "seed": args.seed, "width": args.width, "augment": args.augment,
                "extra_blocks_8x8": EXTRA_BLOCKS, "amp_bf16": device.type == "cuda",
                "schedule": "linear warm-up 1 epoch, cosine to 0"}
    common = {"settings": settings, "device": device_name, "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git_commit": provenance.git_version()}
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    print(f"device {device_name}, torch {torch.__version__}, {len(args.data_dirs)} data dir(s)", flush=True)

    results = []
    for d, meta in zip(args.data_dirs, metas):
        entry = dict(common)
        results.append(entry)
        try:
            train_dir(d, meta, args, device, entry, lambda: write_json(args.out, results))
        except fmt.LraDataError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    write_json(args.out, results)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
