#!/usr/bin/env python3
"""Check that a binarised fairseq LM data directory can be trained on, before training starts.

    python3 scripts/check_lm_data.py DATA_DIR [--splits train,valid]

Prints ``dictionary_size=N`` and one ``SPLIT tokens=... max_id=...`` line per split and exits 0, or
prints one ``error: ...`` line naming the problem and the fix and exits 2. Checks:

* ``dict.txt`` exists and parses (``symbol count [flags]`` per line);
* every requested split has ``.bin`` and ``.idx`` in fairseq's ``mmap`` format (what
  ``fairseq-preprocess`` writes by default);
* no token id in the data reaches past the dictionary: data binarised with a larger dictionary than
  ``dict.txt`` (for example GPT-2 BPE data next to a small sentencepiece ``dict.txt``) would
  otherwise crash deep inside the embedding lookup, or train on the wrong words.

numpy only (no torch, no fairseq import), so it costs well under a second even on WikiText-103.
"""
import argparse
import os
import struct
import sys

import numpy as np

FAIRSEQ_SPECIALS = 4  # <s>, <pad>, </s>, <unk>: fairseq's Dictionary adds them before dict.txt
MMAP_MAGIC = b"MMIDIDX\x00\x00"
# fairseq.data.indexed_dataset._code_to_dtype (integer codes only)
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16, 9: np.uint32, 10: np.uint64}
PREPROCESS_HINT = (
    "binarise with fairseq-preprocess --only-source --srcdict DATA_DIR/dict.txt (or the data_prep/ scripts)"
)


class DataCheckError(Exception):
    pass


def dictionary_size(path: str) -> int:
    """Number of entries fairseq's ``Dictionary.load`` gives: 4 specials + one per line."""
    if not os.path.isfile(path):
        raise DataCheckError(f"dictionary {path} is missing: {PREPROCESS_HINT}")
    lines = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\n").rsplit(" ", 2)
            if not line.strip():
                continue
            if len(fields) < 2:
                raise DataCheckError(
                    f"{path}:{number}: expected 'symbol count', got {line.strip()[:40]!r}: "
                    f"use the dict.txt that fairseq-preprocess wrote"
                )
            lines += 1
    if lines == 0:
        raise DataCheckError(f"dictionary {path} is empty: {PREPROCESS_HINT}")
    return FAIRSEQ_SPECIALS + lines


def split_stats(prefix: str):
    """(number of tokens, largest token id) of one binarised split."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    missing = [p for p in (idx, bin_) if not os.path.isfile(p)]
    if missing:
        raise DataCheckError(f"split {os.path.basename(prefix)!r} is missing ({', '.join(missing)}): {PREPROCESS_HINT}")
    with open(idx, "rb") as f:
        magic = f.read(9)
        if magic != MMAP_MAGIC:
            raise DataCheckError(
                f"{idx} is not in fairseq's mmap format: re-binarise with fairseq-preprocess "
                f"--dataset-impl mmap (the default)"
            )
        f.read(8)  # version
        (code,) = struct.unpack("<B", f.read(1))
    if code not in DTYPES:
        raise DataCheckError(f"{idx}: token dtype code {code} is not an integer type: re-binarise the split")
    if os.path.getsize(bin_) == 0:
        return 0, -1
    tokens = np.memmap(bin_, dtype=DTYPES[code], mode="r")
    return int(tokens.size), int(tokens.max())


def check(data_dir: str, splits):
    if not os.path.isdir(data_dir):
        raise DataCheckError(f"data directory {data_dir} does not exist: {PREPROCESS_HINT}")
    size = dictionary_size(os.path.join(data_dir, "dict.txt"))
    stats = {}
    for split in splits:
        num_tokens, max_id = split_stats(os.path.join(data_dir, split))
        if max_id >= size:
            raise DataCheckError(
                f"{split} data uses token id {max_id} but {data_dir}/dict.txt has only {size} entries "
                f"(with fairseq's 4 specials): the data was binarised with another dictionary; put that "
                f"dict.txt in {data_dir} or re-binarise with fairseq-preprocess --srcdict {data_dir}/dict.txt"
            )
        stats[split] = (num_tokens, max_id)
    return size, stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir")
    parser.add_argument("--splits", default="train,valid", help="comma-separated split names")
    args = parser.parse_args(argv)
    try:
        size, stats = check(args.data_dir, [s for s in args.splits.split(",") if s])
    except DataCheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"dictionary_size={size}")
    for split, (num_tokens, max_id) in stats.items():
        print(f"{split} tokens={num_tokens} max_id={max_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
