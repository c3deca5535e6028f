"""An hgrn_lm checkpoint refuses a dictionary other than its training one, whatever fairseq task loads it."""
import logging
import os
import shutil
import sys
import types

import pytest
import torch
from fairseq.data import Dictionary

import hgrn_fairseq
from hgrn_fairseq.data_checks import DataError
from hgrn_fairseq.models.hgrn_lm import HgrnLanguageModel, hgrn_lm_tiny
from tests import pyrun
from tests.lm_corpus import binarise, write_corpus

pytestmark = pytest.mark.integration  # starts commands

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))


def dictionary(words):
    d = Dictionary()
    for w in words:
        d.add_symbol(w)
    return d


def build(words, data="/data/a"):
    args = types.SimpleNamespace(arch="hgrn_lm_tiny", kernel_backend="reference")
    hgrn_lm_tiny(args)
    task = types.SimpleNamespace(target_dictionary=dictionary(words), cfg=types.SimpleNamespace(data=data))
    return HgrnLanguageModel.build_model(args, task)


WORDS = ["the", "cat", "sat", "on", "mat"]


def test_the_same_dictionary_loads():
    state = build(WORDS).state_dict()
    assert state["decoder._extra_state"]["dictionary_path"] == os.path.abspath("/data/a/dict.txt")
    model = build(WORDS, data="/elsewhere")
    model.load_state_dict(state)
    assert torch.equal(model.decoder.embed_tokens.weight, state["decoder.embed_tokens.weight"])


def test_same_size_other_symbols_names_the_first_difference_and_both_files():
    state = build(WORDS).state_dict()
    other = WORDS[:2] + ["dog"] + WORDS[3:]
    with pytest.raises(DataError) as e:
        build(other, data="/data/b").load_state_dict(state)
    msg = str(e.value)
    assert "\n" not in msg
    assert "was trained with another dictionary than /data/b/dict.txt (trained with /data/a/dict.txt" in msg
    # 'sat' is the third line of dict.txt, id 4 + 2 after fairseq's four specials
    assert "same size (9 entries), different symbols: first at id 6 (dict.txt line 3), 'sat' in training vs 'dog' now" in msg


def test_another_size_says_size_mismatch():
    state = build(WORDS).state_dict()
    with pytest.raises(DataError, match=r"size mismatch: 9 entries in training vs 10 now"):
        build(WORDS + ["extra"], data="/data/b").load_state_dict(state)


def test_a_checkpoint_without_the_record_loads_with_a_warning(caplog):
    state = build(WORDS).state_dict()
    del state["decoder._extra_state"]
    with caplog.at_level(logging.WARNING):
        build(WORDS[::-1]).load_state_dict(state)
    assert "records no dictionary" in caplog.text


# ---- end to end: fairseq commands with the stock language_modeling task -------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp")
    write_corpus(str(root / "text"), sizes={"train": 60, "valid": 20, "test": 20})
    binarise(str(root / "text"), str(root / "bin"))
    foreign = root / "foreign"
    shutil.copytree(root / "bin", foreign)
    lines = (foreign / "dict.txt").read_text().splitlines()
    lines[3], lines[4] = lines[4], lines[3]
    (foreign / "dict.txt").write_text("\n".join(lines) + "\n")
    return root, root / "bin", foreign, lines[4].split()[0], lines[3].split()[0]


def train(root, data_dir, task):
    save = root / f"ck_{task}"
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(data_dir), "--user-dir", PLUGIN, "--task", task,
           "--arch", "hgrn_lm_tiny", "--tokens-per-sample", "16", "--optimizer", "adam", "--lr", "1e-3",
           "--batch-size", "4", "--max-update", "2", "--cpu", "--num-workers", "0", "--save-dir", str(save),
           "--no-epoch-checkpoints"]
    proc = pyrun.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(save / "checkpoint_last.pt")


def eval_lm(ckpt, data_dir, task):
    cmd = [sys.executable, "-m", "fairseq_cli.eval_lm", str(data_dir), "--user-dir", PLUGIN, "--task", task,
           "--path", ckpt, "--cpu", "--tokens-per-sample", "16", "--batch-size", "8", "--gen-subset", "valid",
           "--num-workers", "0"]
    return pyrun.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("train_task,eval_task", [("language_modeling", "language_modeling"),
                                                  ("hgrn_language_modeling", "language_modeling"),
                                                  ("language_modeling", "hgrn_language_modeling")])
def test_eval_lm_refuses_a_foreign_dictionary_whatever_the_task(data, train_task, eval_task):
    root, good, foreign, first_trained, first_now = data
    ckpt = train(root, good, train_task)
    proc = eval_lm(ckpt, foreign, eval_task)
    assert proc.returncode != 0, proc.stdout[-2000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"another dictionary than {foreign}" in last, last
    assert f"(trained with {good}/dict.txt; " in last, last  # the model's record: the stock task records none
    assert f"dict.txt line 4), '{first_trained}' in training vs '{first_now}' now" in last, last
    ok = eval_lm(ckpt, good, eval_task)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "Loss (base 2)" in ok.stdout + ok.stderr
