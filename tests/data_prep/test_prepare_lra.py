"""data_prep/prepare_lra.py end to end on tiny fake LRA / IMDB / CIFAR-10 sources written here."""
import hashlib
import json
import os
import pickle
import sys
import tarfile

import numpy as np
import pytest
from data_prep import lra_listops
from data_prep import prepare_lra as pl
from tests import pyrun

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "data_prep", "prepare_lra.py")


def quiet(_msg):
    pass


def read_dict(dest):
    """Symbols of dict.txt in id order (fairseq: 4 specials first)."""
    with open(os.path.join(dest, "dict.txt"), encoding="utf-8") as f:
        return ["<s>", "<pad>", "</s>", "<unk>"] + [line.rsplit(" ", 1)[0] for line in f.read().splitlines()]


def read_stream(dest, split, stream="input0"):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    ds = MMapIndexedDataset(os.path.join(dest, f"{split}.{stream}"))
    return [ds[i].numpy().tolist() for i in range(len(ds))]


def meta(dest):
    with open(os.path.join(dest, "meta.json")) as f:
        return json.load(f)


def make_tar(path, folder, arcroot):
    with tarfile.open(path, "w:gz") as t:
        t.add(folder, arcname=arcroot)
    return path


# ------------------------------------------------------------------------------------------ listops
@pytest.fixture(scope="module")
def listops_src(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lo_src"))
    lra_listops.generate(root, train=30, valid=6, test=6, seed=2, workers=1, progress=False, log=quiet)
    return root


def test_listops_end_to_end_tokens_labels_and_rerun(listops_src, tmp_path):
    dest = str(tmp_path / "listops")
    m = pl.prepare("listops", listops_src, dest, log=quiet)
    assert m["splits"] == {"train": 30, "valid": 6, "test": 6}
    assert m["comparable"] is False and m["source"] == "generator"
    symbols = read_dict(dest)
    for split, name in (("train", "basic_train.tsv"), ("valid", "basic_val.tsv"), ("test", "basic_test.tsv")):
        with open(os.path.join(listops_src, "listops-1000", name)) as f:
            rows = [line.rstrip("\n").split("\t") for line in f][1:]
        ids = read_stream(dest, split)
        labels = np.load(os.path.join(dest, f"{split}.label.npy"))
        for (src, tgt), seq, lab in zip(rows, ids, labels):
            expected = [("X" if t == "]" else t) for t in src.split() if t not in ("(", ")")]
            assert [symbols[i] for i in seq] == expected
            assert lab == int(tgt)
    stamp = os.path.getmtime(os.path.join(dest, "meta.json"))
    messages = []
    pl.prepare("listops", listops_src, dest, log=messages.append)
    assert any("up to date" in msg for msg in messages)
    assert os.path.getmtime(os.path.join(dest, "meta.json")) == stamp


def test_listops_truncation_is_counted(listops_src, tmp_path):
    dest = str(tmp_path / "cut")
    messages = []
    m = pl.prepare("listops", listops_src, dest, max_len=700, log=messages.append)
    want = {}
    for split, name in (("train", "basic_train.tsv"), ("valid", "basic_val.tsv"), ("test", "basic_test.tsv")):
        with open(os.path.join(listops_src, "listops-1000", name)) as f:
            rows = [line.split("\t")[0] for line in f][1:]
        want[split] = sum(1 for r in rows if len([t for t in r.split() if t not in "()"]) > 700)
        assert max(len(s) for s in read_stream(dest, split)) <= 700
    assert m["truncated"] == want and sum(want.values()) > 0
    assert any("truncated to 700" in msg for msg in messages)


def test_listops_label_out_of_range_names_file_and_line(tmp_path):
    folder = tmp_path / "lra_release" / "lra_release" / "listops-1000"
    folder.mkdir(parents=True)
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        (folder / name).write_text("Source\tTarget\n( ( [MAX 2 ) 3 ] )\t3\n( ( [MIN 2 ) 3 ] )\t12\n")
    with pytest.raises(pl.PrepError, match=r"basic_train\.tsv line 3: label '12' is outside 0\.\.9"):
        pl.prepare("listops", str(tmp_path), str(tmp_path / "out"), log=quiet)


@pytest.mark.integration
def test_missing_files_say_where_they_come_from(tmp_path):
    with pytest.raises(pl.PrepError, match="lra_release.gz: download from https://storage.googleapis.com/"
                                           "long-range-arena/lra_release.gz"):
        pl.prepare("retrieval", str(tmp_path), str(tmp_path / "out"), log=quiet)
    with pytest.raises(pl.PrepError, match="aclImdb_v1.tar.gz: download from"):
        pl.prepare("text", str(tmp_path / "nowhere.tar.gz"), str(tmp_path / "out"), log=quiet)
    r = pyrun.run([sys.executable, SCRIPT, "image", "--source", str(tmp_path), "--dest", str(tmp_path / "o")],
                  capture_output=True, text=True)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("prepare_lra.py: ") and "cifar-10-python.tar.gz: download from" in last


# ------------------------------------------------------------------------------------------ text
REVIEWS = {
    ("train", "pos"): ["Great film!\nLoved it.", "a" * 50 + " fine", "Superb acting ~"],
    ("train", "neg"): ["Bad film.", "Terrible\tplot " + "b" * 40, "aaa zzz"],
    ("test", "pos"): ["Good good good", "x" * 70],
    ("test", "neg"): ["Awful", "Meh. Éh"],
}


@pytest.fixture(scope="module")
def imdb_archive(tmp_path_factory):
    root = tmp_path_factory.mktemp("imdb")
    for (split, sub), texts in REVIEWS.items():
        d = root / "aclImdb" / split / sub
        d.mkdir(parents=True)
        for i, t in enumerate(texts):
            (d / f"{i}_{7 if sub == 'pos' else 2}.txt").write_text(t, encoding="utf-8")
    return make_tar(str(root / "aclImdb_v1.tar.gz"), str(root / "aclImdb"), "aclImdb")


def test_text_from_archive_chars_minfreq_truncation_valid_is_test(imdb_archive, tmp_path):
    dest = str(tmp_path / "text")
    m = pl.prepare("text", imdb_archive, dest, max_len=60, min_freq=3, log=quiet)
    assert m["splits"] == {"train": 6, "valid": 4, "test": 4}
    assert m["truncated"] == {"train": 0, "valid": 1, "test": 1}
    assert m["comparable"] is True
    symbols = read_dict(dest)
    # independent count of the train characters (first 60 of each review)
    counts = {}
    for (split, _), texts in REVIEWS.items():
        if split == "train":
            for t in texts:
                for c in t[:60]:
                    counts[c] = counts.get(c, 0) + 1
    kept = {c for c, n in counts.items() if n >= 3}
    shown = {(" " if s == "<U+0020>" else "\n" if s == "<U+000A>" else "\t" if s == "<U+0009>" else s)
             for s in symbols[4:]}
    assert shown == kept
    for split, order in (("train", "train"), ("test", "test"), ("valid", "test")):
        texts = REVIEWS[(order, "neg")] + REVIEWS[(order, "pos")]  # neg (0) first, by file number
        labels = np.load(os.path.join(dest, f"{split}.label.npy")).tolist()
        assert labels == [0] * len(REVIEWS[(order, "neg")]) + [1] * len(REVIEWS[(order, "pos")])
        for t, seq in zip(texts, read_stream(dest, split)):
            expected = [pl.char_symbol(c) if c in kept else "<unk>" for c in t[:60]]
            assert [symbols[i] for i in seq] == expected
    messages = []
    pl.prepare("text", imdb_archive, dest, max_len=60, min_freq=3, log=messages.append)
    assert any("up to date" in msg for msg in messages)


# ------------------------------------------------------------------------------------------ retrieval
def test_retrieval_pairs_and_truncated_documents(tmp_path):
    folder = tmp_path / "rel" / "lra_release" / "lra_release" / "tsv_data"
    folder.mkdir(parents=True)
    rows = {
        "train": [("1.0", "a", "b", "hello world", "x" * 30), ("0.0", "c", "d", "abc", "defg"),
                  ("1", "e", "f", "q" * 25, "zz")],
        "eval": [("0.0", "g", "h", "hi", "yo")],
        "test": [("1.0", "i", "j", "w" * 21, "a b")],
    }
    for split, rs in rows.items():
        (folder / f"new_aan_pairs.{split}.tsv").write_text("".join("\t".join(r) + "\n" for r in rs))
    archive = make_tar(str(tmp_path / "lra_release.gz"), str(tmp_path / "rel" / "lra_release"), "lra_release")
    dest = str(tmp_path / "retrieval")
    m = pl.prepare("retrieval", archive, dest, max_len=20, log=quiet)
    assert m["pair"] is True and m["splits"] == {"train": 3, "valid": 1, "test": 1}
    assert m["truncated"] == {"train": 2, "valid": 0, "test": 1}
    assert m["truncated_documents"] == {"train": 2, "valid": 0, "test": 1}
    symbols = read_dict(dest)
    for split, key in (("train", "train"), ("valid", "eval"), ("test", "test")):
        a, b = read_stream(dest, split, "input0"), read_stream(dest, split, "input1")
        for r, sa, sb in zip(rows[key], a, b):
            for text, seq in ((r[3], sa), (r[4], sb)):
                got = "".join(" " if s == "<U+0020>" else ("?" if s == "<unk>" else s) for s in (symbols[i] for i in seq))
                train_chars = set("".join(x[3][:20] + x[4][:20] for x in rows["train"]))
                assert got == "".join(c if c in train_chars else "?" for c in text[:20])
        assert np.load(os.path.join(dest, f"{split}.label.npy")).tolist() == [int(float(r[0])) for r in rows[key]]


# ------------------------------------------------------------------------------------------ image
def test_image_cifar_pickles_split_45_5_like(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(10, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=10).tolist()
        batches[name] = (data, labels)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)
    archive = make_tar(str(tmp_path / "cifar-10-python.tar.gz"), str(folder), "cifar-10-batches-py")
    dest = str(tmp_path / "image")
    m = pl.prepare("image", archive, dest, log=quiet)
    assert m["splits"] == {"train": 45, "valid": 5, "test": 10} and m["image_shape"] == [32, 32, 3]

    def rgb(row):  # CIFAR rows are 1024 red, 1024 green, 1024 blue values, row-major
        return np.stack([row[:1024].reshape(32, 32), row[1024:2048].reshape(32, 32), row[2048:].reshape(32, 32)], -1)

    pairs = [(rgb(d).tobytes(), l) for name in sorted(batches)[:5] for d, l in zip(*batches[name])]
    got = []
    for split in ("train", "valid"):
        px = np.load(os.path.join(dest, f"{split}.pixels.npy"))
        lab = np.load(os.path.join(dest, f"{split}.label.npy"))
        assert px.dtype == np.uint8 and px.shape[1:] == (32, 32, 3)
        got += [(p.tobytes(), int(l)) for p, l in zip(px, lab)]
    assert sorted(got) == sorted(pairs)  # train + valid = the 50 training images, each once
    test_px = np.load(os.path.join(dest, "test.pixels.npy"))
    assert [p.tobytes() for p in test_px] == [rgb(d).tobytes() for d in batches["test_batch"][0]]
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": batches["data_batch_3"][0], b"labels": [10] * 10}, f)
    with pytest.raises(pl.PrepError, match=r"data_batch_3: image 0 has label 10 outside 0\.\.9"):
        pl.prepare("image", str(tmp_path), str(tmp_path / "image2"), log=quiet)


# ------------------------------------------------------------------------------------------ pathfinder
def write_fake_pathfinder(root, size, n, per_folder=10, folder="curv_contour_length_14"):
    from PIL import Image

    rng = np.random.default_rng([size, len(folder)])
    base = os.path.join(root, f"pathfinder{size}", folder)
    images, labels = {}, {}
    for k in range((n + per_folder - 1) // per_folder):
        os.makedirs(os.path.join(base, "imgs", str(k)), exist_ok=True)
        os.makedirs(os.path.join(base, "metadata"), exist_ok=True)
        lines = []
        for i in range(min(per_folder, n - k * per_folder)):
            img = rng.integers(0, 256, size=(size, size), dtype=np.uint8)
            Image.fromarray(img).save(os.path.join(base, "imgs", str(k), f"sample_{i}.png"))
            label = int(rng.integers(2))
            images[(k, i)], labels[(k, i)] = img, label
            lines.append(f"imgs/{k} sample_{i}.png {i} {label} 1.8 14 4 5 1.5 2 1\n")
        with open(os.path.join(base, "metadata", f"{k}.npy"), "w") as f:
            f.write("".join(lines))
    return base, images, labels


def test_pathfinder_empty_png_reported_and_split(tmp_path):
    base, images, labels = write_fake_pathfinder(str(tmp_path / "src" / "lra_release"), 32, 30)
    open(os.path.join(base, "imgs", "1", "sample_2.png"), "wb").close()  # like the release's sample_172.png
    with open(os.path.join(base, "imgs", "2", "sample_5.png"), "wb") as f:
        f.write(b"\x89PNG not really")
    dest = str(tmp_path / "pathfinder")
    messages = []
    m = pl.prepare("pathfinder", str(tmp_path / "src"), dest, workers=1, log=messages.append)
    reasons = {s["file"]: s["reason"] for s in m["skipped"]["all"]}
    assert reasons == {"pathfinder32/curv_contour_length_14/imgs/1/sample_2.png": "empty file",
                       "pathfinder32/curv_contour_length_14/imgs/2/sample_5.png": "unreadable PNG (UnidentifiedImageError)"}
    assert any("imgs/1/sample_2.png: empty file" in msg for msg in messages)
    assert m["splits"] == {"train": 24, "valid": 2, "test": 2} and m["comparable"] is True
    want = sorted((images[key].tobytes(), labels[key]) for key in images if key not in ((1, 2), (2, 5)))
    got = []
    for split in ("train", "valid", "test"):
        px = np.load(os.path.join(dest, f"{split}.pixels.npy"))
        assert px.shape[1:] == (32, 32, 1)
        got += [(p[:, :, 0].tobytes(), int(l)) for p, l in zip(px, np.load(os.path.join(dest, f"{split}.label.npy")))]
    assert sorted(got) == want


def test_pathx_and_bad_label_in_metadata(tmp_path):
    base, images, labels = write_fake_pathfinder(str(tmp_path / "src"), 128, 10)
    m = pl.prepare("pathx", str(tmp_path / "src"), str(tmp_path / "pathx"), workers=1, log=quiet)
    assert m["image_shape"] == [128, 128, 1] and sum(m["splits"].values()) == 10 and m["max_len"] == 16384
    path = os.path.join(base, "metadata", "0.npy")
    with open(path) as f:
        lines = f.read().splitlines()
    lines[3] = lines[3].replace(" 3 ", " 3 2 ", 1).replace(" 2 1.8", " 1.8", 1)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(pl.PrepError, match=r"metadata/0\.npy line 4: label '2' is outside 0\.\.1"):
        pl.prepare("pathx", str(tmp_path / "src"), str(tmp_path / "pathx2"), workers=1, log=quiet)


def test_generated_pathfinder_through_prepare(tmp_path):
    from hgrn_fairseq.preprocessing import lra_pathfinder

    lra_pathfinder.generate(str(tmp_path / "gen"), num=20, size=32, seed=0, workers=1, per_folder=10,
                            progress=False, log=quiet)
    m = pl.prepare("pathfinder", str(tmp_path / "gen"), str(tmp_path / "pf"), workers=2, log=quiet)
    assert m["splits"] == {"train": 16, "valid": 2, "test": 2} and m["comparable"] is False
    assert m["generator_options"]["num"] == 20
    labels = np.concatenate([np.load(str(tmp_path / "pf" / f"{s}.label.npy")) for s in ("train", "valid", "test")])
    assert labels.sum() == 10
    digest = hashlib.sha256(np.load(str(tmp_path / "pf" / "train.pixels.npy")).tobytes()).hexdigest()
    m2 = pl.prepare("pathfinder", str(tmp_path / "gen"), str(tmp_path / "pf_again"), workers=1, log=quiet)
    assert hashlib.sha256(np.load(str(tmp_path / "pf_again" / "train.pixels.npy")).tobytes()).hexdigest() == digest
    assert m2["splits"] == m["splits"]


def test_pathfinder_difficulty_folders(tmp_path):
    """--contour-length picks the release's curv_baseline / curv_contour_length_9 folder, from a folder
    or an archive; only LRA's 14 is comparable; a length or task without such folders is refused."""
    import tarfile

    src = str(tmp_path / "src" / "lra_release")
    _, hard, _ = write_fake_pathfinder(src, 32, 10)
    _, easy, _ = write_fake_pathfinder(src, 32, 20, folder="curv_baseline")
    dest = str(tmp_path / "pf")
    m14 = pl.prepare("pathfinder", str(tmp_path / "src"), dest, workers=1, log=quiet)
    assert sum(m14["splits"].values()) == 10 and m14["comparable"] is True and m14["contour_length"] == 14
    messages = []
    m6 = pl.prepare("pathfinder", str(tmp_path / "src"), dest, workers=1, log=messages.append, contour_length=6)
    assert not any("up to date" in msg for msg in messages)  # another difficulty is another fingerprint
    assert sum(m6["splits"].values()) == 20 and m6["comparable"] is False and m6["contour_length"] == 6
    assert m6["inputs_fingerprint"] != m14["inputs_fingerprint"]
    got = set()
    for split in ("train", "valid", "test"):
        got |= {p[:, :, 0].tobytes() for p in np.load(os.path.join(dest, f"{split}.pixels.npy"))}
    assert got == {img.tobytes() for img in easy.values()}
    archive = str(tmp_path / "release.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(str(tmp_path / "src"), arcname="lra_release")
    m6a = pl.prepare("pathfinder", archive, str(tmp_path / "pf_archive"), workers=1, log=quiet, contour_length=6)
    assert sum(m6a["splits"].values()) == 20
    with pytest.raises(pl.PrepError, match=r"pathfinder32/curv_contour_length_9/metadata not found .*--contour-length 9"):
        pl.prepare("pathfinder", str(tmp_path / "src"), str(tmp_path / "pf9"), workers=1, log=quiet, contour_length=9)
    with pytest.raises(pl.PrepError, match=r"--contour-length 7: expected one of \[6, 9, 14\]"):
        pl.prepare("pathfinder", str(tmp_path / "src"), str(tmp_path / "pf7"), workers=1, log=quiet, contour_length=7)
    with pytest.raises(pl.PrepError, match=r"--contour-length is for pathfinder and pathx"):
        pl.prepare("listops", str(tmp_path / "src"), str(tmp_path / "lo"), log=quiet, contour_length=6)
