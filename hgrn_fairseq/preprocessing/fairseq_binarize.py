"""fairseq-preprocess with a fixed dictionary, and token counts of the result.

Used by ``prepare_wikitext103.py``; also runnable on its own:

    python data_prep/fairseq_binarize.py --srcdict spm/dict.txt --text-dir spm --suffix .bpe \\
        --destdir data-bin/corpus
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, Optional, Sequence

SPLIT_FLAGS = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}


def binarize(
    prefixes: Dict[str, str], srcdict: str, destdir: str, workers: int = 1, log=print
) -> None:
    """Run ``fairseq-preprocess --only-source --srcdict`` on ``prefixes`` ({split: text file}).

    fairseq appends nothing to the file names here: the text files are passed as full paths.
    """
    for split, path in prefixes.items():
        if split not in SPLIT_FLAGS:
            raise ValueError(f"split {split!r} is not one of {sorted(SPLIT_FLAGS)}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{split} text {path} not found")
    if not os.path.isfile(srcdict):
        raise FileNotFoundError(f"dictionary {srcdict} not found")
    os.makedirs(destdir, exist_ok=True)
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--srcdict", srcdict,
           "--destdir", destdir, "--workers", str(max(1, workers))]
    for split, path in prefixes.items():
        cmd += [SPLIT_FLAGS[split], path]
    log(f"[binarize] fairseq-preprocess ({max(1, workers)} workers) -> {destdir}")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        raise RuntimeError(f"fairseq-preprocess failed (exit {proc.returncode}):\n{tail}")
    for line in proc.stdout.splitlines():
        if "sents," in line and "tokens" in line:
            log("[binarize] " + line.split("[None] ")[-1].strip())


def token_counts(destdir: str, splits: Sequence[str] = ("train", "valid", "test")) -> Dict[str, dict]:
    """Lines and tokens (end-of-sentence included) of each binarised split, from its index file."""
    from fairseq.data import data_utils

    counts = {}
    for split in splits:
        prefix = os.path.join(destdir, split)
        if not os.path.isfile(prefix + ".idx"):
            continue
        ds = data_utils.load_indexed_dataset(prefix, None, "mmap")
        counts[split] = {"lines": int(len(ds)), "tokens": int(ds.sizes.sum())}
    return counts


def format_counts(counts: Dict[str, dict]) -> str:
    rows = ["| split | lines | tokens |", "|---|---:|---:|"]
    for split, c in counts.items():
        rows.append(f"| {split} | {c['lines']:,} | {c['tokens']:,} |")
    return "\n".join(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--srcdict", required=True)
    p.add_argument("--text-dir", required=True, help="directory with {split}{suffix} files")
    p.add_argument("--suffix", default=".bpe")
    p.add_argument("--destdir", required=True)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    prefixes = {s: os.path.join(args.text_dir, s + args.suffix) for s in SPLIT_FLAGS
                if os.path.isfile(os.path.join(args.text_dir, s + args.suffix))}
    try:
        binarize(prefixes, args.srcdict, args.destdir, args.workers)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"fairseq_binarize.py: error: {e}", file=sys.stderr)
        return 2
    counts = token_counts(args.destdir)
    print(format_counts(counts))
    with open(os.path.join(args.destdir, "token_counts.json"), "w") as f:
        json.dump(counts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
