"""scripts/demo.sh: argument handling and the commands it runs, through --dry-run (the full run takes
minutes). Bad options must fail at once, before any work, with a one-line reason."""
import os
import shlex

import pytest

from tests import fixtures_corpus
from tests import pyrun

pytestmark = pytest.mark.integration

DEMO = os.path.join(fixtures_corpus.REPO, "scripts", "demo.sh")


def _run(*args, env=None):
    return pyrun.run(["bash", DEMO, *args], capture_output=True, text=True, timeout=60,
                     env=env or fixtures_corpus.subprocess_env())


def test_syntax_and_help():
    assert pyrun.run(["bash", "-n", DEMO]).returncode == 0
    proc = _run("--help")
    assert proc.returncode == 0 and "--workdir" in proc.stdout and "--max-update" in proc.stdout
    assert "--dry-run" in proc.stdout


def test_bad_options_fail_fast(tmp_path):
    proc = _run("--max-update", "abc", "--workdir", str(tmp_path / "w"))
    assert proc.returncode != 0 and "--max-update abc: expected a positive integer" in proc.stderr
    assert not (tmp_path / "w").exists()  # nothing was done
    proc = _run("--bogus")
    assert proc.returncode != 0 and "unknown option --bogus" in proc.stderr


def test_dry_run_trains_on_the_checked_task_and_explains_the_table(tmp_path):
    """The training command uses hgrn_language_modeling (the task the README recommends), the evaluation
    scores 1x to 8x the training length, and the demo says what that table shows. On the CPU the run
    gets OMP_NUM_THREADS=1 unless it is set."""
    env = fixtures_corpus.subprocess_env()
    env.pop("OMP_NUM_THREADS", None)
    workdir = tmp_path / "w"
    proc = _run("--dry-run", "--cpu", "--workdir", str(workdir), "--max-update", "7", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    train = next(shlex.split(line) for line in lines if "fairseq-train" in line)
    assert train[:2] == ["OMP_NUM_THREADS=1", "fairseq-train"]
    flags = dict(zip(train, train[1:]))
    assert flags["--task"] == "hgrn_language_modeling" and "language_modeling" not in train
    assert flags["--tokens-per-sample"] == "128" and flags["--max-update"] == "7" and "--cpu" in train
    assert train[2] == str(workdir / "data-bin")
    evaluate = next(shlex.split(line) for line in lines if "hgrn_fairseq.evaluation.extrapolation" in line)
    assert evaluate[evaluate.index("--lengths") + 1] == "128,256,512,1024"
    assert evaluate[3] == str(workdir / "checkpoints" / "checkpoint_last.pt")
    explain = next(line for line in lines if line.startswith("The table:"))
    assert "trained on blocks of L = 128 tokens" in explain and "1x, 2x, 4x and 8x L" in explain
    assert "flat or falling" in explain and "extrapolates" in explain
    assert not workdir.exists()  # a dry run does nothing
    env["OMP_NUM_THREADS"] = "2"
    proc = _run("--dry-run", "--cpu", "--workdir", str(workdir), env=env)
    assert proc.returncode == 0 and "OMP_NUM_THREADS=1" not in proc.stdout  # the user's setting stands
