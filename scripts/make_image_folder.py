#!/usr/bin/env python3
"""Write a small offline image classification data set in the ImageFolder layout that
``python -m hgrn_fairseq.image.train`` reads (DEST/train/<class>/*.png, DEST/val/<class>/*.png).

Sources (no download):

* ``shapes``: six classes of filled shapes (circle, square, triangle, cross, ring, diamond) of random
  size, place and colours on a noisy background. Needs only numpy and Pillow; the tests use it.
* ``digits``: scikit-learn's bundled handwritten digits (1797 images of 8 x 8, 10 classes),
  upscaled to ``--size``. Needs scikit-learn (installed on the GPU machine; not a dependency here).
* ``pathfinder``: the LRA Pathfinder task (two classes: the markers are / are not joined by one
  path) from ``data_prep/lra_pathfinder.py``; ``--size`` picks its preset (32, 64, 128, 256).

The validation split is ``--val-fraction`` of every class, chosen by a seeded permutation, so the
output depends only on the arguments. Writing goes to ``DEST.partial`` and is renamed at the end; an
existing complete DEST (with ``dataset.json``) is left as it is ("up to date").

    python scripts/make_image_folder.py --source digits --dest data/digits --size 32
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

SOURCES = ("shapes", "digits", "pathfinder")
SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond")


def draw_shape(kind: str, size: int, rng: np.random.Generator) -> Image.Image:
    """One ``size`` x ``size`` RGB image of ``kind`` (random scale, centre, colours, background noise)."""
    background = rng.integers(0, 256, 3)
    colour = (background + rng.integers(96, 160, 3)) % 256  # far enough from the background in every channel
    noise = rng.normal(0, 12, (size, size, 3))
    img = Image.fromarray(np.clip(background + noise, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    r = rng.uniform(0.2, 0.4) * size
    cx, cy = rng.uniform(r, size - r, 2)
    fill = tuple(int(c) for c in colour)
    if kind == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif kind == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif kind == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    elif kind == "cross":
        w = r / 3
        d.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        d.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    elif kind == "ring":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=max(1, int(r / 3)))
    elif kind == "diamond":
        d.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill)
    else:
        raise ValueError(f"shape {kind!r} is not one of {SHAPES}")
    return img


def shapes_images(per_class: int, size: int, seed: int) -> Tuple[List[str], List[Tuple[Image.Image, int]]]:
    rng = np.random.default_rng(seed)
    items = [(draw_shape(kind, size, rng), c) for c, kind in enumerate(SHAPES) for _ in range(per_class)]
    return list(SHAPES), items


def digits_images(size: int) -> Tuple[List[str], List[Tuple[Image.Image, int]]]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("error: --source digits needs scikit-learn (pip install scikit-learn); "
                         "--source shapes needs nothing more") from None
    digits = load_digits()
    items = []
    for image, label in zip(digits.images, digits.target):
        small = Image.fromarray((image * (255.0 / 16.0)).round().astype(np.uint8), mode="L")
        items.append((small.resize((size, size), Image.BICUBIC), int(label)))
    return [str(i) for i in range(10)], items


def pathfinder_images(count: int, size: int, seed: int) -> Tuple[List[str], List[Tuple[Image.Image, int]]]:
    from hgrn_fairseq.preprocessing import lra_pathfinder

    if size not in lra_pathfinder.PRESETS:
        raise SystemExit(f"error: --size {size}: Pathfinder presets are {sorted(lra_pathfinder.PRESETS)}")
    settings = lra_pathfinder.PRESETS[size]
    items = []
    for i in range(count):
        label = i % 2
        rendered = lra_pathfinder.render(settings, np.random.default_rng([seed, i]), label)
        items.append((Image.fromarray(rendered["image"], mode="L"), label))
    return ["disconnected", "connected"], items


def split_items(items: Sequence[Tuple[Image.Image, int]], num_classes: int, val_fraction: float,
                seed: int) -> Dict[str, List[Tuple[Image.Image, int]]]:
    rng = np.random.default_rng([seed, 1])
    splits: Dict[str, List[Tuple[Image.Image, int]]] = {"train": [], "val": []}
    for c in range(num_classes):
        members = [it for it in items if it[1] == c]
        order = rng.permutation(len(members))
        n_val = max(1, int(round(val_fraction * len(members))))
        for rank, i in enumerate(order):
            splits["val" if rank < n_val else "train"].append(members[i])
    return splits


def write(dest: str, classes: List[str], splits, info: dict) -> None:
    partial = dest.rstrip("/") + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    for split, members in splits.items():
        for c in classes:
            os.makedirs(os.path.join(partial, split, c), exist_ok=True)
        for i, (img, label) in enumerate(members):
            img.save(os.path.join(partial, split, classes[label], f"{i:06d}.png"))
    counts = {s: len(m) for s, m in splits.items()}
    with open(os.path.join(partial, "dataset.json"), "w") as f:
        json.dump(dict(info, classes=classes, images=counts), f, indent=1)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(partial, dest)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", choices=SOURCES, default="shapes")
    p.add_argument("--dest", required=True, help="output folder (gets train/ and val/)")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (Pathfinder: its preset, 32..256)")
    p.add_argument("--per-class", type=int, default=100, help="shapes: images per class")
    p.add_argument("--count", type=int, default=2000, help="pathfinder: images in all (half of each label)")
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    # our own checks: one line (p.error would print the usage block first)
    if not 0.0 < args.val_fraction < 1.0:
        print(f"make_image_folder.py: error: --val-fraction {args.val_fraction} must be in (0, 1)", file=sys.stderr)
        return 2
    if args.size < 8:
        print(f"make_image_folder.py: error: --size {args.size} must be at least 8", file=sys.stderr)
        return 2
    info = {k: v for k, v in vars(args).items() if k != "dest"}
    marker = os.path.join(args.dest, "dataset.json")
    if os.path.isfile(marker):
        with open(marker) as f:
            existing = json.load(f)
        if all(existing.get(k) == v for k, v in info.items()):
            print(f"{args.dest}: up to date ({existing['images']})")
            return 0
    if args.source == "shapes":
        classes, items = shapes_images(args.per_class, args.size, args.seed)
    elif args.source == "digits":
        classes, items = digits_images(args.size)
    else:
        classes, items = pathfinder_images(args.count, args.size, args.seed)
    splits = split_items(items, len(classes), args.val_fraction, args.seed)
    write(args.dest, classes, splits, info)
    print(f"{args.dest}: {len(classes)} classes, {len(splits['train'])} train / {len(splits['val'])} val images "
          f"of {args.size} x {args.size} ({args.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
