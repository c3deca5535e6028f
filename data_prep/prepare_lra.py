#!/usr/bin/env python3
"""Long Range Arena sources -> ``data-bin/lra/TASK`` in the ``hgrn-lra/1`` format.

    python data_prep/prepare_lra.py TASK --source PATH --dest data-bin/lra/TASK

TASK and what ``--source`` points at (an archive, or a folder holding the unpacked files anywhere
up to four levels down, e.g. ``lra_release/lra_release/listops-1000``):

* ``listops``     LRA release (``lra_release.gz``) or the generator's output (``lra_listops.py``):
                  ``listops-1000/basic_{train,val,test}.tsv``. Tokens: ``]`` -> ``X``, ``(`` and ``)``
                  dropped, split on whitespace; max 2000 tokens.
* ``text``        IMDB (``aclImdb_v1.tar.gz`` or ``aclImdb/``): characters, symbols seen fewer than
                  15 times in train -> ``<unk>``, max 4095 (+ the recipe's ``<eos>``: 4096); the test split doubles as validation.
* ``retrieval``   LRA release: ``tsv_data/new_aan_pairs.{train,eval,test}.tsv`` (label, id1, id2,
                  text1, text2); characters, max 3999 per document (+ ``<eos>``: 4000).
* ``image``       CIFAR-10 (``cifar-10-python.tar.gz`` or ``cifar-10-batches-py/``): RGB uint8
                  [N, 32, 32, 3]; train split 45k/5k with ``torch.randperm(50000)`` seeded 42 (the
                  S4-based LRA code's ``random_split``) + the 10k test images.
* ``pathfinder``  LRA release or ``lra_pathfinder.py`` output: ``pathfinder32/curv_contour_length_14``
                  PNGs + ``metadata/<k>.npy`` lines; grayscale uint8 [N, 32, 32, 1]; random 80/10/10
                  split (``torch.randperm`` seeded 42, as ``random_split`` in the S4-based code).
* ``pathx``       as ``pathfinder`` with ``pathfinder128`` (Path-X, 128 x 128).

``--contour-length 6`` / ``9`` prepares the release's easier Pathfinder folders (``curv_baseline``,
``curv_contour_length_9``) instead of LRA's ``curv_contour_length_14``: for curricula and for checking
that a model learns Pathfinder at all; their meta.json says ``comparable=false``.

Longer sequences are truncated to ``--max-len`` (counted, in meta.json and on stdout); unreadable
or empty images (the release's ``sample_172.png``) are reported, counted and left out; a label
outside the task's classes, a ListOps symbol other than the operators, digits and ``]`` (refused, not
mapped to ``<unk>``), a split without examples, a non-UTF-8 TSV or IMDB review and a damaged archive stop with
one line naming the file (and line). Everything is written through
``hgrn_fairseq/tasks/lra_format.py`` (temporary names, renamed; ``meta.json`` last). A rerun with
the same inputs and options finds ``meta.json``'s fingerprint unchanged and prints "up to date".
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import multiprocessing
import os
import pickle
import re
import shutil
import sys
import tarfile
import zlib
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from hgrn_fairseq.preprocessing.lra_pathfinder import DIFFICULTY_FOLDER  # the generator's names of the release's folders
from hgrn_fairseq.tasks import lra_format as fmt

LRA_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
PREP_VERSION = 1  # part of the fingerprint: bump when the output of a task changes
SPLIT_SEED = 42

# Text and Retrieval: the official harness's 4,096 / 4,000 positions less the <eos> the recipe appends
# (lra_text --append-eos); ListOps: LRA's 2,000 (its examples are shorter), 2,048 with <eos> in the arch.
DEFAULT_MAX_LEN = {"listops": 2000, "text": 4095, "retrieval": 3999}
PIXEL_SHAPE = {"image": (32, 32, 3), "pathfinder": (32, 32, 1), "pathx": (128, 128, 1)}
PATHFINDER_DIR = {"pathfinder": "pathfinder32/curv_contour_length_14",
                  "pathx": "pathfinder128/curv_contour_length_14"}
DEFAULT_CONTOUR = 14  # LRA's Pathfinder; DIFFICULTY_FOLDER (the generator's): the release's three folders


def pathfinder_dir(task: str, contour_length: int = DEFAULT_CONTOUR) -> str:
    """``pathfinder32/curv_...`` (``pathfinder128`` for Path-X) of one difficulty."""
    if contour_length not in DIFFICULTY_FOLDER:
        raise PrepError(f"--contour-length {contour_length}: expected one of {sorted(DIFFICULTY_FOLDER)} "
                        f"(the LRA release's curv_baseline, curv_contour_length_9, curv_contour_length_14)")
    return PATHFINDER_DIR[task].rsplit("/", 1)[0] + "/" + DIFFICULTY_FOLDER[contour_length]

# files each task needs, relative to the folder that holds them, and where they are published
NEEDS = {
    "listops": (["listops-1000/basic_train.tsv", "listops-1000/basic_val.tsv", "listops-1000/basic_test.tsv"],
                f"lra_release.gz: download from {LRA_URL} (or generate offline: python data_prep/lra_listops.py "
                f"--dest DIR, then --source DIR)"),
    "retrieval": (["tsv_data/new_aan_pairs.train.tsv", "tsv_data/new_aan_pairs.eval.tsv",
                   "tsv_data/new_aan_pairs.test.tsv"], f"lra_release.gz: download from {LRA_URL}"),
    "text": (["aclImdb/train/pos", "aclImdb/train/neg", "aclImdb/test/pos", "aclImdb/test/neg"],
             f"aclImdb_v1.tar.gz: download from {IMDB_URL}"),
    "image": (["cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/data_batch_2",
               "cifar-10-batches-py/data_batch_3", "cifar-10-batches-py/data_batch_4",
               "cifar-10-batches-py/data_batch_5", "cifar-10-batches-py/test_batch"],
              f"cifar-10-python.tar.gz: download from {CIFAR_URL}"),
    "pathfinder": ([PATHFINDER_DIR["pathfinder"] + "/metadata"],
                   f"lra_release.gz: download from {LRA_URL} (or generate offline: python "
                   f"data_prep/lra_pathfinder.py --dest DIR --num 200000, then --source DIR)"),
    "pathx": ([PATHFINDER_DIR["pathx"] + "/metadata"],
              f"lra_release.gz: download from {LRA_URL} (or generate offline: python "
              f"data_prep/lra_pathfinder.py --dest DIR --size 128 --num N, then --source DIR)"),
}
# archive members to unpack for each task (matched anywhere in the member's path)
MEMBERS = {
    "listops": re.compile(r"(?:^|/)(listops-1000/basic_(?:train|val|test)\.tsv)$"),
    "retrieval": re.compile(r"(?:^|/)(tsv_data/new_aan_pairs\.(?:train|eval|test)\.tsv)$"),
    "text": re.compile(r"(?:^|/)(aclImdb/(?:train|test)/(?:pos|neg)/[^/]+\.txt)$"),
    "image": re.compile(r"(?:^|/)(cifar-10-batches-py/(?:data_batch_[1-5]|test_batch))$"),
    "pathfinder": re.compile(r"(?:^|/)(pathfinder32/curv_contour_length_14/(?:imgs/\d+/[^/]+\.png|metadata/\d+\.npy"
                             r"|GENERATOR\.json))$"),
    "pathx": re.compile(r"(?:^|/)(pathfinder128/curv_contour_length_14/(?:imgs/\d+/[^/]+\.png|metadata/\d+\.npy"
                        r"|GENERATOR\.json))$"),
}


class PrepError(Exception):
    """A missing or malformed input: the message names the file and the fix."""


def _needs(task: str, contour_length: int = DEFAULT_CONTOUR) -> Tuple[List[str], str]:
    """NEEDS[task], with the folder of ``contour_length`` for the Pathfinder tasks."""
    needs, where = NEEDS[task]
    if task in PATHFINDER_DIR and contour_length != DEFAULT_CONTOUR:
        needs = [pathfinder_dir(task, contour_length) + "/metadata"]
        where = where.replace("--dest DIR", f"--dest DIR --contour-length {contour_length}", 1)
    return list(needs), where


def _members(task: str, contour_length: int = DEFAULT_CONTOUR):
    """MEMBERS[task], with the folder of ``contour_length`` for the Pathfinder tasks."""
    if task in PATHFINDER_DIR and contour_length != DEFAULT_CONTOUR:
        return re.compile(MEMBERS[task].pattern.replace(PATHFINDER_DIR[task], pathfinder_dir(task, contour_length)))
    return MEMBERS[task]


def _tqdm(iterable=None, **kw):
    from tqdm import tqdm

    # disable=None: bars on a terminal only, so a captured stderr holds the messages, errors among them
    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, mininterval=1.0, disable=None, **kw)


# --------------------------------------------------------------------------------------------
# locating the inputs
# --------------------------------------------------------------------------------------------
def _find_root(source: str, needs: Sequence[str], max_depth: int = 4) -> Optional[str]:
    """The folder holding ``needs[0]``: ``source`` itself, a folder up to ``max_depth`` levels below
    it, or -- when ``source`` is the needed folder itself (e.g. ``.../listops-1000``) -- an ancestor."""
    first = needs[0]
    base = os.path.abspath(source)
    for dirpath, dirnames, _ in os.walk(base):
        if os.path.exists(os.path.join(dirpath, first)):
            return dirpath
        depth = 0 if dirpath == base else dirpath[len(base) + 1:].count(os.sep) + 1
        if depth >= max_depth:
            dirnames[:] = []
        dirnames.sort()
    up = base
    for _ in range(first.count("/")):
        up = os.path.dirname(up)
        if os.path.exists(os.path.join(up, first)):
            return up
    return None


def unpack(task: str, archive: str, workdir: str, log=print, contour_length: int = DEFAULT_CONTOUR) -> str:
    """Unpack the members ``task`` needs from a (compressed) tar archive into ``workdir``."""
    stamp = os.path.join(workdir, "UNPACKED.json")
    st = os.stat(archive)
    key = {"archive": os.path.abspath(archive), "bytes": st.st_size, "mtime": int(st.st_mtime), "task": task}
    if task in PATHFINDER_DIR and contour_length != DEFAULT_CONTOUR:
        key["contour_length"] = contour_length
    if os.path.isfile(stamp):
        with open(stamp) as f:
            if json.load(f) == key:
                return workdir
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as e:
        # (tarfile lists one line per compression it tried: the first line says enough)
        why = str(e).splitlines()[0].rstrip(":") if str(e) else type(e).__name__
        raise PrepError(f"{archive}: not a readable tar archive ({why}): damaged, truncated or another format "
                        f"(a .zip must be unpacked first); {_needs(task, contour_length)[1]}") from None
    pattern = _members(task, contour_length)
    n = 0
    out = None
    try:
        with tar:
            for member in _tqdm(tar, desc=f"unpacking {os.path.basename(archive)}", unit=" files"):
                m = pattern.search(member.name)
                if not m or not member.isfile():
                    continue
                out = os.path.join(workdir, m.group(1))
                os.makedirs(os.path.dirname(out), exist_ok=True)
                src = tar.extractfile(member)
                with open(out + ".part", "wb") as f:
                    shutil.copyfileobj(src, f, 1 << 20)
                os.replace(out + ".part", out)
                n += 1
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        # a truncated or corrupted download: nothing unpacked from it is used (no stamp is written)
        if out is not None and os.path.exists(out + ".part"):
            os.remove(out + ".part")
        raise PrepError(f"{archive}: damaged or truncated archive ({type(e).__name__}: {e}); "
                        f"download it again") from None
    log(f"[{task}] unpacked {n} files from {archive}")
    with open(stamp, "w") as f:
        json.dump(key, f)
    return workdir


def locate(task: str, source: str, workdir: str, log=print, contour_length: int = DEFAULT_CONTOUR) -> str:
    """The folder holding the task's files (unpacking an archive first); a PrepError names what is missing."""
    needs, where = _needs(task, contour_length)
    if not os.path.exists(source):
        raise PrepError(f"{source} not found; {where}")
    if os.path.isfile(source):
        source = unpack(task, source, workdir, log, contour_length)
    root = _find_root(source, needs)
    if root is None:
        raise PrepError(f"{needs[0]} not found under {source}; {where}")
    for rel in needs[1:]:
        if not os.path.exists(os.path.join(root, rel)):
            raise PrepError(f"{os.path.join(root, rel)} not found; {where}")
    return root


# --------------------------------------------------------------------------------------------
# tokens
# --------------------------------------------------------------------------------------------
def char_symbol(c: str) -> str:
    """A character as a fairseq dict.txt symbol: itself, or ``<U+XXXX>`` for whitespace / control
    characters (dict.txt is ``symbol count`` per line and fairseq splits on whitespace)."""
    return c if c.isprintable() and not c.isspace() else f"<U+{ord(c):04X}>"


# LRA's ListOps vocabulary after listops_tokens(): the four operators, the closing bracket, the digits.
LISTOPS_SYMBOLS = frozenset(["[MIN", "[MAX", "[MED", "[SM", "X"] + [str(d) for d in range(10)])


def listops_tokens(source: str) -> List[str]:
    """LRA's ListOps tokenizer: ``]`` -> ``X``, parentheses dropped, split on whitespace."""
    return source.translate({ord("]"): "X", ord("("): None, ord(")"): None}).split()


class CharEncoder:
    """Characters -> dictionary indices, vectorised through a code-point lookup table."""

    def __init__(self, dictionary):
        self.unk = dictionary.unk()
        self.lut: Dict[int, int] = {}
        for i, sym in enumerate(dictionary.symbols[dictionary.nspecial:], dictionary.nspecial):
            if len(sym) == 1:
                self.lut[ord(sym)] = i
            elif sym.startswith("<U+") and sym.endswith(">"):
                self.lut[int(sym[3:-1], 16)] = i
        top = max(self.lut) + 1 if self.lut else 1
        self.table = np.full(top, self.unk, dtype=np.int64)
        for cp, i in self.lut.items():
            self.table[cp] = i

    def __call__(self, text: str) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        out = np.full(cps.shape, self.unk, dtype=np.int64)
        ok = cps < len(self.table)
        out[ok] = self.table[cps[ok]]
        return out


def _build_char_dictionary(texts: Iterable[str], min_count: int):
    counts: collections.Counter = collections.Counter()
    for t in texts:
        counts.update(t)
    from fairseq.data import Dictionary

    d = Dictionary()
    for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if n >= min_count:
            d.add_symbol(char_symbol(c), n)
    d.finalize(threshold=min_count, padding_factor=1)
    return d


def _read_tsv(path: str) -> Iterable[Tuple[int, List[str]]]:
    csv.field_size_limit(sys.maxsize)
    lineno = 0
    with open(path, encoding="utf-8", newline="") as f:
        try:
            for lineno, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
                yield lineno, row
        except UnicodeDecodeError as e:
            raise PrepError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} after line {lineno}); "
                            f"LRA's TSV files are UTF-8: re-download the file or convert it to UTF-8") from None


def _require_examples(path: str, n: int) -> None:
    """No split may be empty: a header-only file would pass until evaluation divides by zero."""
    if n == 0:
        raise PrepError(f"{path}: no examples (a header at most); every split needs at least one: "
                        f"re-download or regenerate the file")


def _label(text: str, path: str, lineno: int, num_classes: int) -> int:
    try:
        v = float(text)
    except ValueError:
        raise PrepError(f"{path} line {lineno}: label {text!r} is not a number; expected a class "
                        f"0..{num_classes - 1}") from None
    if not v.is_integer() or not 0 <= v < num_classes:
        raise PrepError(f"{path} line {lineno}: label {text!r} is outside 0..{num_classes - 1}; "
                        f"the file is not LRA's (re-download or regenerate it)")
    return int(v)


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------
class Result:
    def __init__(self):
        self.splits: Dict[str, int] = {}
        self.truncated: Dict[str, int] = {}
        self.skipped: Dict[str, List[Dict[str, str]]] = {}
        self.extra: Dict[str, object] = {}


def prepare_listops(root: str, dest: str, max_len: int, log) -> Result:
    files = {"train": "basic_train.tsv", "valid": "basic_val.tsv", "test": "basic_test.tsv"}
    data: Dict[str, Tuple[List[List[str]], List[int]]] = {}
    res = Result()
    for split, name in files.items():
        path = os.path.join(root, "listops-1000", name)
        docs, labels, cut = [], [], 0
        for lineno, row in _tqdm(_read_tsv(path), desc=f"listops {split}", unit=" lines"):
            if lineno == 1 and row == ["Source", "Target"]:
                continue
            if len(row) != 2:
                raise PrepError(f"{path} line {lineno}: {len(row)} tab-separated fields, expected 2 (Source, Target)")
            toks = listops_tokens(row[0])
            if not toks:
                raise PrepError(f"{path} line {lineno}: empty expression")
            # refused, not mapped to <unk>: ListOps has a closed vocabulary, so a foreign symbol means a
            # damaged or different file, and a model cannot compute a value through an unknown operator
            bad = next((t for t in toks if t not in LISTOPS_SYMBOLS), None)
            if bad is not None:
                raise PrepError(f"{path} line {lineno}: unknown ListOps symbol {bad!r}; expected the operators "
                                f"[MIN [MAX [MED [SM, the digits 0-9 and ]: the file is not LRA's ListOps "
                                f"(re-download or regenerate it)")
            if len(toks) > max_len:
                toks, cut = toks[:max_len], cut + 1
            docs.append(toks)
            labels.append(_label(row[1], path, lineno, 10))
        _require_examples(path, len(docs))
        data[split] = (docs, labels)
        res.truncated[split] = cut
    d = fmt.build_dictionary(data["train"][0])
    fmt.write_dictionary(dest, d)
    for split, (docs, labels) in data.items():
        fmt.write_tokens(dest, split, "input0", (fmt.encode(d, t) for t in docs), len(d))
        res.splits[split] = fmt.write_labels(dest, split, labels, 10)
    res.extra["vocab_size"] = len(d)
    return res


def _imdb_docs(root: str, split: str) -> Tuple[List[str], List[int], List[str]]:
    docs, labels, names = [], [], []
    for label, sub in ((0, "neg"), (1, "pos")):
        folder = os.path.join(root, "aclImdb", split, sub)
        files = [f for f in os.listdir(folder) if f.endswith(".txt")]
        files.sort(key=lambda f: (int(f.split("_")[0]) if f.split("_")[0].isdigit() else 0, f))
        if not files:
            raise PrepError(f"{folder}: no review files; {NEEDS['text'][1]}")
        for f in _tqdm(files, desc=f"text {split}/{sub}", unit=" files"):
            docs.append(_read_review(os.path.join(folder, f)))
            labels.append(label)
            names.append(os.path.join(folder, f))
    return docs, labels, names


def _read_review(path: str) -> str:
    """One IMDB review as text. The release is UTF-8 throughout: another encoding means a converted or
    damaged copy, refused with the file, line and byte (decoding it anyway would change the characters
    the model reads, and so the dictionary)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise PrepError(f"{path} line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                        f"the IMDB release is UTF-8: unpack aclImdb_v1.tar.gz again (from {IMDB_URL}) or convert the file to UTF-8") from None


def prepare_text(root: str, dest: str, max_len: int, min_freq: int, log) -> Result:
    res = Result()
    raw = {split: _imdb_docs(root, split) for split in ("train", "test")}
    cut = {split: [t[:max_len] for t in raw[split][0]] for split in raw}
    for split in raw:
        res.truncated[split] = sum(len(t) > max_len for t in raw[split][0])
    d = _build_char_dictionary(cut["train"], min_freq)
    fmt.write_dictionary(dest, d)
    enc = CharEncoder(d)
    unknown = {}
    for split in ("train", "test"):
        ids = [enc(t) for t in _tqdm(cut[split], desc=f"text encode {split}", unit=" docs")]
        for i, (a, name) in enumerate(zip(ids, raw[split][2])):
            if a.size == 0:
                raise PrepError(f"{name}: empty review; the archive is damaged ({NEEDS['text'][1]})")
        unknown[split] = int(sum(int((a == d.unk()).sum()) for a in ids))
        for out in ((split, "valid") if split == "test" else (split,)):
            fmt.write_tokens(dest, out, "input0", ids, len(d))
            res.splits[out] = fmt.write_labels(dest, out, raw[split][1], 2)
    res.truncated["valid"] = res.truncated["test"]
    res.extra.update({"vocab_size": len(d), "min_freq": min_freq, "valid_is_test": True,
                      "unknown_tokens": {"train": unknown["train"], "valid": unknown["test"], "test": unknown["test"]}})
    return res


def prepare_retrieval(root: str, dest: str, max_len: int, log) -> Result:
    res = Result()
    files = {"train": "new_aan_pairs.train.tsv", "valid": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
    data = {}
    docs_cut = {}
    for split, name in files.items():
        path = os.path.join(root, "tsv_data", name)
        a, b, labels = [], [], []
        cut_examples = cut_docs = 0
        for lineno, row in _tqdm(_read_tsv(path), desc=f"retrieval {split}", unit=" lines"):
            if lineno == 1 and row and row[0].lower() == "label":
                continue
            if len(row) != 5:
                raise PrepError(f"{path} line {lineno}: {len(row)} tab-separated fields, expected 5 "
                                f"(label, id1, id2, text1, text2)")
            labels.append(_label(row[0], path, lineno, 2))
            for text, out in ((row[3], a), (row[4], b)):
                if not text:
                    raise PrepError(f"{path} line {lineno}: empty document")
                out.append(text[:max_len])
            n_cut = (len(row[3]) > max_len) + (len(row[4]) > max_len)
            cut_docs += n_cut
            cut_examples += n_cut > 0
        _require_examples(path, len(labels))
        data[split] = (a, b, labels)
        res.truncated[split] = cut_examples
        docs_cut[split] = cut_docs
    d = _build_char_dictionary(data["train"][0] + data["train"][1], 1)
    fmt.write_dictionary(dest, d)
    enc = CharEncoder(d)
    for split, (a, b, labels) in data.items():
        for stream, docs in (("input0", a), ("input1", b)):
            fmt.write_tokens(dest, split, stream, (enc(t) for t in _tqdm(docs, desc=f"encode {split} {stream}",
                                                                          unit=" docs")), len(d))
        res.splits[split] = fmt.write_labels(dest, split, labels, 2)
    res.extra.update({"vocab_size": len(d), "truncated_documents": docs_cut})
    return res


def _split_indices(n: int, fractions: Sequence[float]) -> List[np.ndarray]:
    """``torch.utils.data.random_split`` with ``torch.Generator().manual_seed(42)``, as the S4-based
    LRA code does: a random permutation cut into int(f * n) pieces (the first takes the rest)."""
    import torch

    lengths = [int(f * n) for f in fractions[1:]]
    lengths = [n - sum(lengths)] + lengths
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy()
    out, start = [], 0
    for length in lengths:
        out.append(perm[start:start + length])
        start += length
    return out


def prepare_image(root: str, dest: str, log) -> Result:
    res = Result()
    folder = os.path.join(root, "cifar-10-batches-py")

    def load(name):
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="bytes")
            data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            labels = np.asarray(batch[b"labels"], dtype=np.int64)
        except Exception as e:  # a damaged pickle: say which file
            raise PrepError(f"{path}: not a CIFAR-10 python batch ({type(e).__name__}: {e}); "
                            f"{NEEDS['image'][1]}") from None
        bad = np.flatnonzero((labels < 0) | (labels > 9))
        if bad.size:
            raise PrepError(f"{path}: image {int(bad[0])} has label {int(labels[bad[0]])} outside 0..9")
        if len(labels) != len(data):
            raise PrepError(f"{path}: {len(data)} images but {len(labels)} labels")
        return np.ascontiguousarray(data), labels

    parts = [load(f"data_batch_{i}") for i in range(1, 6)]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = load("test_batch")
    tr, va = _split_indices(len(train_y), (0.9, 0.1))
    for split, x, y in (("train", train_x[tr], train_y[tr]), ("valid", train_x[va], train_y[va]),
                        ("test", test_x, test_y)):
        fmt.write_pixels(dest, split, x)
        res.splits[split] = fmt.write_labels(dest, split, y, 10)
        res.truncated[split] = 0
    res.extra.update({"split_seed": SPLIT_SEED, "channels": "RGB"})
    return res


def _read_png(job) -> Tuple[int, Optional[np.ndarray], str]:
    i, path, shape = job
    from PIL import Image

    try:
        if os.path.getsize(path) == 0:
            return i, None, "empty file"
        with Image.open(path) as im:
            arr = np.asarray(im.convert("L"), dtype=np.uint8)
    except FileNotFoundError:
        return i, None, "file missing (listed in the metadata)"
    except Exception as e:  # Pillow raises several types for damaged files
        return i, None, f"unreadable PNG ({type(e).__name__})"
    if arr.shape != tuple(shape):
        return i, None, f"image is {arr.shape[0]}x{arr.shape[1]}, expected {shape[0]}x{shape[1]}"
    return i, arr, ""


def prepare_pathfinder(task: str, root: str, dest: str, workers: int, log,
                       contour_length: int = DEFAULT_CONTOUR) -> Result:
    res = Result()
    base = os.path.join(root, pathfinder_dir(task, contour_length))
    H, W, _ = PIXEL_SHAPE[task]
    meta_dir = os.path.join(base, "metadata")
    names = [n for n in os.listdir(meta_dir) if re.fullmatch(r"\d+\.npy", n)]
    if not names:
        raise PrepError(f"{meta_dir}: no metadata files (<k>.npy); {_needs(task, contour_length)[1]}")
    names.sort(key=lambda n: int(n[:-4]))
    paths, labels = [], []
    for name in names:
        mpath = os.path.join(meta_dir, name)
        with open(mpath, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                fields = line.split()
                if not fields:
                    continue
                if len(fields) < 4:
                    raise PrepError(f"{mpath} line {lineno}: {len(fields)} fields, expected at least 4 "
                                    f"(folder, file, index, label, ...)")
                paths.append(os.path.join(base, fields[0], fields[1]))
                labels.append(_label(fields[3], mpath, lineno, 2))
    n = len(paths)
    images = np.empty((n, H, W), dtype=np.uint8)
    ok = np.zeros(n, dtype=bool)
    skipped = []
    jobs = ((i, p, (H, W)) for i, p in enumerate(paths))
    pool = multiprocessing.Pool(workers) if workers > 1 else None
    try:
        it = pool.imap_unordered(_read_png, jobs, chunksize=256) if pool else map(_read_png, jobs)
        for i, arr, reason in _tqdm(it, total=n, desc=f"{task} images", unit=" img"):
            if arr is None:
                skipped.append({"file": os.path.relpath(paths[i], root), "reason": reason})
            else:
                images[i] = arr
                ok[i] = True
    finally:
        if pool is not None:
            pool.terminate()
    for s in sorted(skipped, key=lambda s: s["file"]):
        log(f"[{task}] skipped {s['file']}: {s['reason']}")
    keep = np.flatnonzero(ok)
    labels_arr = np.asarray(labels, dtype=np.int64)
    parts = _split_indices(len(keep), (0.8, 0.1, 0.1))
    for split, idx in zip(("train", "valid", "test"), parts):
        sel = keep[idx]
        with fmt.pixels_writer(dest, split, len(sel), (H, W, 1)) as arr:
            for start in range(0, len(sel), 4096):
                arr[start:start + 4096, :, :, 0] = images[sel[start:start + 4096]]
        res.splits[split] = fmt.write_labels(dest, split, labels_arr[sel], 2)
        res.truncated[split] = 0
    # skipped files belong to no split; meta.json lists them under "all"
    res.skipped = {"all": sorted(skipped, key=lambda s: s["file"])}
    res.extra.update({"split_seed": SPLIT_SEED, "contour_length": contour_length,
                      "listed_images": n, "skipped_count": len(skipped),
                      "labels": {"0": int((labels_arr[keep] == 0).sum()), "1": int((labels_arr[keep] == 1).sum())}})
    return res


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------
def _input_files(task: str, root: str, contour_length: int = DEFAULT_CONTOUR) -> List[str]:
    if task in ("listops", "retrieval", "image"):
        return [os.path.join(root, rel) for rel in NEEDS[task][0]]
    if task == "text":
        out = []
        for rel in NEEDS[task][0]:
            folder = os.path.join(root, rel)
            out += [os.path.join(folder, f) for f in os.listdir(folder)]
        return out
    base = os.path.join(root, pathfinder_dir(task, contour_length))
    out = [os.path.join(base, "metadata", f) for f in os.listdir(os.path.join(base, "metadata"))]
    imgs = os.path.join(base, "imgs")
    if os.path.isdir(imgs):
        for k in os.listdir(imgs):
            folder = os.path.join(imgs, k)
            out += [os.path.join(folder, f) for f in os.listdir(folder)]
    return out


def _generator_stamp(task: str, root: str, contour_length: int = DEFAULT_CONTOUR) -> Optional[dict]:
    """The generator's GENERATOR.json when the inputs were made by lra_listops.py / lra_pathfinder.py."""
    folder = "listops-1000" if task == "listops" else (
        pathfinder_dir(task, contour_length) if task in PATHFINDER_DIR else None)
    path = os.path.join(root, folder, "GENERATOR.json") if folder else ""
    if path and os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return None


def prepare(task: str, source: str, dest: str, max_len: Optional[int] = None, min_freq: int = 15,
            workers: int = 1, log=print, contour_length: Optional[int] = None) -> dict:
    """Prepare one task; returns meta.json's content. Raises PrepError for bad inputs.

    ``contour_length`` (Pathfinder / Path-X only: 6, 9 or 14, default 14, LRA's) picks the release's
    difficulty folder; only 14 is LRA's task, so other lengths give ``comparable=false``."""
    if task not in fmt.TASKS:
        raise PrepError(f"task {task!r}: expected one of {', '.join(fmt.TASKS)}")
    if contour_length is not None and task not in PATHFINDER_DIR:
        raise PrepError(f"--contour-length is for pathfinder and pathx; {task} has no difficulty folders")
    contour = DEFAULT_CONTOUR if contour_length is None else contour_length
    if task in PATHFINDER_DIR:
        pathfinder_dir(task, contour)  # a clear error for a length the release does not have
    spec = fmt.TASKS[task]
    if spec["input"] == "tokens":
        max_len = DEFAULT_MAX_LEN[task] if max_len is None else max_len
        if max_len < 1:
            raise PrepError(f"--max-len {max_len}: expected a positive number of tokens")
    else:
        if max_len is not None:
            raise PrepError(f"--max-len is for token tasks; {task} images keep their size")
        H, W, _ = PIXEL_SHAPE[task]
        max_len = H * W
    if min_freq < 1:
        raise PrepError(f"--min-freq {min_freq}: expected an integer >= 1")
    workdir = os.path.join(dest, ".unpacked")
    options = {"task": task, "max_len": max_len, "min_freq": min_freq if task == "text" else None,
               "split_seed": SPLIT_SEED, "version": PREP_VERSION, "format": fmt.FORMAT}
    if contour != DEFAULT_CONTOUR:  # (absent for LRA's 14: fingerprints of earlier preparations stay valid)
        options["contour_length"] = contour
    if os.path.isfile(source):  # an archive: its size and time stand for its content
        fingerprint = fmt.fingerprint_files([source], extra=options)
        if fmt.is_complete(dest, fingerprint):
            log(f"[{task}] {dest}: up to date (same inputs and options)")
            return fmt.read_meta(dest)
    root = locate(task, source, workdir, log, contour)
    if not os.path.isfile(source):
        fingerprint = fmt.fingerprint_files(_input_files(task, root, contour), extra=options)
        if fmt.is_complete(dest, fingerprint):
            log(f"[{task}] {dest}: up to date (same inputs and options)")
            return fmt.read_meta(dest)
    fmt.begin(dest)
    log(f"[{task}] reading {root}")
    if task == "listops":
        res = prepare_listops(root, dest, max_len, log)
    elif task == "text":
        res = prepare_text(root, dest, max_len, min_freq, log)
    elif task == "retrieval":
        res = prepare_retrieval(root, dest, max_len, log)
    elif task == "image":
        res = prepare_image(root, dest, log)
    else:
        res = prepare_pathfinder(task, root, dest, workers, log, contour)
    gen = _generator_stamp(task, root, contour)
    extra = dict(res.extra)
    extra["source"] = "generator" if gen else os.path.abspath(source)
    if gen:
        extra["generator_options"] = gen.get("options")
    meta = fmt.write_meta(
        dest, task=task, input=spec["input"], pair=spec["pair"], num_classes=spec["num_classes"],
        max_len=max_len, splits=res.splits, image_shape=PIXEL_SHAPE.get(task), truncated=res.truncated,
        skipped=res.skipped, inputs_fingerprint=fingerprint, comparable=gen is None and contour == DEFAULT_CONTOUR,
        extra=extra)
    shutil.rmtree(workdir, ignore_errors=True)
    counts = ", ".join(f"{s} {n}" for s, n in res.splits.items())
    log(f"[{task}] {dest}: {counts}")
    if spec["input"] == "tokens":
        cut = ", ".join(f"{s} {n}" for s, n in res.truncated.items())
        log(f"[{task}] truncated to {max_len} tokens: {cut} examples")
    skipped = sum(len(v) for v in res.skipped.values())
    if skipped or spec["input"] == "pixels":
        log(f"[{task}] skipped images: {skipped} (listed in meta.json)")
    if gen:
        log(f"[{task}] generated data: meta.json says comparable=false (not LRA's released files)")
    elif contour != DEFAULT_CONTOUR:
        log(f"[{task}] contour length {contour}: meta.json says comparable=false (LRA's task is length 14)")
    return meta


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=list(fmt.TASKS))
    p.add_argument("--source", required=True, help="archive or folder with the task's files")
    p.add_argument("--dest", required=True, help="output folder, e.g. data-bin/lra/TASK")
    p.add_argument("--max-len", type=int, default=None,
                   help="token tasks: truncate longer sequences (default listops 2000, text 4095, retrieval 3999: the "
                        "official 4,096 / 4,000 less the <eos> the recipe appends)")
    p.add_argument("--min-freq", type=int, default=15, help="text: characters seen fewer times in train -> <unk>")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes reading images")
    p.add_argument("--contour-length", type=int, default=None, choices=sorted(DIFFICULTY_FOLDER),
                   help="pathfinder / pathx: the difficulty folder (6 curv_baseline, 9, 14; default 14, LRA's task)")
    a = p.parse_args(argv)
    try:
        prepare(a.task, a.source, a.dest, a.max_len, a.min_freq, max(1, a.workers), contour_length=a.contour_length)
    except (PrepError, fmt.LraDataError) as e:
        print(f"prepare_lra.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
