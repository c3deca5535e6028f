"""One table of bad inputs walked through each of the package's commands: every one exits non-zero with
one stderr line naming the bad path, option or value, and no traceback.

Cases fail before any training or data work, so the table stays fast. An argparse error (an option
argparse itself rejects) prints argparse's usage block before its one ``error:`` line: those cases
allow that block and still require exactly one line beside it.
"""
import os
import subprocess
import sys

import pytest

from tests import pyrun

pytestmark = pytest.mark.integration  # starts commands

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def table(t):
    """(case id, command, words the one line must contain, argparse usage block allowed)."""
    missing, junk, empty = f"{t}/missing.pt", f"{t}/junk.pt", f"{t}/emptydata"
    return [
        ("train_wt103 unknown recipe", ["bash", "scripts/train_wt103.sh", "nosuch", empty, "--dry-run"],
         ["RECIPE 'nosuch'"], False),
        ("train_wt103 data without dict.txt", ["bash", "scripts/train_wt103.sh", "hgrn_lm_base", empty, "--dry-run"],
         [f"{empty}/dict.txt is missing"], False),
        ("prepare_lra missing source", [PY, "data_prep/prepare_lra.py", "listops", "--source", f"{t}/nosrc",
                                        "--dest", f"{t}/out"], [f"{t}/nosrc not found"], False),
        ("prepare_lra max-len 0", [PY, "data_prep/prepare_lra.py", "listops", "--source", f"{t}/nosrc",
                                   "--dest", f"{t}/out", "--max-len", "0"], ["--max-len 0"], False),
        ("prepare_wikitext103 missing source", [PY, "data_prep/prepare_wikitext103.py", "--source", f"{t}/nosrc",
                                                "--dest", f"{t}/wt"], [f"{t}/nosrc not found", "--source"], False),
        ("lra_eval missing checkpoint", [PY, "scripts/lra_eval.py", missing], [missing, "not found"], False),
        ("lra_eval unreadable checkpoint", [PY, "scripts/lra_eval.py", junk], [junk, "cannot be read"], False),
        ("extrapolation missing checkpoint", [PY, "-m", "hgrn_fairseq.evaluation.extrapolation", missing, empty,
                                              "--cpu"], [missing, "not found"], False),
        ("extrapolation bad lengths", [PY, "-m", "hgrn_fairseq.evaluation.extrapolation", junk, empty, "--cpu",
                                       "--lengths", "abc"], ["--lengths 'abc'"], False),
        ("eval_zero_shot missing checkpoint", ["bash", "scripts/eval_zero_shot.sh", missing, empty],
         [missing, "not found"], False),
        ("eval_zero_shot data without dict.txt", ["bash", "scripts/eval_zero_shot.sh", junk, empty],
         [f"{empty}/dict.txt not found"], False),
        ("mqar_sweep no kv pairs", [PY, "scripts/mqar_sweep.py", "--out", f"{t}/mq1", "--settings", "16:0"],
         ["--settings '16:0'", "0 kv pairs"], False),
        ("mqar_sweep vocabulary 0", [PY, "scripts/mqar_sweep.py", "--out", f"{t}/mq2", "--vocab-size", "0"],
         ["--vocab-size '0'"], False),
        ("make_image_folder size 0", [PY, "scripts/make_image_folder.py", "--dest", f"{t}/img", "--size", "0"],
         ["--size 0"], False),
        ("make_image_folder val fraction 1", [PY, "scripts/make_image_folder.py", "--dest", f"{t}/img",
                                              "--val-fraction", "1"], ["--val-fraction 1.0"], False),
        ("lm_eval missing checkpoint", [PY, "-m", "hgrn_fairseq.evaluation.lm_eval", "--path", missing,
                                        "--tasks", "piqa"], [missing, "not found"], False),
        ("lm_eval data without dict.txt", [PY, "-m", "hgrn_fairseq.evaluation.lm_eval", "--path", junk, "--data",
                                           empty, "--tasks", "piqa"], [f"{empty}/dict.txt not found"], False),
        ("image train missing folder", [PY, "-m", "hgrn_fairseq.image.train", "--dry-run", f"data.path={t}/noimg"],
         [f"'{t}/noimg' does not exist", "data.path"], False),
        ("image train unknown recipe", [PY, "-m", "hgrn_fairseq.image.train", "--dry-run", "--config-name", "nosuch"],
         ["no config 'nosuch'", "--config-name"], False),
        ("check_lm_data missing directory", [PY, "scripts/check_lm_data.py", f"{t}/nodata"],
         [f"{t}/nodata does not exist"], False),
    ]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    t = tmp_path_factory.mktemp("bad")
    (t / "emptydata").mkdir()
    (t / "junk.pt").write_bytes(b"not a checkpoint")
    return str(t)


CASES = [case[0] for case in table("T")]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_a_non_zero_exit(scratch, case):
    _, cmd, needles, usage_allowed = next(c for c in table(scratch) if c[0] == case)
    if cmd[0] == PY:
        proc = pyrun.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    err = proc.stderr.strip()
    assert proc.returncode != 0, (proc.stdout + err)[-2000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.splitlines()
    if usage_allowed and lines and lines[0].startswith("usage:"):
        lines = [line for line in lines if not (line.startswith("usage:") or line.startswith(" "))]
    assert len(lines) == 1, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
