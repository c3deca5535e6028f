import json
import os
import sys

import pytest

from tests import fixtures_corpus
from data_prep import prepare_wikitext103 as pw
from tests import pyrun

pytestmark = pytest.mark.integration


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def _binarised_tokens(prefix):
    from fairseq.data import data_utils

    ds = data_utils.load_indexed_dataset(prefix, None, "mmap")
    return int(ds.sizes.sum()), len(ds)


@pytest.fixture(scope="module")
def wikitext(tmp_path_factory):
    root = tmp_path_factory.mktemp("wt")
    return fixtures_corpus.write_wikitext_folder(str(root))


@pytest.fixture(scope="module")
def offline_run(wikitext, tmp_path_factory):
    dest = str(tmp_path_factory.mktemp("bin") / "wikitext-103")
    messages = []
    counts = pw.prepare(wikitext, dest, tokenizer="auto", gpt2_dir=None, workers=1, vocab_size=200,
                        log=messages.append)
    return dest, counts, messages


def test_offline_tokenizer_path(offline_run, wikitext):
    dest, counts, messages = offline_run
    assert any("falling back to the offline sentencepiece" in m for m in messages)
    marker = json.load(open(os.path.join(dest, "TOKENIZER_INFO.json")))
    assert marker["tokenizer"] == "sentencepiece-bpe" and marker["comparable_with_paper"] is False
    assert os.path.isfile(os.path.join(dest, "spm.model"))
    enc_dir = dest + ".work/sentencepiece"
    for split in ("train", "valid", "test"):
        raw = _lines(os.path.join(wikitext, f"wiki.{split}.raw"))
        enc = _lines(os.path.join(enc_dir, f"{split}.bpe"))
        assert len(enc) == len(raw)
        # fairseq adds one end-of-sentence per line to the pieces written by the tokenizer
        expected_tokens = sum(len(line.split()) + 1 for line in enc)
        assert counts[split] == {"lines": len(raw), "tokens": expected_tokens}
        assert _binarised_tokens(os.path.join(dest, split)) == (expected_tokens, len(raw))
    assert json.load(open(os.path.join(dest, "token_counts.json"))) == counts
    # the counts are printed
    assert any("| test |" in m for m in messages)


def test_rerun_is_a_noop(offline_run, wikitext):
    dest, counts, _ = offline_run
    before = {f: os.stat(os.path.join(dest, f)).st_mtime_ns for f in os.listdir(dest)}
    messages = []
    assert pw.prepare(wikitext, dest, workers=1, vocab_size=200, log=messages.append) == counts
    assert any("nothing to do" in m for m in messages)
    assert before == {f: os.stat(os.path.join(dest, f)).st_mtime_ns for f in os.listdir(dest)}


def test_zip_input_gives_the_same_data(offline_run, wikitext, tmp_path):
    _, counts, _ = offline_run
    zip_path = fixtures_corpus.write_wikitext_zip(wikitext, str(tmp_path / "wikitext-103-raw-v1.zip"))
    dest = str(tmp_path / "from-zip")
    got = pw.prepare(zip_path, dest, tokenizer="sentencepiece", workers=1, vocab_size=200, log=lambda *_: None)
    assert got == counts


def test_gpt2_path_with_byte_level_files(wikitext, tmp_path):
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    files = fixtures_corpus.write_byte_level_gpt2_files(str(tmp_path / "gpt2"))
    dest = str(tmp_path / "gpt2-bin")
    counts = pw.prepare(wikitext, dest, tokenizer="auto", gpt2_dir=str(tmp_path / "gpt2"), workers=2,
                        log=lambda *_: None, custom_gpt2=True)
    marker = json.load(open(os.path.join(dest, "TOKENIZER_INFO.json")))
    # these small files are not the published ones: accepted only as custom, and marked so
    assert marker["tokenizer"] == "gpt2-bpe" and marker["comparable_with_paper"] is False
    decoder = get_encoder(files["encoder.json"], files["vocab.bpe"])
    raw = _lines(os.path.join(wikitext, "wiki.test.raw"))
    enc = _lines(os.path.join(dest + ".work", "gpt2", "test.bpe"))
    assert len(raw) == len(enc)
    for r, e in zip(raw, enc):
        ids = [int(t) for t in e.split()]
        assert decoder.decode(ids) == r.strip()  # lines are stripped, empty lines kept
    assert "256" in " ".join(enc) or "257" in " ".join(enc)  # the merges were applied
    assert counts["test"]["tokens"] == sum(len(e.split()) + 1 for e in enc)


def test_missing_gpt2_files_name_the_file_and_url(wikitext, tmp_path):
    with pytest.raises(pw.PrepError) as err:
        pw.prepare(wikitext, str(tmp_path / "d"), tokenizer="gpt2", gpt2_dir=str(tmp_path), log=lambda *_: None)
    msg = str(err.value)
    assert "encoder.json" in msg and "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json" in msg
    assert "\n" not in msg


def test_missing_dataset_names_the_file_and_url(tmp_path):
    proc = pyrun.run(
        [sys.executable, os.path.join(fixtures_corpus.DATA_PREP, "prepare_wikitext103.py"),
         "--source", str(tmp_path / "wikitext-103-raw-v1.zip"), "--dest", str(tmp_path / "d")],
        capture_output=True, text=True, env=fixtures_corpus.subprocess_env(),
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1
    assert "wikitext-103-raw-v1.zip" in lines[0] and pw.WIKITEXT_URL in lines[0]


def test_incomplete_folder(tmp_path):
    folder = tmp_path / "wikitext-103-raw"
    folder.mkdir()
    (folder / "wiki.train.raw").write_text(" = A = \n")
    with pytest.raises(pw.PrepError, match="wiki.valid.raw not found"):
        pw.locate_raw(str(tmp_path), str(tmp_path / "w"))


# ---- the GPT-2 files are verified before any work -------------------------------------------
def test_gpt2_files_that_are_not_the_published_ones_are_refused(wikitext, tmp_path):
    fixtures_corpus.write_byte_level_gpt2_files(str(tmp_path / "gpt2"))
    with pytest.raises(pw.PrepError) as err:
        pw.prepare(wikitext, str(tmp_path / "d"), tokenizer="gpt2", gpt2_dir=str(tmp_path / "gpt2"),
                   log=lambda *_: None)
    msg = str(err.value)
    assert "encoder.json is not the published GPT-2 encoder.json" in msg and "--custom-gpt2" in msg
    assert not os.path.exists(tmp_path / "d")  # nothing was written


def test_a_gpt2_dir_that_does_not_exist_is_an_error_not_a_fallback(wikitext, tmp_path):
    with pytest.raises(pw.PrepError, match="--gpt2-dir .*nowhere does not exist"):
        pw.prepare(wikitext, str(tmp_path / "d"), tokenizer="auto", gpt2_dir=str(tmp_path / "nowhere"),
                   log=lambda *_: None)


def test_damaged_encoder_ends_the_preparation_at_once(wikitext, tmp_path):
    """A partial encoder.json (cut in the middle) with 2 workers: one error line, exit 2, in seconds."""
    import time

    files = fixtures_corpus.write_byte_level_gpt2_files(str(tmp_path / "gpt2"))
    with open(files["encoder.json"], "rb") as f:
        data = f.read()
    with open(files["encoder.json"], "wb") as f:
        f.write(data[: len(data) // 2])
    start = time.time()
    proc = pyrun.run(
        [sys.executable, os.path.join(fixtures_corpus.DATA_PREP, "prepare_wikitext103.py"), "--source", wikitext,
         "--dest", str(tmp_path / "d"), "--gpt2-dir", str(tmp_path / "gpt2"), "--custom-gpt2", "--workers", "2"],
        capture_output=True, text=True, env=fixtures_corpus.subprocess_env(), timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.time() - start < 60
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "cannot be loaded" in errors[0] and "encoder.json" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_worker_that_cannot_load_the_encoder_fails_its_first_chunk(tmp_path):
    """The pool's workers keep their load error and raise it from their first task (a raising
    initializer would make multiprocessing.Pool restart workers forever)."""
    pw._gpt2_init(str(tmp_path / "missing.json"), str(tmp_path / "missing.bpe"))
    try:
        with pytest.raises(RuntimeError, match="did not load in a worker"):
            pw._gpt2_encode_chunk(["a line"])
    finally:
        pw._GPT2, pw._GPT2_ERROR = None, None


def test_the_published_checksums_are_pinned():
    # the digests tiktoken pins for OpenAI's GPT-2 files (which fairseq's gpt2_bpe/ mirrors)
    assert pw.GPT2_SHA256["encoder.json"].startswith("196139668be63f3b")
    assert pw.GPT2_SHA256["vocab.bpe"].startswith("1ce1664773c50f3e")


def _damage(dest, what):
    if what == "dict.txt deleted":
        os.remove(os.path.join(dest, "dict.txt"))
    elif what == "valid.bin truncated":
        size = os.path.getsize(os.path.join(dest, "valid.bin"))
        with open(os.path.join(dest, "valid.bin"), "r+b") as f:
            f.truncate(size - 2)  # one int16 token short: the .idx still says the old size
    elif what == "test.bin grown":
        with open(os.path.join(dest, "test.bin"), "ab") as f:
            f.write(b"\0\0\0\0")
    elif what == "train.idx truncated":
        size = os.path.getsize(os.path.join(dest, "train.idx"))
        with open(os.path.join(dest, "train.idx"), "r+b") as f:
            f.truncate(size - 8)


@pytest.mark.parametrize("what, named", [("dict.txt deleted", "dict.txt"), ("valid.bin truncated", "valid.bin"),
                                         ("test.bin grown", "test.bin"), ("train.idx truncated", "train.idx")])
def test_damaged_outputs_are_rebuilt_not_reported_up_to_date(offline_run, wikitext, tmp_path, what, named):
    """Same inputs, a damaged output: a warning names it and the directory is rebuilt (the counts
    and files equal the first run's), never "up to date"."""
    import shutil

    dest0, counts, _ = offline_run
    dest = str(tmp_path / "wikitext-103")
    shutil.copytree(dest0, dest)
    shutil.copytree(dest0 + ".work", dest + ".work")  # the sentencepiece model is reused, not retrained
    intact = {f: open(os.path.join(dest0, f), "rb").read() for f in ("dict.txt", "valid.bin", "test.bin", "train.idx")}
    _damage(dest, what)
    proc = pyrun.run(
        [sys.executable, os.path.join(fixtures_corpus.DATA_PREP, "prepare_wikitext103.py"), "--source", wikitext,
         "--dest", dest, "--workers", "1", "--vocab-size", "200"],
        capture_output=True, text=True, env=fixtures_corpus.subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not [line for line in proc.stdout.splitlines() if line.startswith("[wikitext]") and "up to date" in line]
    warnings = [line for line in proc.stdout.splitlines() if "is not intact" in line]
    assert len(warnings) == 1 and os.path.join(dest, named) in warnings[0] and "rebuilding" in warnings[0], proc.stdout
    for name, data in intact.items():
        assert open(os.path.join(dest, name), "rb").read() == data, name
    assert json.load(open(os.path.join(dest, "token_counts.json"))) == counts
    # and the rebuilt directory is up to date again
    messages = []
    assert pw.prepare(wikitext, dest, workers=1, vocab_size=200, log=messages.append) == counts
    assert any("nothing to do" in m for m in messages)
