"""scripts/train_imagenet.sh without data: --dry-run prints the exact command (OMP_NUM_THREADS=1 for a CPU
run), a real run stops with one line. No Python is started, so these need neither timm nor hydra."""
import os
import shlex
import subprocess

import pytest

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "train_imagenet.sh")


def run(args, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OUTPUT_DIR", "NUM_GPUS")}
    base.update(PYTHON="python3", **env)
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=base, timeout=60)


def test_dry_run_prints_the_command_without_the_data(tmp_path):
    missing = str(tmp_path / "no such imagenet")
    res = run(["hgrn2_vit_small", missing, "optim.epochs=3", "--dry-run"], NUM_GPUS="0")
    assert res.returncode == 0, res.stderr
    assert shlex.split(res.stdout) == [
        "OMP_NUM_THREADS=1", "python3", "-m", "hgrn_fairseq.image.train", "--config-name", "hgrn2_small",
        "model.name=hgrn2_vit_small", f"data.path={missing}", "train.output_dir=runs/hgrn2_vit_small",
        "train.device=cpu", "optim.epochs=3"]
    assert "data check and the plan were skipped" in res.stderr
    assert not os.path.exists(missing)


def test_dry_run_keeps_the_users_threads_and_uses_torchrun_for_several_gpus(tmp_path):
    res = run(["hgrn1d_vit_tiny", str(tmp_path / "x"), "--dry-run"], NUM_GPUS="0", OMP_NUM_THREADS="3")
    assert res.returncode == 0 and res.stdout.startswith("OMP_NUM_THREADS=3 python3 -m hgrn_fairseq.image.train ")
    assert "--config-name hgrn1 " in res.stdout
    res = run(["deit_tiny_patch16_224", str(tmp_path / "x"), "--dry-run"], NUM_GPUS="2", OUTPUT_DIR="/o")
    assert res.returncode == 0, res.stderr
    words = shlex.split(res.stdout)
    assert words[:6] == ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    assert "--config-name" in words and "deit" in words and "train.output_dir=/o" in words
    assert not any(w.startswith("OMP_NUM_THREADS") for w in words)  # GPU runs keep torchrun's own setting


def test_a_real_run_without_data_fails_in_one_line(tmp_path):
    res = run(["hgrn1d_vit_tiny", str(tmp_path / "none")], NUM_GPUS="0")
    assert res.returncode == 1 and res.stdout == ""
    errors = res.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("train_imagenet.sh: DATA_DIR ") and "is not a folder" in errors[0]
