"""The LRA data contract (tasks/lra_format.py): writers, reader, validation with one line per problem.

Also home of the tiny generated data sets the other LRA tests train on (``write_tiny``)."""
import json
import os

import numpy as np
import pytest

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from hgrn_fairseq.tasks import lra_format as lf

LISTOPS_SYMBOLS = [str(i) for i in range(10)] + ["MIN", "MAX", "MED", "SM", "X"]


def write_tiny(dest, task, sizes=(64, 16, 16), seed=0, max_len=24, image=(4, 4, 1), num_classes=None):
    """A small data set of ``task``'s kind in ``dest`` through the writers.

    Token tasks: ListOps-like symbol strings whose label is the first digit (listops: 10 classes),
    or whether the first symbol is a digit (text); retrieval: pairs labelled 1 when both documents
    start with the same symbol. Pixel tasks: label 1 when the top-left pixel is bright."""
    rng = np.random.default_rng(seed)
    spec = lf.TASKS[task]
    classes = num_classes or spec["num_classes"]
    lf.begin(dest)
    if spec["input"] == "tokens":
        data = {}
        for split, n in zip(lf.SPLITS, sizes):
            docs0, docs1, labels = [], [], []
            for _ in range(n):
                a = [LISTOPS_SYMBOLS[i] for i in rng.integers(0, 15, rng.integers(3, max_len + 1))]
                if task == "listops":
                    a[0] = str(rng.integers(0, 10))
                    labels.append(int(a[0]) % classes)
                elif task == "text":
                    labels.append(int(a[0].isdigit()))
                else:
                    b = [LISTOPS_SYMBOLS[i] for i in rng.integers(0, 15, rng.integers(3, max_len + 1))]
                    if rng.random() < 0.5:
                        b[0] = a[0]
                    labels.append(int(a[0] == b[0]))
                    docs1.append(b)
                docs0.append(a)
            data[split] = (docs0, docs1, labels)
        d = lf.build_dictionary(data["train"][0] + data["train"][1])
        lf.write_dictionary(dest, d)
        for split, (docs0, docs1, labels) in data.items():
            lf.write_tokens(dest, split, "input0", (lf.encode(d, t) for t in docs0), len(d))
            if spec["pair"]:
                lf.write_tokens(dest, split, "input1", (lf.encode(d, t) for t in docs1), len(d))
            lf.write_labels(dest, split, labels, classes)
        return lf.write_meta(dest, task=task, input="tokens", pair=spec["pair"], num_classes=classes, max_len=max_len,
                             splits={s: len(v[2]) for s, v in data.items()}, truncated={"train": 0},
                             inputs_fingerprint="sha256:test", comparable=False, extra={"source": "tests"})
    splits = {}
    for split, n in zip(lf.SPLITS, sizes):
        px = rng.integers(0, 120, size=(n,) + tuple(image), dtype=np.uint8)
        labels = rng.integers(0, 2, n)
        px[labels == 1, 0, 0, :] = 255
        with lf.pixels_writer(dest, split, n, image) as arr:
            arr[:] = px
        lf.write_labels(dest, split, labels, classes)
        splits[split] = n
    return lf.write_meta(dest, task=task, input="pixels", num_classes=classes, max_len=image[0] * image[1],
                         image_shape=list(image), splits=splits, inputs_fingerprint="sha256:test", comparable=False)


def test_round_trip_tokens_and_pairs(tmp_path):
    dest = str(tmp_path / "retrieval")
    meta = write_tiny(dest, "retrieval", sizes=(5, 3, 2))
    assert sorted(os.listdir(dest)) == sorted(
        ["meta.json", "dict.txt"] + [f"{s}.{k}" for s in lf.SPLITS for k in
                                     ("input0.bin", "input0.idx", "input1.bin", "input1.idx", "label.npy")])
    assert lf.validate(dest) == meta and meta["pair"] and meta["splits"] == {"train": 5, "valid": 3, "test": 2}
    split = lf.load_split(dest, "valid")
    assert len(split) == 3 and len(split.input1) == 3 and split.labels.dtype == np.int64
    from fairseq.data import Dictionary

    d = Dictionary.load(os.path.join(dest, "dict.txt"))
    assert all(4 <= int(t) < len(d) for i in range(3) for t in split.input0[i])  # no BOS/EOS, no specials


def test_round_trip_pixels_and_atomic_writes(tmp_path):
    dest = str(tmp_path / "pf")
    write_tiny(dest, "pathfinder", sizes=(6, 2, 2), image=(4, 4, 1))
    s = lf.load_split(dest, "train")
    assert s.pixels.shape == (6, 4, 4, 1) and s.pixels.dtype == np.uint8
    # an exception inside a writer leaves the old file as it was (and no temporary behind)
    before = np.load(lf.pixels_path(dest, "test")).copy()
    with pytest.raises(RuntimeError):
        with lf.pixels_writer(dest, "test", 2, (4, 4, 1)) as arr:
            arr[:] = 1
            raise RuntimeError("killed")
    np.testing.assert_array_equal(np.load(lf.pixels_path(dest, "test")), before)
    assert not [f for f in os.listdir(dest) if f.endswith(".tmp")]
    # begin() removes meta.json first: a directory being rewritten is not a finished one
    lf.begin(dest)
    with pytest.raises(lf.LraDataError, match="meta.json: missing"):
        lf.read_meta(dest)
    assert not lf.is_complete(dest, "sha256:test")


def test_dictionary_order_counts_threshold_and_encoding():
    """Most frequent first, ties in symbol order, counts kept, symbols under min_count left out; encoding
    maps them (and unseen symbols) to <unk>. Expected values written out by hand."""
    docs = [["b", "a", "c", "c"], ["a", "b", "d"], ["c", "e"]]
    d = lf.build_dictionary(docs)
    assert d.symbols[d.nspecial:] == ["c", "a", "b", "d", "e"] and d.count[d.nspecial:] == [3, 2, 2, 1, 1]
    d2 = lf.build_dictionary(docs, min_count=2)
    assert d2.symbols[d2.nspecial:] == ["c", "a", "b"] and len(d2) == d2.nspecial + 3
    unk = d2.unk()
    got = lf.encode(d2, ["a", "d", "c", "zz", "b"])
    assert got.dtype == np.int64 and got.tolist() == [5, unk, 4, unk, 6] and d2.nspecial == 4
    assert lf.encode(d2, []).tolist() == []


def test_dictionary_symbols_must_survive_the_text_format(tmp_path):
    d = lf.build_dictionary([["a", "line\nbreak"]])
    with pytest.raises(lf.LraDataError, match="do not survive fairseq's dict.txt format"):
        lf.write_dictionary(str(tmp_path), d)
    assert not os.path.exists(tmp_path / "dict.txt")
    # a space is a symbol fairseq reads back
    d = lf.build_dictionary([[" ", "a", "a"]])
    lf.write_dictionary(str(tmp_path), d)
    assert " " in open(tmp_path / "dict.txt").read()


def test_writers_refuse_bad_values(tmp_path):
    dest = str(tmp_path)
    with pytest.raises(lf.LraDataError, match=r"label values 0..10 are outside 0..9"):
        lf.write_labels(dest, "train", [0, 10], 10)
    with pytest.raises(lf.LraDataError, match=r"example 1 has token id 9 outside \[0, 9\)"):
        lf.write_tokens(dest, "train", "input0", [[4, 5], [9]], 9)
    with pytest.raises(lf.LraDataError, match="example 0 has shape"):
        lf.write_tokens(dest, "train", "input0", [[]], 9)
    with pytest.raises(lf.LraDataError, match=r"expected uint8 \[N, H, W, C\]"):
        lf.write_pixels(dest, "train", np.zeros((2, 4, 4), dtype=np.uint8))
    with pytest.raises(lf.LraDataError, match="task 'cifar' is not one of"):
        lf.write_meta(dest, task="cifar", input="pixels", num_classes=10, max_len=4, splits={"train": 0},
                      image_shape=[2, 2, 1], check=False)
    with pytest.raises(ValueError, match="split 'dev' is not one of"):
        lf.label_path(dest, "dev")


def problems(dest, **kw):
    with pytest.raises(lf.LraDataError) as e:
        lf.validate(dest, **kw)
    return str(e.value).splitlines()


def test_validation_names_each_problem_and_the_fix(tmp_path):
    dest = str(tmp_path / "listops")
    write_tiny(dest, "listops", sizes=(6, 3, 3), max_len=12)
    # sequences longer than the model takes
    (line,) = problems(dest, splits=["train"], max_len=2)
    assert "train.input0: example" in line and "more than the model's max length 2" in line and "--max-len" in line
    # labels out of range, a missing file, counts that disagree: one line each
    np.save(os.path.join(dest, "valid.label.npy"), np.array([0, 11, 2]))
    os.remove(os.path.join(dest, "test.input0.bin"))
    meta = json.load(open(os.path.join(dest, "meta.json")))
    meta["splits"]["train"] = 7
    json.dump(meta, open(os.path.join(dest, "meta.json"), "w"))
    lines = problems(dest)
    assert len(lines) == 4, lines
    assert any("train.label.npy: 6 labels but meta.json says train has 7" in x for x in lines)
    assert any("valid.label.npy: labels 0..11 outside 0..9 (num_classes 10)" in x for x in lines)
    assert any("test.input0.bin: missing; fix: rerun data_prep/prepare_lra.py" in x for x in lines)
    assert all("fix:" in x for x in lines)


def test_validation_of_token_ids_bin_size_and_format(tmp_path):
    dest = str(tmp_path / "text")
    write_tiny(dest, "text", sizes=(4, 2, 2))
    with open(os.path.join(dest, "dict.txt")) as f:
        kept = f.readlines()[:3]
    with open(os.path.join(dest, "dict.txt"), "w") as f:  # a dictionary shorter than the ids
        f.writelines(kept)
    lines = problems(dest, splits=["train"])
    assert len(lines) == 1 and ">= dictionary size 7" in lines[0]
    write_tiny(dest, "text", sizes=(4, 2, 2))
    with open(os.path.join(dest, "valid.input0.bin"), "ab") as f:
        f.write(b"\0\0")
    (line,) = problems(dest, splits=["valid"])
    assert "valid.input0.bin:" in line and "bytes but its index describes" in line
    meta = json.load(open(os.path.join(dest, "meta.json")))
    json.dump(dict(meta, format="hgrn-lra/0"), open(os.path.join(dest, "meta.json"), "w"))
    (line,) = problems(dest)
    assert "format 'hgrn-lra/0' is not 'hgrn-lra/1'" in line
    with pytest.raises(lf.LraDataError, match="LRA data directory not found"):
        lf.validate(str(tmp_path / "nowhere"))


def test_validation_of_pixels(tmp_path):
    dest = str(tmp_path / "image")
    write_tiny(dest, "image", sizes=(4, 2, 2), image=(4, 4, 3))
    assert lf.validate(dest, grid=(4, 4))["image_shape"] == [4, 4, 3]
    (line,) = problems(dest, grid=(2, 8))
    assert "images are 4x4 but the model's grid is 2x8" in line
    np.save(lf.pixels_path(dest, "test"), np.zeros((2, 4, 5, 3), dtype=np.uint8))
    (line,) = problems(dest)
    assert "test.pixels.npy: uint8 [2, 4, 5, 3]; expected uint8 [N, 4, 4, 3]" in line
    with pytest.raises(lf.LraDataError, match="holds pixels inputs .* fix: use --task lra_image"):
        lf.validate(dest, input_kind="tokens")
