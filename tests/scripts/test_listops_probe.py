"""bench/listops_ngram_baseline.py (the token-statistics level of a ListOps curve) on a hand-written TSV,
and the probe script's syntax and part names."""
import importlib
import os
import sys

import pytest
from tests import pyrun

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("sklearn")


def write_split(folder, split, rows):
    os.makedirs(folder / "listops-1000", exist_ok=True)
    with open(folder / "listops-1000" / f"basic_{split}.tsv", "w") as f:
        f.write("Source\tTarget\n")
        for source, label in rows:
            f.write(f"{source}\t{label}\n")


def test_ngram_baseline_reads_the_models_tokens_and_scores_the_test_split(tmp_path, capsys):
    baseline = importlib.import_module("bench.listops_ngram_baseline")
    # a label given away by one token: the unigram regression must find it; the majority is 3 of 4
    train = [("( ( [MAX 1 ) 7 ) ]", 7), ("( ( [MIN 1 ) 7 ) ]", 1)] * 20
    write_split(tmp_path, "train", train)
    write_split(tmp_path, "test", [("( ( [MAX 2 ) 7 ) ]", 7), ("( ( [MAX 7 ) 3 ) ]", 7),
                                   ("( ( [MIN 7 ) 1 ) ]", 1), ("( ( [MAX 1 ) 7 ) ]", 7)])
    texts, labels = baseline.load(str(tmp_path), "train")
    assert texts[0] == "[MAX 1 7 X" and labels[:2] == [7, 1]  # prepare_lra.py's tokens: ] -> X, no ( )
    assert baseline.main([str(tmp_path), "--ngrams", "1"]) == 0
    out = capsys.readouterr().out
    assert "majority class: 75.00%" in out
    assert "logistic regression on 1..1-grams" in out and out.strip().endswith("100.00%")


def test_ngram_baseline_names_a_missing_file(tmp_path):
    r = pyrun.run([sys.executable, os.path.join(REPO, "bench", "listops_ngram_baseline.py"), str(tmp_path)],
                  capture_output=True, text=True)
    assert r.returncode == 1 and "basic_train.tsv is missing" in r.stderr and r.stderr.count("\n") == 1


def test_probe_script_parses_and_refuses_an_unknown_part(tmp_path):
    script = os.path.join(REPO, "bench", "lra_listops_probe.sh")
    assert pyrun.run(["bash", "-n", script]).returncode == 0
    r = pyrun.run(["bash", script], capture_output=True, text=True,
                  env=pyrun.script_env(dict(os.environ, OUT=str(tmp_path), PROBE_PARTS="deep")))
    assert r.returncode == 2 and "unknown part 'deep'" in r.stderr
