"""Bad inputs to the LRA data commands: each run as ``python data_prep/...`` ends quickly with a non-zero
exit and exactly one line on stderr that names the file, option or value (no traceback)."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

DATA_PREP = os.path.join(os.path.dirname(__file__), "..", "..", "data_prep")
# the package of this checkout for the entry points (as `pip install -e .` gives it)
PACKAGE_ENV = dict(os.environ, PYTHONPATH=os.path.abspath(os.path.join(DATA_PREP, "..")))


def run(script, *args, timeout=60):
    # a real interpreter with a timeout: a hang is a failure, not a stuck suite
    return subprocess.run([sys.executable, os.path.join(DATA_PREP, script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=PACKAGE_ENV)


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
    from data_prep import lra_listops
    monkeypatch.setattr(lra_listops, "COUNT_CAP", 1)
    with pytest.raises(lra_listops.SamplingError, match="10 distinct of 22 at --max-depth 1"):
        lra_listops.generate(str(tmp_path), train=20, valid=1, test=1, workers=1, max_depth=1, min_length=0,
                             max_length=50, progress=False, log=lambda m: None)


# ------------------------------------------------------------------------------------------ prepare_lra.py
def prepare(*args):
    from tests import pyrun  # a fresh `python data_prep/prepare_lra.py`, started from a warm interpreter

    return pyrun.run([sys.executable, os.path.join(DATA_PREP, "prepare_lra.py"), *map(str, args)],
                     capture_output=True, text=True, env=PACKAGE_ENV)


ROWS = ["( ( ( [MAX 2 ) 9 ) ] )\t9", "( ( ( [SM 4 ) 7 ) ] )\t1", "3\t3", "( ( ( [MED 1 ) 5 ) ] )\t3"]


def listops_folder(tmp_path, test_rows=ROWS, train_rows=ROWS):
    folder = tmp_path / "src" / "listops-1000"
    folder.mkdir(parents=True)
    for name, rows in (("basic_train.tsv", train_rows), ("basic_val.tsv", ROWS), ("basic_test.tsv", test_rows)):
        (folder / name).write_text("Source\tTarget\n" + "".join(r + "\n" for r in rows))
    return folder


def test_prepare_refuses_a_header_only_split(tmp_path):
    folder = listops_folder(tmp_path, test_rows=[])
    proc = prepare("listops", "--source", tmp_path / "src", "--dest", tmp_path / "out")
    assert_one_line(proc, str(folder / "basic_test.tsv"), "no examples")
    assert not (tmp_path / "out" / "meta.json").exists()


def test_prepare_refuses_an_unknown_listops_operator_with_its_line(tmp_path):
    # line 3 of the train file (the header is line 1) uses an operator LRA's ListOps does not have
    folder = listops_folder(tmp_path, train_rows=[ROWS[0], "( ( ( [AVG 2 ) 4 ) ] )\t3"] + ROWS[1:])
    proc = prepare("listops", "--source", tmp_path / "src", "--dest", tmp_path / "out")
    assert_one_line(proc, f"{folder / 'basic_train.tsv'} line 3", "'[AVG'")


def test_prepare_names_a_tsv_that_is_not_utf8(tmp_path):
    folder = listops_folder(tmp_path)
    # Latin-1 bytes (0xe9 = e acute) in the validation file's third example
    (folder / "basic_val.tsv").write_bytes(b"Source\tTarget\n3\t3\n4\t4\n\xe9t\xe9\t5\n")
    proc = prepare("listops", "--source", tmp_path / "src", "--dest", tmp_path / "out")
    assert_one_line(proc, str(folder / "basic_val.tsv"), "UTF-8", "0xe9")


def test_prepare_names_a_truncated_archive(tmp_path):
    import io
    import tarfile

    listops_folder(tmp_path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        t.add(str(tmp_path / "src"), arcname="lra_release")
        # incompressible padding so that the cut lands inside the compressed stream, after the TSVs' headers
        pad = tarfile.TarInfo("lra_release/zz_padding.bin")
        pad.size = 1 << 16
        t.addfile(pad, io.BytesIO(os.urandom(pad.size)))
    data = buf.getvalue()
    archive = tmp_path / "lra_release.tar.gz"
    archive.write_bytes(data[:len(data) // 2])
    proc = prepare("listops", "--source", archive, "--dest", tmp_path / "out")
    err = assert_one_line(proc, str(archive), "download it again")
    assert ".unpacked" not in err and "line" not in err


def test_prepare_names_a_damaged_zip(tmp_path):
    archive = tmp_path / "lra_release.zip"
    archive.write_bytes(b"PK\x03\x04" + os.urandom(200))
    proc = prepare("listops", "--source", archive, "--dest", tmp_path / "out")
    assert_one_line(proc, str(archive))


def test_validate_refuses_an_empty_split_before_training(tmp_path):
    # a directory written without the check (as an older preparation could): test holds no example
    import numpy as np
    from fairseq.data import Dictionary

    from hgrn_fairseq.tasks import lra_format as fmt

    dest = str(tmp_path)
    d = Dictionary()
    for sym in ("1", "2"):
        d.add_symbol(sym)
    fmt.write_dictionary(dest, d)
    for split, n in (("train", 2), ("valid", 1), ("test", 0)):
        fmt.write_tokens(dest, split, "input0", [np.array([4, 5])] * n, len(d))
        fmt.write_labels(dest, split, [0] * n, 10)
    fmt.write_meta(dest, task="listops", input="tokens", num_classes=10, max_len=8,
                   splits={"train": 2, "valid": 1, "test": 0}, check=False)
    with pytest.raises(fmt.LraDataError) as e:
        fmt.validate(dest, input_kind="tokens")
    assert str(e.value).count("\n") == 0 and "test.label" in str(e.value) and "no examples" in str(e.value)
