"""A damaged WikiText archive: one error line naming it and the fix, exit 2, and nothing unpacked
that a rerun with a good archive would trust."""
import os
import random
import shutil
import sys
import zipfile

import pytest

from tests import fixtures_corpus
from tests import pyrun
from data_prep import prepare_wikitext103 as pw

pytestmark = pytest.mark.integration

SCRIPT = os.path.join(fixtures_corpus.DATA_PREP, "prepare_wikitext103.py")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return fixtures_corpus.write_wikitext_folder(str(tmp_path_factory.mktemp("wt")), seed=3)


def _zip(folder, path, compression, replace=None):
    """The fixture folder as a WikiText zip; ``replace`` {file name: text} changes some members."""
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name in sorted(os.listdir(folder)):
            data = open(os.path.join(folder, name), "rb").read()
            if replace and name in replace:
                data = replace[name].encode("utf-8")
            z.writestr(f"wikitext-103-raw/{name}", data)
    return path


def _member_data_span(path, name):
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(f"wikitext-103-raw/{name}")
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    start = info.header_offset + 30 + n + m
    return start, start + info.compress_size


def _overwrite(path, start, data):
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(data)


def _make(kind, folder, path):
    if kind == "random bytes":
        with open(path, "wb") as f:
            f.write(random.Random(5).randbytes(4096))
    elif kind == "truncated":
        data = open(_zip(folder, path, zipfile.ZIP_DEFLATED), "rb").read()
        with open(path, "wb") as f:
            f.write(data[: len(data) * 2 // 3])
    elif kind == "middle cut out":  # the central directory is intact, the offsets it gives are not
        data = open(_zip(folder, path, zipfile.ZIP_STORED), "rb").read()
        start, end = _member_data_span(path, "wiki.train.raw")
        with open(path, "wb") as f:
            f.write(data[:start + 10] + data[start + 400:])
    elif kind == "stored member flipped":  # read whole, then its CRC-32 differs
        _zip(folder, path, zipfile.ZIP_STORED)
        start, end = _member_data_span(path, "wiki.valid.raw")
        _overwrite(path, (start + end) // 2, b"#")
    elif kind == "deflated member scrambled":  # zlib cannot inflate it
        _zip(folder, path, zipfile.ZIP_DEFLATED)
        start, end = _member_data_span(path, "wiki.train.raw")
        _overwrite(path, start, b"\xff" * min(64, end - start))
    return path


KINDS = ["random bytes", "truncated", "middle cut out", "stored member flipped", "deflated member scrambled"]


def _cli(source, dest):
    return pyrun.run([sys.executable, SCRIPT, "--source", source, "--dest", dest, "--workers", "1",
                      "--vocab-size", "200", "--tokenizer", "sentencepiece"],
                     capture_output=True, text=True, env=fixtures_corpus.subprocess_env(), timeout=300)


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_archive_is_one_line_naming_it_and_the_fix(folder, tmp_path, kind):
    archive = _make(kind, folder, str(tmp_path / "wikitext-103-raw-v1.zip"))
    dest = str(tmp_path / "bin")
    proc = _cli(archive, dest)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert archive in lines[0] and "download it again" in lines[0] and "wikitext-103-raw-v1.zip from" in lines[0]
    # nothing half-unpacked: no raw file, no partial file, no stamp
    raw = os.path.join(dest + ".work", "raw")
    left = sorted(os.listdir(raw)) if os.path.isdir(raw) else []
    assert left == [], left
    assert not os.path.exists(os.path.join(dest, pw.STAMP))


def test_a_failed_unpack_over_a_good_one_is_not_trusted_by_a_rerun(folder, tmp_path):
    """A good archive is unpacked; the same path then holds a damaged one whose first members are good
    but different: the unpack fails and the good archive restored (same size and mtime) is unpacked
    again, its own text, not a mix."""
    good = _zip(folder, str(tmp_path / "good.zip"), zipfile.ZIP_STORED)
    archive = str(tmp_path / "wikitext-103-raw-v1.zip")
    shutil.copy2(good, archive)
    work = str(tmp_path / "work")
    raw = pw.locate_raw(archive, work, log=lambda *_: None)
    expected = {s: open(p, "rb").read() for s, p in raw.items()}
    # wiki.test.raw and wiki.train.raw come first in the archive; wiki.valid.raw is damaged
    bad = _zip(folder, str(tmp_path / "bad.zip"), zipfile.ZIP_STORED,
               replace={"wiki.test.raw": " = Other = \n", "wiki.train.raw": " = Other train = \n"})
    start, end = _member_data_span(bad, "wiki.valid.raw")
    _overwrite(bad, (start + end) // 2, b"#")
    shutil.copyfile(bad, archive)
    with pytest.raises(pw.PrepError, match="download it again"):
        pw.locate_raw(archive, work, log=lambda *_: None)
    assert sorted(os.listdir(os.path.join(work, "raw"))) == ["wiki.test.raw", "wiki.train.raw", "wiki.valid.raw"]
    shutil.copy2(good, archive)  # same bytes, size and mtime as the first time
    messages = []
    raw = pw.locate_raw(archive, work, log=messages.append)
    assert [m for m in messages if "unpacking" in m], "the good archive was not unpacked again"
    assert {s: open(p, "rb").read() for s, p in raw.items()} == expected


def test_a_good_archive_after_a_damaged_one_prepares(folder, tmp_path):
    archive = _make("stored member flipped", folder, str(tmp_path / "wikitext-103-raw-v1.zip"))
    dest = str(tmp_path / "bin")
    assert _cli(archive, dest).returncode == 2
    _zip(folder, archive, zipfile.ZIP_DEFLATED)
    proc = _cli(archive, dest)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.isfile(os.path.join(dest, pw.STAMP))
    counts = pw.prepare(archive, dest, tokenizer="sentencepiece", workers=1, vocab_size=200, log=lambda *_: None)
    assert set(counts) == {"train", "valid", "test"}
    with open(os.path.join(folder, "wiki.test.raw")) as f:
        assert counts["test"]["lines"] == len(f.read().split("\n")[:-1])
