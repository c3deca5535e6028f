"""On-disk format of the Long Range Arena data (``data-bin/lra/TASK``): writer, reader, validation.

One directory per task, written by ``data_prep/prepare_lra.py`` and read by the ``lra_text`` /
``lra_image`` tasks::

    meta.json                 {"format": "hgrn-lra/1", "task": ..., "input": "tokens" | "pixels",
                               "pair": bool, "num_classes": int, "max_len": int,
                               "image_shape": [H, W, C] (pixels only),
                               "splits": {"train": N, "valid": N, "test": N},
                               "truncated": {split: count}, "skipped": {split: [{"file", "reason"}]},
                               "inputs_fingerprint": "sha256:...", "comparable": bool}
    dict.txt                  fairseq Dictionary (tokens tasks only), symbols from the train split
    {split}.input0.bin/.idx   fairseq MMapIndexedDataset of dictionary indices (no BOS/EOS added)
    {split}.input1.bin/.idx   retrieval only: the second document
    {split}.label.npy         int64 [N], classes 0 .. num_classes - 1
    {split}.pixels.npy        uint8 [N, H, W, C] (pixels tasks only)

Every writer writes under a temporary name and renames, so a killed preparation never leaves a
file that looks complete; ``meta.json`` is written last (``write_meta``) and removed first
(``begin``): a directory with a ``meta.json`` is a finished one.

Writer use (tokens task)::

    begin(dest)
    d = build_dictionary(train_token_lists)          # fairseq Dictionary, symbols by count
    write_dictionary(dest, d)
    for split in SPLITS:
        write_tokens(dest, split, "input0", (encode(d, toks) for toks in docs[split]), len(d))
        write_labels(dest, split, labels[split], num_classes)
    write_meta(dest, task="listops", input="tokens", num_classes=10, max_len=2000, splits={...},
               truncated={...}, skipped={...}, inputs_fingerprint=fingerprint_files([...]))

Pixels tasks use ``write_pixels`` (whole array) or ``pixels_writer`` (a memory-mapped array filled
in place, for sets too large for memory) instead of the dictionary and token streams.

Reader use: ``validate(dest)`` checks everything the training needs and raises ``LraDataError``
with one line per problem (the file and the fix); ``load_split(dest, split)`` opens the arrays.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

FORMAT = "hgrn-lra/1"
SPLITS = ("train", "valid", "test")
INPUTS = ("tokens", "pixels")
STREAMS = ("input0", "input1")

# The six LRA tasks: input kind, whether examples are document pairs, classes (LRA's protocol).
TASKS: Dict[str, Dict[str, Any]] = {
    "listops": {"input": "tokens", "pair": False, "num_classes": 10},
    "text": {"input": "tokens", "pair": False, "num_classes": 2},
    "retrieval": {"input": "tokens", "pair": True, "num_classes": 2},
    "image": {"input": "pixels", "pair": False, "num_classes": 10},
    "pathfinder": {"input": "pixels", "pair": False, "num_classes": 2},
    "pathx": {"input": "pixels", "pair": False, "num_classes": 2},
}

PREPARE_HINT = "rerun data_prep/prepare_lra.py for this task"


class LraDataError(ValueError):
    """A problem with an LRA data directory; the message has one line per problem."""


# --------------------------------------------------------------------------------------------
# paths

def meta_path(dest: str) -> str:
    return os.path.join(dest, "meta.json")


def dict_path(dest: str) -> str:
    return os.path.join(dest, "dict.txt")


def stream_prefix(dest: str, split: str, stream: str = "input0") -> str:
    """Prefix of a token stream: fairseq appends ``.bin`` / ``.idx``."""
    _check_split(split)
    if stream not in STREAMS:
        raise ValueError(f"stream {stream!r} is not one of {STREAMS}")
    return os.path.join(dest, f"{split}.{stream}")


def label_path(dest: str, split: str) -> str:
    _check_split(split)
    return os.path.join(dest, f"{split}.label.npy")


def pixels_path(dest: str, split: str) -> str:
    _check_split(split)
    return os.path.join(dest, f"{split}.pixels.npy")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")


# --------------------------------------------------------------------------------------------
# atomic writing

def _temp_name(path: str) -> str:
    d, base = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=d or ".")
    os.close(fd)
    return tmp


@contextlib.contextmanager
def _atomic(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path``; rename it to ``path`` on success, delete on error."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = _temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def begin(dest: str) -> None:
    """Mark ``dest`` as being (re)written: remove its ``meta.json`` so no reader takes it as finished."""
    os.makedirs(dest, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(meta_path(dest))


# --------------------------------------------------------------------------------------------
# writers

def build_dictionary(token_lists: Iterable[Sequence[str]], min_count: int = 1):
    """A fairseq ``Dictionary`` of the symbols in ``token_lists`` (the train split), most frequent first.

    Symbols seen fewer than ``min_count`` times are left out (they encode as ``<unk>``). No padding
    symbols are added (``padding_factor=1``): the vocabulary is exactly the symbols kept + 4 specials.
    """
    from fairseq.data import Dictionary

    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    counts: collections.Counter = collections.Counter()
    for tokens in token_lists:
        counts.update(tokens)  # (counted in C; finalize sorts, so the order of insertion does not matter)
    d = Dictionary()
    for tok, n in counts.items():
        d.add_symbol(tok, n)
    d.finalize(threshold=min_count, padding_factor=1)
    return d


def encode(dictionary, tokens: Sequence[str]) -> np.ndarray:
    """Dictionary indices of ``tokens`` (unknown symbols -> ``<unk>``), int64, no BOS/EOS."""
    # (Dictionary.index(t) is indices.get(t, unk_index); looked up here without a Python call per token)
    return np.fromiter(map(dictionary.indices.get, tokens, itertools.repeat(dictionary.unk_index, len(tokens))),
                       dtype=np.int64, count=len(tokens))


def write_dictionary(dest: str, dictionary) -> None:
    """Write ``dict.txt`` atomically and check that fairseq reads back the same symbols.

    fairseq's text format is ``symbol count`` per line: a symbol containing a newline (or one that is
    empty) cannot be stored; map such characters to a printable name before building the dictionary.
    """
    from fairseq.data import Dictionary

    path = dict_path(dest)
    with _atomic(path) as tmp:
        dictionary.save(tmp)
        try:
            back = Dictionary.load(tmp).symbols
        except (ValueError, RuntimeError):  # a line fairseq cannot parse
            back = []
        if back != dictionary.symbols:
            bad = [s for s in dictionary.symbols[dictionary.nspecial:] if s not in back]
            raise LraDataError(
                f"{path}: symbols {bad[:5]!r} do not survive fairseq's dict.txt format; "
                "map whitespace/control characters to printable names before build_dictionary")


def _index_dtype(vocab_size: int):
    from fairseq.data.indexed_dataset import best_fitting_int_dtype

    return best_fitting_int_dtype(vocab_size)


def write_tokens(dest: str, split: str, stream: str, sequences: Iterable[Any], vocab_size: int) -> Dict[str, int]:
    """Write one token stream (``{split}.{stream}.bin/.idx``) from an iterable of id sequences.

    Each sequence is a list / numpy array / tensor of dictionary indices in [0, vocab_size); empty
    sequences are refused (mean pooling needs at least one position). Returns
    ``{"count": N, "tokens": total, "max_len": longest}``.
    """
    import torch
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    prefix = stream_prefix(dest, split, stream)
    dtype = _index_dtype(vocab_size)
    count = total = longest = 0
    with _atomic(prefix + ".bin") as tmp_bin, _atomic(prefix + ".idx") as tmp_idx:
        builder = MMapIndexedDatasetBuilder(tmp_bin, dtype=dtype)
        try:
            for seq in sequences:
                arr = np.asarray(seq.numpy() if isinstance(seq, torch.Tensor) else seq, dtype=np.int64)
                if arr.ndim != 1 or arr.size == 0:
                    raise LraDataError(f"{prefix}: example {count} has shape {arr.shape}; "
                                       "every example needs a non-empty 1-D sequence of token ids")
                lo, hi = int(arr.min()), int(arr.max())
                if lo < 0 or hi >= vocab_size:
                    raise LraDataError(f"{prefix}: example {count} has token id {lo if lo < 0 else hi} "
                                       f"outside [0, {vocab_size}); encode with the task's dictionary")
                builder.add_item(torch.from_numpy(arr))
                count += 1
                total += arr.size
                longest = max(longest, arr.size)
        finally:
            builder._data_file.close()  # fairseq's builder leaves it open on errors
        builder.finalize(tmp_idx)
    return {"count": count, "tokens": total, "max_len": longest}


def write_labels(dest: str, split: str, labels: Sequence[int], num_classes: int) -> int:
    """Write ``{split}.label.npy`` (int64); every label must lie in [0, num_classes). Returns N."""
    arr = np.asarray(labels)
    path = label_path(dest, split)
    if arr.ndim != 1:
        raise LraDataError(f"{path}: labels have shape {arr.shape}; expected a 1-D array")
    if arr.size and (not np.issubdtype(arr.dtype, np.integer)):
        raise LraDataError(f"{path}: labels have dtype {arr.dtype}; expected integers")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
        raise LraDataError(f"{path}: label values {int(arr.min())}..{int(arr.max())} are outside "
                           f"0..{num_classes - 1}; map the labels to class indices first")
    with _atomic(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, arr)
    return int(arr.size)


def write_pixels(dest: str, split: str, pixels: np.ndarray) -> int:
    """Write ``{split}.pixels.npy`` from a uint8 array [N, H, W, C]. Returns N."""
    arr = np.asarray(pixels)
    path = pixels_path(dest, split)
    if arr.ndim != 4 or arr.dtype != np.uint8:
        raise LraDataError(f"{path}: pixels are {arr.dtype} {arr.shape}; expected uint8 [N, H, W, C]")
    with _atomic(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, arr)
    return int(arr.shape[0])


@contextlib.contextmanager
def pixels_writer(dest: str, split: str, n: int, image_shape: Sequence[int]) -> Iterator[np.memmap]:
    """A writable memory-mapped uint8 [n, H, W, C] array that becomes ``{split}.pixels.npy`` on exit.

    Fill it in place (``arr[i] = image``); an exception inside the block deletes the partial file.
    """
    path = pixels_path(dest, split)
    shape = (int(n),) + tuple(int(s) for s in image_shape)
    if len(shape) != 4:
        raise ValueError(f"image_shape must be [H, W, C], got {list(image_shape)}")
    with _atomic(path) as tmp:
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        yield arr
        arr.flush()
        del arr


def fingerprint_files(paths: Iterable[str], extra: Optional[Dict[str, Any]] = None) -> str:
    """``sha256:...`` over the names, sizes and modification times of ``paths`` plus ``extra``
    (the preparation's options): a cheap key for "same inputs, nothing to redo"."""
    h = hashlib.sha256()
    for p in sorted(os.path.abspath(p) for p in paths):
        st = os.stat(p)
        h.update(f"{p}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())
    h.update(json.dumps(extra or {}, sort_keys=True).encode())
    return "sha256:" + h.hexdigest()


def write_meta(
    dest: str,
    *,
    task: str,
    input: str,
    num_classes: int,
    max_len: int,
    splits: Dict[str, int],
    pair: bool = False,
    image_shape: Optional[Sequence[int]] = None,
    truncated: Optional[Dict[str, int]] = None,
    skipped: Optional[Dict[str, List[Dict[str, str]]]] = None,
    inputs_fingerprint: str = "",
    comparable: bool = True,
    extra: Optional[Dict[str, Any]] = None,
    check: bool = True,
) -> Dict[str, Any]:
    """Write ``meta.json`` last, after every data file; with ``check`` (default) run ``validate`` first
    so a directory with a meta.json is always a consistent one. ``comparable`` is False when the data
    differ from LRA's protocol (e.g. generated instead of the released files); ``extra`` keys are stored
    as well (e.g. {"source": "generator", "seed": 42})."""
    meta: Dict[str, Any] = {
        "format": FORMAT,
        "task": task,
        "input": input,
        "pair": bool(pair),
        "num_classes": int(num_classes),
        "max_len": int(max_len),
        "splits": {k: int(v) for k, v in splits.items()},
        "truncated": {k: int(v) for k, v in (truncated or {}).items()},
        "skipped": {k: list(v) for k, v in (skipped or {}).items()},
        "inputs_fingerprint": inputs_fingerprint,
        "comparable": bool(comparable),
    }
    if image_shape is not None:
        meta["image_shape"] = [int(s) for s in image_shape]
    for k, v in (extra or {}).items():
        if k in meta:
            raise ValueError(f"extra key {k!r} would overwrite a meta.json field")
        meta[k] = v
    problems = _check_meta_fields(meta, meta_path(dest))
    if problems:
        raise LraDataError("\n".join(problems))
    if check:
        _validate_files(dest, meta)
    with _atomic(meta_path(dest)) as tmp:
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.write("\n")
    return meta


def is_complete(dest: str, inputs_fingerprint: str) -> bool:
    """True when ``dest`` holds a finished, valid directory prepared from the same inputs."""
    try:
        meta = read_meta(dest)
    except LraDataError:
        return False
    if meta.get("inputs_fingerprint") != inputs_fingerprint:
        return False
    try:
        _validate_files(dest, meta)
    except LraDataError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# reader and validation

def _check_meta_fields(meta: Dict[str, Any], path: str) -> List[str]:
    fix = f"fix: {PREPARE_HINT}"
    out: List[str] = []
    if meta.get("format") != FORMAT:
        return [f"{path}: format {meta.get('format')!r} is not {FORMAT!r}; {fix}"]
    if meta.get("input") not in INPUTS:
        out.append(f"{path}: input {meta.get('input')!r} is not one of {INPUTS}; {fix}")
    task = meta.get("task")
    if task not in TASKS:
        out.append(f"{path}: task {task!r} is not one of {sorted(TASKS)}; {fix}")
    elif (meta.get("input"), bool(meta.get("pair"))) != (TASKS[task]["input"], TASKS[task]["pair"]):
        out.append(f"{path}: task {task!r} has input {TASKS[task]['input']!r}, pair {TASKS[task]['pair']}, but "
                   f"meta.json says input {meta.get('input')!r}, pair {meta.get('pair')!r}; {fix}")
    nc = meta.get("num_classes")
    if not isinstance(nc, int) or nc < 2:
        out.append(f"{path}: num_classes {nc!r} must be an integer >= 2; {fix}")
    ml = meta.get("max_len")
    if not isinstance(ml, int) or ml < 1:
        out.append(f"{path}: max_len {ml!r} must be a positive integer; {fix}")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not splits or any(s not in SPLITS for s in splits):
        out.append(f"{path}: splits {splits!r} must map some of {SPLITS} to example counts; {fix}")
    elif any(not isinstance(n, int) or n < 0 for n in splits.values()):
        out.append(f"{path}: split sizes {splits!r} must be non-negative integers; {fix}")
    if meta.get("input") == "pixels":
        shape = meta.get("image_shape")
        if (not isinstance(shape, list) or len(shape) != 3
                or any(not isinstance(s, int) or s < 1 for s in shape)):
            out.append(f"{path}: image_shape {shape!r} must be [H, W, C] for a pixels task; {fix}")
        if meta.get("pair"):
            out.append(f"{path}: pair is true for a pixels task; only token tasks have pairs; {fix}")
    return out


def read_meta(dest: str) -> Dict[str, Any]:
    """Read and check the fields of ``meta.json`` (not the data files: see ``validate``)."""
    path = meta_path(dest)
    if not os.path.isdir(dest):
        raise LraDataError(f"{dest}: LRA data directory not found; fix: run data_prep/prepare_lra.py "
                           f"TASK --dest {dest} (or pass the right DATA_DIR)")
    if not os.path.isfile(path):
        raise LraDataError(f"{path}: missing (preparation not finished); fix: {PREPARE_HINT} --dest {dest}")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise LraDataError(f"{path}: unreadable ({e}); fix: {PREPARE_HINT}") from None
    if not isinstance(meta, dict):
        raise LraDataError(f"{path}: not a JSON object; fix: {PREPARE_HINT}")
    problems = _check_meta_fields(meta, path)
    if problems:
        raise LraDataError("\n".join(problems))
    return meta


def _read_index(prefix: str):
    """(dtype, sizes) of a fairseq mmap index, or an LraDataError."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    idx = prefix + ".idx"
    try:
        index = MMapIndexedDataset.Index(idx)
    except (AssertionError, OSError, ValueError, KeyError, struct.error) as e:
        raise LraDataError(f"{idx}: not a fairseq mmap index ({type(e).__name__}); fix: {PREPARE_HINT}") from None
    sizes = np.array(index.sizes, dtype=np.int64)
    dtype = index.dtype
    del index
    return dtype, sizes


def _stream_max(path: str, dtype, n_items: int, chunk: int = 1 << 24) -> int:
    """Largest value in a .bin file, read in chunks (the retrieval files are gigabytes)."""
    if n_items == 0:
        return -1
    data = np.memmap(path, dtype=dtype, mode="r", shape=(n_items,))
    best = -1
    for start in range(0, n_items, chunk):
        best = max(best, int(data[start:start + chunk].max()))
    del data
    return best


def _validate_files(dest: str, meta: Dict[str, Any], max_len: Optional[int] = None,
                    grid: Optional[Sequence[int]] = None, splits: Optional[Sequence[str]] = None) -> None:
    problems: List[str] = []
    fix = f"fix: {PREPARE_HINT}"
    nc = meta["num_classes"]
    vocab = None
    if meta["input"] == "tokens":
        dp = dict_path(dest)
        if not os.path.isfile(dp):
            problems.append(f"{dp}: missing; {fix}")
        else:
            from fairseq.data import Dictionary

            try:
                vocab = len(Dictionary.load(dp))
            except Exception as e:  # fairseq raises ValueError / RuntimeError on bad lines
                problems.append(f"{dp}: unreadable as a fairseq dictionary ({e}); {fix}")
    else:
        shape = meta["image_shape"]
        if grid is not None and list(grid) != shape[:2]:
            problems.append(f"{meta_path(dest)}: images are {shape[0]}x{shape[1]} but the model's grid is "
                            f"{grid[0]}x{grid[1]}; fix: use the arch made for this task (hgrn1_lra_TASK / hgrn2_lra_TASK)")
    limit = meta["max_len"] if max_len is None else min(meta["max_len"], max_len)
    for split in (splits if splits is not None else list(meta["splits"])):
        if split not in meta["splits"]:
            problems.append(f"{meta_path(dest)}: split {split!r} not prepared (have {sorted(meta['splits'])}); {fix}")
            continue
        n = meta["splits"][split]
        lp = label_path(dest, split)
        if n == 0:  # refused here, not when evaluation divides by the split's size at the end of a run
            problems.append(f"{lp}: split {split!r} has no examples (meta.json: 0); every split needs at least "
                            f"one; {fix}")
            continue
        if not os.path.isfile(lp):
            problems.append(f"{lp}: missing; {fix}")
        else:
            try:
                labels = np.load(lp, mmap_mode="r")
            except (OSError, ValueError) as e:
                problems.append(f"{lp}: unreadable ({e}); {fix}")
                labels = None
            if labels is not None:
                if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
                    problems.append(f"{lp}: {labels.dtype} {labels.shape}; expected int64 [N]; {fix}")
                elif len(labels) != n:
                    problems.append(f"{lp}: {len(labels)} labels but meta.json says {split} has {n}; {fix}")
                elif n and (labels.min() < 0 or labels.max() >= nc):
                    problems.append(f"{lp}: labels {int(labels.min())}..{int(labels.max())} outside "
                                    f"0..{nc - 1} (num_classes {nc}); {fix}")
        if meta["input"] == "tokens":
            streams = STREAMS if meta.get("pair") else STREAMS[:1]
            for stream in streams:
                prefix = stream_prefix(dest, split, stream)
                missing = [p for p in (prefix + ".idx", prefix + ".bin") if not os.path.isfile(p)]
                if missing:
                    problems.extend(f"{p}: missing; {fix}" for p in missing)
                    continue
                try:
                    dtype, sizes = _read_index(prefix)
                except LraDataError as e:
                    problems.append(str(e))
                    continue
                if len(sizes) != n:
                    problems.append(f"{prefix}.idx: {len(sizes)} examples but meta.json says {split} has {n}; {fix}")
                    continue
                expected = int(sizes.sum()) * np.dtype(dtype).itemsize
                actual = os.path.getsize(prefix + ".bin")
                if actual != expected:
                    problems.append(f"{prefix}.bin: {actual} bytes but its index describes {expected}; {fix}")
                    continue
                if n and sizes.min() < 1:
                    problems.append(f"{prefix}.idx: example {int(np.argmin(sizes))} is empty; {fix}")
                if n and sizes.max() > limit:
                    i = int(np.argmax(sizes))
                    who = "meta.json's max_len" if limit == meta["max_len"] else "the model's max length"
                    problems.append(
                        f"{prefix}: example {i} has {int(sizes[i])} tokens, more than {who} {limit}; fix: "
                        f"prepare the data with truncation to {limit} (prepare_lra.py --max-len) or use an arch "
                        f"with a longer --max-positions")
                if vocab is not None:
                    top = _stream_max(prefix + ".bin", dtype, int(sizes.sum()))
                    if top >= vocab:
                        problems.append(f"{prefix}.bin: token id {top} >= dictionary size {vocab} "
                                        f"({dict_path(dest)}); {fix}")
        else:
            pp = pixels_path(dest, split)
            if not os.path.isfile(pp):
                problems.append(f"{pp}: missing; {fix}")
                continue
            try:
                px = np.load(pp, mmap_mode="r")
            except (OSError, ValueError) as e:
                problems.append(f"{pp}: unreadable ({e}); {fix}")
                continue
            shape = meta["image_shape"]
            if px.dtype != np.uint8 or px.ndim != 4 or list(px.shape[1:]) != shape:
                problems.append(f"{pp}: {px.dtype} {list(px.shape)}; expected uint8 [N, {shape[0]}, "
                                f"{shape[1]}, {shape[2]}] (meta.json image_shape); {fix}")
            elif px.shape[0] != n:
                problems.append(f"{pp}: {px.shape[0]} images but meta.json says {split} has {n}; {fix}")
            elif shape[0] * shape[1] > limit:
                problems.append(f"{pp}: {shape[0]}x{shape[1]} = {shape[0] * shape[1]} positions, more than "
                                f"the maximum {limit}; fix: use the arch for this task (longer --max-positions)")
            del px
    if problems:
        raise LraDataError("\n".join(problems))


def validate(dest: str, splits: Optional[Sequence[str]] = None, max_len: Optional[int] = None,
             grid: Optional[Sequence[int]] = None, input_kind: Optional[str] = None) -> Dict[str, Any]:
    """Check ``dest`` before training and return its meta.

    ``splits``: the splits to check (default: all in meta.json). ``max_len``: the model's maximum
    sequence length (every sequence must fit). ``grid``: the model's (H, W) for 2-D tasks.
    ``input_kind``: what the fairseq task reads, "tokens" or "pixels" (a pixels directory given to a
    tokens task is an error). Raises ``LraDataError`` (one line per problem: the file and the fix).
    """
    meta = read_meta(dest)
    if input_kind is not None and meta["input"] != input_kind:
        want = "lra_text" if meta["input"] == "tokens" else "lra_image"
        raise LraDataError(f"{meta_path(dest)}: this directory holds {meta['input']} inputs "
                           f"(task {meta.get('task')!r}) but the task reads {input_kind}; fix: use --task {want}")
    _validate_files(dest, meta, max_len=max_len, grid=grid, splits=splits)
    return meta


@dataclass
class LraSplit:
    """One split opened for reading. ``input0`` / ``input1`` are fairseq MMapIndexedDatasets (tokens
    tasks; ``input1`` only for pairs); ``pixels`` a read-only memory map [N, H, W, C] (pixels tasks)."""
    labels: np.ndarray
    input0: Any = None
    input1: Any = None
    pixels: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.labels)


def load_split(dest: str, split: str, meta: Optional[Dict[str, Any]] = None) -> LraSplit:
    """Open one split (call ``validate`` first; this only opens files)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    meta = meta or read_meta(dest)
    labels = np.load(label_path(dest, split)).astype(np.int64)
    if meta["input"] == "pixels":
        return LraSplit(labels=labels, pixels=np.load(pixels_path(dest, split), mmap_mode="r"))
    input0 = MMapIndexedDataset(stream_prefix(dest, split, "input0"))
    input1 = MMapIndexedDataset(stream_prefix(dest, split, "input1")) if meta.get("pair") else None
    return LraSplit(labels=labels, input0=input0, input1=input1)


def summary(meta: Dict[str, Any]) -> str:
    """One line: task, input, classes, split sizes, truncated / skipped counts, comparability."""
    skipped = {k: len(v) for k, v in meta.get("skipped", {}).items() if v}
    shape = f", images {'x'.join(map(str, meta['image_shape']))}" if meta["input"] == "pixels" else ""
    return (f"{meta['task']}: {meta['input']}{shape}, {meta['num_classes']} classes, max_len {meta['max_len']}, "
            f"splits {meta['splits']}, truncated {meta.get('truncated', {})}, skipped {skipped}, "
            f"comparable with LRA: {meta.get('comparable', True)}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hgrn_fairseq.tasks.lra_format validate DIR [--max-len N]``: check a data directory."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m hgrn_fairseq.tasks.lra_format", description="check an LRA data directory")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate")
    v.add_argument("dest")
    v.add_argument("--max-len", type=int, default=None, help="the model's longest sequence")
    args = p.parse_args(argv)
    try:
        meta = validate(args.dest, max_len=args.max_len)
    except LraDataError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    print(summary(meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
