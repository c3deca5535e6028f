"""Bad inputs to the LRA data commands: each run as ``python data_prep/...`` ends quickly with a non-zero
exit and exactly one line on stderr that names the file, option or value (no traceback)."""
import os
import subprocess
import sys

import pytest

DATA_PREP = os.path.join(os.path.dirname(__file__), "..", "..", "data_prep")


def run(script, *args, timeout=60):
    # a real interpreter with a timeout: a hang is a failure, not a stuck suite
    return subprocess.run([sys.executable, os.path.join(DATA_PREP, script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line(proc, *needles):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.mark.parametrize("args, needles", [
    # depth 2, 10 arguments: the largest tree is an operator over 10 digits, length 12
    (("--max-depth", 2, "--min-length", 30), ("--min-length 30", "12")),
    # depth 3, 4 arguments: 2 + 4 * (2 + 4) = 26
    (("--max-depth", 3, "--max-args", 4, "--min-length", 26), ("--min-length 26", "26")),
    # two arguments only: every length is 1 + 3 * (operators), so none lies strictly between 7 and 10
    (("--max-depth", 4, "--max-args", 2, "--min-length", 7, "--max-length", 10), ("7 and 10",)),
    # depth 1: ten digits are all the trees there are, 12 examples asked
    (("--max-depth", 1, "--min-length", 0, "--max-length", 50), ("12 examples", "only 10 distinct")),
])
def test_listops_impossible_lengths_refused_before_work(tmp_path, args, needles):
    proc = run("lra_listops.py", "--dest", tmp_path, "--train", 8, "--valid", 2, "--test", 2, "--workers", 1,
               "--no-progress", *args)
    assert_one_line(proc, "lra_listops.py:", *needles)
    assert not (tmp_path / "listops-1000").exists()  # refused before any work


def test_listops_reachable_but_too_rare_ends_with_the_draw_budget(tmp_path):
    # depth 3, 10 arguments reach 122, but a tree above 110 needs nearly every node an operator
    proc = run("lra_listops.py", "--dest", tmp_path, "--train", 3, "--valid", 1, "--test", 1, "--workers", 2,
               "--no-progress", "--max-depth", 3, "--min-length", 110)
    assert_one_line(proc, "100000 draws", "--max-depth 3", "110 < length < 2000")
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "listops-1000").iterdir())


def test_listops_duplicate_budget_ends_a_search_the_count_did_not_cover(tmp_path, monkeypatch):
    # with the exact count switched off, only the duplicate budget stops a search for 22 of 10 digits
    sys.path.insert(0, DATA_PREP)
    try:
        import lra_listops
    finally:
        sys.path.remove(DATA_PREP)
    monkeypatch.setattr(lra_listops, "COUNT_CAP", 1)
    with pytest.raises(lra_listops.SamplingError, match="10 distinct of 22 at --max-depth 1"):
        lra_listops.generate(str(tmp_path), train=20, valid=1, test=1, workers=1, max_depth=1, min_length=0,
                             max_length=50, progress=False, log=lambda m: None)
