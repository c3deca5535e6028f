#!/usr/bin/env python3
"""Offline ListOps generator with the Long Range Arena distribution.

A tree node is a digit 0-9 with probability 0.75 (always a digit at depth ``--max-depth``, the root
being depth 1), otherwise an operator -- MIN, MAX, MED (integer part of the median), SM (sum mod 10)
-- over 2..``--max-args`` children. The text form wraps each (operator, argument) pair in
parentheses and closes the operator with ``]``::

    [MAX 2 9 [MIN 4 7 ] 0 ]   is written   ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )

The length of an example counts operators, digits and closing brackets (the tokens a model reads
once ``(`` and ``)`` are dropped); examples with ``--min-length < length < --max-length`` are
kept, duplicates dropped (counted), and the first 96k/2k/2k distinct examples become
``basic_train.tsv`` / ``basic_val.tsv`` / ``basic_test.tsv`` with the header ``Source\\tTarget``,
the layout of ``lra_release/listops-1000``.

Work is split into fixed chunks of ``CHUNK`` accepted examples, chunk ``c`` drawing from
``random.Random(seed * 1_000_003 + c)``, so the output depends on ``--seed`` only (not on
``--workers``). Trees larger than the maximum are abandoned as soon as they pass it: that only
drops examples that would be rejected, so the kept ones have exactly the distribution above.

Lengths no tree reaches at ``--max-depth`` / ``--max-args``, or fewer distinct trees than examples
asked, are refused before any work; otherwise a draw budget per example and a duplicate budget end
a search for trees that are reachable but too rare, with one line naming the options.

    python data_prep/lra_listops.py --dest data/lra_generated --workers 16

writes ``data/lra_generated/listops-1000/`` (``GENERATOR.json`` records the options, counts and
label histogram; re-running with the same options prints "up to date").
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import sys
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25  # probability that a node above the maximum depth is an operator
CHUNK = 500  # accepted examples per work unit
FOLDER = "listops-1000"
SPLIT_FILES = (("train", "basic_train.tsv"), ("valid", "basic_val.tsv"), ("test", "basic_test.tsv"))
STAMP = "GENERATOR.json"
FORMAT = "hgrn-listops-generator/1"


MAX_DRAWS = 100_000  # trees drawn for one example before giving up (the defaults need about 10)
COUNT_CAP = 4096  # lengths up to which generate() counts the distinct trees exactly before any work


class _TooLong(Exception):
    pass


class SamplingError(ValueError):
    """Sampling ran out of its draw budget: the requested lengths are reachable but too rare."""


def longest_tree(max_depth: int, max_args: int) -> int:
    """Length of the largest tree: every node above ``max_depth`` an operator with ``max_args`` children."""
    n = 1
    for _ in range(max_depth - 1):
        n = 2 + max_args * n
    return n


def tree_counts(max_depth: int, max_args: int, limit: int):
    """float64 [limit]: number of distinct tree texts of each length below ``limit`` (capped at 1e15,
    exact below it), by dynamic programming over the depth, as ``_node`` builds them."""
    import numpy as np

    cap = 1e15
    counts = np.zeros(limit)
    counts[1] = 10.0  # a digit
    for _ in range(max_depth - 1):
        children = np.zeros(limit)  # lengths of k >= 2 children together
        acc = counts
        for _ in range(2, max_args + 1):
            acc = np.minimum(np.convolve(acc, counts)[:limit], cap)
            children += acc
        new = np.zeros(limit)
        new[1] = 10.0
        new[3:] = 4.0 * children[1:limit - 2]  # the operator and its closing bracket: +2
        new = np.minimum(new, cap)
        if np.array_equal(new, counts):
            break
        counts = new
    return counts


def check_reachable(total: int, max_depth: int, max_args: int, min_length: int, max_length: int) -> None:
    """Refuse, before any sampling, lengths no tree can have or fewer distinct trees than examples asked."""
    what = f"at --max-depth {max_depth} --max-args {max_args}"
    longest = longest_tree(max_depth, max_args)
    if longest <= min_length:
        raise ValueError(f"--min-length {min_length}: the longest ListOps tree {what} has length {longest}; "
                         f"lower --min-length below {longest} or raise --max-depth / --max-args")
    limit = min(max_length, longest + 1, COUNT_CAP)
    exact = min(max_length, longest + 1) <= COUNT_CAP  # every length of the window counted
    if min_length + 1 >= limit:
        return  # the window starts beyond the exact count: the draw budget of sample() is the guard
    counts = tree_counts(max_depth, max_args, limit)
    in_window = float(counts[min_length + 1:limit].sum())
    if in_window == 0 and exact:
        reach = [i for i in range(limit) if counts[i] > 0]
        below = max(i for i in reach if i <= min_length)
        wider = tree_counts(max_depth, max_args, min(longest + 1, COUNT_CAP))
        above = next((str(i) for i in range(max_length, len(wider)) if wider[i] > 0), "none")
        raise ValueError(f"--min-length {min_length} --max-length {max_length}: no ListOps tree {what} has a "
                         f"length strictly between them (nearest reachable lengths: {below} and {above}); "
                         f"widen the range")
    if in_window < total and exact:
        raise ValueError(f"--train/--valid/--test {total} examples: only {int(in_window)} distinct ListOps trees "
                         f"{what} have {min_length} < length < {max_length}; ask for fewer or widen the range")


def _apply(op: str, args: List[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    s = sorted(args)  # [MED: integer part of the median (values are >= 0, so floor)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def _node(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: List[int],
          out: List[str]) -> int:
    """Append the text of one random subtree to ``out``; return its value.

    ``budget[0]`` counts down the length still allowed; passing zero aborts the tree.
    """
    if depth >= max_depth or rng.random() > VALUE_P:
        budget[0] -= 1
        if budget[0] <= 0:
            raise _TooLong
        v = rng.randrange(10)
        out.append(str(v))
        return v
    budget[0] -= 2  # the operator and its closing bracket
    if budget[0] <= 0:
        raise _TooLong
    op = OPERATORS[rng.randrange(4)]
    k = rng.randint(2, max_args)
    out.append("( " * (k + 1) + op + " ")
    values = []
    for i in range(k):
        values.append(_node(rng, depth + 1, max_depth, max_args, budget, out))
        out.append(" ) " if i < k - 1 else " )")
    out.append(" ] )")
    return _apply(op, values)


def sample(rng: random.Random, max_depth: int = 10, max_args: int = 10, min_length: int = 500,
           max_length: int = 2000) -> Tuple[str, int, int]:
    """Draw trees until one has ``min_length < length < max_length``: (text, value, length).

    Raises SamplingError after ``MAX_DRAWS`` draws without one (lengths reachable but too rare)."""
    for _ in range(MAX_DRAWS):
        out: List[str] = []
        budget = [max_length]
        try:
            value = _node(rng, 1, max_depth, max_args, budget, out)
        except _TooLong:
            continue
        length = max_length - budget[0]
        if length > min_length:
            return "".join(out), value, length
    raise SamplingError(f"no ListOps tree with {min_length} < length < {max_length} in {MAX_DRAWS} draws at "
                        f"--max-depth {max_depth} --max-args {max_args} (reachable up to "
                        f"{longest_tree(max_depth, max_args)}, but too rare); widen --min-length/--max-length "
                        f"or raise --max-depth / --max-args")


def _chunk(job: Tuple[int, int, int, int, int, int, int]) -> List[Tuple[str, int, int]]:
    seed, index, count, max_depth, max_args, min_length, max_length = job
    rng = random.Random(seed * 1_000_003 + index)
    return [sample(rng, max_depth, max_args, min_length, max_length) for _ in range(count)]


def _jobs(seed: int, start: int, opts: dict) -> Iterator[Tuple[int, ...]]:
    index = start
    while True:
        yield (seed, index, CHUNK, opts["max_depth"], opts["max_args"], opts["min_length"],
               opts["max_length"])
        index += 1


def generate(dest: str, train: int = 96000, valid: int = 2000, test: int = 2000, seed: int = 0,
             workers: int = 1, max_depth: int = 10, max_args: int = 10, min_length: int = 500,
             max_length: int = 2000, log=print, progress: bool = True) -> dict:
    """Write ``dest/listops-1000/basic_{train,val,test}.tsv``; return the stamp (counts etc.)."""
    for name, v, lo in (("train", train, 1), ("valid", valid, 0), ("test", test, 0),
                        ("max_depth", max_depth, 1), ("max_args", max_args, 2),
                        ("min_length", min_length, 0)):
        if v < lo:
            raise ValueError(f"--{name.replace('_', '-')} {v}: expected an integer >= {lo}")
    if max_length <= min_length + 2:
        raise ValueError(f"--max-length {max_length} must exceed --min-length {min_length} by more than 2")
    check_reachable(train + valid + test, max_depth, max_args, min_length, max_length)
    opts = {"train": train, "valid": valid, "test": test, "seed": seed, "max_depth": max_depth,
            "max_args": max_args, "min_length": min_length, "max_length": max_length}
    folder = os.path.join(dest, FOLDER)
    stamp_path = os.path.join(folder, STAMP)
    paths = {split: os.path.join(folder, name) for split, name in SPLIT_FILES}
    if os.path.isfile(stamp_path) and all(os.path.isfile(p) for p in paths.values()):
        with open(stamp_path) as f:
            stamp = json.load(f)
        if stamp.get("options") == opts:
            log(f"[listops] {folder}: up to date (same options; delete {STAMP} to regenerate)")
            return stamp
    os.makedirs(folder, exist_ok=True)
    targets = {"train": train, "valid": valid, "test": test}
    total = train + valid + test
    t0 = time.time()
    seen = set()
    duplicates = 0
    max_duplicates = 20 * total + 10_000  # a full draw of every distinct tree needs ~ln(total) per example
    labels = {split: [0] * 10 for split in targets}
    lengths = {split: [max_length, 0, 0] for split in targets}  # min, max, sum
    order = [s for s, _ in SPLIT_FILES]
    files = {s: open(paths[s] + ".tmp", "w", encoding="utf-8", newline="\n") for s in order}
    for f in files.values():
        f.write("Source\tTarget\n")
    written = {s: 0 for s in order}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="listops", unit="ex", file=sys.stderr)
    pool = multiprocessing.Pool(workers) if workers > 1 else None
    try:
        chunks = pool.imap(_chunk, _jobs(seed, 0, opts)) if pool else map(_chunk, _jobs(seed, 0, opts))
        done = 0
        for chunk in chunks:
            for text, value, n in chunk:
                if done == total:
                    break
                key = hashlib.blake2b(text.encode(), digest_size=16).digest()
                if key in seen:
                    duplicates += 1
                    if duplicates > max_duplicates:
                        raise SamplingError(
                            f"{duplicates} duplicate ListOps trees after {done} distinct of {total} at "
                            f"--max-depth {max_depth} --max-args {max_args} --min-length {min_length} "
                            f"--max-length {max_length}: too few distinct trees; ask for fewer or widen the range")
                    continue
                seen.add(key)
                split = next(s for s in order if written[s] < targets[s])
                files[split].write(f"{text}\t{value}\n")
                written[split] += 1
                labels[split][value] += 1
                lo, hi, tot = lengths[split]
                lengths[split] = [min(lo, n), max(hi, n), tot + n]
                done += 1
                if bar is not None:
                    bar.update(1)
            if done == total:
                break
    except BaseException:
        for f in files.values():
            f.close()
            os.remove(f.name)  # no half-written split left beside the finished ones
        raise
    finally:
        if pool is not None:
            pool.terminate()
        if bar is not None:
            bar.close()
        for f in files.values():
            f.close()
    for s in order:
        os.replace(paths[s] + ".tmp", paths[s])
    stamp = {
        "format": FORMAT,
        "options": opts,
        "counts": written,
        "duplicates_dropped": duplicates,
        "labels": labels,
        "length": {s: {"min": v[0], "max": v[1], "mean": round(v[2] / max(1, written[s]), 1)}
                   for s, v in lengths.items()},
        "seconds": round(time.time() - t0, 1),
        "workers": workers,
    }
    with open(stamp_path + ".tmp", "w") as f:
        json.dump(stamp, f, indent=1)
    os.replace(stamp_path + ".tmp", stamp_path)
    log(f"[listops] {folder}: train {written['train']}, val {written['valid']}, test {written['test']} "
        f"({duplicates} duplicates dropped, {stamp['seconds']} s on {workers} workers)")
    log(f"[listops] train labels 0-9: {labels['train']}")
    return stamp


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", required=True, help="output folder; listops-1000/ is created inside")
    p.add_argument("--train", type=int, default=96000)
    p.add_argument("--valid", type=int, default=2000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--max-depth", type=int, default=10)
    p.add_argument("--max-args", type=int, default=10)
    p.add_argument("--min-length", type=int, default=500)
    p.add_argument("--max-length", type=int, default=2000)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    try:
        generate(a.dest, a.train, a.valid, a.test, a.seed, max(1, a.workers), a.max_depth,
                 a.max_args, a.min_length, a.max_length, progress=not a.no_progress)
    except ValueError as e:
        print(f"lra_listops.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
