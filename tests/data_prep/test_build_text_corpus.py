import os
import shutil

import pytest
from data_prep import build_text_corpus as btc
from tests import fixtures_corpus

SPLITS = ("train", "valid", "test")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "lib"
    fixtures_corpus.write_source_tree(str(root), n_docs=40)
    return str(root)


def test_documents_are_whole_and_in_exactly_one_split(tree, tmp_path):
    out = str(tmp_path / "corpus")
    manifest = btc.build_corpus(out, sources=[tree], max_bytes=None, valid_fraction=0.1,
                                test_fraction=0.1, log=lambda *_: None)
    texts = {s: _read(os.path.join(out, f"{s}.txt")) for s in SPLITS}
    keys = {s: manifest["documents"][s] for s in SPLITS}
    assert all(keys[s] for s in SPLITS), "every split gets at least one document"
    all_keys = keys["train"] + keys["valid"] + keys["test"]
    assert len(all_keys) == len(set(all_keys)) == 40  # the 40 real documents, each once
    assert not any("site-packages" in k or "binary" in k or "tiny" in k or k.endswith(".json") for k in all_keys)
    for split in SPLITS:
        for key in keys[split]:
            rel = key.split("/", 1)[1]
            expected = btc.normalise_text(_read(os.path.join(tree, rel)), 400)
            # the whole document is in its split, and in no other split
            assert expected in texts[split]
            for other in SPLITS:
                if other != split:
                    assert expected not in texts[other]
    # normalisation: no trailing whitespace, no run of blank lines, no tabs
    for split in SPLITS:
        assert "\n\n\n" not in texts[split] and "\t" not in texts[split]
        assert all(line == line.rstrip() for line in texts[split].split("\n"))
    # fractions are by bytes and approximately honoured
    total = sum(len(t.encode()) for t in texts.values())
    assert 0.05 < len(texts["test"].encode()) / total < 0.3


def test_deterministic_and_independent_of_location(tree, tmp_path):
    copy = str(tmp_path / "copy_of_lib")
    shutil.copytree(tree, copy)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    btc.build_corpus(a, sources=[tree], max_bytes=20_000, log=lambda *_: None)
    btc.build_corpus(b, sources=[copy], max_bytes=20_000, log=lambda *_: None)
    for split in SPLITS:
        assert _read(os.path.join(a, f"{split}.txt")) == _read(os.path.join(b, f"{split}.txt"))


def test_size_cap(tree, tmp_path):
    out = str(tmp_path / "capped")
    manifest = btc.build_corpus(out, sources=[tree], max_bytes=15_000, log=lambda *_: None)
    keys = [k for s in SPLITS for k in manifest["documents"][s]]
    sizes = [len(btc.normalise_text(_read(os.path.join(tree, k.split("/", 1)[1])), 400).encode()) for k in keys]
    assert sum(sizes) <= 15_000
    assert 3 <= len(keys) < 40


def test_rerun_is_a_noop_and_force_rebuilds(tree, tmp_path):
    out = str(tmp_path / "corpus")
    btc.build_corpus(out, sources=[tree], log=lambda *_: None)
    mtimes = {s: os.stat(os.path.join(out, f"{s}.txt")).st_mtime_ns for s in SPLITS}
    messages = []
    btc.build_corpus(out, sources=[tree], log=messages.append)
    assert "nothing to do" in messages[-1]
    assert mtimes == {s: os.stat(os.path.join(out, f"{s}.txt")).st_mtime_ns for s in SPLITS}
    messages.clear()
    btc.build_corpus(out, sources=[tree], max_bytes=10_000, log=messages.append)  # new options
    assert "wrote" in messages[-1]


def test_default_source_is_the_stdlib(tmp_path):
    out = str(tmp_path / "stdlib")
    manifest = btc.build_corpus(out, max_bytes=100_000, log=lambda *_: None)
    assert manifest["options"]["sources"] == [os.path.abspath(btc.default_sources()[0])]
    for split in SPLITS:
        assert manifest["splits"][split]["documents"] >= 1
    assert not any("site-packages" in k for s in SPLITS for k in manifest["documents"][s])


def test_bad_inputs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="usable documents"):
        btc.build_corpus(str(tmp_path / "o"), sources=[str(empty)], log=lambda *_: None)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        btc.build_corpus(str(tmp_path / "o"), sources=[str(tmp_path / "missing")], log=lambda *_: None)
    assert btc.main(["--out-dir", str(tmp_path / "o"), "--source", str(tmp_path), "--test-fraction", "0.7"]) == 2
