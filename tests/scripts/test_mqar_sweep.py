"""scripts/mqar_sweep.py's GPU and budget plumbing (GPU assignment, threads per run, per-setting
budgets), its log parsing and its reports for runs cut by the timeout, run_mqar.sh's pass-through, and
one tiny sweep on CPU through fairseq-train with interval validations. (The report basics are in
tests/tasks/test_mqar.py; the sweep's numbers come from the GPU machine.)"""
import importlib
import argparse
import csv
import json
import os
import re
import sys
import threading

import pytest

from tests.fixtures_corpus import REPO, subprocess_env
from tests import pyrun

SWEEP = os.path.join(REPO, "scripts", "mqar_sweep.py")


@pytest.fixture(scope="module")
def sweep():
    return importlib.import_module("scripts.mqar_sweep")


# ----------------------------------------------------------------------------------------------
# GPUs and threads


def test_gpu_pool_gives_the_least_loaded_gpu_and_takes_it_back(sweep):
    pool = sweep.GpuPool(["3", "5", "7"])
    assert [pool.acquire() for _ in range(4)] == ["3", "5", "7", "3"]  # round the GPUs, ties to the first
    assert pool.running == [2, 1, 1]
    pool.release("5")
    pool.release("7")
    assert pool.acquire() == "5"  # now the least loaded (0 runs), ahead of "7" (also 0) by order
    assert pool.acquire() == "7"
    assert pool.acquire() == "5"  # 3:2, 5:1, 7:1 -> 5
    assert pool.running == [2, 2, 1]
    with pytest.raises(ValueError, match="'9' has no running run"):
        pool.release("9")
    with pytest.raises(ValueError, match="devices is empty"):
        sweep.GpuPool([])


def test_gpu_pool_counts_stay_right_under_threads(sweep):
    pool = sweep.GpuPool(["0", "1", "2", "3"])
    seen = []

    def work():
        for _ in range(200):
            gpu = pool.acquire()
            seen.append(gpu)
            pool.release(gpu)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.running == [0, 0, 0, 0] and len(seen) == 1600
    held = [pool.acquire() for _ in range(8)]  # 8 runs at once: 2 per GPU
    assert sorted(held) == ["0", "0", "1", "1", "2", "2", "3", "3"]


def test_visible_gpus_maps_through_cuda_visible_devices(sweep):
    assert sweep.visible_gpus(None, 4, environ={}) == ["0", "1", "2", "3"]
    assert sweep.visible_gpus(2, 4, environ={}) == ["0", "1"]
    assert sweep.visible_gpus(None, 2, environ={"CUDA_VISIBLE_DEVICES": "4,6"}) == ["4", "6"]
    assert sweep.visible_gpus(1, 2, environ={"CUDA_VISIBLE_DEVICES": " 4, 6 "}) == ["4"]
    uuid = "GPU-8f4c2f2e-0000-0000-0000-000000000000"
    assert sweep.visible_gpus(None, 1, environ={"CUDA_VISIBLE_DEVICES": uuid}) == [uuid]
    with pytest.raises(SystemExit, match=r"--gpus 3: expected 1 to 2 \(the GPUs visible: 4,6\)"):
        sweep.visible_gpus(3, 2, environ={"CUDA_VISIBLE_DEVICES": "4,6"})
    with pytest.raises(SystemExit, match="--gpus 0: expected 1 to 4"):
        sweep.visible_gpus(0, 4, environ={})


def test_child_threads(sweep):
    env = {"OMP_NUM_THREADS": "4"}
    sweep.set_child_threads(env, use_cpu=False, jobs=32, cpus=64)
    assert env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}  # the inherited 4 is overridden
    env = {}
    sweep.set_child_threads(env, use_cpu=False, jobs=32, cpus=16)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"  # never below 1
    env = {"OMP_NUM_THREADS": "4"}
    sweep.set_child_threads(env, use_cpu=False, jobs=1, cpus=64)
    assert env == {"OMP_NUM_THREADS": "4"}  # one run alone keeps what it inherits
    env = {}
    sweep.set_child_threads(env, use_cpu=True, jobs=8, cpus=64)
    assert env == {"OMP_NUM_THREADS": "1"}  # CPU runs: 1 thread ...
    env = {"OMP_NUM_THREADS": "3"}
    sweep.set_child_threads(env, use_cpu=True, jobs=8, cpus=64)
    assert env == {"OMP_NUM_THREADS": "3"}  # ... unless the user set it


def test_runs_of_one_width_rotate_over_model_and_lr(sweep):
    settings = [sweep.Setting(256, 16), sweep.Setting(512, 64)]
    runs = sweep.order_runs(settings, ["hgrn1", "hgrn2"], [64, 128, 256, 512], [1e-3, 3e-3],
                            {"seq256_kv16": 900, "seq512_kv64": 500})
    assert len(runs) == 32 and len({r.name for r in runs}) == 32
    assert [r.d for r in runs[:16]] == [512] * 4 + [256] * 4 + [128] * 4 + [64] * 4
    assert all(r.setting == settings[0] and r.max_update == 900 for r in runs[:16])
    assert all(r.setting == settings[1] and r.max_update == 500 for r in runs[16:])
    # dealt round 4 GPUs in start order, each GPU gets every (model, lr) pair once per setting
    for g in range(4):
        assert len({(r.model, r.lr) for r in runs[g:16:4]}) == 4


# ----------------------------------------------------------------------------------------------
# Budgets


def run_mqar_sh(env, *args):
    """scripts/run_mqar.sh with ``args`` under ``env`` (PYTHON=echo in the callers: it prints the command)."""
    return pyrun.run(["bash", os.path.join(REPO, "scripts", "run_mqar.sh"), *args], env=env,
                     capture_output=True, text=True)


def budget_args(**kw):
    base = dict(train_size=1000, batch_size=64, epochs="32", max_update="", warmup_frac=0.1)
    base.update(kw)
    return argparse.Namespace(**base)


def test_per_setting_budgets(sweep):
    two = sweep.parse_settings("256:16,512:64")
    assert sweep.planned_updates(budget_args(epochs="6,3"), two) == {"seq256_kv16": 96, "seq512_kv64": 48}
    assert sweep.planned_updates(budget_args(epochs="2"), two) == {"seq256_kv16": 32, "seq512_kv64": 32}
    assert sweep.planned_updates(budget_args(epochs=2), two) == {"seq256_kv16": 32, "seq512_kv64": 32}
    got = sweep.planned_updates(budget_args(epochs="6,3", max_update="9000,5000"), two)
    assert got == {"seq256_kv16": 9000, "seq512_kv64": 5000}  # --max-update wins
    assert sweep.planned_updates(budget_args(max_update="700"), two) == {"seq256_kv16": 700, "seq512_kv64": 700}


def test_budget_list_of_the_wrong_length_is_refused(sweep):
    two = sweep.parse_settings("256:16,512:64")
    with pytest.raises(SystemExit, match=r"--epochs: 3 values \(6,3,2\) for 2 settings \(256:16,512:64\): give one "
                                         r"value for every setting or one per setting"):
        sweep.planned_updates(budget_args(epochs="6,3,2"), two)
    with pytest.raises(SystemExit, match=r"--max-update: 2 values \(9000,5000\) for 1 settings \(256:16\)"):
        sweep.planned_updates(budget_args(max_update="9000,5000"), two[:1])
    with pytest.raises(SystemExit, match=r"--epochs: '0' in '6,0' is not a positive integer"):
        sweep.planned_updates(budget_args(epochs="6,0"), two)
    with pytest.raises(SystemExit, match=r"--max-update: '1e4' in '1e4' is not a positive integer"):
        sweep.planned_updates(budget_args(max_update="1e4"), two)


def test_command_uses_the_run_budget(sweep):
    args = argparse.Namespace(out="/tmp/x", vocab_size=64, train_size=1000, test_size=10, data_seed=1, weight_decay=0.1,
                              clip_norm=1.0, warmup_frac=0.1, batch_size=64, log_interval=10, seed=1, fairseq_args="",
                              validate_interval_updates=250)
    run = sweep.Run(sweep.Setting(256, 16), "hgrn2", 128, 3e-3, max_update=1000)
    cmd = sweep.fairseq_command(run, args, use_cpu=True)

    def value(flag):
        return cmd[cmd.index(flag) + 1]

    assert value("--max-update") == "1000" and value("--warmup-updates") == "100"
    assert value("--max-epoch") == "63"  # ceil(1000 / 16): the update limit is the one that stops it
    assert value("--validate-interval-updates") == "250"
    args.validate_interval_updates = 0
    assert "--validate-interval-updates" not in sweep.fairseq_command(run, args, use_cpu=True)


# ----------------------------------------------------------------------------------------------
# Logs and reports


def log_line(tag, stats):
    return f"1970-01-01 00:00:00 | INFO | {tag} | " + json.dumps({k: str(v) for k, v in stats.items()})


def test_log_parsing_keeps_every_validation_and_tells_epoch_ends(sweep):
    lines = [
        log_line("train_inner", {"epoch": 1, "loss": 9, "ups": "7.5", "num_updates": 100}),
        log_line("valid", {"epoch": 1, "valid_loss": 9.1, "valid_accuracy": 0.5, "valid_num_updates": 100}),
        log_line("train_inner", {"epoch": 1, "loss": 8, "ups": "8.25", "num_updates": 200}),
        log_line("valid", {"epoch": 1, "valid_loss": 8.0, "valid_accuracy": 2.5, "valid_num_updates": 200}),
        # the epoch's end
        log_line("valid", {"epoch": 1, "valid_loss": 7.9, "valid_accuracy": 3.0, "valid_num_updates": 250}),
        log_line("train", {"epoch": 1, "train_loss": 8, "train_num_updates": 250}),
        log_line("train_inner", {"epoch": 2, "loss": 7, "ups": "9", "num_updates": 300}),
        log_line("valid", {"epoch": 2, "valid_loss": 7.0, "valid_accuracy": 4.0, "valid_num_updates": 300}),
        "something else | not json",
        log_line("train_inner", {"epoch": 2, "loss": 7, "ups": "9.5", "num_updates": 400}),
        log_line("train", {"epoch": 2, "train_loss": 7, "train_num_updates": 500}),  # an epoch end not validated
        log_line("train_inner", {"epoch": 3, "loss": 7, "ups": "9.75", "num_updates": 600}),  # then killed
    ]
    parsed = sweep.parse_fairseq_log("\n".join(lines))
    assert parsed["curve"] == [[100, 0.5], [200, 2.5], [250, 3.0], [300, 4.0]]
    assert parsed["accs"] == [0.5, 2.5, 3.0, 4.0]
    assert parsed["epoch_accs"] == [3.0]  # not 4.0: training went on after that validation
    assert parsed["updates"] == 600 and parsed["ups"] == 9.75 and parsed["loss"] == 7.0


def result(sweep, model, d, lr, status="ok", final=None, best=None, updates=1000, max_update=1000):
    return sweep.RunResult(name=f"seq64_kv4_{model}_d{d}_lr{lr:g}", seq_len=64, num_kv_pairs=4, model=model, d=d,
                           lr=lr, status=status, final_acc=final, best_acc=best if best is not None else final,
                           updates=updates, max_update=max_update, updates_per_s=12.5, gpu="1")


def report_args(out, **kw):
    base = dict(out=str(out), no_plot=False, vocab_size=8192, train_size=64000, test_size=10, epochs="1",
                max_update="1000", batch_size=64, lrs="1e-3,3e-3", weight_decay=0.1, warmup_frac=0.1,
                validate_interval_updates=100)
    base.update(kw)
    return argparse.Namespace(**base)


def test_report_counts_differences_within_a_point_as_ties(sweep, tmp_path):
    results = [result(sweep, "hgrn1", 64, 1e-3, final=6.1), result(sweep, "hgrn2", 64, 1e-3, final=6.4),
               result(sweep, "hgrn1", 128, 1e-3, final=5.9), result(sweep, "hgrn2", 128, 1e-3, final=99.99),
               result(sweep, "hgrn1", 256, 1e-3, final=8.0), result(sweep, "hgrn2", 256, 1e-3, final=6.9)]
    sweep.write_reports(results, [sweep.Setting(64, 4)], ["hgrn1", "hgrn2"], [64, 128, 256],
                        report_args(tmp_path, reveal_answers=True))
    table = (tmp_path / "table.md").read_text()
    assert "| 64 | 6.1 (lr 0.001) | 6.4 (lr 0.001) | tie (within 1) |" in table
    assert "| 128 | 5.9 (lr 0.001) | 100.0 (lr 0.001) | yes |" in table
    assert "| 256 | 8.0 (lr 0.001) | 6.9 (lr 0.001) | no |" in table
    assert "HGRN2 beats HGRN1 by more than 1 point at 1 of 3 widths measured, ties at 1 (finished runs only)." in table
    # 4 pairs with the answers shown: (1 + 1/2 + 1/3 + 1/4) / 4 (docs/mqar.md: 52.1%)
    assert "shown ones excluded): 52.1%." in table


def test_report_marks_cut_cells_and_counts_only_finished_runs(sweep, tmp_path):
    results = [
        # d 64: both finished, HGRN2 wins
        result(sweep, "hgrn1", 64, 1e-3, final=20.0), result(sweep, "hgrn2", 64, 1e-3, final=30.0),
        # d 128: HGRN2 finished; HGRN1's runs both cut: the best accuracy seen of either is shown
        result(sweep, "hgrn1", 128, 1e-3, "timeout", best=2.0, updates=420),
        result(sweep, "hgrn1", 128, 3e-3, "timeout", best=3.14, updates=400),
        result(sweep, "hgrn2", 128, 1e-3, final=1.0),
        # d 256: both cut; the HGRN2 run was cut before its first validation
        result(sweep, "hgrn1", 256, 1e-3, "timeout", best=0.0213, updates=300),
        result(sweep, "hgrn2", 256, 3e-3, "timeout", updates=50),
        # d 512: HGRN2 has a finished run and a cut one with a higher accuracy: the finished one counts
        result(sweep, "hgrn1", 512, 1e-3, final=50.0),
        result(sweep, "hgrn2", 512, 1e-3, final=40.0), result(sweep, "hgrn2", 512, 3e-3, "timeout", best=90.0),
    ]
    sweep.write_reports(results, [sweep.Setting(64, 4)], ["hgrn1", "hgrn2"], [64, 128, 256, 512],
                        report_args(tmp_path))
    table = (tmp_path / "table.md").read_text()
    assert "| 64 | 20.0 (lr 0.001) | 30.0 (lr 0.001) | yes |" in table
    assert "| 128 | 3.1* (lr 0.003, cut at 400/1000 upd) | 1.0 (lr 0.001) | - |" in table
    assert "| 256 | 0.021* (lr 0.001, cut at 300/1000 upd) | -* (lr 0.003, cut at 50/1000 upd) | - |" in table
    assert "| 512 | 50.0 (lr 0.001) | 40.0 (lr 0.001) | no |" in table
    assert ("HGRN2 beats HGRN1 by more than 1 point at 1 of 2 widths measured, ties at 0 (finished runs only; "
            "2 not measured); 3 of 8 cells unfinished (marked *).") in table
    assert "Without recall (the example's values known, not their keys): 1/4 = 25%." in table
    assert "\\* no run of this cell finished its schedule (cut by the run timeout, or paused" in table
    assert "1000 updates of batch 64 per run (1 epoch(s) of 1000), 100 of them warm-up." in table
    assert "every 100 updates" in table
    with open(tmp_path / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(results)  # every run, cut ones too
    cut = next(r for r in rows if r["d"] == "128" and r["lr"] == "0.003" and r["model"] == "hgrn1")
    columns = ["status", "best_acc", "final_acc", "updates", "max_update", "updates_per_s", "gpu", "selected"]
    assert [cut[c] for c in columns] == ["timeout", "3.14", "", "400", "1000", "12.5", "1", "0"]
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seeds_repeat_the_grid_and_each_cell_takes_its_best_seed(sweep, tmp_path):
    # the same recipe escaped on one GPU and not on another (docs/mqar.md): --seeds runs a cell more than once
    settings = [sweep.Setting(256, 16)]
    runs = sweep.order_runs(settings, ["hgrn1", "hgrn2"], [64, 128], [1e-3, 5e-3], {"seq256_kv16": 900},
                            seeds=[1, 2])
    assert len(runs) == 16 and len({r.name for r in runs}) == 16
    assert [r.seed for r in runs] == [1] * 8 + [2] * 8  # a sweep cut short has every cell of seed 1
    one = {r.name for r in runs if r.seed == 1}
    assert "seq256_kv16_hgrn2_d64_lr0.005" in one  # seed 1 keeps the names of sweeps before --seeds
    assert {r.name for r in runs if r.seed == 2} == {n + "_s2" for n in one}
    args = argparse.Namespace(out="/tmp/x", vocab_size=64, train_size=1000, test_size=10, data_seed=7,
                              weight_decay=0.1, clip_norm=1.0, warmup_frac=0.1, batch_size=64, log_interval=10,
                              fairseq_args="", validate_interval_updates=0)
    cmd = sweep.fairseq_command(runs[-1], args, use_cpu=True)
    assert cmd[cmd.index("--seed") + 1] == "2" and cmd[cmd.index("--data-seed") + 1] == "7"

    def seeded(model, d, lr, seed, final):
        r = result(sweep, model, d, lr, final=final)
        r.seed, r.name = seed, r.name + (f"_s{seed}" if seed != 1 else "")
        return r

    results = [seeded("hgrn1", 64, 1e-3, 1, 6.0), seeded("hgrn1", 64, 1e-3, 2, 5.0),
               seeded("hgrn2", 64, 1e-3, 1, 6.3), seeded("hgrn2", 64, 1e-3, 2, 99.0),
               seeded("hgrn2", 64, 5e-3, 1, 50.0)]
    sweep.write_reports(results, [sweep.Setting(64, 4)], ["hgrn1", "hgrn2"], [64],
                        report_args(tmp_path, seeds="1,2", no_plot=True))
    table = (tmp_path / "table.md").read_text()
    assert "| 64 | 6.0 (lr 0.001) | 99.0 (lr 0.001, seed 2) | yes |" in table
    assert "Seeds 1,2 (best per cell over them)." in table
    with open(tmp_path / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    picked = [(r["model"], r["lr"], r["seed"]) for r in rows if r["selected"] == "1"]
    assert sorted(picked) == [("hgrn1", "0.001", "1"), ("hgrn2", "0.001", "2")]
    with pytest.raises(SystemExit, match=r"--seeds '1,1' \(SEEDS in run_mqar.sh\): a seed given twice; expected "
                                         r"distinct integers"):
        sweep.main(["--out", str(tmp_path / "x"), "--seeds", "1,1", "--report-only"])
    # a record from before --seeds is seed 1
    assert sweep.RunResult.from_json({k: v for k, v in json.loads(json.dumps(
        sweep.asdict(results[0]))).items() if k != "seed"}).seed == 1


OLD_JSON = {  # a run JSON written before valid_curve / max_update / updates_per_s / gpu existed
    "name": "seq256_kv16_hgrn1_d64_lr0.003", "seq_len": 256, "num_kv_pairs": 16, "model": "hgrn1", "d": 64,
    "lr": 0.003, "status": "timeout", "final_acc": None, "best_acc": 1.794, "final_loss": 10.326, "epochs": 2,
    "updates": 4000, "wall_s": 430.7, "valid_acc_per_epoch": [0.9, 1.794], "error": "killed",
}


def test_report_only_reads_old_run_jsons(sweep, tmp_path):
    r = sweep.RunResult.from_json(dict(OLD_JSON, some_future_field=1))
    assert r.valid_curve == [] and r.max_update == 0 and r.updates_per_s is None and r.best_acc == 1.794
    out = tmp_path / "sweep"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / (OLD_JSON["name"] + ".json")).write_text(json.dumps(OLD_JSON))
    sweep.main(["--out", str(out), "--report-only", "--settings", "256:16", "--dims", "64", "--lrs", "3e-3",
                "--epochs", "4", "--no-plot"])
    table = (out / "table.md").read_text()
    assert "| 64 | 1.8* (lr 0.003, cut at 4000 upd) | - | - |" in table  # no planned total on record
    rows = (out / "runs.csv").read_text().splitlines()
    assert len(rows) == 2 and ",timeout," in rows[1]


# ----------------------------------------------------------------------------------------------
# Shell wrappers


@pytest.mark.integration
@pytest.mark.parametrize("script", ["bench/gpu_checks.sh", "scripts/run_mqar.sh", "bench/split_pytest.sh",
                                    "bench/gpu_scan_run.sh", "bench/gpu_hgrn2_run.sh", "bench/explore/gpu_block_explore.sh",
                                    "bench/gpu_fairseq.sh", "bench/gpu_session.sh", "bench/gpu_lm_eval.sh",
                                    "bench/gpu_baselines.sh", "bench/gpu_mqar.sh", "bench/gpu_mps.sh",
                                    "bench/gpu_lra.sh"])
def test_shell_syntax(script):
    r = pyrun.run(["bash", "-n", os.path.join(REPO, script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.integration
def test_run_mqar_passes_the_budget_gpu_and_validation_variables():
    env = subprocess_env()
    env.update(PYTHON="echo", OUT="/tmp/o", SETTINGS="256:16,512:64", EPOCHS="6,3", MAX_UPDATE="9000,5000",
               GPUS="4", JOBS="32", VALIDATE_EVERY="500", LRS="1e-3,3e-3")
    r = run_mqar_sh(env, "--yes", "--run-timeout", "390")
    assert r.returncode == 0, r.stderr
    for part in ["--settings 256:16,512:64", "--epochs 6,3", "--max-update 9000,5000", "--gpus 4", "--jobs 32",
                 "--validate-interval-updates 500", "--lrs 1e-3,3e-3", "--run-timeout 390"]:
        assert part in r.stdout, (part, r.stdout)
    for name in ("MAX_UPDATE", "GPUS", "VALIDATE_EVERY"):
        env.pop(name)
    r = run_mqar_sh(env, "--yes")
    assert "--max-update" not in r.stdout and "--gpus" not in r.stdout
    assert "--validate-interval-updates 0" in r.stdout


@pytest.mark.integration
def test_run_mqar_passes_fairseq_args_that_start_with_dashes(tmp_path):
    """FAIRSEQ_ARGS='--cuda-graphs ...' reaches fairseq-train (argparse once took such a value for an
    option of its own and the sweep stopped with 'expected one argument')."""
    env = subprocess_env()
    env.update(OUT=str(tmp_path / "o"), SETTINGS="32:4", DIMS="32", LRS="3e-3", MODELS="hgrn1",
               FAIRSEQ_ARGS="--cuda-graphs")  # (one word: argparse lets a value with a space through)
    r = run_mqar_sh(env, "--dry-run")
    assert r.returncode == 0, r.stderr
    train = [line for line in r.stdout.splitlines() if "scripts/fairseq_train.py" in line]
    assert len(train) == 1 and train[0].split()[-1] == "--cuda-graphs", r.stdout


GRID_VARIABLES = {"OUT": "results/mqar", "SETTINGS": "256:16,512:64", "MODELS": "hgrn1,hgrn2",
                  "DIMS": "64,128,256,512", "LRS": "1e-4,5e-4,1e-3,5e-3", "EXPAND": "64,128", "SEEDS": "1",
                  "VOCAB_SIZE": "8192", "TRAIN_SIZE": "100000", "TEST_SIZE": "3000", "EPOCHS": "32",
                  "MAX_UPDATE": "none", "BATCH_SIZE": "64", "VALIDATE_EVERY": "0", "CKPT_EVERY": "1000",
                  "SLICE_S": "none", "REVEAL_ANSWERS": "0", "JOBS": "1", "GPUS": "every visible GPU",
                  "TIME_BUDGET": "none", "FAIRSEQ_ARGS": "none", "PYTHON": "python3"}


@pytest.mark.integration
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_mqar_help_lists_its_variables_and_the_default_sweeps_size(flag):
    env = subprocess_env()
    env.update(SETTINGS="64:4", EPOCHS="1")  # the help shows the defaults, not the environment
    r = run_mqar_sh(env, flag)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert text.startswith("usage: [VARIABLE=value ...] bash scripts/run_mqar.sh")
    assert "mqar_sweep.py [-h]" not in text  # its own usage, not the python tool's
    for name, default in GRID_VARIABLES.items():
        assert f"{name} [{default}]" in text, name
    # every variable the script reads is listed
    script = open(os.path.join(REPO, "scripts", "run_mqar.sh")).read()
    read = set(re.findall(r"\$\{([A-Z][A-Z_]*)[-:}]", script)) - {n for n in re.findall(r"\b(D_[A-Z_]+)=", script)}
    assert read == set(GRID_VARIABLES), read ^ set(GRID_VARIABLES)
    # the default sweep: 2 settings x (HGRN1: 4 d x 4 lr; HGRN2: 7 (d, expand) x 4 lr) = 88 runs of 32 epochs
    assert "MQAR sweep plan: 88 runs, 4,401,408 updates in all" in text
    for setting in ("seq 256, 16 kv pairs", "seq 512, 64 kv pairs"):
        assert (f"  {setting}: 44 runs (HGRN1 16, HGRN2 28), 50,016 updates each (32 epochs of 100,000 "
                f"examples, batch 64)") in text
    assert "--yes" in text and "OMP_NUM_THREADS=1" in text


@pytest.mark.integration
def test_run_mqar_without_yes_prints_the_plan_and_starts_nothing(tmp_path):
    env = subprocess_env()
    for name in GRID_VARIABLES:
        if name != "PYTHON":
            env.pop(name, None)
    env["OUT"] = str(tmp_path / "sweep")
    r = run_mqar_sh(env)  # no arguments: the paper-scale default grid
    assert r.returncode == 2
    assert "MQAR sweep plan: 88 runs" in r.stdout and "44 runs (HGRN1 16, HGRN2 28)" in r.stdout
    assert "nothing started. Add --yes" in r.stderr
    assert not (tmp_path / "sweep").exists()  # not even the output folder
    env.update(SETTINGS="32:4", DIMS="32", MODELS="hgrn1", LRS="3e-3")
    r = run_mqar_sh(env, "--cpu")  # a small grid asks the same way
    assert r.returncode == 2 and "MQAR sweep plan: 1 runs" in r.stdout
    env["PYTHON"] = "echo"  # with --yes the sweep starts (echo prints its command instead)
    r = run_mqar_sh(env, "--yes", "--cpu")
    assert r.returncode == 0 and r.stdout.startswith("scripts/mqar_sweep.py --out ")
    assert "--plan" not in r.stdout and "--yes" not in r.stdout and r.stdout.rstrip().endswith("--cpu")


# (variable, value, what the one line must say after "VARIABLE in run_mqar.sh)")
BAD_VALUES = [
    ("SETTINGS", "16:0", "'16:0' has 0 kv pairs; expected SEQ_LEN:KV_PAIRS"),
    ("SETTINGS", "32:4,10:3", "'10:3': 3 pairs and their queries need 12 tokens; expected"),
    ("SETTINGS", "32-4", "'32-4' is not SEQ_LEN:KV_PAIRS"),
    ("VOCAB_SIZE", "0", "4 distinct keys and values (32:4) need 9 tokens (blank, keys, values); expected an integer >= 9"),
    ("VOCAB_SIZE", "8", "need 9 tokens"),
    ("VOCAB_SIZE", "many", "invalid int value: 'many'"),
    ("DIMS", "0", "0 is below 1; expected model widths d >= 1"),
    ("DIMS", "32,-8", "-8 is below 1; expected model widths d >= 1"),
    ("DIMS", "3x", "'3x' is not an integer; expected model widths"),
    ("DIMS", ",", "no value; expected model widths"),
    ("LRS", "1e-3,-1e-3", "-1e-3 is not a positive number; expected learning rates > 0"),
    ("LRS", "fast", "'fast' is not a number"),
    ("TRAIN_SIZE", "0", "below 1; expected an integer >= 1"),
    ("TEST_SIZE", "-5", "below 1; expected an integer >= 1"),
    ("JOBS", "0", "below 1; expected an integer >= 1"),
    ("EXPAND", "64,0", "0 is below 1; expected HGRN2 expand ratios >= 1"),
    ("MODELS", "hgrn1,lstm", "'lstm' is not a model; expected a subset of hgrn1,hgrn2"),
    ("EPOCHS", "0", "is not a positive integer"),
    ("VALIDATE_EVERY", "-1", "negative; expected an integer >= 0"),
]


# every bad value with --yes (the path that trains); the three also without it (the plan)
CASES = [(v, x, says, True) for v, x, says in BAD_VALUES] + [
    (v, x, says, False) for v, x, says in BAD_VALUES if (v, x) in {("SETTINGS", "16:0"), ("VOCAB_SIZE", "0"), ("DIMS", "0")}]


@pytest.mark.integration
@pytest.mark.parametrize("variable,value,says,yes", CASES,
                         ids=[f"{v}={x}" + ("" if yes else "-plan") for v, x, _, yes in CASES])
def test_run_mqar_refuses_nonsense_in_one_line_before_any_work(tmp_path, variable, value, says, yes):
    env = subprocess_env()
    env.update(SETTINGS="32:4", VOCAB_SIZE="64", DIMS="16", MODELS="hgrn1", LRS="3e-3", TRAIN_SIZE="64",
               TEST_SIZE="16", MAX_UPDATE="1", OUT=str(tmp_path / "sweep"))
    env[variable] = value
    r = run_mqar_sh(env, *(["--yes", "--cpu"] if yes else []))
    assert r.returncode != 0 and r.stdout == "", (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    flag = "--" + {"EXPAND": "hgrn2-expand", "VALIDATE_EVERY": "validate-interval-updates"}.get(
        variable, variable.lower().replace("_", "-"))
    assert lines[0].startswith("mqar_sweep.py: ") and flag in lines[0], lines[0]
    assert f"{variable} in run_mqar.sh)" in lines[0] and value in lines[0] and says in lines[0], lines[0]
    assert not (tmp_path / "sweep").exists()  # nothing written, nothing trained


@pytest.mark.integration
@pytest.mark.parametrize("option,value,says", [
    ("--settings", "64:0", "--settings '64:0' (SETTINGS in run_mqar.sh): '64:0' has 0 kv pairs"),
    ("--vocab-size", "2", "--vocab-size '2' (VOCAB_SIZE in run_mqar.sh): 64 distinct keys and values (512:64) need "
                     "129 tokens"),
    ("--dims", "-64", "--dims '-64' (DIMS in run_mqar.sh): -64 is below 1"),
    ("--warmup-frac", "1.5", "--warmup-frac '1.5': out of range; expected a share of the updates in [0, 1)"),
    ("--run-timeout", "0", "--run-timeout '0.0': not positive; expected seconds > 0"),
    ("--jobs", "two", "argument --jobs: invalid int value: 'two' (JOBS in run_mqar.sh)"),
    ("--no-such-option", "1", "unrecognized arguments: --no-such-option 1"),
])
def test_sweep_refuses_nonsense_in_one_line(tmp_path, option, value, says):
    r = pyrun.run([sys.executable, SWEEP, "--out", str(tmp_path / "sweep"), "--cpu", option, value],
                  env=subprocess_env(), capture_output=True, text=True)
    assert r.returncode != 0 and r.stdout == "" and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
    assert not (tmp_path / "sweep").exists()


def test_settings_rule_is_the_tasks_rule(sweep):
    """The sweep refuses exactly the settings and vocabularies the MQAR task refuses (its check_mqar_options)."""
    from hgrn_fairseq.tasks.mqar import check_mqar_options

    for seq_len, kv, vocab in [(16, 4, 9), (15, 4, 9), (16, 4, 8), (4, 1, 3), (3, 1, 3), (4, 1, 2), (64, 0, 100)]:
        try:
            check_mqar_options(vocab, seq_len, kv)
            task_ok = True
        except ValueError:
            task_ok = False
        try:
            settings = sweep.parse_settings(f"{seq_len}:{kv}")
            sweep.check_options(sweep.main.__globals__["argparse"].Namespace(
                vocab_size=vocab, train_size=1, test_size=1, jobs=1, log_interval=1, validate_interval_updates=0,
                checkpoint_every=0, slice_updates=0, gpus=None, warmup_frac=0.1, weight_decay=0.1, clip_norm=1.0,
                run_timeout=None, time_budget=None, slice_s=None), settings)
            sweep_ok = True
        except SystemExit:
            sweep_ok = False
        assert (seq_len, kv, vocab, sweep_ok) == (seq_len, kv, vocab, task_ok)


STUB_TRAIN = """import json, sys
argv = sys.argv[1:]
d, total = int(argv[argv.index("--decoder-embed-dim") + 1]), int(argv[argv.index("--max-update") + 1])
if d in FAIL:
    print("RuntimeError: stub fairseq-train broke at d %d" % d)
    sys.exit(3)
stats = {"valid_loss": "1.0", "valid_accuracy": "55.0", "valid_num_updates": str(total)}
print("1970-01-01 00:00:00 | INFO | valid | " + json.dumps(stats))
"""


@pytest.mark.integration
@pytest.mark.parametrize("fail,exit_code,says", [
    ((16,), 1, "mqar_sweep.py: 1 of 3 runs failed: seq32_kv4_hgrn1_d16_lr0.003 (the first ended with: "
               "RuntimeError: stub fairseq-train broke at d 16)"),
    ((8, 16, 32), 1, "mqar_sweep.py: 3 of 3 runs failed: seq32_kv4_hgrn1_d32_lr0.003, seq32_kv4_hgrn1_d16_lr0.003, "
                     "seq32_kv4_hgrn1_d8_lr0.003 (the first ended with: RuntimeError: stub fairseq-train broke at d 32)"),
    ((), 0, ""),
])
def test_sweep_with_failed_runs_exits_non_zero_and_counts_them(sweep, tmp_path, monkeypatch, capsys, fail, exit_code,
                                                                says):
    stub = tmp_path / "stub_train.py"
    stub.write_text(f"FAIL = {fail!r}\n" + STUB_TRAIN)
    monkeypatch.setattr(sweep, "FAIRSEQ_TRAIN", str(stub))
    out = tmp_path / "sweep"
    argv = ["--out", str(out), "--cpu", "--settings", "32:4", "--vocab-size", "64", "--models", "hgrn1",
            "--dims", "8,16,32", "--lrs", "3e-3", "--train-size", "64", "--test-size", "16", "--max-update", "2",
            "--checkpoint-every", "0", "--no-preflight", "--no-plot"]
    assert sweep.main(argv) == exit_code
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1] if says else err
    assert last.startswith(says) and last.endswith(f"; logs in {out / 'logs'}; delete their runs/NAME.json to rerun "
                                                   "them (--force reruns all)" if says else ""), err
    # a rerun with the same --out trains nothing and still reports what failed
    assert sweep.main(argv) == exit_code
    assert capsys.readouterr().err.strip().splitlines()[-1:] == ([last] if says else [])


@pytest.mark.integration
def test_run_mqar_cpu_runs_get_one_thread_unless_set(tmp_path):
    """The shell path trains CPU runs with OMP_NUM_THREADS=1 when it is not set (the run log's segment
    line records the value the fairseq-train process got), and keeps a value the user set."""
    base = subprocess_env()
    base.update(SETTINGS="32:4", VOCAB_SIZE="64", DIMS="16", MODELS="hgrn1", LRS="3e-3", TRAIN_SIZE="64",
                TEST_SIZE="16", MAX_UPDATE="1", CKPT_EVERY="0", EXPAND="")
    for value, expected in [(None, "OMP_NUM_THREADS=1 "), ("2", "OMP_NUM_THREADS=2 ")]:
        env = dict(base, OUT=str(tmp_path / f"omp{value}"))
        env.pop("OMP_NUM_THREADS", None)
        if value:
            env["OMP_NUM_THREADS"] = value
        r = run_mqar_sh(env, "--yes", "--cpu", "--no-preflight", "--no-plot")
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
        log = (tmp_path / f"omp{value}" / "logs" / "seq32_kv4_hgrn1_d16_lr0.003.log").read_text()
        assert log.startswith("# segment 1: CUDA_VISIBLE_DEVICES=- " + expected), log[:200]


# ----------------------------------------------------------------------------------------------
# A tiny sweep through fairseq-train on CPU: 15 updates per epoch, 30 in all, validation every 10;
# then the same run cut (by updates, and by time) and continued from its checkpoint

TINY = ["--cpu", "--settings", "32:4", "--vocab-size", "64", "--models", "hgrn1", "--dims", "32", "--lrs", "3e-3",
        "--train-size", "960", "--test-size", "64", "--max-update", "30", "--validate-interval-updates", "10",
        "--checkpoint-every", "10", "--log-interval", "5", "--jobs", "1", "--no-plot", "--keep-checkpoints", "--no-preflight"]
TINY_RUN = "seq32_kv4_hgrn1_d32_lr0.003"


def tiny_run(out):
    return json.loads((out / "runs" / f"{TINY_RUN}.json").read_text())


def final_weights(out):
    import torch

    state = torch.load(out / "checkpoints" / TINY_RUN / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    return state["model"], state["last_optimizer_state"]


@pytest.fixture(scope="module")
def uncut(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("uncut")
    sweep.main(["--out", str(out)] + TINY)
    return out


@pytest.mark.integration
def test_tiny_cpu_sweep_records_interval_validations(uncut):
    run = tiny_run(uncut)
    assert run["status"] == "ok", run["error"]
    assert [u for u, _ in run["valid_curve"]] == [10, 15, 20, 30]  # every 10 and at each epoch's end (15, 30)
    assert run["valid_acc_per_epoch"] == [run["valid_curve"][1][1], run["valid_curve"][3][1]]
    assert run["epochs"] == 2 and run["updates"] == run["max_update"] == 30
    assert run["final_acc"] == run["valid_curve"][-1][1]
    assert run["updates_per_s"] > 0 and run["gpu"] == "" and run["segments"] == 1
    assert "| 32 | " in (uncut / "table.md").read_text()


def assert_same_end(out, uncut):
    import torch

    a, b = tiny_run(out), tiny_run(uncut)
    assert a["status"] == "ok" and a["updates"] == 30, a
    assert a["final_acc"] == b["final_acc"] and a["final_loss"] == b["final_loss"]
    model_a, opt_a = final_weights(out)
    model_b, opt_b = final_weights(uncut)
    assert model_a.keys() == model_b.keys()
    for k in model_a:
        if torch.is_tensor(model_a[k]):
            torch.testing.assert_close(model_a[k], model_b[k], rtol=0, atol=0, msg=k)
        else:  # the decoder's dictionary record
            assert model_a[k]["dictionary_sha256"] == model_b[k]["dictionary_sha256"], k
    for slot_a, slot_b in zip(opt_a["state"].values(), opt_b["state"].values()):
        for k in slot_a:
            torch.testing.assert_close(slot_a[k], slot_b[k], rtol=0, atol=0, msg=k)
    return a


@pytest.mark.integration
def test_run_cut_by_updates_and_by_time_and_continued_ends_where_the_uncut_run_ends(sweep, uncut, tmp_path):
    out = tmp_path / "cut"
    sweep.main(["--out", str(out), "--slice-updates", "13"] + TINY)  # mid-epoch (15 per epoch)
    run = tiny_run(out)
    assert run["status"] == "paused" and run["updates"] == 13 and run["final_acc"] is None
    assert (out / "checkpoints" / TINY_RUN / "checkpoint_last.pt").exists()
    assert "paused at 13/30 upd" in (out / "table.md").read_text()
    # to another machine and back: packed into small files (tiny parts here), restored elsewhere
    state = importlib.import_module("hgrn_fairseq.cli.mqar_state")
    note = state.pack(str(out), str(tmp_path / "returned"), ckpt_mb=100, part_mb=0.02)
    assert note.startswith("1 of 1 paused runs' checkpoints packed")
    parts = sorted(p.name for p in (tmp_path / "returned").iterdir() if ".part" in p.name)
    assert len(parts) >= 2 and parts[0] == "mqar_ckpt.tar.part00"
    # never into another sweep's folder (a carry folder left on a warm machine restored into a new sweep)
    with pytest.raises(SystemExit, match="packed from a folder named 'cut', not 'other'"):
        state.restore(str(tmp_path / "returned"), str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()
    out = tmp_path / "elsewhere" / "cut"
    assert "1 checkpoints" in state.restore(str(tmp_path / "returned"), str(out))
    assert not (out / "sweep_name.txt").exists()
    with pytest.raises(SystemExit, match="holds a sweep already"):
        state.restore(str(tmp_path / "returned"), str(out))
    # a slice that leaves 0.01 s of training: fairseq's --stop-time-hours stops it after one update, with a checkpoint
    sweep.main(["--out", str(out), "--slice-s", "1", "--min-slice-s", "0", "--slice-startup-s", "5"] + TINY)
    run = tiny_run(out)
    assert run["status"] == "paused" and 13 < run["updates"] < 30, run
    by_time = run["updates"]
    sweep.main(["--out", str(out)] + TINY)  # the same command, no slice: continues to the end
    run = assert_same_end(out, uncut)
    assert run["segments"] == 3 and run["restarts"] == 0
    # the uncut run's validations, plus the ones fairseq makes where it was stopped
    assert [u for u, _ in run["valid_curve"]] == sorted({10, 13, by_time, 15, 20, 30})
    uncut_curve = dict(map(tuple, tiny_run(uncut)["valid_curve"]))
    assert all(uncut_curve[u] == acc for u, acc in run["valid_curve"] if u in uncut_curve)


@pytest.mark.integration
def test_paused_run_without_its_checkpoint_restarts_and_says_so(sweep, tmp_path):
    """A run paused on another machine whose checkpoint was too big to come back: its record and log
    travel (mqar_state.py pack/restore), the checkpoint does not; the run starts over and says so."""
    out = tmp_path / "there"
    (out / "runs").mkdir(parents=True)
    (out / "logs").mkdir()
    (out / "checkpoints" / TINY_RUN).mkdir(parents=True)
    (out / "checkpoints" / TINY_RUN / "checkpoint_last.pt").write_bytes(b"x" * 50_000)
    record = dict(name=TINY_RUN, seq_len=32, num_kv_pairs=4, model="hgrn1", d=32, lr=0.003, status="paused",
                  updates=6, max_update=30, segments=1, valid_curve=[[6, 3.0]], best_acc=3.0)
    (out / "runs" / f"{TINY_RUN}.json").write_text(json.dumps(record))
    (out / "logs" / f"{TINY_RUN}.log").write_text("# segment 1: the first 6 updates\n")
    state = importlib.import_module("hgrn_fairseq.cli.mqar_state")
    note = state.pack(str(out), str(tmp_path / "returned"), ckpt_mb=0.01)  # too small for the checkpoint
    assert note.startswith("0 of 1 paused runs' checkpoints packed") and TINY_RUN in note
    out = tmp_path / "elsewhere"
    state.restore(str(tmp_path / "returned"), str(out), any_name=True)
    assert not (out / "checkpoints").exists()
    sweep.main(["--out", str(out), "--slice-updates", "4"] + TINY)
    run = tiny_run(out)
    assert run["status"] == "paused" and run["updates"] == 4  # from scratch: 4, not 6 + 4
    assert run["restarts"] == 1 and run["segments"] == 1 and "restarted from scratch" in run["error"]
    assert (out / "logs" / f"{TINY_RUN}.log.lost1").read_text().startswith("# segment 1: the first 6")


def test_hgrn2_default_expand_run_is_found_under_either_name(sweep, tmp_path):
    """HGRN2 at d 64 runs with expand 64 (the arch default, min(d, 128)) whether the grid lists 128 only
    (named hgrn2_d64) or 64,128 (named hgrn2_e64_d64): a sweep or report of either grid finds the other's
    record instead of leaving the cell empty or training the same model twice."""
    runs = sweep.order_runs([sweep.Setting(64, 4)], ["hgrn2"], [64], [1e-3], {"seq64_kv4": 1000}, [64, 128])
    assert [r.name for r in runs] == ["seq64_kv4_hgrn2_e64_d64_lr0.001"]
    assert sweep.other_names(runs[0]) == ["seq64_kv4_hgrn2_d64_lr0.001"]
    legacy = sweep.order_runs([sweep.Setting(64, 4)], ["hgrn2"], [64], [1e-3], {"seq64_kv4": 1000}, [128])
    assert sweep.other_names(legacy[0]) == ["seq64_kv4_hgrn2_e64_d64_lr0.001"]
    wide = sweep.order_runs([sweep.Setting(64, 4)], ["hgrn2"], [128], [1e-3], {"seq64_kv4": 1000}, [64])
    assert sweep.other_names(wide[0]) == []  # expand 64 at d 128 is not the default (128)
    out = tmp_path / "sweep"
    (out / "runs").mkdir(parents=True)
    (out / "logs").mkdir()
    old = result(sweep, "hgrn2", 64, 1e-3, final=92.5)  # named seq64_kv4_hgrn2_d64_lr0.001, expand 0
    (out / "runs" / f"{old.name}.json").write_text(json.dumps(sweep.asdict(old)))
    (out / "logs" / f"{old.name}.log").write_text("the run's log\n")
    grid = ["--out", str(out), "--cpu", "--settings", "64:4", "--models", "hgrn2", "--dims", "64", "--lrs", "1e-3",
            "--hgrn2-expand", "64,128", "--max-update", "1000", "--no-plot", "--no-preflight"]
    sweep.main(grid + ["--report-only"])
    assert "| 64 | 92.5 (lr 0.001, e 64) |" in (out / "table.md").read_text()
    assert (out / "runs" / f"{old.name}.json").exists()  # a report leaves the records as they are
    sweep.main(grid)  # a sweep adopts the record under its grid's name: nothing to train
    new = "seq64_kv4_hgrn2_e64_d64_lr0.001"
    assert sorted(p.name for p in (out / "runs").iterdir()) == [f"{new}.json"]
    record = json.loads((out / "runs" / f"{new}.json").read_text())
    assert record["name"] == new and record["expand"] == 64 and record["final_acc"] == 92.5
    assert (out / "logs" / f"{new}.log").read_text() == "the run's log\n"


def test_default_grid_has_44_runs_per_setting_with_expand_ratios_that_d_allows(sweep):
    settings = [sweep.Setting(256, 16), sweep.Setting(512, 64)]
    runs = sweep.order_runs(settings, ["hgrn1", "hgrn2"], [64, 128, 256, 512], [1e-4, 5e-4, 1e-3, 5e-3],
                            {"seq256_kv16": 900, "seq512_kv64": 500}, [64, 128], {"seq256_kv16": 256, "seq512_kv64": 64})
    assert len(runs) == 88 and len({r.name for r in runs}) == 88
    for d, expected in [(64, {64}), (128, {64, 128}), (256, {64, 128}), (512, {64, 128})]:
        assert {r.expand for r in runs if r.model == "hgrn2" and r.d == d} == expected
    assert {r.expand for r in runs if r.model == "hgrn1"} == {0}
    assert {(r.setting.seq_len, r.batch_size) for r in runs} == {(256, 256), (512, 64)}
    assert "seq256_kv16_hgrn2_e64_d128_lr0.0005" in {r.name for r in runs}
    assert sweep.hgrn2_expands(32, [64, 128]) == [0]  # below every ratio: the arch default, min(d, 128)
    args = argparse.Namespace(out="/tmp/x", vocab_size=8192, train_size=100000, test_size=10, data_seed=1,
                              weight_decay=0.1, clip_norm=1.0, warmup_frac=0.1, batch_size="256,64", log_interval=10,
                              seed=1, fairseq_args="", validate_interval_updates=0, checkpoint_every=500,
                              reveal_answers=False)
    run = next(r for r in runs if r.name == "seq256_kv16_hgrn2_e64_d128_lr0.0005")
    cmd = sweep.fairseq_command(run, args, use_cpu=False, stop_at_update=400, stop_time_hours=0.5)

    def value(flag):
        return cmd[cmd.index(flag) + 1]

    assert value("--expand-ratio") == "64" and value("--batch-size") == "256"
    assert value("--max-update") == "400" and value("--lr-period-updates") == "810"  # 900 - 90 warm-up
    assert value("--stop-time-hours") == "0.500000" and value("--save-interval-updates") == "500"
    assert "--no-save" not in cmd and "--reveal-answers" not in cmd
    assert value("--max-epoch") == "3"  # ceil(900 / ceil(100000 / 256))


@pytest.mark.integration
def test_run_mqar_passes_the_slice_checkpoint_layout_and_seed_variables():
    env = subprocess_env()
    env.update(PYTHON="echo", OUT="/tmp/o", SLICE_S="480", CKPT_EVERY="500", REVEAL_ANSWERS="1", EXPAND="128",
               BATCH_SIZE="256,64")
    r = run_mqar_sh(env, "--yes")
    assert r.returncode == 0, r.stderr
    for part in ["--slice-s 480", "--checkpoint-every 500", "--reveal-answers", "--hgrn2-expand 128",
                 "--batch-size 256,64", "--lrs 1e-4,5e-4,1e-3,5e-3", "--seeds 1 "]:
        assert part in r.stdout, (part, r.stdout)
    for name in ("SLICE_S", "REVEAL_ANSWERS", "EXPAND"):
        env.pop(name)
    r = run_mqar_sh(env, "--yes")
    assert "--slice-s" not in r.stdout and "--reveal-answers" not in r.stdout
    assert "--hgrn2-expand 64,128" in r.stdout
    env["SEEDS"] = "1,2,3"
    assert "--seeds 1,2,3 " in run_mqar_sh(env, "--yes").stdout


# bench/results/mqar: the committed report (mqar.md's table, mqar.csv) comes back from the run records of
# mqar.json through the --report-only command it states.
MQAR_RESULTS = os.path.join(REPO, "bench", "results", "mqar")


@pytest.mark.integration
def test_committed_gpu_report_comes_back_from_its_run_records(tmp_path):
    with open(os.path.join(MQAR_RESULTS, "mqar.json")) as f:
        committed = json.load(f)
    assert len(committed["runs"]) == 88 and {r["status"] for r in committed["runs"]} == {"ok"}
    (tmp_path / "runs").mkdir()
    for record in committed["runs"]:
        (tmp_path / "runs" / (record["name"] + ".json")).write_text(json.dumps(record))
    env = subprocess_env()
    env.update(OUT=str(tmp_path), PYTHON=pyrun.script_env()["PYTHON"], **committed["grid"])
    assert committed["report_command"].startswith("OUT=DIR " + " ".join(f"{k}={v}" for k, v in committed["grid"].items())
                                                  + " bash scripts/run_mqar.sh --report-only")
    r = run_mqar_sh(env, "--report-only", "--no-plot")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "table.md").read_text().strip() in open(os.path.join(MQAR_RESULTS, "mqar.md")).read()
    with open(tmp_path / "runs.csv") as f, open(os.path.join(MQAR_RESULTS, "mqar.csv")) as g:
        assert list(csv.DictReader(f)) == list(csv.DictReader(g))
