import json
import os
import subprocess
import sys

import pytest

from tests import fixtures_corpus
import prepare_wikitext103 as pw


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
                        log=lambda *_: None)
    marker = json.load(open(os.path.join(dest, "TOKENIZER_INFO.json")))
    assert marker["tokenizer"] == "gpt2-bpe" and marker["comparable_with_paper"] is True
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
    proc = subprocess.run(
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
