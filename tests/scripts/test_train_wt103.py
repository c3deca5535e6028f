"""scripts/train_wt103.sh and configs/wt103/*.yaml: the printed recipes, bad input, the hydra configs
against the shell recipes, and a real run (5 updates on CPU with the recipes' linear_cross_entropy
criterion, resume, sampling with fairseq-interactive; fairseq's cross_entropy through an extra
--criterion gives the same losses)."""
import importlib.util
import os
import re
import shlex
import shutil
import sys
import warnings

import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from tests.lm_corpus import write_corpus
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "train_wt103.sh")
CONFIGS = os.path.join(REPO, "configs", "wt103")
RECIPES = ("hgrn_lm_base", "hgrn2_lm_base", "transformer_lm_wt103_small")
BASELINES = ("lru_lm_base", "lru_mml_lm_base", "mlgru_lm_base", "mlgru_mml_lm_base")  # HGRN1's recipe
from hgrn_fairseq.cli import fairseq_train

pytestmark = pytest.mark.integration


def run_script(*args, env=None, timeout=600):
    full_env = pyrun.script_env()  # (PYTHON: the warm interpreter of tests/pyrun.py)
    full_env.pop("NUM_GPUS", None)
    full_env.pop("BATCH_PER_GPU", None)
    full_env.update(env or {})
    return pyrun.run(["bash", SCRIPT, *map(str, args)], capture_output=True, text=True, env=full_env,
                     timeout=timeout, cwd=REPO)


def dry_run(recipe, data, *extra, env=None):
    proc = run_script("--dry-run", recipe, data, *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout), proc.stderr


def flags(argv):
    """The last value of every --flag in a command line (what argparse keeps); True for bare flags."""
    out = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = True if nxt is None or nxt.startswith("--") else nxt
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """tests/lm_corpus.py's corpus, binarised by fairseq-preprocess in this process (saves a start-up)."""
    from fairseq import options
    from fairseq_cli import preprocess

    root = tmp_path_factory.mktemp("wt103")
    text = root / "text"
    write_corpus(str(text))
    args = options.get_preprocessing_parser().parse_args([
        "--only-source", "--destdir", str(root / "bin"), "--workers", "1", "--trainpref", str(text / "train.txt"),
        "--validpref", str(text / "valid.txt"), "--testpref", str(text / "test.txt")])
    preprocess.main(args)
    return str(root / "bin")


# ---- the recipes as printed ----------------------------------------------------------------------
COMMON = {
    "--task": "hgrn_language_modeling", "--tokens-per-sample": "512", "--sample-break-mode": "none",
    "--optimizer": "adam", "--adam-betas": "(0.9, 0.98)", "--lr": "0.0005", "--lr-scheduler": "inverse_sqrt",
    "--warmup-init-lr": "1e-07", "--dropout": "0.1", "--criterion": "linear_cross_entropy",
}
EXPECTED = {
    "hgrn_lm_base": {"--arch": "hgrn_lm_base", "--warmup-updates": "8000", "--weight-decay": "0.2",
                     "--clip-norm": "0.0", "--max-update": "100000", "--cuda-graphs": True},
    "hgrn2_lm_base": {"--arch": "hgrn2_lm_base", "--warmup-updates": "4000", "--weight-decay": "0.1",
                      "--clip-norm": "1.0", "--max-update": "50000", "--bf16": True, "--cuda-graphs": True},
    "transformer_lm_wt103_small": {
        "--arch": "transformer_lm", "--decoder-layers": "6", "--decoder-embed-dim": "512",
        "--decoder-ffn-embed-dim": "2048", "--decoder-attention-heads": "8", "--decoder-normalize-before": True,
        "--share-decoder-input-output-embed": True, "--warmup-updates": "8000", "--weight-decay": "0.01",
        "--clip-norm": "0.0", "--max-update": "100000"},
}


@pytest.mark.parametrize("recipe", RECIPES)
def test_dry_run_prints_the_paper_recipe(recipe, data):
    argv, log = dry_run(recipe, data, env={"NUM_GPUS": "1"})
    got = flags(argv)
    for flag, value in {**COMMON, **EXPECTED[recipe]}.items():
        assert got.get(flag) == value, (flag, got.get(flag))
    if recipe != "hgrn2_lm_base":
        assert "--bf16" not in got and "--fp16" not in got  # fp32
    assert argv[0] == pyrun.script_env()["PYTHON"] and argv[1].endswith("scripts/fairseq_train.py") and argv[2] == data
    assert got["--user-dir"] == os.path.join(REPO, "hgrn_fairseq")
    assert got["--save-dir"] == os.path.join(REPO, "checkpoints", "wt103", recipe)
    assert got["--tensorboard-logdir"] == os.path.join(REPO, "checkpoints", "wt103", recipe, "logs", "tensorboard")
    # 128 sequences x 512 tokens per update on one GPU: 16 x 8
    assert (got["--batch-size"], got["--update-freq"], got["--distributed-world-size"]) == ("16", "8", "1")
    assert "update-freq 8 (128 sequences per update)" in log
    assert "not GPT-2 BPE's 50264" in log  # the tiny corpus's dictionary


@pytest.mark.parametrize("gpus, batch, update_freq", [("1", "32", "4"), ("2", None, "4"), ("4", "8", "4"),
                                                      ("8", None, "1"), ("8", "4", "4")])
def test_update_freq_keeps_128_sequences_per_update(gpus, batch, update_freq, data):
    env = {"NUM_GPUS": gpus, **({"BATCH_PER_GPU": batch} if batch else {})}
    argv, _ = dry_run("hgrn_lm_base", data, env=env)
    got = flags(argv)
    assert int(got["--batch-size"]) * int(got["--update-freq"]) * int(gpus) == 128
    assert got["--update-freq"] == update_freq and got["--distributed-world-size"] == gpus
    if gpus == "1":
        assert "torch.distributed.run" not in argv
    else:  # one process per GPU through torchrun
        assert argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node"] and argv[5] == gpus


@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_graphs_on_for_hgrn_recipes_unless_switched_off(recipe, data):
    hgrn = recipe != "transformer_lm_wt103_small"
    argv, _ = dry_run(recipe, data, env={"NUM_GPUS": "1"})
    assert ("--cuda-graphs" in argv) == hgrn
    if hgrn:
        assert shell_args(recipe, data).cuda_graphs is True
        assert hydra_config(recipe, data)["model"]["cuda_graphs"] is True
    argv, _ = dry_run(recipe, data, env={"NUM_GPUS": "1", "CUDA_GRAPHS": "0"})
    assert "--cuda-graphs" not in argv
    proc = pyrun.run(["bash", SCRIPT, "--dry-run", recipe, data], capture_output=True, text=True,
                     env={**os.environ, "NUM_GPUS": "1", "CUDA_GRAPHS": "yes"})
    assert proc.returncode != 0 and "CUDA_GRAPHS='yes' is not 0 or 1" in proc.stderr


@pytest.mark.parametrize("recipe, paper", [("hgrn_lm_base", "fp32"), ("hgrn2_lm_base", "bf16"),
                                           ("transformer_lm_wt103_small", "fp32")])
def test_precision_switch(recipe, paper, data):
    for precision in ("fp32", "tf32", "bf16"):
        proc = run_script("--dry-run", recipe, data, env={"NUM_GPUS": "1", "PRECISION": precision})
        assert proc.returncode == 0, proc.stderr
        argv = shlex.split(proc.stdout)
        assert ("--bf16" in argv) == (precision == "bf16") and "--fp16" not in argv
        assert (argv[0] == "HGRN_MATMUL_PRECISION=tf32") == (precision == "tf32")
        expected = f"precision: {precision} (the paper's)" if precision == paper else \
            f"precision: {precision} (the paper trained {recipe} in {paper})"
        assert expected in proc.stderr
    argv, log = dry_run(recipe, data, env={"NUM_GPUS": "1"})  # default: the paper's
    assert ("--bf16" in argv) == (paper == "bf16") and f"precision: {paper} (the paper's)" in log
    proc = run_script("--dry-run", recipe, data, env={"NUM_GPUS": "1", "PRECISION": "fp16"})
    assert proc.returncode != 0 and "PRECISION='fp16' is not one of fp32, tf32, bf16" in proc.stderr
    proc = run_script("--dry-run", recipe, data, "--bf16", env={"NUM_GPUS": "1"})
    assert proc.returncode != 0 and "pass the precision as PRECISION=" in proc.stderr


def test_tf32_matmul_precision_is_set(monkeypatch):
    monkeypatch.setenv("HGRN_MATMUL_PRECISION", "tf32")
    before = torch.get_float32_matmul_precision()
    try:
        fairseq_train.set_matmul_precision()
        assert torch.get_float32_matmul_precision() == "high"
        monkeypatch.setenv("HGRN_MATMUL_PRECISION", "fp32")
        fairseq_train.set_matmul_precision()
        assert torch.get_float32_matmul_precision() == "highest"
        monkeypatch.setenv("HGRN_MATMUL_PRECISION", "fp16")
        with pytest.raises(SystemExit, match="is not one of"):
            fairseq_train.set_matmul_precision()
    finally:
        torch.set_float32_matmul_precision(before)


def test_cpu_and_overrides(data):
    argv, log = dry_run("hgrn_lm_base", data, "--cpu", "--max-update", "7", "--batch-size", "4",
                        env={"NUM_GPUS": "4"})
    got = flags(argv)
    assert got["--distributed-world-size"] == "1" and got["--cpu"] is True  # --cpu: one process
    assert got["--max-update"] == "7" and argv[-1] == "4"  # extra args come last, so they win
    assert "--batch-size overrides the recipe" in log


@pytest.mark.parametrize("recipe", RECIPES)
def test_extra_criterion_gives_fairseqs_cross_entropy_back(recipe, data):
    """The recipes use linear_cross_entropy; an extra --criterion cross_entropy comes after it and is the
    one fairseq parses (argparse keeps the last occurrence), as the script's header says."""
    assert "bash scripts/train_wt103.sh hgrn_lm_base --criterion cross_entropy" in open(SCRIPT).read()
    assert shell_args(recipe, data).criterion == "linear_cross_entropy"
    argv, _ = dry_run(recipe, data, "--criterion", "cross_entropy", env={"NUM_GPUS": "1"})
    assert argv.count("--criterion") == 2 and flags(argv)["--criterion"] == "cross_entropy"
    assert shell_args(recipe, data, "--criterion", "cross_entropy").criterion == "cross_entropy"
    # the same in hydra mode: criterion._name=cross_entropy, as the configs' header says
    assert "criterion._name=cross_entropy" in open(os.path.join(CONFIGS, recipe + ".yaml")).read()
    assert hydra_config(recipe, data)["criterion"]["_name"] == "linear_cross_entropy"
    assert hydra_config(recipe, data, "criterion._name=cross_entropy")["criterion"]["_name"] == "cross_entropy"


def test_default_data_dir_and_save_dir_env(tmp_path, data):
    argv, _ = dry_run("hgrn_lm_base", data, env={"NUM_GPUS": "1", "SAVE_DIR": str(tmp_path / "ck"),
                                                 "LOG_DIR": str(tmp_path / "lg")})
    got = flags(argv)
    assert got["--save-dir"] == str(tmp_path / "ck") and got["--log-file"] == str(tmp_path / "lg" / "train.log")
    # DATA_DIR omitted and the next argument a flag: the default data-bin/wikitext-103 is used
    default = os.path.join(REPO, "data-bin", "wikitext-103")
    if not os.path.exists(default):
        proc = run_script("--dry-run", "hgrn_lm_base", "--max-update", "3", env={"NUM_GPUS": "1"})
        assert proc.returncode == 0 and shlex.split(proc.stdout)[2] == default
        err = one_line_error(run_script("hgrn_lm_base", "--max-update", "3", env={"NUM_GPUS": "1"}))
        assert "data-bin/wikitext-103 does not exist" in err


def test_dry_run_needs_no_data_but_a_run_does(tmp_path):
    """--dry-run prints the command before the data exists (a note says how to make it); a real run
    stops with one line naming the directory and the command that makes it."""
    missing = tmp_path / "wikitext-103"
    for args in (("--dry-run", "hgrn_lm_base", missing), ("hgrn2_lm_base", missing, "--dry-run")):
        proc = run_script(*args, env={"NUM_GPUS": "1"})
        assert proc.returncode == 0, proc.stderr
        argv = shlex.split(proc.stdout)
        assert argv[2] == str(missing) and "--arch" in argv
        assert "does not exist yet" in proc.stderr and "data_prep/prepare_wikitext103.py" in proc.stderr
    err = one_line_error(run_script("hgrn_lm_base", missing, env={"NUM_GPUS": "1"}))
    assert f"DATA_DIR {missing} does not exist" in err
    assert f"data_prep/prepare_wikitext103.py --source wikitext-103-raw-v1.zip --gpt2-dir GPT2_DIR --dest {missing}" in err
    assert not missing.exists()


def test_cpu_runs_default_to_one_omp_thread(tmp_path):
    """On the CPU the command gets OMP_NUM_THREADS=1 unless the user set it; GPU runs are left alone."""
    missing = tmp_path / "data"

    def command(env, *extra):
        full = pyrun.script_env()
        full.pop("OMP_NUM_THREADS", None)
        full.update(env)
        proc = pyrun.run(["bash", SCRIPT, "--dry-run", "hgrn_lm_base", str(missing), *extra], capture_output=True,
                         text=True, env=full, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        return shlex.split(proc.stdout), proc.stderr

    for env, extra in (({"NUM_GPUS": "0"}, ()), ({"NUM_GPUS": "1"}, ("--cpu",))):
        argv, log = command(env, *extra)
        assert argv[0] == "OMP_NUM_THREADS=1" and "OMP_NUM_THREADS=1 for the CPU run" in log
    argv, _ = command({"NUM_GPUS": "0", "OMP_NUM_THREADS": "2"})
    assert not any(a.startswith("OMP_NUM_THREADS") for a in argv)  # the user's setting stands
    argv, _ = command({"NUM_GPUS": "1"})
    assert not any(a.startswith("OMP_NUM_THREADS") for a in argv)


# ---- bad input: one line, exit 2, naming the fix ----------------------------------------------
def one_line_error(proc):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("train_wt103.sh: error: "), proc.stderr
    assert proc.stdout == ""  # no command printed
    return errors[0]


def test_unknown_or_missing_recipe(data):
    err = one_line_error(run_script("--dry-run", "hgrn_lm_large", data))
    assert "unknown RECIPE 'hgrn_lm_large'" in err and all(r in err for r in RECIPES)
    err = one_line_error(run_script("--dry-run"))
    assert "no RECIPE given" in err


def test_missing_data_dir_or_dictionary(tmp_path, data):
    err = one_line_error(run_script("hgrn_lm_base", tmp_path / "nowhere"))
    assert "nowhere does not exist" in err and "data_prep/" in err
    no_dict = tmp_path / "no_dict"
    shutil.copytree(data, no_dict)
    os.remove(no_dict / "dict.txt")
    err = one_line_error(run_script("--dry-run", "hgrn_lm_base", no_dict))
    assert "dict.txt is missing" in err and "fairseq-preprocess" in err
    no_valid = tmp_path / "no_valid"
    shutil.copytree(data, no_valid)
    os.remove(no_valid / "valid.bin")
    err = one_line_error(run_script("--dry-run", "hgrn_lm_base", no_valid))
    assert "split 'valid' is missing" in err and "valid.bin" in err


def test_dictionary_smaller_than_the_data(tmp_path, data):
    wrong = tmp_path / "wrong_dict"
    shutil.copytree(data, wrong)
    lines = open(wrong / "dict.txt").read().splitlines()
    with open(wrong / "dict.txt", "w") as f:  # a dictionary from another tokenizer, smaller than the data's
        f.write("\n".join(lines[:50]) + "\n")
    err = one_line_error(run_script("--dry-run", "hgrn2_lm_base", wrong))
    assert "split 'train' uses token id" in err and "has only 54 entries" in err and "--srcdict" in err


@pytest.mark.parametrize("env, message", [
    ({"NUM_GPUS": "3"}, "cannot be split evenly over 3 processes"),
    ({"NUM_GPUS": "2", "BATCH_PER_GPU": "48"}, "set BATCH_PER_GPU to a divisor of 64"),
    ({"NUM_GPUS": "1", "BATCH_PER_GPU": "0"}, "BATCH_PER_GPU='0' must be a positive whole number"),
    ({"NUM_GPUS": "two"}, "NUM_GPUS='two' is not a number"),
])
def test_batch_that_does_not_divide_128(env, message, data):
    err = one_line_error(run_script("--dry-run", "hgrn_lm_base", data, env=env))
    assert message in err


# ---- bf16 on the command line ------------------------------------------------------------------
def test_bf16_does_not_turn_into_tpu(data):
    from fairseq import options

    args = [data, "--task", "hgrn_language_modeling", "--arch", "hgrn_lm_tiny", "--optimizer", "adam",
            "--lr-scheduler", "inverse_sqrt", "--bf16"]
    stock = options.parse_args_and_arch(options.get_training_parser(), args)
    assert stock.bf16 and stock.tpu  # what fairseq does by itself: --bf16 means TPU
    fixed = fairseq_train._bf16_without_tpu(options.parse_args_and_arch)
    ours = fixed(options.get_training_parser(), args)
    assert ours.bf16 and not ours.tpu
    assert fixed(options.get_training_parser(), args + ["--tpu"]).tpu  # an explicit --tpu is kept


# ---- hydra configs select the same run as the shell recipes --------------------------------------
def resolve_paths(cfg):
    for section, key in [("common", "user_dir"), ("common", "tensorboard_logdir"), ("checkpoint", "save_dir")]:
        value = cfg[section][key]
        if value is not None and not os.path.isabs(value):
            cfg[section][key] = os.path.join(REPO, value)  # the configs are meant to be run from the repo root


def hydra_config(name, data, *overrides):
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    hydra_init(name)  # what fairseq-hydra-train does: the FairseqConfig schema under the config's name
    GlobalHydra.instance().clear()
    with warnings.catch_warnings():  # hydra 1.3 deprecation notices about fairseq's 1.0-style configs
        warnings.simplefilter("ignore")
        with initialize_config_dir(config_dir=CONFIGS, version_base="1.1"):
            cfg = compose(config_name=name, overrides=[f"task.data={data}", *overrides])
    GlobalHydra.instance().clear()
    add_defaults(cfg)
    cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    resolve_paths(cfg)
    return cfg


def shell_args(recipe, data, *extra):
    from fairseq import options

    argv, _ = dry_run(recipe, data, *extra, env={"NUM_GPUS": "1"})
    parse = fairseq_train._bf16_without_tpu(options.parse_args_and_arch)
    return parse(options.get_training_parser(), argv[2:])  # what scripts/fairseq_train.py parses


def shell_config(recipe, data):
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    args = shell_args(recipe, data)
    return OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)


def test_every_recipe_has_a_config():
    assert sorted(f[:-5] for f in os.listdir(CONFIGS) if f.endswith(".yaml")) == sorted(RECIPES + BASELINES)
    script = open(SCRIPT).read()
    assert f'RECIPES="{" ".join(RECIPES + BASELINES)}"' in script


@pytest.mark.parametrize("recipe", BASELINES)
def test_baseline_recipes_are_hgrn1s(recipe, data):
    argv, log = dry_run(recipe, data, env={"NUM_GPUS": "1"})
    got = flags(argv)
    for flag, value in {**COMMON, **EXPECTED["hgrn_lm_base"], "--arch": recipe}.items():
        if flag != "--cuda-graphs":
            assert got.get(flag) == value, (flag, got.get(flag))
    assert "--cuda-graphs" not in got and "--bf16" not in got and "precision: fp32 (the paper's)" in log


@pytest.mark.parametrize("recipe", RECIPES + BASELINES)
def test_hydra_config_equals_shell_recipe(recipe, data):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    hydra_cfg, shell_cfg = hydra_config(recipe, data), shell_config(recipe, data)
    # in hydra mode the model is named by its model name; the arch name maps to it
    shell_cfg["model"]["_name"] = ARCH_MODEL_NAME_REGISTRY[shell_cfg["model"]["_name"]]
    # The shell recipe's --log-file LOG_DIR/train.log is hydra's own log file in the configs (hydra.run.dir).
    assert shell_cfg["common"].pop("log_file").endswith("/logs/train.log")
    assert hydra_cfg["common"].pop("log_file") is None
    compared = ["common", "checkpoint", "task", "dataset", "distributed_training", "criterion", "optimizer",
                "lr_scheduler", "optimization", "model"]
    for section in compared:
        assert hydra_cfg[section] == shell_cfg[section], section
    # spot checks, so that a wrong value in both places cannot pass
    assert hydra_cfg["task"]["tokens_per_sample"] == 512 and hydra_cfg["optimization"]["lr"] == [0.0005]
    assert hydra_cfg["dataset"]["batch_size"] * hydra_cfg["optimization"]["update_freq"][0] == 128
    assert hydra_cfg["common"]["bf16"] == (recipe == "hgrn2_lm_base") and not hydra_cfg["common"]["tpu"]
    assert hydra_cfg["criterion"]["_name"] == "linear_cross_entropy"
    if recipe == "transformer_lm_wt103_small":
        assert hydra_cfg["model"]["decoder_normalize_before"] is True


def test_transformer_baseline_size():
    """6 layers, d 512, FFN 2048, tied: the papers' 44.65M with the GPT-2 dictionary."""
    import types

    from fairseq.data import Dictionary
    from fairseq.models import build_model
    from omegaconf import OmegaConf

    cfg = hydra_config("transformer_lm_wt103_small", "/unused")
    dictionary = Dictionary()
    for i in range(50264 - len(dictionary)):
        dictionary.add_symbol(f"tok{i}")
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = build_model(OmegaConf.create(cfg["model"]), task)
    params = sum(p.numel() for p in model.parameters())
    assert round(params / 1e6, 2) == 44.65, params
    assert model.decoder.layers[0].normalize_before and model.decoder.layer_norm is not None


# ---- a real run: 5 updates, resume, sample; the hydra config trains the same way ----------------
def num_updates(checkpoint):
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return state["optimizer_history"][-1]["num_updates"]


def criterion_of(checkpoint):
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return state["cfg"]["criterion"]["_name"], state["optimizer_history"][-1]["criterion_name"]


def train_losses(output):
    return {int(m.group(2)): float(m.group(1)) for m in re.finditer(r"loss=([\d.]+),.*?num_updates=(\d+),", output)}


# The hgrn_lm_base recipe made tiny through extra arguments (they override the recipe's), one process.
TINY = {"decoder_embed_dim": 32, "decoder_layers": 2, "glu_dim": 64, "tokens_per_sample": 16, "warmup_updates": 2,
        "lr": 0.01, "num_workers": 0, "log_interval": 1, "seed": 3}
TINY_BATCH = 32  # BATCH_PER_GPU: update-freq 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("train")
    env = {"SAVE_DIR": str(root / "ckpt"), "LOG_DIR": str(root / "logs"), "BATCH_PER_GPU": str(TINY_BATCH)}
    small = ["--cpu"] + [a for k, v in TINY.items() for a in ("--" + k.replace("_", "-"), v)]
    first = run_script("hgrn_lm_base", data, *small, "--max-update", "5", env=env)
    return root, env, small, first


def test_train_resume_and_sample(trained, data):
    root, env, small, first = trained
    save_dir, log_dir = root / "ckpt", root / "logs"
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert "update-freq 4 (128 sequences per update)" in out  # 32 x 4 on one process
    assert re.search(r"bsz=128, num_updates=\d", out)  # 128 sequences per update (the epoch's last one is short)
    assert num_updates(save_dir / "checkpoint_last.pt") == 5
    # trained with the recipe's fused criterion
    assert criterion_of(save_dir / "checkpoint_last.pt") == ("linear_cross_entropy", "LinearCrossEntropyCriterion")
    assert (log_dir / "train.log").exists() and "hgrn_lm_base" in (log_dir / "command.txt").read_text()
    if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
        assert "no tensorboard logs" in out

    again = run_script("hgrn_lm_base", data, *small, "--max-update", "7", env=env)  # same command, more updates
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert f"Loaded checkpoint {save_dir}/checkpoint_last.pt" in out and "@ 5 updates)" in out
    assert re.search(r"num_updates=6,", out) and not re.search(r"num_updates=1,", out)
    assert num_updates(save_dir / "checkpoint_last.pt") == 7
    assert len((log_dir / "command.txt").read_text().splitlines()) == 4  # two runs, date + command each

    # Sampling from the trained model (docs/generation.md): top-k sampling, one sample per prompt.
    words = {line.split()[0] for line in open(os.path.join(data, "dict.txt"))}
    cmd = [sys.executable, "-m", "fairseq_cli.interactive", data, "--user-dir", os.path.join(REPO, "hgrn_fairseq"),
           "--task", "hgrn_language_modeling", "--path", str(save_dir / "checkpoint_last.pt"),
           "--sampling", "--sampling-topk", "10", "--beam", "1", "--max-len-b", "12", "--seed", "1", "--cpu"]
    proc = pyrun.run(cmd, input="w5 w6 w7\nw40\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hyps = [line.split("\t")[2].split() for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 2, proc.stdout
    assert hyps[0][:3] == ["w5", "w6", "w7"] and hyps[1][:1] == ["w40"]  # the prompt, then sampled words
    for hyp in hyps:
        assert len(hyp) > 4 and set(hyp) <= words


def test_hydra_config_trains_like_the_shell_recipe(trained, data, tmp_path):
    """fairseq-hydra-train with configs/wt103/hgrn_lm_base.yaml and the same tiny overrides gives the
    same losses, update by update, as train_wt103.sh (same seed, same data order, same model)."""
    _, _, _, first = trained
    model_keys = ("decoder_embed_dim", "decoder_layers", "glu_dim")
    overrides = [f"task.data={data}", f"common.user_dir={os.path.join(REPO, 'hgrn_fairseq')}",
                 f"checkpoint.save_dir={tmp_path / 'ckpt'}", f"common.tensorboard_logdir={tmp_path / 'tb'}",
                 f"hydra.run.dir={tmp_path / 'logs'}", "common.cpu=true", "optimization.max_update=2",
                 f"dataset.batch_size={TINY_BATCH}", "optimization.update_freq=[4]",
                 f"optimization.lr=[{TINY['lr']}]", f"lr_scheduler.warmup_updates={TINY['warmup_updates']}",
                 f"task.tokens_per_sample={TINY['tokens_per_sample']}", f"common.seed={TINY['seed']}",
                 "dataset.num_workers=0", "common.log_interval=1"]
    overrides += [f"model.{k}={TINY[k]}" for k in model_keys]
    proc = pyrun.run([sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", CONFIGS,
                      "--config-name", "hgrn_lm_base", *overrides], capture_output=True, text=True,
                     timeout=300, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert (tmp_path / "logs" / "hydra_train.log").exists() and num_updates(tmp_path / "ckpt" / "checkpoint_last.pt") == 2
    hydra_losses, shell_losses = train_losses(out), train_losses(first.stdout + first.stderr)
    assert set(hydra_losses) == {1, 2}
    assert all(hydra_losses[u] == shell_losses[u] for u in (1, 2)), (hydra_losses, shell_losses)


def test_extra_criterion_cross_entropy_trains_the_same(trained, data, tmp_path):
    """`train_wt103.sh hgrn_lm_base --criterion cross_entropy` (the header's way back to fairseq's
    criterion) trains with cross_entropy and logs the same losses as the recipe's linear_cross_entropy
    (same seed and data; fp32 on CPU, losses logged with 3 decimals)."""
    _, _, small, first = trained
    env = {"SAVE_DIR": str(tmp_path / "ckpt"), "LOG_DIR": str(tmp_path / "logs"), "BATCH_PER_GPU": str(TINY_BATCH)}
    proc = run_script("hgrn_lm_base", data, *small, "--max-update", "2", "--criterion", "cross_entropy", env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert criterion_of(tmp_path / "ckpt" / "checkpoint_last.pt") == ("cross_entropy", "CrossEntropyCriterion")
    plain, fused = train_losses(out), train_losses(first.stdout + first.stderr)
    assert set(plain) == {1, 2}
    assert [plain[u] for u in (1, 2)] == pytest.approx([fused[u] for u in (1, 2)], abs=2e-3), (plain, fused)
