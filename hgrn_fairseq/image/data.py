"""ImageFolder data for the image entry point: layout checks with one-line errors, and a dataset that
counts unreadable images instead of crashing hours into a run. Only open/decode errors make an image
unreadable; an error in the transform is a bug and surfaces (``TransformError``), naming the file.

Layout (ImageNet's usual one)::

    ROOT/train/<class>/<image>     ROOT/val/<class>/<image>

Class indices are the sorted class folder names of ``train/``; ``val/`` must use the same names.

``python -m hgrn_fairseq.image.data ROOT [--decode]`` runs the checks (``--decode`` also opens every
image) and prints a summary.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from PIL import Image, ImageOps

logger = logging.getLogger("hgrn_fairseq.image.data")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
MAX_CONSECUTIVE_FAILURES = 20


# What opening and decoding a damaged file raises: OSError covers UnidentifiedImageError, truncated
# files and missing or unreadable files; some PIL plugins raise SyntaxError or EOFError on broken data.
DECODE_ERRORS = (OSError, SyntaxError, EOFError, Image.DecompressionBombError)


class DataError(ValueError):
    """A problem with the data set, described in one line that names the fix."""


class TransformError(RuntimeError):
    """The transform failed on an image that decoded: a bug in the augmentation, not a bad file."""


@dataclass
class Split:
    """One split of an ImageFolder: ``samples`` are ``(path, class index)``, sorted."""

    name: str
    root: str
    classes: List[str]
    samples: List[Tuple[str, int]]
    other_files: int = 0  # files that are not images by their extension (counted, reported, not read)
    missing_classes: List[str] = field(default_factory=list)  # train classes with no folder here

    def summary(self) -> str:
        line = f"{self.name}: {len(self.samples)} images in {len(self.classes) - len(self.missing_classes)} classes"
        if self.other_files:
            line += f" ({self.other_files} files without an image extension ignored)"
        if self.missing_classes:
            line += (f"; {len(self.missing_classes)} of the {len(self.classes)} training classes have no folder "
                     f"here (e.g. {self.missing_classes[0]})")
        return line


def _list_images(folder: str) -> Tuple[List[str], int]:
    images, others = [], 0
    for dirpath, _, files in os.walk(folder, followlinks=True):
        for f in files:
            if f.lower().endswith(IMAGE_EXTENSIONS):
                images.append(os.path.join(dirpath, f))
            elif not f.startswith("."):
                others += 1
    return sorted(images), others


def scan_split(root: str, split: str, classes: Optional[Sequence[str]] = None) -> Split:
    """Check ``root/split`` and list its images. ``classes``: the training classes (for ``val``)."""
    path = os.path.join(root, split)
    key = "data.train_split" if classes is None else "data.val_split"
    if not os.path.isdir(root):
        raise DataError(f"data set folder {root!r} does not exist: set data.path to the folder that holds "
                        f"{split}/ (ImageFolder layout: {split}/<class>/<image>)")
    if not os.path.isdir(path):
        present = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        raise DataError(f"missing split {split!r}: {path} does not exist (folders there: {present or 'none'}); "
                        f"create {split}/<class>/<image> or set {key} to the right folder name")
    entries = sorted(os.listdir(path))
    folders = [d for d in entries if os.path.isdir(os.path.join(path, d))]
    loose = [f for f in entries if f.lower().endswith(IMAGE_EXTENSIONS) and not os.path.isdir(os.path.join(path, f))]
    if loose:
        raise DataError(f"{path} holds {len(loose)} images directly (e.g. {loose[0]}) instead of class folders: "
                        f"sort them into {split}/<class>/ folders by their labels")
    if not folders:
        raise DataError(f"{path} has no class folders: the layout is {split}/<class>/<image>")
    if classes is not None:
        unknown = [d for d in folders if d not in set(classes)]
        if unknown:
            raise DataError(f"{path} has {len(unknown)} class folders that train has not (e.g. {unknown[0]!r}): "
                            "both splits must use the same class folder names")
        class_list = list(classes)
    else:
        class_list = folders
    index = {c: i for i, c in enumerate(class_list)}
    samples: List[Tuple[str, int]] = []
    other_files = 0
    for c in folders:
        images, others = _list_images(os.path.join(path, c))
        other_files += others
        if not images:
            raise DataError(f"empty class folder {os.path.join(path, c)}: it holds no images "
                            f"({', '.join(IMAGE_EXTENSIONS[:3])}, ...); add its images or remove the folder "
                            "(in both splits, so that the class indices stay the same)")
        samples.extend((p, index[c]) for p in images)
    missing = [c for c in class_list if c not in set(folders)]
    return Split(split, path, class_list, samples, other_files, missing)


def scan_image_folder(root: str, train_split: str = "train", val_split: str = "val") -> Tuple[Split, Split]:
    """Both splits, checked (``DataError`` with a one-line message on a problem)."""
    train = scan_split(root, train_split)
    val = scan_split(root, val_split, train.classes)
    return train, val


def load_rgb(path: str) -> Image.Image:
    """Open and fully decode an image (PIL opens lazily: a truncated file fails only on decode)."""
    with open(path, "rb") as f:
        img = Image.open(f)
        img.load()
        return img.convert("RGB")


def find_unreadable(samples: Sequence[Tuple[str, int]]) -> List[Tuple[str, str]]:
    """``(path, error)`` of every sample that does not open or decode (other errors propagate)."""
    bad = []
    for path, _ in samples:
        try:
            load_rgb(path)
        except DECODE_ERRORS as e:
            bad.append((path, f"{type(e).__name__}: {e}"))
    return bad


def posterize_any_bits(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize op for every Pillow: current Pillow refuses 0 bits, which older Pillow turned
    into an all-zero (black) image and timm's "inc" RandAugment asks for at full magnitude."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0 and img.mode in ("L", "RGB"):
        return Image.new(img.mode, img.size, 0)
    return ImageOps.posterize(img, max(int(bits_to_keep), 1))


def guard_posterize(transform) -> int:
    """Swap timm's posterize in every augmentation op reachable from ``transform`` (Compose, RandAugment,
    AutoAugment, AugMix) for ``posterize_any_bits``; returns how many ops were swapped."""
    try:
        from timm.data import auto_augment
    except ImportError:
        return 0
    swapped, seen, todo = 0, set(), [transform]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            todo.extend(obj)
            continue
        if getattr(obj, "aug_fn", None) is auto_augment.posterize:
            obj.aug_fn = posterize_any_bits
            swapped += 1
        for attr in ("transforms", "ops", "policy"):
            child = getattr(obj, attr, None)
            if isinstance(child, (list, tuple)):
                todo.append(child)
    return swapped


class ImageFolderDataset(torch.utils.data.Dataset):
    """``(image tensor, class index, unreadable count)`` for each sample of a ``Split``.

    An image that does not open or decode (``DECODE_ERRORS``) is logged (path and error) and counted;
    an error in the transform raises ``TransformError`` (the file is fine). ``on_error`` says what stands
    in for an unreadable image: ``"next"`` (training) takes the next readable image of the split, so batch
    shapes and the run go on; ``"mark"`` (evaluation) returns a zero image with class -1, which the
    evaluation leaves out of the accuracy and reports. The third element is the number of unreadable
    files met for this sample, which the entry point sums and reports.
    """

    def __init__(self, split: Split, transform: Callable, on_error: str = "next"):
        if on_error not in ("next", "mark"):
            raise ValueError(f"on_error={on_error!r} is not 'next' or 'mark'")
        self.split, self.transform, self.on_error = split, transform, on_error
        guard_posterize(transform)  # timm's RandAugment asks the installed Pillow for 0-bit posterize
        self.samples = split.samples
        self.targets = [t for _, t in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        failures = 0
        for _ in range(MAX_CONSECUTIVE_FAILURES):
            path, target = self.samples[index]
            try:
                img = load_rgb(path)
            except DECODE_ERRORS as e:
                failures += 1
                logger.warning("unreadable image %s (%s: %s): counted and %s", path, type(e).__name__, e,
                               "replaced by the next image" if self.on_error == "next" else "left out")
                if self.on_error == "mark":
                    return torch.zeros_like(self._blank()), -1, failures
                index = (index + 1) % len(self.samples)
                continue
            try:
                return self.transform(img), target, failures
            except Exception as e:
                raise TransformError(f"the transform failed on {path} ({type(e).__name__}: {e}); the file "
                                     "decodes, so the augmentation is at fault, not the image") from e
        raise DataError(f"{MAX_CONSECUTIVE_FAILURES} consecutive unreadable images ending at {path}: the data set "
                        f"looks damaged; list them with `python -m hgrn_fairseq.image.data "
                        f"{os.path.dirname(self.split.root)} --decode`")

    def _blank(self) -> torch.Tensor:
        if not hasattr(self, "_blank_cache"):
            self._blank_cache = self.transform(Image.new("RGB", (256, 256)))
        return self._blank_cache


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="folder holding train/ and val/")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--decode", action="store_true", help="also decode every image and list the unreadable ones")
    args = p.parse_args(argv)
    try:
        splits = scan_image_folder(args.root, args.train_split, args.val_split)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    bad_total = 0
    for s in splits:
        print(s.summary())
        if args.decode:
            bad = find_unreadable(s.samples)
            bad_total += len(bad)
            for path, err in bad:
                print(f"unreadable: {path}: {err}")
    if bad_total:
        print(f"error: {bad_total} unreadable images (listed above): replace or delete them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
