import collections
import os

import pytest

from tests import fixtures_corpus
from hgrn_fairseq.preprocessing import sentencepiece_bpe as sbpe


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm")
    texts = fixtures_corpus.write_plain_splits(str(root / "text"), {"train": 600, "valid": 40, "test": 40})
    out = str(root / "out")
    info = sbpe.prepare_sentencepiece(texts, out, vocab_size=150, workers=1, log=lambda *_: None)
    return texts, out, info


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def test_outputs_round_trip_to_the_text(prepared):
    import sentencepiece as spm

    texts, out, info = prepared
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    assert info["vocab_size"] == sp.get_piece_size() <= 150
    for split, path in texts.items():
        raw, enc = _lines(path), _lines(os.path.join(out, f"{split}.bpe"))
        assert len(raw) == len(enc)
        for a, b in zip(raw, enc):
            assert sp.decode_pieces(b.split()) == " ".join(a.split())


def test_fairseq_dict_lists_every_regular_piece_with_train_counts(prepared):
    import sentencepiece as spm

    _, out, _ = prepared
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    entries = [line.split() for line in _lines(os.path.join(out, "dict.txt"))]
    pieces = [p for p, _ in entries]
    regular = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    assert pieces == regular
    assert not {"<s>", "</s>", "<unk>", "<pad>"} & set(pieces)
    counted = collections.Counter(p for line in _lines(os.path.join(out, "train.bpe")) for p in line.split())
    assert {p: int(c) for p, c in entries} == {p: counted.get(p, 0) for p in pieces}


def test_marker_says_not_comparable(prepared):
    _, out, info = prepared
    marker = sbpe.read_marker(out)
    assert marker == info
    assert marker["comparable_with_paper"] is False
    assert "NOT comparable" in marker["label"]
    assert marker["spm_model_sha256"] == sbpe.sha256_file(os.path.join(out, "spm.model"))


def test_rerun_noop_and_deterministic(prepared, tmp_path):
    texts, out, info = prepared
    mtime = os.stat(os.path.join(out, "train.bpe")).st_mtime_ns
    msgs = []
    sbpe.prepare_sentencepiece(texts, out, vocab_size=150, workers=1, log=msgs.append)
    assert "nothing to do" in msgs[-1] and os.stat(os.path.join(out, "train.bpe")).st_mtime_ns == mtime
    # a second, independent training (2 encoding processes) gives the same pieces
    other = str(tmp_path / "again")
    sbpe.prepare_sentencepiece(texts, other, vocab_size=150, workers=2, log=lambda *_: None)
    for split in texts:
        assert _lines(os.path.join(other, f"{split}.bpe")) == _lines(os.path.join(out, f"{split}.bpe"))


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="train text"):
        sbpe.prepare_sentencepiece({"train": str(tmp_path / "nope.txt")}, str(tmp_path / "o"))
    with pytest.raises(ValueError, match="'train' split"):
        sbpe.prepare_sentencepiece({"valid": str(tmp_path / "nope.txt")}, str(tmp_path / "o"))
    assert sbpe.main(["--text-dir", str(tmp_path), "--out-dir", str(tmp_path / "o")]) == 2
