"""python -m hgrn_fairseq.image.train, hgrn_fairseq.image.data, scripts/make_image_folder.py and
scripts/train_imagenet.sh on a tiny generated ImageFolder (CPU): the presets hold the papers' recipes,
one training update and one evaluation, resume, the run lock, the data errors, unreadable images."""
import importlib
import json
import math
import os
import sys

import pytest
import torch

pytest.importorskip("timm")
from hgrn_fairseq.image import data as image_data  # noqa: E402
from hgrn_fairseq.image import train  # noqa: E402
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
make_image_folder = importlib.import_module("scripts.make_image_folder")

# a model of a few thousand parameters on 16 x 16 images: every code path, seconds on a CPU
TINY = ["model.img_size=16", "+model.kwargs.patch_size=4", "+model.kwargs.embed_dim=8", "+model.kwargs.depth=1",
        "+model.kwargs.glu_dim=8", "optim.batch_size=8", "data.workers=0", "train.precision=fp32",
        "train.log_every=1", "train.no_progress=true", "train.device=cpu"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    dest = tmp_path_factory.mktemp("img") / "shapes"
    assert make_image_folder.main(["--dest", str(dest), "--per-class", "5", "--size", "16"]) == 0
    return dest


def events(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def run(capsys, *args):
    code = train.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------- recipes
PAPER = {  # the papers' recipes: (base lr, total batch, weight decay, warm-up epochs, clip)
    "hgrn1": (5e-4, 2048, 0.05, 10, 5.0),
    "hgrn2_tiny": (7.5e-4, 1024, 0.05, 20, 5.0),
    "hgrn2_small": (7.5e-4, 2048, 0.1, 10, 5.0),
    "deit": (5e-4, 1024, 0.05, 5, 0.0),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_presets_hold_the_papers_recipes(name):
    cfg = train.load_config(name, None, ["data.path=/x"])
    lr, batch, wd, warmup, clip = PAPER[name]
    assert (cfg.optim.base_lr, cfg.optim.batch_size, cfg.optim.weight_decay, cfg.optim.warmup_epochs,
            cfg.optim.clip_grad) == (lr, batch, wd, warmup, clip)
    assert cfg.optim.opt == "adamw" and cfg.optim.epochs == 300
    a = cfg.aug
    assert (a.auto_augment, a.color_jitter, a.mixup, a.cutmix, a.smoothing, a.reprob, a.repeated_aug) == (
        "rand-m9-mstd0.5-inc1", 0.4, 0.8, 1.0, 0.1, 0.25, 3)
    assert cfg.aug.eval_crop_pct * 256 == 224 and cfg.model.img_size == 224
    assert cfg.ema.decay > 0 and cfg.train.precision == "bf16"
    # every value is overridable from the command line
    assert train.load_config(name, None, ["data.path=/x", "optim.base_lr=0.1"]).optim.base_lr == 0.1


def test_bad_command_lines(capsys):
    code, _, err = run(capsys, "--config-name", "nope", "data.path=/x")
    assert code == 1 and "no config 'nope'" in err
    code, _, err = run(capsys, "optim.not_a_key=1", "data.path=/x")
    assert code == 1 and "bad override" in err
    code, _, err = run(capsys, "--dry-run")
    assert code == 1 and "data.path is not set" in err
    code, _, err = run(capsys, "data.path=/x", "oops")
    assert code == 1 and "is not KEY=VALUE" in err


def test_plan_batches():
    assert train.plan_batches(2048, 256, 8) == (256, 1)
    assert train.plan_batches(2048, 256, 1) == (256, 8)
    assert train.plan_batches(2048, 200, 1) == (128, 16)  # 2048 / 11 is not whole: 16 steps of 128
    assert train.plan_batches(1024, 256, 3 * 0 + 2) == (256, 2)
    with pytest.raises(train.UsageError, match="not divisible by the 3 processes"):
        train.plan_batches(1024, 256, 3)


# ------------------------------------------------------------------------------- training end to end
def test_dry_run_trains_nothing(folder, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run(capsys, "--dry-run", f"data.path={folder}", f"train.output_dir={out}", *TINY)
    assert code == 0
    assert "dry run: nothing trained" in stdout and '"classes": 6' in stdout
    assert '"batch_per_process": 8' in stdout and '"lr": 7.8125e-06' in stdout  # 5e-4 x 8 / 512
    assert not out.exists()


@pytest.mark.integration
def test_one_update_evaluation_and_resume(folder, tmp_path, capsys):
    out = tmp_path / "run"
    common = [f"data.path={folder}", f"train.output_dir={out}", "optim.epochs=3", "optim.warmup_epochs=1",
              "aug.repeated_aug=0", *TINY]
    code, _, err = run(capsys, *common, "train.max_updates=1")
    assert code == 0, err
    log = events(out)
    kinds = [e["event"] for e in log]
    assert kinds == ["start", "train", "eval", "done"], kinds
    assert log[1]["update"] == 1 and log[1]["loss"] > 0 and "grad_norm" in log[1]
    ev = log[2]
    assert ev["images"] == 6 and ev["unreadable_images"] == 0  # 6 classes x 1 validation image
    assert 0 <= ev["top1"] <= ev["top5"] <= 100 and "ema_top1" in ev
    first = torch.load(out / train.CHECKPOINT, weights_only=True)
    assert (first["num_updates"], first["epoch"], first["batch_in_epoch"]) == (1, 0, 1)
    assert (out / train.BEST).is_file()
    assert os.path.isdir(out / "tensorboard") and os.listdir(out / "tensorboard")

    # rerun with a larger budget: resumes inside epoch 0 at batch 1 and goes on to update 4
    code, _, err = run(capsys, *common, "train.max_updates=4")
    assert code == 0, err
    log = events(out)[4:]
    assert log[0] == {**log[0], "event": "resume", "update": 1, "epoch": 0, "batch_in_epoch": 1}
    assert log[0]["changed_settings"] == ["train.max_updates"]
    assert [e["update"] for e in log if e["event"] == "train"] == [2, 3, 4]
    second = torch.load(out / train.CHECKPOINT, weights_only=True)
    assert second["num_updates"] == 4
    # 24 training images / batch 8 = 3 updates per epoch: update 4 is the first of epoch 1
    assert (second["epoch"], second["batch_in_epoch"]) == (1, 1)
    changed = [k for k in first["model"] if not torch.equal(first["model"][k], second["model"][k])]
    assert changed, "resumed training changed no weight"
    assert second["optimizer"]["state"], "optimizer state was not saved"

    # the learning rate follows the schedule across the restart: linear warm-up over 1 epoch (3 updates)
    # from 1e-6, then DeiT's cosine, whose period of 9 updates counts the warm-up
    lrs = {e["update"]: e["lr"] for e in events(out) if e["event"] == "train"}
    peak, floor, total = 5e-4 * 8 / 512, 1e-5, 9
    assert lrs[4] == pytest.approx(floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * 4 / total)))
    assert lrs[2] == pytest.approx(1e-6 + 2 * (peak - 1e-6) / 3)

    # a checkpoint of another data set is refused
    other = tmp_path / "other"
    assert make_image_folder.main(["--dest", str(other), "--per-class", "3", "--size", "16", "--seed", "1"]) == 0
    import shutil

    shutil.rmtree(other / "train" / "ring")
    shutil.rmtree(other / "val" / "ring")
    code, _, err = run(capsys, *[a.replace(str(folder), str(other)) for a in common], "train.max_updates=5")
    assert code == 1 and "was trained on other classes than this data's class folders" in err
    # ... and so is one with as many classes under other names, for training and for evaluation
    renamed = copy_folder(folder, tmp_path / "renamed")
    for split in ("train", "val"):
        os.rename(renamed / split / "ring", renamed / split / "zring")
    swapped = [a.replace(str(folder), str(renamed)) for a in common]
    for extra in ("train.max_updates=5", "train.eval_only=true"):
        code, _, err = run(capsys, *swapped, extra)
        assert code == 1 and "was trained on other classes" in err, (extra, err)

    # the same command again: nothing left to do
    code, stdout, _ = run(capsys, *common, "train.max_updates=4")
    assert code == 0 and "already at the end of training" in stdout

    # evaluation of the saved weights (model and EMA)
    code, stdout, _ = run(capsys, *common, "train.eval_only=true")
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    assert code == 0 and [x["weights"] for x in lines] == ["model", "ema"]
    assert all(x["images"] == 6 for x in lines)


def test_a_second_run_on_a_folder_in_use_is_refused(folder, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    held = train.RunLock(out)  # what a running training holds
    code, _, err = run(capsys, f"data.path={folder}", f"train.output_dir={out}", "train.max_updates=1", *TINY)
    assert code == 1 and "is in use by another training run" in err and f"pid {os.getpid()}" in err
    held.release()
    code, _, err = run(capsys, f"data.path={folder}", f"train.output_dir={out}", "train.max_updates=1",
                       "optim.epochs=1", *TINY)
    assert code == 0, err


def test_save_atomic_replaces_whole_files(tmp_path):
    path = tmp_path / "c.pt"
    train.save_atomic({"a": 1}, path)
    train.save_atomic({"a": 2}, path)
    assert torch.load(path) == {"a": 2}
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]  # no temporary file left


# ------------------------------------------------------------------------------------------------ data
def copy_folder(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_data_errors_are_one_line_with_the_fix(folder, tmp_path, capsys):
    bad = copy_folder(folder, tmp_path / "no_val")
    import shutil

    shutil.rmtree(bad / "val")
    code, _, err = run(capsys, "--dry-run", f"data.path={bad}", *TINY)
    assert code == 1 and "missing split 'val'" in err and "data.val_split" in err and len(err.strip().splitlines()) == 1

    empty = copy_folder(folder, tmp_path / "empty")
    for f in os.listdir(empty / "train" / "ring"):
        os.remove(empty / "train" / "ring" / f)
    code, _, err = run(capsys, "--dry-run", f"data.path={empty}", *TINY)
    assert code == 1 and "empty class folder" in err and "ring" in err

    extra = copy_folder(folder, tmp_path / "extra")
    (extra / "val" / "hexagon").mkdir()
    code, _, err = run(capsys, "--dry-run", f"data.path={extra}", *TINY)
    assert code == 1 and "class folders that train has not" in err and "hexagon" in err

    flat = copy_folder(folder, tmp_path / "flat")
    for c in os.listdir(flat / "val"):
        for f in os.listdir(flat / "val" / c):
            os.rename(flat / "val" / c / f, flat / "val" / f"{c}_{f}")
        os.rmdir(flat / "val" / c)
    code, _, err = run(capsys, "--dry-run", f"data.path={flat}", *TINY)
    assert code == 1 and "instead of class folders" in err

    code, _, err = run(capsys, "--dry-run", f"data.path={tmp_path / 'nowhere'}", *TINY)
    assert code == 1 and "does not exist" in err

    code, _, err = run(capsys, "--dry-run", f"data.path={folder}", *TINY[1:], "model.img_size=18")
    assert code == 1 and "multiples of the patch size 4" in err
    code, _, err = run(capsys, "--dry-run", f"data.path={folder}", *TINY, "+model.kwargs.scan=3d")
    assert code == 1 and "scan='3d' is not one of" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "--dry-run", f"data.path={folder}", *TINY, "model.name=no_such_model")
    assert code == 1 and "is not a timm model" in err


def test_unreadable_images_are_counted_not_fatal(folder, tmp_path, capsys):
    broken = copy_folder(folder, tmp_path / "broken")
    bad_train = broken / "train" / "circle" / "zz_broken.png"
    bad_train.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png")
    bad_val = broken / "val" / "square" / "zz_broken.jpg"
    bad_val.write_bytes(b"\xff\xd8\xff\xe0 truncated")

    train_split, val_split = image_data.scan_image_folder(str(broken))
    ds = image_data.ImageFolderDataset(train_split, lambda im: torch.tensor(im.size), on_error="next")
    i = [p for p, _ in train_split.samples].index(str(bad_train))
    _, target, failures = ds[i]
    assert failures == 1 and target == train_split.samples[(i + 1) % len(ds)][1]  # the next image stands in
    vs = image_data.ImageFolderDataset(val_split, lambda im: torch.zeros(2), on_error="mark")
    j = [p for p, _ in val_split.samples].index(str(bad_val))
    assert vs[j][1:] == (-1, 1)

    # evaluation leaves it out and says so
    out = tmp_path / "run"
    code, stdout, err = run(capsys, f"data.path={broken}", f"train.output_dir={out}", "train.max_updates=1",
                            "optim.epochs=1", *TINY)
    assert code == 0, err
    ev = [e for e in events(out) if e["event"] == "eval"][0]
    assert (ev["images"], ev["unreadable_images"]) == (6, 1)

    # the checker lists both and fails
    code = image_data.main([str(broken), "--decode"])
    printed = capsys.readouterr()
    assert code == 1 and str(bad_train) in printed.out and str(bad_val) in printed.out
    assert image_data.main([str(folder), "--decode"]) == 0


def test_make_image_folder_is_deterministic_and_up_to_date(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert make_image_folder.main(["--dest", str(d), "--per-class", "3", "--size", "12", "--seed", "5"]) == 0
    for split in ("train", "val"):
        for c in make_image_folder.SHAPES:
            names = sorted(os.listdir(a / split / c))
            assert names == sorted(os.listdir(b / split / c)) and names
            for n in names:
                assert (a / split / c / n).read_bytes() == (b / split / c / n).read_bytes()
    assert make_image_folder.main(["--dest", str(a), "--per-class", "3", "--size", "12", "--seed", "5"]) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.integration
def test_train_imagenet_sh_picks_the_recipe(folder, tmp_path):
    env = pyrun.script_env(dict(os.environ, NUM_GPUS="0", OUTPUT_DIR=str(tmp_path / "o")))
    res = pyrun.run(["bash", os.path.join(REPO, "scripts", "train_imagenet.sh"), "hgrn2_vit_small", str(folder),
                     *TINY, "+model.kwargs.expand_ratio=4", "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "recipe hgrn2_small" in res.stderr and "weight_decay: 0.1" in res.stdout
    assert "name: hgrn2_vit_small" in res.stdout and "dry run: nothing trained" in res.stdout
    res = pyrun.run(["bash", os.path.join(REPO, "scripts", "train_imagenet.sh"), "hgrn1d_vit_tiny"],
                    capture_output=True, text=True, env=env)
    assert res.returncode == 1 and "usage" in res.stderr


def test_other_timm_models_train_with_the_same_entry_point():
    # models without an img_size argument (convolutional nets) are built without it
    cfg = train.load_config("deit", None, ["data.path=/x", "model.name=resnet18", "model.drop_path=0.0"])
    assert train.build_model(cfg, 5).num_classes == 5
    cfg = train.load_config("deit", None, ["data.path=/x", "model.img_size=64"])
    model = train.build_model(cfg, 3)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)  # DeiT at 64 px (its position table built so)


def test_loading_a_config_leaves_fairseq_able_to_use_hydra(tmp_path):
    """hydra's version_base is process-wide: after the image config is composed, fairseq's
    convert_namespace_to_omegaconf (hydra.experimental.initialize) must still work in this process."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from hgrn_fairseq.image.train import load_config

    load_config("hgrn1", None, [])
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(tmp_path), "--task", "language_modeling", "--arch", "transformer_lm", "--optimizer", "adam"])
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.model._name == "transformer_lm"


def test_cuda_graph_setting_is_applied_and_reported(folder, tmp_path, capsys):
    """train.cuda_graphs: on in the HGRN presets, off in DeiT's; the plan says what it does for the model."""
    assert train.load_config("hgrn1", None, ["data.path=/x"]).train.cuda_graphs is True
    assert train.load_config("hgrn2_tiny", None, ["data.path=/x"]).train.cuda_graphs is True
    assert train.load_config("deit", None, ["data.path=/x"]).train.cuda_graphs is False
    cfg = train.load_config("hgrn1", None, ["data.path=/x", *TINY])
    model = train.build_model(cfg, 3)
    assert train.cuda_graph_setting(cfg, model, torch.device("cpu")) == "off: not on CUDA"
    assert model.cuda_graphs is False
    assert train.cuda_graph_setting(cfg, model, torch.device("cuda")) == "on" and model.cuda_graphs is True
    other = torch.nn.Linear(2, 2)
    assert "has no CUDA-graph option" in train.cuda_graph_setting(cfg, other, torch.device("cuda"))
    off = train.load_config("hgrn1", None, ["data.path=/x", "train.cuda_graphs=false", *TINY])
    assert train.cuda_graph_setting(off, train.build_model(off, 3), torch.device("cuda")) == "off"
    code, stdout, _ = run(capsys, "--config-name", "hgrn1", "--dry-run", f"data.path={folder}",
                          f"train.output_dir={tmp_path / 'r'}", *TINY)
    assert code == 0 and '"cuda_graphs": "off: not on CUDA"' in stdout
