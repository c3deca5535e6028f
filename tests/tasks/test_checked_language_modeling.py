"""Bad input to `fairseq-train --task hgrn_language_modeling`: one clear line naming problem and fix."""
import os
import shutil
import sys

import numpy as np
import pytest

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from hgrn_fairseq.tasks.checked_language_modeling import CheckedLanguageModelingTask, DataError
from tests.lm_corpus import binarise, write_corpus
from tests import pyrun

pytestmark = pytest.mark.integration

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
    proc = pyrun.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1]
    assert last.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
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


# ---- every token counted, a checkpoint knows its data, numbers and splits checked ---------------
FAIRSEQ = os.path.dirname(sys.executable)


def split_tokens(prefix):
    """Tokens of a binarised split, from its .bin file size (uint16 ids for these small dictionaries)."""
    return os.path.getsize(prefix + ".bin") // 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    """A tiny model trained on ``data`` (5 updates), run from its own directory with relative paths."""
    root = tmp_path_factory.mktemp("trained")
    shutil.copytree(data, root / "data-bin")
    cmd = [sys.executable, "-m", "fairseq_cli.train", "data-bin", "--user-dir", PLUGIN,
           "--task", "hgrn_language_modeling", "--arch", "hgrn_lm_tiny", "--tokens-per-sample", "16",
           "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4", "--max-update", "5", "--cpu",
           "--num-workers", "0", "--save-dir", "ck", "--no-epoch-checkpoints"]
    proc = pyrun.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def foreign(tmp_path_factory, data):
    """The same data with a dictionary of the same size whose first two words are swapped."""
    root = tmp_path_factory.mktemp("foreign")
    shutil.copytree(data, root / "bin")
    lines = (root / "bin" / "dict.txt").read_text().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    (root / "bin" / "dict.txt").write_text("\n".join(lines) + "\n")
    return root / "bin"


def run_elsewhere(cmd, tmp_path):
    """Run a command from a directory that is neither the training one nor the data's."""
    other = tmp_path / "elsewhere"
    other.mkdir(exist_ok=True)
    return pyrun.run(cmd, capture_output=True, text=True, timeout=300, cwd=other)


def eval_commands(trained, data_dir):
    ckpt = str(trained / "ck" / "checkpoint_last.pt")
    common = ["--user-dir", PLUGIN, "--task", "hgrn_language_modeling", "--path", ckpt, "--cpu",
              "--tokens-per-sample", "16", "--num-workers", "0"]
    return {
        "eval_lm": [sys.executable, "-m", "fairseq_cli.eval_lm", str(data_dir), *common, "--batch-size", "8",
                    "--gen-subset", "valid"],
        "validate": [sys.executable, "-m", "fairseq_cli.validate", str(data_dir), *common, "--batch-size", "8",
                     "--valid-subset", "valid"],
        "generate": [sys.executable, "-m", "fairseq_cli.generate", str(data_dir), *common, "--gen-subset", "test",
                     "--sample-break-mode", "eos", "--prefix-size", "2", "--max-len-b", "100",
                     "--sampling", "--beam", "1", "--batch-size", "8"],
        "extrapolation": [sys.executable, "-m", "hgrn_fairseq.evaluation.extrapolation", ckpt, str(data_dir),
                          "--lengths", "16", "--split", "valid", "--cpu", "--no-plot", "--no-progress",
                          "--out-dir", str(trained / "extrap")],
    }


@pytest.mark.parametrize("command", ["eval_lm", "validate", "generate", "extrapolation"])
def test_a_foreign_dictionary_is_refused_from_any_directory(trained, foreign, command, tmp_path):
    proc = run_elsewhere(eval_commands(trained, foreign)[command], tmp_path)
    assert proc.returncode != 0, proc.stdout[-2000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert "was trained with another dictionary than" in last and str(foreign) in last, proc.stderr[-3000:]


def test_eval_lm_with_a_batch_size_that_does_not_divide_the_blocks_scores_every_token(trained, data, tmp_path):
    # valid: its blocks of 16 tokens do not fill a last batch of 8 (fairseq used to drop that batch)
    proc = run_elsewhere(eval_commands(trained, data)["eval_lm"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    total = split_tokens(os.path.join(data, "valid"))
    blocks = -(-total // 16)
    assert blocks % 8 != 0
    assert f"Evaluated {total:,} tokens" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]


def test_validation_batches_cover_the_split(data):
    """The task's batches of an evaluation split hold every example whatever the batch size and the
    --required-batch-size-multiple (fairseq's batching drops a last smaller batch)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling", "--arch", "hgrn_lm_tiny",
        "--tokens-per-sample", "16", "--batch-size", "8"])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    assert len(ds) == -(-split_tokens(os.path.join(data, "valid")) // 16) and len(ds) % 8 != 0
    for bsz, multiple in ((8, 8), (3, 2), (5, 8)):
        itr = task.get_batch_iterator(ds, max_sentences=bsz, required_batch_size_multiple=multiple,
                                      max_positions=16)
        assert sorted(i for b in itr.frozen_batches for i in b) == list(range(len(ds)))


def test_a_prompt_longer_than_the_length_budget_is_refused(trained, tmp_path):
    prompt = " ".join(f"w{i % 100}" for i in range(150))
    cmd = [sys.executable, "-m", "fairseq_cli.interactive", str(trained / "data-bin"), "--user-dir", PLUGIN,
           "--task", "hgrn_language_modeling", "--path", str(trained / "ck" / "checkpoint_last.pt"), "--cpu",
           "--max-len-b", "100", "--beam", "1", "--tokens-per-sample", "16"]
    proc = pyrun.run(cmd, input=prompt + "\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert "fill the length budget of 100 tokens" in last and "--max-len-b" in last, proc.stderr[-2000:]
    ok = pyrun.run(cmd[:-6] + ["--max-len-b", "160", "--beam", "1", "--tokens-per-sample", "16"],
                   input=prompt + "\n", capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    hypo = [line for line in ok.stdout.splitlines() if line.startswith("H-")][0].split("\t")[2].split()
    assert hypo[:150] == prompt.split() and len(hypo) > 150


@pytest.mark.parametrize("value", ["0", "-4"])
def test_tokens_per_sample_must_be_positive(data, value):
    last = train_error(data, "--tokens-per-sample", value)
    assert f"--tokens-per-sample={int(value)}" in last and ">= 1" in last


def test_empty_split_is_named(data, tmp_path):
    broken = tmp_path / "empty"
    shutil.copytree(data, broken)
    pyrun.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--srcdict",
               str(broken / "dict.txt"), "--validpref", os.devnull, "--destdir", str(tmp_path / "e")],
              check=True, capture_output=True)
    for ext in (".bin", ".idx"):
        shutil.copyfile(tmp_path / "e" / f"valid{ext}", broken / f"valid{ext}")
    last = train_error(broken, "--tokens-per-sample", "16")
    assert "split 'valid'" in last and "is empty" in last


def test_dictionary_smaller_than_the_ids_in_the_data(data, tmp_path):
    broken = tmp_path / "small"
    shutil.copytree(data, broken)
    lines = (broken / "dict.txt").read_text().splitlines()
    (broken / "dict.txt").write_text("\n".join(lines[:10]) + "\n")
    last = train_error(broken, "--tokens-per-sample", "16")
    assert "uses token id" in last and "has only 14 entries" in last
