"""hgrn_fairseq.image.data: only open/decode errors count an image as unreadable; an error in the transform
surfaces naming the file; timm's RandAugment posterize at 0 bits works with the installed Pillow."""
import io
import logging
import random

import pytest
import torch
from PIL import Image, ImageOps

pytest.importorskip("timm")
from timm.data import create_transform  # noqa: E402
from timm.data.auto_augment import AugmentOp, RandAugment  # noqa: E402

from hgrn_fairseq.image import data as image_data  # noqa: E402


def png_bytes(colour, size=(12, 10)):
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def truncated_png():
    """A noise PNG cut at 60%: it opens, and fails only when its pixels are decoded."""
    rng = random.Random(5)
    buf = io.BytesIO()
    Image.frombytes("RGB", (24, 24), bytes(rng.randrange(256) for _ in range(24 * 24 * 3))).save(buf, format="PNG")
    data = buf.getvalue()
    return data[:len(data) * 6 // 10]


@pytest.fixture
def split(tmp_path):
    """train/ with three classes: a good image, a truncated PNG, a text file named .jpg, more good images."""
    root = tmp_path / "data"
    for cls, files in {"ant": {"a1.png": png_bytes((200, 40, 40)), "a2.png": png_bytes((10, 220, 30))},
                       "bee": {"b1.png": truncated_png()},
                       "cat": {"c1.jpg": b"just some text, not a jpeg\n", "c2.png": png_bytes((1, 2, 3))}}.items():
        (root / "train" / cls).mkdir(parents=True)
        for name, content in files.items():
            (root / "train" / cls / name).write_bytes(content)
    return image_data.scan_split(str(root), "train")


def path_of(split, name):
    return next(p for p, _ in split.samples if p.endswith(name))


def test_truncated_and_garbage_files_are_counted_and_named(split, caplog):
    ds = image_data.ImageFolderDataset(split, lambda im: torch.tensor(im.size), on_error="next")
    names = [p.rsplit("/", 1)[1] for p, _ in split.samples]
    assert names == ["a1.png", "a2.png", "b1.png", "c1.jpg", "c2.png"]
    with caplog.at_level(logging.WARNING, logger="hgrn_fairseq.image.data"):
        image, target, failures = ds[2]  # b1 (truncated) then c1 (text): both skipped, c2 stands in
    assert (image.tolist(), target, failures) == ([12, 10], 2, 2)
    warned = caplog.text
    assert f"{path_of(split, 'b1.png')} (OSError: image file is truncated" in warned
    assert f"{path_of(split, 'c1.jpg')} (UnidentifiedImageError" in warned
    assert warned.count("unreadable image") == 2

    marked = image_data.ImageFolderDataset(split, lambda im: torch.ones(3), on_error="mark")
    assert marked[3][1:] == (-1, 1)
    bad = image_data.find_unreadable(split.samples)
    assert [p.rsplit("/", 1)[1] for p, _ in bad] == ["b1.png", "c1.jpg"]


@pytest.mark.parametrize("error", [ValueError("bits must be between or equal to 1 and 8"),
                                   OSError("a bug that happens to raise OSError"), KeyError("mean")])
def test_a_failing_transform_surfaces_and_blames_no_file(split, caplog, error):
    def transform(img):
        raise error

    ds = image_data.ImageFolderDataset(split, transform, on_error="next")
    with caplog.at_level(logging.WARNING, logger="hgrn_fairseq.image.data"):
        with pytest.raises(image_data.TransformError) as info:
            ds[1]  # a2.png: a valid image
    assert info.value.__cause__ is error
    assert path_of(split, "a2.png") in str(info.value) and type(error).__name__ in str(info.value)
    assert "unreadable" not in caplog.text


def test_posterize_at_zero_bits_gives_the_black_image_older_pillow_gave():
    img = Image.new("RGB", (5, 4), (255, 128, 7))
    black = image_data.posterize_any_bits(img, 0)
    assert black.mode == "RGB" and black.size == (5, 4) and set(black.getdata()) == {(0, 0, 0)}
    assert set(image_data.posterize_any_bits(img.convert("L"), -1).getdata()) == {0}
    assert set(image_data.posterize_any_bits(img, 1).getdata()) == {(128, 128, 0)}
    assert image_data.posterize_any_bits(img, 8) is img


def posterize_only(transform):
    """The transform's RandAugment reduced to one posterize op at full magnitude (0 bits) that always fires."""
    ra = next(t for t in transform.transforms if isinstance(t, RandAugment))
    ra.ops = [AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=10)]
    ra.num_layers = 1
    return transform


def test_randaugment_posterize_zero_bits_runs_with_installed_pillow(split):
    tf = posterize_only(create_transform(input_size=8, is_training=True, auto_augment="rand-m9-mstd0.5-inc1"))
    img = Image.new("RGB", (12, 10), (200, 100, 50))
    try:  # what the installed Pillow does with 0 bits unguarded (current Pillow raises)
        ImageOps.posterize(img, 0)
        raises_unguarded = False
    except ValueError:
        raises_unguarded = True
    if raises_unguarded:
        with pytest.raises(ValueError):
            tf(img)
    ds = image_data.ImageFolderDataset(split, tf, on_error="next")  # the dataset guards its transform
    out, target, failures = ds[0]
    assert out.shape == (3, 8, 8) and (target, failures) == (0, 0)
    # a black image, normalised: every channel at -mean/std
    expected = torch.tensor([-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225])
    assert torch.allclose(out.mean(dim=(1, 2)), expected, atol=1e-4)


def test_guard_reaches_every_posterize_op():
    tf = create_transform(input_size=8, is_training=True, auto_augment="rand-m9-mstd0.5-inc1")
    ra = next(t for t in tf.transforms if isinstance(t, RandAugment))
    assert image_data.guard_posterize(tf) == 1  # RandAugment's "inc" list has one posterize op
    assert [op.aug_fn for op in ra.ops if op.name.startswith("Posterize")] == [image_data.posterize_any_bits]
    assert image_data.guard_posterize(tf) == 0  # already guarded
    aa = create_transform(input_size=8, is_training=True, auto_augment="original")
    assert image_data.guard_posterize(aa) == 5  # AutoAugment's "original" policy: five posterize ops
