"""Checks of binarised fairseq data and of the dictionary a checkpoint was trained with.

Every entry point that reads a binarised split (``fairseq-train`` / ``-validate`` / ``-eval-lm`` /
``-generate`` / ``-interactive`` through the ``hgrn_language_modeling`` task, the extrapolation tool,
the lm-evaluation-harness model, ``scripts/check_lm_data.py``) checks it here before any work starts:

* ``dict.txt`` parses; the split has ``.bin`` and ``.idx`` in fairseq's ``mmap`` format, is not
  empty, its ``.bin`` holds exactly the tokens its index describes, and no token id reaches past the
  dictionary (data binarised with a larger dictionary would crash deep in the embedding lookup, or
  train on the wrong words);
* a checkpoint records its training dictionary (the symbols in id order and their SHA-256, and the
  ``dict.txt`` they came from) and the tokenizer recorded next to the data (``TOKENIZER_INFO.json``);
  evaluating it on data with another dictionary is an error that says how the two differ (size, or
  the first differing symbol and its line).

numpy only: no torch, no fairseq.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # what fairseq's Dictionary puts before dict.txt
TOKENIZER_MARKER = "TOKENIZER_INFO.json"
MMAP_MAGIC = b"MMIDIDX\x00\x00"
# fairseq.data.indexed_dataset._code_to_dtype (integer codes only)
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16, 9: np.uint32, 10: np.uint64}
PREPROCESS_HINT = (
    "binarise with fairseq-preprocess --only-source --srcdict DATA_DIR/dict.txt (or the data_prep/ scripts)"
)


class DataError(ValueError):
    """Input data that cannot be used as asked; the message names the problem and the fix."""


def read_dictionary_symbols(path: str) -> List[str]:
    """The symbols of a fairseq ``dict.txt`` in id order, fairseq's four specials first."""
    if not os.path.isfile(path):
        raise DataError(f"dictionary {path} is missing: {PREPROCESS_HINT}")
    symbols = list(FAIRSEQ_SPECIALS)
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                fields = line.rstrip("\n").rsplit(" ", 2)
                if len(fields) < 2:
                    raise DataError(f"{path}:{number}: expected 'symbol count', got {line.strip()[:40]!r}: "
                                    f"use the dict.txt that fairseq-preprocess wrote")
                if fields[-1] == "#fairseq:overwrite":
                    fields = fields[:-1]
                symbol = " ".join(fields[:-1]) if len(fields) > 2 else fields[0]
                symbols.append(symbol)
    except UnicodeDecodeError as e:
        raise DataError(f"dictionary {path} is not UTF-8 text ({e.reason} at byte {e.start}): "
                        f"use the dict.txt that fairseq-preprocess wrote") from None
    if len(symbols) == len(FAIRSEQ_SPECIALS):
        raise DataError(f"dictionary {path} is empty: {PREPROCESS_HINT}")
    return symbols


def symbols_fingerprint(symbols: Sequence[str]) -> str:
    h = hashlib.sha256()
    for s in symbols:
        h.update(s.encode("utf-8") + b"\n")
    return h.hexdigest()


def tokenizer_record(data_dir: str) -> Optional[dict]:
    """What ``TOKENIZER_INFO.json`` (written by ``data_prep/``) says about the tokenizer, or None."""
    path = os.path.join(data_dir, TOKENIZER_MARKER)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path} cannot be read ({e}): rerun the data_prep/ script that wrote it") from None
    keep = ("tokenizer", "spm_model_sha256", "gpt2_sha256", "comparable_with_paper")
    return {k: info[k] for k in keep if k in info}


def data_fingerprint(data_dir: str, symbols: Optional[Sequence[str]] = None,
                     nspecial: int = len(FAIRSEQ_SPECIALS)) -> Dict[str, object]:
    """The record a checkpoint keeps about its training data: the dictionary (``dictionary_record``)
    and the tokenizer."""
    path = os.path.abspath(os.path.join(data_dir, "dict.txt"))
    if symbols is None:
        symbols = read_dictionary_symbols(path)
    record = dictionary_record(symbols, nspecial, path)
    record["tokenizer"] = tokenizer_record(data_dir)
    return record


def compare_fingerprints(trained: Dict[str, object], given: Dict[str, object], data_dir: str, what: str) -> None:
    """Raise ``DataError`` when ``given`` (the data passed now) is not the data ``what`` was trained on."""
    given = dict(given)
    given.setdefault("dictionary_path", os.path.join(data_dir, "dict.txt"))
    check_dictionary(trained, given, what)
    a, b = trained.get("tokenizer"), given.get("tokenizer")
    if a and b and a != b:
        raise DataError(
            f"{what} was trained on data encoded with another tokenizer than {data_dir} "
            f"({TOKENIZER_MARKER}: {a} vs {b}): evaluate on data encoded with the training tokenizer"
        )


def dictionary_record(symbols: Sequence[str], nspecial: int, path: Optional[str]) -> Dict[str, object]:
    """What a model keeps about the dictionary it was built with (saved with its weights): the symbols in
    id order, their SHA-256, how many leading specials fairseq added, and the ``dict.txt`` they came from."""
    return {
        "dictionary_sha256": symbols_fingerprint(symbols),
        "dictionary_size": len(symbols),
        "dictionary_symbols": list(symbols),
        "nspecial": int(nspecial),
        "dictionary_path": path,
    }


def dictionary_difference(trained: Dict[str, object], given: Dict[str, object]) -> str:
    """How two dictionary records differ, in a phrase: a size mismatch, or (same size) the first symbol
    that differs with its line in ``dict.txt``. Records without symbols compare by size only."""
    a, b = trained.get("dictionary_size"), given.get("dictionary_size")
    if a != b:
        return f"size mismatch: {a} entries in training vs {b} now"
    sym_a, sym_b = trained.get("dictionary_symbols"), given.get("dictionary_symbols")
    if not sym_a or not sym_b:
        return f"same size ({a} entries), different symbols"
    i = next(i for i, (x, y) in enumerate(zip(sym_a, sym_b)) if x != y)
    nspecial = int(given.get("nspecial") or len(FAIRSEQ_SPECIALS))
    where = f"dict.txt line {i - nspecial + 1}" if i >= nspecial else f"special symbol #{i}"
    return f"same size ({a} entries), different symbols: first at id {i} ({where}), {sym_a[i]!r} in training vs {sym_b[i]!r} now"


def check_dictionary(trained: Optional[Dict[str, object]], given: Dict[str, object], what: str) -> None:
    """Raise ``DataError`` naming both dictionaries when ``given`` is not the one ``what`` was trained with."""
    if trained is None or trained.get("dictionary_sha256") == given.get("dictionary_sha256"):
        return
    now = given.get("dictionary_path") or "the dictionary given now"
    then = trained.get("dictionary_path") or "a dictionary it does not name"
    raise DataError(
        f"{what} was trained with another dictionary than {now} (trained with {then}; "
        f"{dictionary_difference(trained, given)}): evaluate on data binarised with the training dictionary"
    )


class RecordsDataInCheckpoints:
    """Mixin for fairseq tasks: ``state_dict()`` (saved in every checkpoint as its ``task_state``) holds
    ``self.data_fingerprint()`` under ``FINGERPRINT_KEY``; ``load_state_dict`` (fairseq calls it whenever
    a checkpoint is loaded with this task) hands the recorded one to ``self.check_data_fingerprint``,
    and warns when the checkpoint has none. The task defines those two methods and
    ``data_description()`` (what the warning names)."""

    FINGERPRINT_KEY = "hgrn_data"

    def state_dict(self):
        state = dict(super().state_dict())
        state[self.FINGERPRINT_KEY] = self.data_fingerprint()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict or {})
        trained = state_dict.pop(self.FINGERPRINT_KEY, None)
        super().load_state_dict(state_dict)
        if trained is None:
            import logging

            logging.getLogger(type(self).__module__).warning(
                "the checkpoint records no data fingerprint (written before it did): cannot check that %s is "
                "the data it was trained on", self.data_description())
            return
        self.check_data_fingerprint(trained)


REBINARISE_HINT = ("re-run fairseq-preprocess for this split (--srcdict DATA_DIR/dict.txt), or the data_prep/ "
                   "script that wrote it")
INDEX_HEADER_BYTES = 9 + 8 + 1 + 8  # magic, version, dtype code, number of sequences


def _read_index(idx: str) -> Tuple[np.dtype, np.ndarray]:
    """(token dtype, sizes) from a fairseq ``mmap`` index file, after checking its whole layout: what
    fairseq's ``MMapIndexedDataset.Index`` reads (header, int32 sizes, int64 byte offsets) and nothing
    more, the offsets those of the sizes laid end to end."""
    nbytes = os.path.getsize(idx)
    with open(idx, "rb") as f:
        head = f.read(INDEX_HEADER_BYTES)
    if len(head) < len(MMAP_MAGIC) and MMAP_MAGIC.startswith(head):
        raise DataError(f"{idx} is truncated ({nbytes} bytes, not even its header): {REBINARISE_HINT}")
    if head[:9] != MMAP_MAGIC:
        raise DataError(f"{idx} is not in fairseq's mmap format: re-binarise with fairseq-preprocess "
                        f"--dataset-impl mmap (the default)")
    if len(head) < INDEX_HEADER_BYTES:
        raise DataError(f"{idx} is truncated ({nbytes} bytes, not even its header): {REBINARISE_HINT}")
    version, code, length = struct.unpack("<QBQ", head[9:])
    if version != 1:
        raise DataError(f"{idx}: index version {version}, fairseq reads version 1: {REBINARISE_HINT}")
    if code not in DTYPES:
        raise DataError(f"{idx}: token dtype code {code} is not an integer type: {REBINARISE_HINT}")
    expected = INDEX_HEADER_BYTES + 12 * length
    if nbytes != expected:
        state = "truncated" if nbytes < expected else "longer than its header says"
        raise DataError(f"{idx} is {state} ({nbytes} bytes; {length} sequences need {expected}): {REBINARISE_HINT}")
    dtype = np.dtype(DTYPES[code])
    index = np.memmap(idx, mode="r", dtype=np.uint8)
    sizes = np.frombuffer(index, dtype=np.int32, count=length, offset=INDEX_HEADER_BYTES)
    pointers = np.frombuffer(index, dtype=np.int64, count=length, offset=INDEX_HEADER_BYTES + 4 * length)
    if length and sizes.min() < 0:
        raise DataError(f"{idx} is damaged (a negative sequence size): {REBINARISE_HINT}")
    starts = np.zeros(length, dtype=np.int64)
    starts[1:] = np.cumsum(sizes[:-1].astype(np.int64)) * dtype.itemsize
    if not np.array_equal(pointers, starts):
        first = int(np.flatnonzero(pointers != starts)[0])
        raise DataError(f"{idx} is damaged (the byte offset of sequence {first} does not follow from the sizes): "
                        f"{REBINARISE_HINT}")
    return dtype, np.array(sizes)


def check_split_files(prefix: str) -> Tuple[np.dtype, int]:
    """Check that a binarised split's ``.idx`` is whole and its ``.bin`` holds exactly the tokens it
    describes, and that there are some; returns (token dtype, tokens). Reads the index only."""
    name = os.path.basename(prefix)
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    missing = [p for p in (idx, bin_) if not os.path.isfile(p)]
    if missing:
        raise DataError(f"split {name!r} is missing ({', '.join(missing)}): {PREPROCESS_HINT}")
    dtype, sizes = _read_index(idx)
    num_tokens = int(sizes.astype(np.int64).sum())
    if num_tokens == 0 or os.path.getsize(bin_) == 0:
        raise DataError(f"split {name!r} ({bin_}) is empty: binarise a non-empty text file for it, or leave "
                        f"the split out (--valid-subset / --gen-subset)")
    expected_bytes = num_tokens * dtype.itemsize
    actual = os.path.getsize(bin_)
    if actual != expected_bytes:
        state = "truncated" if actual < expected_bytes else "longer than its index says"
        raise DataError(f"{bin_} is {state}: {actual} bytes but {idx} describes {num_tokens} tokens "
                        f"({expected_bytes} bytes), so the two are damaged or from different runs: {REBINARISE_HINT}")
    return dtype, num_tokens


def check_split(prefix: str, dictionary_size: int) -> Tuple[int, int]:
    """Check one binarised split against its index and the dictionary; returns (tokens, largest id)."""
    name = os.path.basename(prefix)
    bin_ = prefix + ".bin"
    dtype, num_tokens = check_split_files(prefix)
    max_id = int(np.memmap(bin_, dtype=dtype, mode="r").max())
    if max_id >= dictionary_size:
        data_dir = os.path.dirname(prefix) or "."
        raise DataError(
            f"split {name!r} uses token id {max_id} but {data_dir}/dict.txt has only {dictionary_size} entries "
            f"(with fairseq's 4 specials): the data was binarised with another dictionary; put that dict.txt "
            f"in {data_dir} or re-binarise with fairseq-preprocess --srcdict {data_dir}/dict.txt"
        )
    return num_tokens, max_id


def check_data_dir(data_dir: str, splits: Sequence[str]) -> Tuple[int, Dict[str, Tuple[int, int]]]:
    """Dictionary size and ``{split: (tokens, largest id)}`` after checking every split."""
    if not os.path.isdir(data_dir):
        raise DataError(f"data directory {data_dir} does not exist: {PREPROCESS_HINT}")
    size = len(read_dictionary_symbols(os.path.join(data_dir, "dict.txt")))
    return size, {split: check_split(os.path.join(data_dir, split), size) for split in splits}


def check_positive(name: str, value, fix: str = "") -> None:
    """One-line error for a count or length option that must be >= 1."""
    if value is None:
        return
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise DataError(f"{name}={value!r} must be a whole number >= 1{': ' + fix if fix else ''}")
