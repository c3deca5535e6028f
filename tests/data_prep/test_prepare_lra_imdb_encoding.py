"""prepare_lra.py text: an IMDB review that is not UTF-8 stops preparation with one line naming it."""
import os
import sys

import pytest

from tests import pyrun

pytestmark = pytest.mark.integration  # runs prepare_lra.py

DATA_PREP = os.path.join(os.path.dirname(__file__), "..", "..", "data_prep")


def imdb_folder(root, bad=None):
    """A tiny aclImdb/ tree (two reviews per folder); ``bad`` = (split, sub, bytes) replaces one review."""
    for split in ("train", "test"):
        for sub in ("neg", "pos"):
            d = root / "aclImdb" / split / sub
            d.mkdir(parents=True)
            (d / "0_2.txt").write_text("A fine film, caf\u00e9 scenes.", encoding="utf-8")
            (d / "1_2.txt").write_text("Dull.<br />Very dull.", encoding="utf-8")
    if bad:
        split, sub, blob = bad
        (root / "aclImdb" / split / sub / "1_2.txt").write_bytes(blob)
    return root


def prepare(src, dest):
    return pyrun.run([sys.executable, os.path.join(DATA_PREP, "prepare_lra.py"), "text", "--source", str(src),
                      "--dest", str(dest), "--min-freq", "1"], capture_output=True, text=True)


def test_a_latin1_review_is_named_with_its_line_and_byte(tmp_path):
    # Latin-1 e acute (0xe9) on the second line of a test review
    src = imdb_folder(tmp_path / "src", ("test", "pos", b"Good.\nCaf\xe9 scene.\n"))
    proc = prepare(src, tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    path = os.path.join(str(src), "aclImdb", "test", "pos", "1_2.txt")
    assert err.startswith(f"prepare_lra.py: {path} line 2: not UTF-8 text (byte 0xe9 at offset 9)"), err
    assert "aclImdb_v1.tar.gz" in err
    assert not (tmp_path / "out" / "meta.json").exists()


def test_utf8_reviews_with_non_ascii_characters_prepare(tmp_path):
    src = imdb_folder(tmp_path / "src")
    proc = prepare(src, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "meta.json").exists()
