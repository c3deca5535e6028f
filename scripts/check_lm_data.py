#!/usr/bin/env python3
"""Check that a binarised fairseq LM data directory can be trained on, before training starts.

    python3 scripts/check_lm_data.py DATA_DIR [--splits train,valid]

Prints ``dictionary_size=N`` and one ``SPLIT tokens=... max_id=...`` line per split and exits 0, or
prints one ``error: ...`` line naming the problem and the fix and exits 2. The checks are
``hgrn_fairseq/data_checks.py``'s (the same the task and the evaluation tools run): ``dict.txt``
parses; each split has ``.bin``/``.idx`` in fairseq's ``mmap`` format, is not empty, its ``.bin``
matches its index, and no token id reaches past the dictionary.
"""
import argparse
import sys

from hgrn_fairseq import data_checks as checks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir")
    parser.add_argument("--splits", default="train,valid", help="comma-separated split names")
    args = parser.parse_args(argv)
    try:
        size, stats = checks.check_data_dir(args.data_dir, [s for s in args.splits.split(",") if s])
    except checks.DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"dictionary_size={size}")
    for split, (num_tokens, max_id) in stats.items():
        print(f"{split} tokens={num_tokens} max_id={max_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
