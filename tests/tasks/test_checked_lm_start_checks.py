"""`hgrn_language_modeling` refuses, before the first update, what fairseq would fail on later; a damaged or
empty split is refused whatever the task (the plugin checks fairseq's split reader)."""
import os
import shutil
import sys

import pytest

import hgrn_fairseq
from tests import pyrun
from tests.lm_corpus import binarise, write_corpus

pytestmark = pytest.mark.integration  # starts commands

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("start")
    write_corpus(str(root / "text"), sizes={"train": 60, "valid": 20, "test": 20})
    return binarise(str(root / "text"), str(root / "bin"))


def train(data_dir, tmp_path, *extra, task="hgrn_language_modeling"):
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(data_dir), "--user-dir", PLUGIN,
           "--task", task, "--arch", "hgrn_lm_tiny", "--optimizer", "adam", "--lr", "1e-3",
           "--max-epoch", "1", "--cpu", "--num-workers", "0", "--save-dir", str(tmp_path / "ck"), *extra]
    return pyrun.run(cmd, capture_output=True, text=True, timeout=300)


def refusal(proc, tmp_path):
    assert proc.returncode != 0, proc.stdout[-2000:]
    last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1]
    assert last.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # before any training: no epoch begun, no checkpoint written
    assert "begin training epoch" not in proc.stdout + proc.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")
    return last


def test_max_tokens_below_a_block_names_both_options(data, tmp_path):
    last = refusal(train(data, tmp_path, "--tokens-per-sample", "16", "--max-tokens", "12"), tmp_path)
    assert "--max-tokens=12 is smaller than one sample of split 'train' (16 tokens; --tokens-per-sample=16)" in last
    assert "pass --max-tokens >= 16 or a smaller --tokens-per-sample" in last
    assert "max_positions" not in last


def test_max_tokens_of_one_block_trains(data, tmp_path):
    proc = train(data, tmp_path, "--tokens-per-sample", "16", "--max-tokens", "16", "--max-update", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("task", ["hgrn_language_modeling", "language_modeling"])
def test_an_empty_validation_split_is_refused_before_training(data, tmp_path, task):
    broken = tmp_path / "empty_valid"
    shutil.copytree(data, broken)
    pyrun.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--srcdict",
               str(broken / "dict.txt"), "--validpref", os.devnull, "--destdir", str(tmp_path / "e")],
              check=True, capture_output=True)
    for ext in (".bin", ".idx"):
        shutil.copyfile(tmp_path / "e" / f"valid{ext}", broken / f"valid{ext}")
    last = refusal(train(broken, tmp_path, "--tokens-per-sample", "16", "--batch-size", "4", task=task), tmp_path)
    assert f"split 'valid' ({broken}/valid.bin) is empty" in last and "--valid-subset" in last


@pytest.mark.parametrize("task", ["hgrn_language_modeling", "language_modeling"])
def test_a_truncated_index_is_refused_before_fairseq_reads_it(data, tmp_path, task):
    broken = tmp_path / "cut"
    shutil.copytree(data, broken)
    blob = (broken / "valid.idx").read_bytes()
    (broken / "valid.idx").write_bytes(blob[:-5])
    last = refusal(train(broken, tmp_path, "--tokens-per-sample", "16", "--batch-size", "4", task=task), tmp_path)
    assert f"{broken}/valid.idx is truncated" in last and "re-run fairseq-preprocess" in last
