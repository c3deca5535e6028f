"""scripts/train_lra.sh and its helpers: the recipes against the papers' tables, --dry-run commands, argument errors,
configs/lra in sync with the recipes, the results table, a CPU run end to end (train, resume, test JSON,
table) and a smoke run of bench/bench_lra.py."""
import importlib
import csv
import json
import os
import re
import sys
import time

import pytest

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does

from ..tasks.test_lra_format import write_tiny
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "train_lra.sh")
from hgrn_fairseq.recipes import lra as recipes

pytestmark = pytest.mark.integration

# the papers' LRA tables, written out again: lr, weight decay, warm-up, total, epochs, total batch, clip, paper accuracy
PAPERS = {
    ("listops", "hgrn1"): (5e-4, 0.01, 5000, 50000, 50, 128, 0.0, 59.95),
    ("text", "hgrn1"): (5e-3, 0.0, 10000, 50000, 32, 32, 0.0, 88.14),
    ("retrieval", "hgrn1"): (5e-3, 0.0, 312, 50000, 20, 64, 0.0, 94.23),
    ("image", "hgrn1"): (3e-3, 0.0, 30000, 50000, 100, 50, 0.0, 88.69),
    ("pathfinder", "hgrn1"): (2e-3, 0.0, 50000, 500000, 200, 128, 0.0, 92.92),
    ("pathx", "hgrn1"): (7.5e-4, 0.0, 150000, 500000, 100, 16, 0.0, 97.50),
    ("listops", "hgrn2"): (5e-4, 0.0, 5000, 50000, 50, 128, 0.0, 60.52),
    ("text", "hgrn2"): (5e-3, 0.0, 10000, 50000, 40, 64, 0.0, 88.97),
    ("retrieval", "hgrn2"): (5e-3, 0.0, 312, 50000, 20, 128, 1.0, 95.07),
    ("image", "hgrn2"): (3e-3, 0.0, 30000, 50000, 75, 64, 0.0, 89.33),
    ("pathfinder", "hgrn2"): (2e-3, 0.0, 50000, 500000, 100, 128, 0.0, 93.95),
    ("pathx", "hgrn2"): (7.5e-4, 0.0, 150000, 500000, 200, 256, 1.0, 98.12),
}


def run(args, env=None, timeout=120):
    return pyrun.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                     env=pyrun.script_env(dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))), cwd=REPO)


def flag(cmd, name):
    i = cmd.index(name)
    return cmd[i + 1]


@pytest.mark.parametrize("key", list(PAPERS))
def test_recipes_are_the_papers(key):
    task, model = key
    lr, wd, warm, total, epochs, batch, clip, acc = PAPERS[key]
    r = recipes.recipe(task, model)
    assert (r.lr, r.weight_decay, r.warmup, r.total, r.epochs, r.batch, r.clip, r.paper_accuracy) == \
        (lr, wd, warm, total, epochs, batch, clip, acc)
    assert r.precision == ("bf16" if model == "hgrn2" else "fp32")
    assert r.augment == (task == "image")
    args = recipes.fairseq_args(task, model)
    assert flag(args, "--lr") == repr(lr) and flag(args, "--weight-decay") == repr(wd)
    assert flag(args, "--warmup-updates") == str(warm) and flag(args, "--max-update") == str(total)
    assert flag(args, "--max-epoch") == str(epochs) and flag(args, "--batch-size") == str(batch)
    assert flag(args, "--seed") == "2222" and flag(args, "--clip-norm") == repr(clip)
    assert flag(args, "--arch") == f"{model}_lra_{task}" and flag(args, "--lr-scheduler") == "cosine"
    assert ("--bf16" in args) == (model == "hgrn2") and ("--augment" in args) == (task == "image")
    assert flag(args, "--best-checkpoint-metric") == "accuracy" and "--maximize-best-checkpoint-metric" in args
    # token tasks end every sequence with <eos> as the official harness's data do; --no-eos is the ablation
    assert ("--append-eos" in args) == (task in ("listops", "text", "retrieval"))
    assert "--append-eos" not in recipes.fairseq_args(task, model, eos=False)


def test_dry_run_prints_the_commands(tmp_path):
    p = run(["--dry-run", "listops", "hgrn1", str(tmp_path)], env={"NUM_GPUS": "0"})
    assert p.returncode == 0, p.stderr
    train, evaluate, results = p.stdout.strip().splitlines()
    assert "scripts/fairseq_train.py" in train and str(tmp_path) in train and "--task lra_text" in train
    assert "--arch hgrn1_lra_listops" in train and "--cpu" in train and "--tensorboard-logdir" in train
    assert "--append-eos" in train
    assert "lra_eval.py" in evaluate and "checkpoints/lra/listops_hgrn1/checkpoint_best.pt" in evaluate
    assert "--split test" in evaluate and "test_result.json" in evaluate
    assert "lra_results.py" in results
    # four GPUs: torchrun, the total batch of 128 split in four
    p = run(["--dry-run", "pathfinder", "hgrn2"], env={"NUM_GPUS": "4"})
    assert p.returncode == 0, p.stderr
    line = p.stdout.splitlines()[0]
    assert "torch.distributed.run --standalone --nproc_per_node 4" in line
    assert "--batch-size 32 --update-freq 1" in line and "--distributed-world-size 4" in line and "--bf16" in line
    assert "data-bin/lra/pathfinder" in line and "--task lra_image" in line and "--append-eos" not in line
    p = run(["--dry-run", "text", "hgrn1"], env={"NUM_GPUS": "0", "NO_EOS": "1"})
    assert p.returncode == 0, p.stderr
    assert "--task lra_text" in p.stdout and "--append-eos" not in p.stdout


def test_shortened_runs_compress_the_schedule():
    p = run(["--dry-run", "listops", "hgrn2"], env={"NUM_GPUS": "1", "MAX_UPDATE": "5000", "BATCH_PER_GPU": "32",
                                                    "TRAIN_MINUTES": "3"})
    assert p.returncode == 0, p.stderr
    line = p.stdout.splitlines()[0]
    assert "--warmup-updates 500 " in line and "--max-update 5000 " in line and "--max-epoch" not in line
    assert "--batch-size 32 --update-freq 4" in line and "--stop-time-hours 0.050000" in line


def test_truncated_runs_keep_the_papers_schedule():
    """SCHEDULE=truncate: the paper's warm-up and cosine period, stopped at MAX_UPDATE (Pathfinder's 50,000-update
    warm-up of a 500,000-update cosine), so the learning rate at every update is the paper's run's."""
    p = run(["--dry-run", "pathfinder", "hgrn2"], env={"NUM_GPUS": "1", "MAX_UPDATE": "20000", "SCHEDULE": "truncate"})
    assert p.returncode == 0, p.stderr
    line = p.stdout.splitlines()[0]
    assert "--warmup-updates 50000 " in line and "--max-update 20000 " in line and "--max-epoch" not in line
    assert "--lr-period-updates 450000" in line
    p = run(["--dry-run", "pathfinder", "hgrn2"], env={"NUM_GPUS": "1", "MAX_UPDATE": "20000"})
    assert "--warmup-updates 2000 " in p.stdout and "--lr-period-updates" not in p.stdout  # (compressed)
    p = run(["--dry-run", "pathfinder", "hgrn2"], env={"NUM_GPUS": "1"})  # the full run: nothing to cut
    assert "--warmup-updates 50000 " in p.stdout and "--max-update 500000 " in p.stdout
    assert "--lr-period-updates" not in p.stdout


def test_truncated_learning_rate_is_the_papers(tmp_path):
    """fairseq's cosine scheduler given the truncated flags sets the paper's rate at every update: linear from 0 to
    the peak over the warm-up, then 0.5 * peak * (1 + cos(pi * (t - warmup) / (total - warmup))) (written out here)."""
    import math

    from fairseq.optim import FairseqOptimizer
    from fairseq.optim.lr_scheduler.cosine_lr_scheduler import CosineLRScheduleConfig, CosineLRSchedule

    class Opt(FairseqOptimizer):  # the two methods the scheduler calls
        lr = None

        def __init__(self):
            pass

        def set_lr(self, lr):
            self.lr = lr

        def get_lr(self):
            return self.lr

    r = recipes.recipe("pathfinder", "hgrn2")
    flags = recipes.fairseq_args("pathfinder", "hgrn2", max_update=20000, truncate=True)
    get = lambda name: float(flags[flags.index(name) + 1])  # noqa: E731
    cfg = CosineLRScheduleConfig(warmup_updates=int(get("--warmup-updates")), warmup_init_lr=0.0, lr=[r.lr],
                                 min_lr=0.0, lr_period_updates=get("--lr-period-updates"),
                                 max_update=int(get("--max-update")))
    sched = CosineLRSchedule(cfg, Opt())
    for t in (0, 1000, 12500, 19999, 50000, 100000, 275000, 499999):
        want = r.lr * t / r.warmup if t < r.warmup else \
            0.5 * r.lr * (1 + math.cos(math.pi * (t - r.warmup) / (r.total - r.warmup)))
        assert math.isclose(sched.step_update(t), want, rel_tol=1e-9, abs_tol=1e-12), t


@pytest.mark.parametrize("args, env, message", [
    (["lisops", "hgrn1"], {}, "unknown TASK 'lisops': use one of: listops text retrieval image pathfinder pathx"),
    (["listops", "hgrn3"], {}, "unknown MODEL 'hgrn3': use hgrn1 or hgrn2"),
    (["listops"], {}, "usage: bash scripts/train_lra.sh TASK MODEL"),
    (["listops", "hgrn1"], {"NUM_GPUS": "3"}, "batch of 128 cannot be split evenly over 3 processes"),
    (["listops", "hgrn1"], {"MAX_UPDATE": "many"}, "MAX_UPDATE='many' must be a positive whole number"),
    (["listops", "hgrn1"], {"NO_EOS": "yes"}, "NO_EOS='yes' must be 0 or 1"),
    (["listops", "hgrn1"], {"SCHEDULE": "cut"}, "SCHEDULE='cut' must be compress or truncate"),
    (["listops", "hgrn1"], {"SCHEDULE": "truncate"}, "SCHEDULE=truncate needs MAX_UPDATE"),
    (["listops", "hgrn1"], {"BATCH_PER_GPU": "48", "NUM_GPUS": "1"}, "BATCH_PER_GPU=48 does not divide the 128"),
    (["listops", "hgrn1", "/nonexistent/lra"], {"NUM_GPUS": "0"},
     "DATA_DIR /nonexistent/lra does not exist: prepare it with: python data_prep/prepare_lra.py listops "
     "--source ~/data/lra_release.gz --dest /nonexistent/lra; offline: python data_prep/lra_listops.py"),
    (["text", "hgrn1", "/nonexistent/lra"], {"NUM_GPUS": "0"},
     "prepare it with: python data_prep/prepare_lra.py text --source ~/data/aclImdb_v1.tar.gz --dest /nonexistent/lra "
     "(docs/lra.md"),
])
def test_argument_errors_name_the_fix(args, env, message):
    p = run(args, env=env)
    assert p.returncode == 2
    assert message in p.stderr, p.stderr


def test_missing_data_hint_gives_commands_that_work(tmp_path):
    """The missing-data error's commands, run as printed (from another folder: the scripts' paths are then
    absolute): the archive command gets past argument parsing to prepare_lra.py's own "download from" line,
    and the offline commands (with a smaller generated set) make the folder that train_lra.sh asked for."""
    import shlex

    dest = tmp_path / "data bin"  # (a space: the hint quotes it)
    p = pyrun.run(["bash", SCRIPT, "listops", "hgrn1", str(dest)], capture_output=True, text=True, timeout=120,
                  env=pyrun.script_env(dict(os.environ, NUM_GPUS="0", OMP_NUM_THREADS="1")), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    hint = re.search(r"prepare it with: (.*) \(docs/lra.md", p.stderr).group(1)
    archive, offline = hint.split("; offline: ")

    def command(text):
        argv = [os.path.expanduser(a) for a in shlex.split(text)]
        assert argv[0] == "python" and os.path.isabs(argv[1]), argv
        return [sys.executable, *argv[1:]]

    env = pyrun.script_env(dict(os.environ, OMP_NUM_THREADS="1"))
    r = pyrun.run(command(archive), capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "the following arguments are required" not in r.stderr, r.stderr
    assert "lra_release.gz not found" in r.stderr and "download from https://" in r.stderr, r.stderr
    generate, prepare = offline.split(" && ")
    small = ["--train", "40", "--valid", "8", "--test", "8", "--workers", "1", "--no-progress"]
    r = pyrun.run(command(generate) + small, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = pyrun.run(command(prepare), capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.load(open(dest / "meta.json"))["task"] == "listops"


def test_cpu_runs_set_omp_num_threads_unless_given():
    """On CPU the commands run with OMP_NUM_THREADS=1 (PyTorch's default pool of threads makes these small
    models several times slower); a value the user set stands; on GPUs nothing is added."""
    def dry(env, *extra):
        base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        base.update(env)
        p = pyrun.run(["bash", SCRIPT, "--dry-run", "listops", "hgrn1", "data", *extra], capture_output=True,
                      text=True, timeout=120, env=pyrun.script_env(base), cwd=REPO)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()

    train, evaluate, results = dry({"NUM_GPUS": "0"})
    assert train.startswith("env OMP_NUM_THREADS=1 ") and evaluate.startswith("env OMP_NUM_THREADS=1 ")
    assert dry({"NUM_GPUS": "0", "OMP_NUM_THREADS": "3"})[0].startswith("env OMP_NUM_THREADS=3 ")
    assert dry({"NUM_GPUS": "2"}, "--cpu")[0].startswith("env OMP_NUM_THREADS=1 ")  # --cpu among the extra arguments
    assert "OMP_NUM_THREADS" not in " ".join(dry({"NUM_GPUS": "2"}))


def test_configs_match_the_recipes(tmp_path):
    written = recipes.write_configs(str(tmp_path))
    assert len(written) == 12
    for path in written:
        committed = os.path.join(REPO, "configs", "lra", os.path.basename(path))
        with open(path) as a, open(committed) as b:
            assert a.read() == b.read(), f"{committed} is stale: run python scripts/recipes.py write-configs"
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(os.path.join(REPO, "configs", "lra", "retrieval_hgrn2.yaml"))
    lr, wd, warm, total, epochs, batch, clip, _ = PAPERS[("retrieval", "hgrn2")]
    assert cfg.optimization.lr == [lr] and cfg.optimization.clip_norm == clip and cfg.common.bf16 is True
    assert cfg.lr_scheduler.warmup_updates == warm and cfg.dataset.batch_size == batch and cfg.common.seed == 2222
    assert cfg.model.encoder_embed_dim == 256 and cfg.model.norm == "syncbatch" and cfg.model.expand_ratio == 2
    assert cfg.task.append_eos is True and cfg.model.max_positions == 4000
    assert OmegaConf.load(os.path.join(REPO, "configs", "lra", "image_hgrn1.yaml")).task.get("append_eos") is None


def test_results_table_keeps_the_recipe_seed_and_lists_other_seeds(tmp_path):
    results = importlib.import_module("hgrn_fairseq.recipes.lra_results")
    # run folders sort so that the other seed comes last: it must not replace the recipe's run in the table
    for folder, seed, acc in (("listops_hgrn1", 2222, 41.5), ("listops_hgrn1_s2", 2, 47.25), ("old", None, 12.0),
                              ("listops_hgrn1_s2222_unmasked", 2222, 44.0), ("listops_hgrn1_s2222_eos", 2222, 52.5),
                              ("listops_hgrn1_s2222_noeos", 2222, 40.0), ("listops_hgrn1_s2222_layernorm_eos", 2222, 58.0),
                              ("listops_hgrn1_s2222_eos_layers4", 2222, 61.0), ("listops_hgrn1_s2222_eos_lr", 2222, 62.0)):
        record = {"arch": "hgrn1_lra_listops", "accuracy": acc, "num_updates": 37500, "planned_updates": 50000,
                  "data_comparable": False, "data_source": "generator", "precision": "fp32", "device": "NVIDIA H200",
                  "date": "1970-01-01T00:00:00Z", "examples": 2000, "seed": seed,
                  "unmasked_padding": folder.endswith("_unmasked")}
        record["append_eos"] = not folder.endswith("_noeos")  # (the recipe's)
        record.update(norm="syncbatch", recipe_norm="syncbatch")
        if "layernorm" in folder:  # another norm than the arch's (--norm layer): sorts after the recipe's run
            record["norm"] = "layer"
        record["arch_overrides"] = record["recipe_overrides"] = {}  # (empty for the recipe)
        if folder.endswith("_layers4"):  # another model option than the arch's: sorts after the recipe's run
            record["arch_overrides"] = {"encoder_layers": 4, "glu_multiple": 2.0}
        if folder.endswith("_lr"):  # another training setting than the recipe's: sorts after the recipe's run
            record["recipe_overrides"] = {"lr": 0.001}
        if folder == "listops_hgrn1":  # an older result without the append_eos key
            record.pop("append_eos")
        if seed is None:  # a result from before the seed was recorded: the recipe's, of a pixel task
            record.pop("seed"), record.pop("append_eos")
            record["arch"] = "hgrn1_lra_image"
        os.makedirs(tmp_path / folder)
        with open(tmp_path / folder / "test_result.json", "w") as f:
            json.dump(record, f)
    assert results.main([str(tmp_path)]) == 0
    md = (tmp_path / "results.md").read_text()
    assert "| HGRN1 | listops | 52.50 | 59.95 | -7.45 |" in md  # the run with <eos>, seed 2222, masked
    assert "| HGRN1 | image | 12.00 |" in md
    assert "Other runs (the table has the recipe's: seed 2222, padding masked, <eos> appended on token tasks):" in md
    assert "- HGRN1 listops, seed 2: 47.25 after 37,500 updates (planned 50,000), NVIDIA H200" in md
    assert "- HGRN1 listops, seed 2222, unmasked padding: 44.00 after 37,500 updates" in md
    assert "- HGRN1 listops, seed 2222, no <eos>: 41.50 after 37,500 updates" in md
    assert "- HGRN1 listops, seed 2222, no <eos>: 40.00 after 37,500 updates" in md
    assert "- HGRN1 listops, seed 2222, layer norms instead of syncbatch: 58.00 after 37,500 updates" in md
    assert ("- HGRN1 listops, seed 2222, encoder_layers 4 (not the arch's), glu_multiple 2.0 (not the arch's): "
            "61.00 after 37,500 updates") in md
    assert "- HGRN1 listops, seed 2222, lr 0.001 (not the recipe's): 62.00 after 37,500 updates" in md
    # batch and sync-batch norm are one norm (on one GPU the same computation); results without the keys count
    assert not results.other_norm({"norm": "batch", "recipe_norm": "syncbatch"})
    assert results.other_norm({"norm": "batch", "recipe_norm": "layer"}) and not results.other_norm({})
    # a token-task result from before both the seed and <eos> were recorded is listed, not a crash
    os.makedirs(tmp_path / "older")
    with open(tmp_path / "older" / "test_result.json", "w") as f:
        json.dump({"arch": "hgrn2_lra_text", "accuracy": 60.0, "num_updates": 100}, f)
    assert results.main([str(tmp_path)]) == 0
    assert "- HGRN2 text, seed 2222, no <eos>: 60.00 after 100 updates" in (tmp_path / "results.md").read_text()
    with open(tmp_path / "results.csv") as f:
        listops = [r for r in csv.DictReader(f) if r["task"] == "listops" and r["model"] == "hgrn1"]
    assert [r["ours"] for r in listops] == ["52.5"]
    # Pathfinder at an easier difficulty (prepare_lra.py --contour-length 6) is listed, never the table's cell
    for folder, contour, acc in (("pathfinder6_hgrn2", 6, 81.0), ("pathfinder_hgrn2", 14, 50.5)):
        os.makedirs(tmp_path / folder)
        with open(tmp_path / folder / "test_result.json", "w") as f:
            json.dump({"arch": "hgrn2_lra_pathfinder", "accuracy": acc, "num_updates": 4000, "planned_updates": 4000,
                       "seed": 2222, "append_eos": False, "contour_length": contour, "data_comparable": False}, f)
    assert results.main([str(tmp_path)]) == 0
    md = (tmp_path / "results.md").read_text()
    assert "| HGRN2 | pathfinder | 50.50 |" in md
    assert ("- HGRN2 pathfinder, seed 2222, contour length 6 (an easier Pathfinder than LRA's 14): 81.00 after "
            "4,000 updates") in md


def gpu_lra_functions(*names):
    """bench/gpu_lra.sh's shell functions of these names, cut out of the script (to run them alone)."""
    text = open(os.path.join(REPO, "bench", "gpu_lra.sh")).read()
    return "\n".join(re.search(rf"^{name}\(\) \{{.*?^\}}$", text, re.M | re.S).group(0) for name in names)


def gpu_lra_slice_plan(minutes, now, call_s=None, end_s=None):
    """bench/gpu_lra.sh's slice_plan function, cut out of the script and run with el() answering `now`."""
    func = gpu_lra_functions("slice_plan")
    env = dict(os.environ, MINUTES=str(minutes))
    env.pop("LRA_CALL_S", None), env.pop("LRA_END_S", None)
    if call_s is not None:
        env["LRA_CALL_S"] = str(call_s)
    if end_s is not None:
        env["LRA_END_S"] = str(end_s)
    r = pyrun.run(["bash", "-c", f"el() {{ echo {now}; }}\n{func}\nslice_plan"], capture_output=True,
                  text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def gpu_lra_spec(spec, task="listops"):
    """bench/gpu_lra.sh's run_id and spec_args for one LRA_MODELS entry, cut out of the script."""
    funcs = gpu_lra_functions("run_id", "spec_args")
    r = pyrun.run(["bash", "-c", f'{funcs}\nrun_id "$1" "$2"; spec_args "$2"', "x", task, spec],
                  capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout.split("\n")[0], " ".join(r.stdout.split("\n")[1:]).strip(), r.stderr.strip()


def test_gpu_lra_model_specs_name_their_runs_and_flags():
    assert gpu_lra_spec("hgrn1") == (0, "listops_hgrn1", "", "")
    assert gpu_lra_spec("hgrn1:2") == (0, "listops_hgrn1_s2", "--seed 2", "")
    assert gpu_lra_spec("hgrn1:2222:unmasked") == (0, "listops_hgrn1_s2222_unmasked", "--unmasked-padding --seed 2222", "")
    assert gpu_lra_spec("hgrn2:2222:eos") == (0, "listops_hgrn2_s2222_eos", "--append-eos --max-positions 2048 --seed 2222", "")
    assert gpu_lra_spec("hgrn1:2222:noeos") == (0, "listops_hgrn1_s2222_noeos", "--seed 2222", "")
    # the paper's schedule cut at MAX_UPDATE (train_one passes SCHEDULE=truncate): no fairseq flag of its own
    assert gpu_lra_spec("hgrn2:2222:truncate", "pathfinder") == (0, "pathfinder_hgrn2_s2222_truncate", "--seed 2222", "")
    # the official harness's setting: both flags, joined by '+'
    assert gpu_lra_spec("hgrn1:2222:unmasked+eos") == (
        0, "listops_hgrn1_s2222_unmasked_eos", "--unmasked-padding --append-eos --max-positions 2048 --seed 2222", "")
    assert gpu_lra_spec("hgrn1:2222:unmasked+noeos") == (0, "listops_hgrn1_s2222_unmasked_noeos", "--unmasked-padding --seed 2222", "")
    rc, _, _, err = gpu_lra_spec("hgrn1:2:pads")
    assert rc == 1 and "'hgrn1:2:pads' in LRA_MODELS: the third field can only be 'unmasked', 'eos', 'noeos', 'truncate', 'scratchK' (K 1-99), 'fixedN' (N 10-9999), 'scanpads', 'layernorm', 'scan1d', 'nolb', 'maxpool', 'layersN' (N 1-9), 'lrXe-Y' (e.g. lr2e-4), 'dropX' (e.g. drop0.1), 'wdX' (e.g. wd0.05) or 'repocfg'" in err
    # a 2-D task's raster as one 1-D sequence (the run id keeps the task, pathfinder6 among them)
    assert gpu_lra_spec("hgrn2:2222:scan1d", task="pathfinder6") == (
        0, "pathfinder6_hgrn2_s2222_scan1d", "--scan-2d none --seed 2222", "")
    # the Pathfinder ablations: no lower bounds, fewer layers, another peak rate
    assert gpu_lra_spec("hgrn2:2222:nolb+layers2+lr2e-4", task="pathfinder6") == (
        0, "pathfinder6_hgrn2_s2222_nolb_layers2_lr2e-4", "--no-lower-bound --encoder-layers 2 --lr 2e-4 --seed 2222", "")
    assert gpu_lra_spec("hgrn1:2:lr1.5e-3")[2] == "--lr 1.5e-3 --seed 2"
    assert gpu_lra_spec("hgrn2:202:maxpool", task="pathfinder6")[1:3] == (
        "pathfinder6_hgrn2_s202_maxpool", "--pool max --seed 202")
    # regularisers on the masked ListOps recipe: residual dropout and weight decay
    assert gpu_lra_spec("hgrn2:2222:eos+drop0.1") == (
        0, "listops_hgrn2_s2222_eos_drop0.1", "--append-eos --max-positions 2048 --dropout 0.1 --seed 2222", "")
    assert gpu_lra_spec("hgrn2:202:eos+wd0.05")[1:3] == (
        "listops_hgrn2_s202_eos_wd0.05", "--append-eos --max-positions 2048 --weight-decay 0.05 --seed 202")
    for bad in ("layers12", "lr0.001", "lr2e4", "drop1", "drop0.", "drop.1", "wd1", "wd0.1234"):
        assert gpu_lra_spec(f"hgrn2:2:{bad}")[0] == 1, bad
    # scratch positions after the token (masked padding): scratchK, K 1-99
    assert gpu_lra_spec("hgrn1:2222:scratch16") == (0, "listops_hgrn1_s2222_scratch16", "--scratch-positions 16 --seed 2222", "")
    # every batch padded to a fixed length: fixedN, N 10-9999
    assert gpu_lra_spec("hgrn1:2222:unmasked+eos+fixed2001") == (
        0, "listops_hgrn1_s2222_unmasked_eos_fixed2001",
        "--unmasked-padding --append-eos --max-positions 2048 --pad-to-length 2001 --seed 2222", "")
    assert gpu_lra_spec("hgrn1:2222:scanpads+eos+fixed2001") == (
        0, "listops_hgrn1_s2222_scanpads_eos_fixed2001",
        "--scan-padding --append-eos --max-positions 2048 --pad-to-length 2001 --seed 2222", "")
    # layer norms instead of the arch's batch norms
    assert gpu_lra_spec("hgrn1:2222:layernorm+eos") == (
        0, "listops_hgrn1_s2222_layernorm_eos", "--norm layer --append-eos --max-positions 2048 --seed 2222", "")
    # the public repository's HGRN1 ListOps config (its own schedule and size; HGRN1 only)
    assert gpu_lra_spec("hgrn1:2222:repocfg+eos") == (
        0, "listops_hgrn1_s2222_repocfg_eos",
        "--encoder-embed-dim 128 --glu-multiple 2 --norm layer --lr 0.001 --weight-decay 0.01 --warmup-updates 1000 "
        "--batch-size 50 --batch-size-valid 50 --max-update 50000 --append-eos --max-positions 2048 --seed 2222", "")
    rc, _, _, err = gpu_lra_spec("hgrn2:2222:repocfg")
    assert rc == 1 and "'repocfg' is the public repository's HGRN1 ListOps config (model hgrn1)" in err
    for bad in ("layer", "scratch", "scratch0", "scratch100", "scratchx", "fixed", "fixed0", "fixed9", "fixed10000", "fixed01"):
        rc, _, _, err = gpu_lra_spec(f"hgrn1:2:{bad}")
        assert rc == 1 and "the third field can only be" in err, bad
    rc, _, _, err = gpu_lra_spec("hgrn1:2:unmasked+pads")
    assert rc == 1 and "'hgrn1:2:unmasked+pads' in LRA_MODELS: the third field" in err
    rc, _, _, err = gpu_lra_spec("hgrn1:2:eos+noeos")
    assert rc == 1 and "asks for both 'eos' and 'noeos'" in err


@pytest.mark.parametrize("spec, expected", [("hgrn1:2:noeos", "1"), ("hgrn1:2:unmasked+noeos", "1"),
                                            ("hgrn1:2:eos", "0"), ("hgrn1", "0"), ("hgrn1:2:unmasked", "0")])
def test_gpu_lra_noeos_spec_sets_no_eos(spec, expected):
    """train_one's NO_EOS for the spec: 1 exactly when 'noeos' is one of its flags."""
    text = open(os.path.join(REPO, "bench", "gpu_lra.sh")).read()
    expr = re.search(r'NO_EOS=(\$\(case .*?esac\))', text).group(1)
    r = pyrun.run(["bash", "-c", f'set -- a b "$1"; echo {expr}', "x", spec], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == expected, (spec, r.stdout, r.stderr)


@pytest.mark.parametrize("jobs", ["text/hgrn1", "pathfinder", "listops/hgrn2:2222:eos imdb/hgrn1"])
def test_gpu_lra_jobs_must_name_task_and_spec(tmp_path, jobs):
    """LRA_JOBS entries are TASK/RUN with a task the script prepares data for; anything else stops the
    script at once (exit 2) with the entry named, before any data or training."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), LRA_WORK=str(tmp_path / "work"), LRA_PARTS="none", LRA_JOBS=jobs)
    r = pyrun.run(["bash", os.path.join(REPO, "bench", "gpu_lra.sh")], capture_output=True, text=True,
                  env=pyrun.script_env(env), timeout=120)
    bad = [j for j in jobs.split() if not j.startswith(("listops/", "pathfinder/"))][0]
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"LRA_JOBS entry '{bad}' is not TASK/RUN with TASK listops, pathfinder, pathfinder6 or pathfinder9" in r.stderr
    assert not (tmp_path / "work" / "data-bin").exists() and "train" not in r.stdout


def test_gpu_lra_easier_pathfinder_names_and_cnn_control(tmp_path):
    """Task pathfinderN is the generator's and prepare_lra.py's contour length N (pathfinder: LRA's 14); the
    pf_cnn part runs the CNN control on every prepared Pathfinder data-bin, in the background, and waits for it."""
    import json

    funcs = gpu_lra_functions("contour_of")
    r = pyrun.run(["bash", "-c", f'{funcs}\nfor t in pathfinder pathfinder6 pathfinder9; do contour_of $t; done'],
                  capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == ["14", "6", "9"], r.stderr
    from hgrn_fairseq.preprocessing import lra_pathfinder
    from data_prep import prepare_lra

    lra_pathfinder.generate(str(tmp_path / "gen"), num=20, seed=3, workers=1, progress=False, log=lambda m: None,
                            contour_length=6)
    prepare_lra.prepare("pathfinder", str(tmp_path / "gen"), str(tmp_path / "work" / "data-bin" / "pathfinder6"),
                        log=lambda m: None, contour_length=6)
    env = dict(os.environ, OUT=str(tmp_path / "out"), LRA_WORK=str(tmp_path / "work"), LRA_PARTS="pf_cnn",
               LRA_PF_CNN_ARGS="--epochs 1 --width 4 --device cpu", OMP_NUM_THREADS="1")
    r = pyrun.run(["bash", os.path.join(REPO, "bench", "gpu_lra.sh")], capture_output=True, text=True,
                  env=pyrun.script_env(env), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "== pf_cnn rc=0" in r.stdout, r.stdout[-3000:]
    control = json.loads((tmp_path / "out" / "pf_cnn_control.json").read_text())
    assert [os.path.basename(e["data_dir"].rstrip("/")) for e in control] == ["pathfinder6"]
    assert control[0]["splits"] == {"train": 16, "valid": 2, "test": 2} and control[0]["status"] == "done"

def test_gpu_lra_slices_end_before_the_call_does():
    # no call length: the slice is the minutes asked for, killed 150 s after them
    assert gpu_lra_slice_plan(7.2, now=90) == ["7.200", "582"]
    # a 575 s call at 95 s, 120 s kept for the test evaluation: 360 s of training, not 432; killed 15 s
    # before the end
    assert gpu_lra_slice_plan(7.2, now=95, call_s=575) == ["6.000", "465"]
    # enough time: the minutes asked for stand, the kill still comes before the call's end
    assert gpu_lra_slice_plan(5, now=10, call_s=575) == ["5.000", "450"]
    assert gpu_lra_slice_plan(5, now=10, call_s=575, end_s=300) == ["4.417", "450"]
    # under a minute left: no slice at all
    assert gpu_lra_slice_plan(7.2, now=400, call_s=575) == ["none"]


def test_results_table(tmp_path):
    results = importlib.import_module("hgrn_fairseq.recipes.lra_results")
    for task, model, acc in (("listops", "hgrn1", 58.45), ("pathfinder", "hgrn2", 70.0)):
        os.makedirs(tmp_path / f"{task}_{model}")
        with open(tmp_path / f"{task}_{model}" / "test_result.json", "w") as f:
            json.dump({"arch": f"{model}_lra_{task}", "accuracy": acc, "num_updates": 3000, "planned_updates": 3000,
                       "append_eos": task == "listops", "schedule": "compressed" if task == "listops" else "truncated",
                       "data_comparable": task == "listops", "data_source": None if task == "listops" else "generator",
                       "precision": "fp32", "device": "NVIDIA H100", "date": "1970-01-01T00:00:00Z",
                       "examples": 2000}, f)
    assert results.main([str(tmp_path)]) == 0
    md = (tmp_path / "results.md").read_text()
    assert "| HGRN1 | listops | 58.45 | 59.95 | -1.50 | 3,000 (3,000; 50,000) | 2000 | LRA |" in md
    assert "| HGRN2 | pathfinder | 70.00 | 93.95 | -23.95 | 3,000 (3,000, the recipe's schedule cut there; 500,000) |" in md
    assert "generated (generator)" in md
    assert "HGRN1 average: ours - (needs all six tasks on LRA's data), paper 86.91" in md
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 12 and rows[0]["task"] == "listops" and rows[0]["ours"] == "58.45"
    assert rows[0]["schedule"] == "compressed" and [r["schedule"] for r in rows if r["ours"] == "70.0"] == ["truncated"]


def test_cpu_run_end_to_end_and_resume(tmp_path):
    data = str(tmp_path / "data")
    write_tiny(data, "listops", sizes=(64, 24, 20))
    env = {"NUM_GPUS": "0", "MAX_UPDATE": "12", "SAVE_DIR": str(tmp_path / "runs" / "listops_hgrn1"),
           "SAVE_INTERVAL_UPDATES": "6"}
    tiny = ["--encoder-embed-dim", "8", "--encoder-layers", "1", "--batch-size", "16", "--batch-size-valid", "16"]
    p = run(["listops", "hgrn1", data, *tiny], env=env, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    result = json.load(open(tmp_path / "runs" / "listops_hgrn1" / "test_result.json"))
    assert result["examples"] == 20 and result["split"] == "test" and result["num_updates"] == 12
    assert result["planned_updates"] == 12 and result["paper_accuracy"] == 59.95
    assert result["data_comparable"] is False  # the tiny data say so in meta.json
    # the recipe's run (lra_results.py keeps other seeds and the ablations out of the table): <eos> appended
    assert result["seed"] == 2222 and result["unmasked_padding"] is False and result["append_eos"] is True
    assert "lra_eval: listops hgrn1_lra_listops: test accuracy" in p.stdout
    assert (tmp_path / "runs" / "results.md").is_file() and (tmp_path / "runs" / "results.csv").is_file()
    assert (tmp_path / "runs" / "listops_hgrn1" / "logs" / "train.log").is_file()
    assert (tmp_path / "runs" / "listops_hgrn1" / "finished_max_update_12").is_file()
    # the best checkpoint scored again by scripts/lra_eval.py gives the recorded result
    s = pyrun.run([sys.executable, os.path.join(REPO, "scripts", "lra_eval.py"),
                   str(tmp_path / "runs" / "listops_hgrn1" / "checkpoint_best.pt"), "--data", data,
                   "--split", "test", "--cpu", "--json", str(tmp_path / "result.json")],
                  capture_output=True, text=True, timeout=300, cwd=REPO)
    assert s.returncode == 0, (s.stdout + s.stderr)[-3000:]
    again = json.load(open(tmp_path / "result.json"))
    assert (again["correct"], again["examples"], again["num_updates"]) == (
        result["correct"], result["examples"], result["num_updates"])
    # 12 updates = 3 epochs of 4, validations at each epoch end and the save at 6: once each (fairseq 0.12
    # alone writes epoch n's lines n times into --log-file)
    log = open(tmp_path / "runs" / "listops_hgrn1" / "logs" / "train.log").read().splitlines()
    valid = [line for line in log if "valid on 'valid' subset" in line]
    assert [int(re.search(r"num_updates (\d+)", line).group(1)) for line in valid] == [4, 6, 8, 12], valid
    # tensorboard (the entry point's --tensorboard-logdir; the writer needs the `tensorboard` dependency, without it
    # fairseq only warns): the same validations, with accuracy, and the training curves
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tb = tmp_path / "runs" / "listops_hgrn1" / "logs" / "tensorboard"
    scalars = {}
    for split in ("train", "valid"):
        assert (tb / split).is_dir(), f"no tensorboard events for {split} under {tb}"
        events = EventAccumulator(str(tb / split))
        events.Reload()
        scalars[split] = events
    assert {"loss", "accuracy", "lr"} <= set(scalars["train"].Tags()["scalars"])
    assert [e.step for e in scalars["valid"].Scalars("accuracy")] == [4, 6, 8, 12]
    logged = [float(re.search(r"\| accuracy ([\d.]+)", line).group(1)) for line in valid]
    assert [round(e.value, 2) for e in scalars["valid"].Scalars("accuracy")] == [round(v, 2) for v in logged]
    # rerun of a finished run: no training (fairseq would make a 13th update), straight to the test
    p = run(["listops", "hgrn1", data, *tiny], env=dict(env, SKIP_TEST="1"), timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "training already reached --max-update 12" in p.stderr
    # a longer plan stretches the compressed warm-up and cosine of every later update: refused in one line
    # unless asked for (--reset-lr-scheduler); asked for, it resumes from checkpoint_last.pt at update 12
    p = run(["listops", "hgrn1", data, *tiny], env=dict(env, SKIP_TEST="1", MAX_UPDATE="14"), timeout=300)
    assert p.returncode != 0
    refused = [line for line in p.stderr.splitlines() if "trained with other settings" in line]
    assert len(refused) == 1 and "cosine period" in refused[0] and "--reset-lr-scheduler" in refused[0], p.stderr[-3000:]
    p = run(["listops", "hgrn1", data, *tiny, "--reset-lr-scheduler"], env=dict(env, SKIP_TEST="1", MAX_UPDATE="14"),
            timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert re.search(r"Loaded checkpoint \S+checkpoint_last.pt \(epoch \d+ @ 12 updates\)", p.stdout + p.stderr)
    log = open(tmp_path / "runs" / "listops_hgrn1" / "logs" / "train.log").read()  # fairseq_cli.train's messages
    assert "Stopping training due to num_updates: 14 >= max_update: 14" in log
    # bench/lra_padding_sensitivity.py on the masked model: padding an example to the task's longest
    # changes no prediction and no logit beyond rounding (the unmasked ablation's do: docs/lra.md)
    sens = importlib.import_module("bench.lra_padding_sensitivity")
    r = sens.measure(str(tmp_path / "runs" / "listops_hgrn1" / "checkpoint_last.pt"), data, "test", 6, None, True,
                     pad_by=(1,))
    assert r["examples"] == 6 and r["unmasked_padding"] is False and r["append_eos"] is True
    assert r["pad_to"] > r["example_lengths"][1]  # the padding is real
    assert r["predictions_changed"] == 0 and r["max_abs_logit_diff"] < 1e-5
    assert r["accuracy_alone"] == r["accuracy_padded"] == r["accuracy_padded_by"]["1"]


def _gpus() -> int:
    import torch

    return 0 if os.environ.get("TRITON_INTERPRET") == "1" else torch.cuda.device_count()


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs (torchrun + NCCL; TRITON_INTERPRET unset)")
def test_two_gpu_run_end_to_end_and_resume(tmp_path):
    """The entry point on 2 GPUs: torchrun starts two processes, the recipe's sync-batch norms all-reduce
    over NCCL inside DDP, the run trains, saves, resumes on a longer plan (a schedule changed on purpose:
    --reset-lr-scheduler, as the CPU test above checks) and writes the test JSON."""
    import torch

    data = str(tmp_path / "data")
    write_tiny(data, "listops", sizes=(128, 24, 20))
    save = tmp_path / "runs" / "listops_hgrn1"
    env = {"NUM_GPUS": "2", "MAX_UPDATE": "12", "SAVE_DIR": str(save), "SAVE_INTERVAL_UPDATES": "6",
           "NUM_WORKERS": "0"}
    tiny = ["--encoder-embed-dim", "16", "--encoder-layers", "2", "--batch-size", "16", "--batch-size-valid", "16"]
    p = run(["listops", "hgrn1", data, *tiny], env=env, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "torch.distributed.run --standalone --nproc_per_node 2" in open(save / "logs" / "command.txt").read()
    assert "training on 2 devices" in out, out[-3000:]
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["cfg"]["distributed_training"]["distributed_world_size"] == 2
    model_cfg = state["cfg"]["model"]  # (a dict in these checkpoints; a Namespace in older fairseq ones)
    norm = model_cfg["norm"] if isinstance(model_cfg, dict) else model_cfg.norm
    assert norm == "syncbatch" and any(k.endswith("running_mean") for k in state["model"])
    result = json.load(open(save / "test_result.json"))
    assert result["examples"] == 20 and result["num_updates"] == 12 and (save / "finished_max_update_12").is_file()
    p = run(["listops", "hgrn1", data, *tiny, "--reset-lr-scheduler"], env=dict(env, SKIP_TEST="1", MAX_UPDATE="14"),
            timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert re.search(r"Loaded checkpoint \S+checkpoint_last.pt \(epoch \d+ @ 12 updates\)", out), out[-3000:]
    assert "Stopping training due to num_updates: 14 >= max_update: 14" in open(save / "logs" / "train.log").read()


def test_bench_lra_smoke(tmp_path):
    bench = importlib.import_module("bench.bench_lra")
    assert bench.main(["--out", str(tmp_path), "--quick", "--device", "cpu", "--steps", "1", "--tasks",
                       "retrieval,pathx", "--models", "hgrn2,transformer@hgrn2"]) == 0
    rows = json.load(open(tmp_path / "bench_lra.json"))["rows"]
    assert [(r["task"], r["model"]) for r in rows] == [("retrieval", "hgrn2"), ("retrieval", "transformer@hgrn2"),
                                                       ("pathx", "hgrn2"), ("pathx", "transformer@hgrn2")]
    assert all("error" not in r for r in rows), rows
    assert rows[2]["scan_2d"] == "series" and rows[3]["mixer"] == "attention"
    assert "| pathx | hgrn2 | hgru2 | bf16 |" in (tmp_path / "bench_lra.md").read_text()


def test_hydra_config_trains(tmp_path):
    """configs/lra/listops_hgrn2.yaml through fairseq-hydra-train (tiny overrides: width, updates, CPU)."""
    data = str(tmp_path / "data")
    write_tiny(data, "listops", sizes=(32, 16, 16))
    save = tmp_path / "ck"
    cmd = [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", os.path.join(REPO, "configs", "lra"),
           "--config-name", "listops_hgrn2", f"task.data={data}", f"common.user_dir={REPO}/hgrn_fairseq",
           "optimization.max_update=3", "common.cpu=true", "common.bf16=false", "model.encoder_embed_dim=8",
           "model.encoder_layers=1", "dataset.batch_size=16", "dataset.batch_size_valid=16",
           f"checkpoint.save_dir={save}", "common.tensorboard_logdir=null", f"hydra.run.dir={save}/logs"]
    p = pyrun.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "examples 16" in out and re.search(r"'_name': '?hgrn_lra", out) and re.search(r"'token_mixer': '?hgru2", out)
    assert (save / "checkpoint_best.pt").is_file()


def test_gpu_lra_concurrent_jobs_do_not_wait_for_other_background_processes(tmp_path):
    """train_jobs with LRA_CONCURRENT=1 waits for its training jobs only: gpu_lra.sh may have the CNN
    control running in the background, and a bare `wait` would block on it until the call's time limit."""
    funcs = gpu_lra_functions("run_id", "train_jobs")
    script = f"""{funcs}
train_one() {{ sleep 0.3; echo "trained $1 $3"; }}
task_updates() {{ echo 10; }}
python3() {{ :; }}
sleep 120 &
sampler=$!
mkdir -p "$OUT/runs"
train_jobs listops/hgrn1 listops/hgrn2:2
kill $sampler
"""
    t0 = time.monotonic()
    r = pyrun.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                  env=dict(os.environ, LRA_CONCURRENT="1", LRA_MPS="0", OUT=str(tmp_path), WORK=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 20
    assert "trained listops hgrn1" in r.stdout and "trained listops hgrn2:2" in r.stdout
    assert "-- listops_hgrn1\n" in r.stdout and "-- listops_hgrn2_s2\n" in r.stdout


def test_eval_tells_the_schedules_apart_and_flags_a_wrong_period():
    """lra_eval records a shortened run's schedule (compressed / truncated) and lists a setting that is neither's."""
    from omegaconf import OmegaConf

    ev = importlib.import_module("scripts.lra_eval")
    r = recipes.recipe("pathfinder", "hgrn2")

    def cfg(max_update, warmup, period=-1.0):
        return OmegaConf.create({
            "optimizer": {"_name": "torch_adamw", "weight_decay": r.weight_decay},
            "lr_scheduler": {"_name": "cosine", "warmup_updates": warmup, "lr_period_updates": period},
            "optimization": {"lr": [r.lr], "max_update": max_update, "clip_norm": r.clip, "update_freq": [1]},
            "dataset": {"batch_size": r.batch}, "distributed_training": {"distributed_world_size": 1},
            "common": {"bf16": r.precision == "bf16"}})

    assert ev.run_schedule(cfg(500000, 50000), r) == "full" and ev.recipe_overrides(cfg(500000, 50000), r) == {}
    assert ev.run_schedule(cfg(20000, 2000), r) == "compressed" and ev.recipe_overrides(cfg(20000, 2000), r) == {}
    assert ev.run_schedule(cfg(20000, 50000, 450000.0), r) == "truncated"
    assert ev.recipe_overrides(cfg(20000, 50000, 450000.0), r) == {}
    assert ev.recipe_overrides(cfg(20000, 50000, 100000.0), r) == {"lr_period_updates": 100000.0}
    assert ev.recipe_overrides(cfg(20000, 50000), r) == {"warmup_updates": 50000}  # compressed expects 2,000


def test_gpu_lra_concurrent_jobs_are_dealt_out_over_the_gpus(tmp_path):
    """On a machine with several GPUs, LRA_CONCURRENT=1 gives run k GPU k mod N (CUDA_VISIBLE_DEVICES); with one GPU,
    or LRA_NUM_GPUS > 1 (each run takes them all), nothing is set."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nprintf 'GPU 0: H200\\nGPU 1: H200\\nGPU 2: H200\\n'\n")
    (fake / "nvidia-smi").chmod(0o755)
    funcs = gpu_lra_functions("run_id", "train_jobs")
    script = f"""{funcs}
train_one() {{ echo "trained $3 on [${{CUDA_VISIBLE_DEVICES:-all}}]"; }}
task_updates() {{ echo 10; }}
python3() {{ :; }}
mkdir -p "$OUT/runs"
train_jobs listops/hgrn1 listops/hgrn2 pathfinder/hgrn1 pathfinder/hgrn2 2> /dev/null
echo done  # (train_jobs ends by grepping logs that this stub of train_one does not write)
"""

    def trained(**env):
        base = dict(os.environ, LRA_CONCURRENT="1", LRA_MPS="0", OUT=str(tmp_path), WORK=str(tmp_path),
                    PATH=f"{fake}:{os.environ['PATH']}", **env)
        base.pop("CUDA_VISIBLE_DEVICES", None)
        r = pyrun.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, env=base)
        assert r.returncode == 0, r.stderr
        return sorted(line for line in r.stdout.splitlines() if line.startswith("trained"))

    assert trained() == ["trained hgrn1 on [0]", "trained hgrn1 on [2]", "trained hgrn2 on [0]", "trained hgrn2 on [1]"]
    assert trained(LRA_NUM_GPUS="3") == ["trained hgrn1 on [all]"] * 2 + ["trained hgrn2 on [all]"] * 2
