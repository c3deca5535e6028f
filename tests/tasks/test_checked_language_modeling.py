"""Bad input to `fairseq-train --task hgrn_language_modeling`: one clear line naming problem and fix."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hgrn_fairseq
from hgrn_fairseq.tasks.checked_language_modeling import CheckedLanguageModelingTask, DataError
from tests.lm_corpus import binarise, write_corpus

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("checked")
    write_corpus(str(root / "text"), sizes={"train": 60, "valid": 20, "test": 20})
    return binarise(str(root / "text"), str(root / "bin"))


def train_error(data_dir, *extra):
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(data_dir), "--user-dir", PLUGIN,
           "--task", "hgrn_language_modeling", "--arch", "hgrn_lm_tiny", "--optimizer", "adam", "--lr", "1e-3",
           "--batch-size", "2", "--max-update", "1", "--cpu", "--no-save", "--num-workers", "0", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1]
    assert last.startswith("hgrn_fairseq.tasks.checked_language_modeling.DataError: "), proc.stderr[-3000:]
    return last


def test_missing_data_directory(tmp_path):
    last = train_error(tmp_path / "nowhere", "--tokens-per-sample", "16")
    assert "does not exist" in last and "fairseq-preprocess" in last


def test_missing_dictionary(tmp_path):
    last = train_error(tmp_path, "--tokens-per-sample", "16")
    assert "dict.txt" in last and "is missing" in last and "fairseq-preprocess" in last


def test_corpus_too_small_for_block_size(data):
    last = train_error(data, "--tokens-per-sample", "100000")
    assert "fewer than --tokens-per-sample=100000" in last and "lower --tokens-per-sample" in last


def test_missing_validation_split(data, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(data, partial)
    for ext in (".bin", ".idx"):
        os.remove(partial / f"valid{ext}")
    last = train_error(partial, "--tokens-per-sample", "16")
    assert "split 'valid' not found" in last and "--valid-subset" in last


class _Sized:
    def __init__(self, sizes):
        self.sizes = np.array(sizes)

    def filter_indices_by_size(self, indices, max_positions):
        keep = self.sizes[indices] <= max_positions
        return indices[keep], indices[~keep].tolist()

    def size(self, i):
        return int(self.sizes[i])


def test_long_samples_are_refused_not_skipped():
    task = CheckedLanguageModelingTask.__new__(CheckedLanguageModelingTask)
    indices = np.arange(3)
    kept = task.filter_indices_by_size(indices, _Sized([5, 6, 7]), max_positions=10, ignore_invalid_inputs=True)
    assert kept.tolist() == [0, 1, 2]
    with pytest.raises(DataError, match=r"1 samples are longer than the model's max_positions=6 .*of size 7"):
        task.filter_indices_by_size(indices, _Sized([5, 6, 7]), max_positions=6, ignore_invalid_inputs=True)
