"""fairseq-train checkpoints survive a kill at any moment, one run per save directory, a missing
--restore-file is an error (hgrn_fairseq/checkpoint_safety.py).

The runs go through a launcher that makes checkpoint copies slow (the file grows in 64 KiB steps),
so that a test can SIGKILL the process while a checkpoint file is being written. Checkpoints are
checked with ``torch.load`` here, not with the code under test.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from tests import pyrun
from tests.lm_corpus import binarise, write_corpus

pytestmark = pytest.mark.integration

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))
LAUNCHER = '''
import os, shutil, sys, time
flag = os.environ.get("SLOW_COPY_LOG")
if flag:
    fast_copy = shutil.copyfile

    def slow_copyfile(src, dst, *args, **kwargs):
        if not os.path.basename(src).startswith("checkpoint"):
            return fast_copy(src, dst, *args, **kwargs)
        with open(flag, "a") as log:
            log.write(dst + "\\n")
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            while True:
                chunk = fi.read(64 * 1024)
                if not chunk:
                    break
                fo.write(chunk)
                fo.flush()
                time.sleep(float(os.environ.get("SLOW_COPY_PAUSE", "0.05")))
        return dst

    shutil.copyfile = slow_copyfile
from fairseq_cli.train import cli_main
sys.argv = ["fairseq-train"] + sys.argv[1:]
cli_main()
'''


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    write_corpus(str(root / "text"), sizes={"train": 200, "valid": 20, "test": 20})
    return str(binarise(str(root / "text"), str(root / "bin")))


def train_cmd(launcher, data, save_dir, max_update, *extra):
    return [sys.executable, str(launcher), data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling",
            "--arch", "hgrn_lm_tiny", "--tokens-per-sample", "32", "--batch-size", "4", "--optimizer", "adam",
            "--lr", "1e-3", "--max-update", str(max_update), "--save-interval-updates", "2",
            "--no-epoch-checkpoints", "--save-dir", str(save_dir), "--cpu", "--num-workers", "0",
            "--no-progress-bar", "--log-format", "simple", "--log-interval", "1", "--seed", "3", *extra]


@pytest.fixture
def launcher(tmp_path):
    path = tmp_path / "slow_train.py"
    path.write_text(LAUNCHER)
    return path


def run(cmd, env=None, timeout=300):
    return pyrun.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def slow_env(log, pause="0.05"):
    return dict(os.environ, SLOW_COPY_LOG=str(log), SLOW_COPY_PAUSE=pause, OMP_NUM_THREADS="1")


def wait_for(predicate, proc, timeout=240):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError("the run ended before the awaited moment:\n" + proc.stderr.read()[-3000:])
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def num_updates(path):
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["optimizer_history"][-1]["num_updates"]


def test_kill_while_a_checkpoint_is_written_then_the_same_command_resumes(data, launcher, tmp_path):
    save = tmp_path / "save"
    log = tmp_path / "copies.log"
    cmd = train_cmd(launcher, data, save, 6)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=slow_env(log))
    try:
        # the second save (update 4) is copying its checkpoint to checkpoint_last.pt: kill mid-copy
        wait_for(lambda: log.exists() and log.read_text().count("checkpoint_last") >= 2, proc)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    written = sorted(p for p in os.listdir(save) if p.startswith("checkpoint") and p.endswith(".pt"))
    assert "checkpoint_1_4.pt" in written  # the save was under way
    for name in written:  # complete or absent: every checkpoint file there loads
        num_updates(save / name)
    resumed = run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout + resumed.stderr
    assert "resuming from" in out and "@ 4 updates" in out, out[-3000:]
    assert num_updates(save / "checkpoint_last.pt") == 6


def trained_to_4(launcher, data, tmp_path):
    """A run's save directory after 4 updates (saves at 2 and 4), and the environment to go on with."""
    save = tmp_path / "save"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = run(train_cmd(launcher, data, save, 4), env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    return save, env


def test_damaged_last_checkpoint_resumes_from_the_newest_intact_one(data, launcher, tmp_path):
    save, env = trained_to_4(launcher, data, tmp_path)
    last = save / "checkpoint_last.pt"
    data_bytes = last.read_bytes()
    last.write_bytes(data_bytes[: len(data_bytes) // 2])  # as a kill mid-write by some other tool leaves it
    os.utime(save / "checkpoint_1_2.pt", (time.time() + 5, time.time() + 5))  # the newest intact one
    again = run(train_cmd(launcher, data, save, 6), env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    out = again.stdout + again.stderr
    assert "checkpoint_last.pt is damaged" in out and "checkpoint_1_2.pt" in out and "@ 2 updates" in out
    assert (save / "checkpoint_last.pt.damaged").exists()
    assert num_updates(last) == 6


def test_a_best_without_optimizer_state_newer_than_last_is_not_resumed_from(data, launcher, tmp_path):
    # checkpoint_best.pt rewritten without its optimizer state (for
    # evaluation only) after checkpoint_last.pt, so the newer file; resuming from it restarted at update 0
    save, env = trained_to_4(launcher, data, tmp_path)
    best = save / "checkpoint_best.pt"
    state = torch.load(best, map_location="cpu", weights_only=True)
    del state["last_optimizer_state"]
    torch.save(state, best)
    os.utime(best, (time.time() + 5, time.time() + 5))
    again = run(train_cmd(launcher, data, save, 6), env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    out = again.stdout + again.stderr
    assert "checkpoint_last.pt (epoch" in out and "@ 4 updates" in out, out[-3000:]
    assert "checkpoint_best.pt holds no optimizer state" in out, out[-3000:]
    assert num_updates(save / "checkpoint_last.pt") == 6


def test_a_second_run_on_a_save_directory_in_use_is_refused(data, launcher, tmp_path):
    save = tmp_path / "save"
    log = tmp_path / "copies.log"
    first = subprocess.Popen(train_cmd(launcher, data, save, 1000), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=slow_env(log, pause="0.5"))
    try:
        wait_for(lambda: log.exists(), first)  # training (and its lock) is under way
        second = run(train_cmd(launcher, data, save, 4), env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        first.kill()
        first.wait()
    assert second.returncode != 0
    last_line = [line for line in second.stderr.splitlines() if line.strip()][-1]
    assert f"save directory {save} is in use by another fairseq-train (process {first.pid})" in last_line
    # the lock ends with its process, however it ends
    third = run(train_cmd(launcher, data, save, 2), env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert third.returncode == 0, third.stderr[-3000:]


def test_restore_file_that_does_not_exist_is_an_error(data, launcher, tmp_path):
    proc = run(train_cmd(launcher, data, tmp_path / "save", 2, "--restore-file", str(tmp_path / "nope.pt")),
               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode != 0
    last_line = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert "--restore-file" in last_line and "nope.pt does not exist" in last_line
