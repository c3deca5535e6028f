"""The offline ListOps generator (data_prep/lra_listops.py) against an independent parser/evaluator."""
import csv
import os
import random
import statistics
import sys

import pytest

from data_prep import lra_listops as lo
from tests import pyrun

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "data_prep", "lra_listops.py")


def parse(source):
    """Parse LRA's ListOps text independently: (value, leaf depth, [(op, n_args)], token count).

    A stack of open operators; ``(`` and ``)`` are layout only, ``]`` closes the innermost operator.
    """
    stack = []  # [op, args]
    result = None
    ops = []
    max_depth = 0
    tokens = 0
    for tok in source.split():
        if tok in ("(", ")"):
            continue
        tokens += 1
        if tok.startswith("["):
            stack.append([tok[1:], []])
        elif tok == "]":
            op, args = stack.pop()
            ops.append((op, len(args)))
            if op == "MIN":
                v = min(args)
            elif op == "MAX":
                v = max(args)
            elif op == "MED":
                v = int(statistics.median(args))
            elif op == "SM":
                v = sum(args) % 10
            else:
                raise AssertionError(f"unknown operator {op}")
            if stack:
                stack[-1][1].append(v)
            else:
                result = v
        else:
            assert tok.isdigit() and len(tok) == 1, tok
            max_depth = max(max_depth, len(stack) + 1)
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
    assert not stack
    return result, max_depth, ops, tokens


def lra_text(source):
    """Re-write a parsed expression in LRA's parenthesisation (the to_string of its listops.py)."""
    toks = [t for t in source.split() if t not in ("(", ")")]
    pos = 0

    def node():
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if not tok.startswith("["):
            return tok
        t = None
        first = True
        while toks[pos] != "]":
            child = node()
            t = f"( {tok} {child} )" if first else f"( {t} {child} )"
            first = False
        pos += 1
        return f"( {t} ] )"

    out = node()
    assert pos == len(toks)
    return out


def read_tsv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    return rows[0], rows[1:]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    dest = str(tmp_path_factory.mktemp("listops"))
    lo.generate(dest, train=300, valid=40, test=40, seed=3, workers=1, progress=False, log=lambda m: None)
    return os.path.join(dest, "listops-1000")


def test_layout_and_counts(generated):
    for name, n in (("basic_train.tsv", 300), ("basic_val.tsv", 40), ("basic_test.tsv", 40)):
        header, rows = read_tsv(os.path.join(generated, name))
        assert header == ["Source", "Target"]
        assert len(rows) == n
        assert all(len(r) == 2 for r in rows)


def test_every_example_is_a_valid_expression_with_its_value(generated):
    seen = set()
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        _, rows = read_tsv(os.path.join(generated, name))
        for source, target in rows:
            value, depth, ops, tokens = parse(source)
            assert int(target) == value
            assert 500 < tokens < 2000
            assert depth <= 10
            assert ops and all(op in ("MIN", "MAX", "MED", "SM") for op, _ in ops)
            assert all(2 <= n <= 10 for _, n in ops)
            assert lra_text(source) == source  # LRA's exact parenthesisation
            assert source not in seen  # no duplicates, across splits too
            seen.add(source)


def test_labels_spread_over_the_ten_classes(generated):
    _, rows = read_tsv(os.path.join(generated, "basic_train.tsv"))
    counts = [0] * 10
    for _, t in rows:
        counts[int(t)] += 1
    assert all(c > 0 for c in counts), counts
    assert max(counts) < 0.4 * len(rows), counts


def test_node_distribution():
    rng = random.Random(11)
    # unconstrained lengths: the root is a digit with probability 0.75
    n = 4000
    digits = sum(1 for _ in range(n) if lo.sample(rng, min_length=0, max_length=10 ** 7)[2] == 1)
    assert abs(digits / n - 0.75) < 0.03
    # at maximum depth 2 every operator's arguments are digits
    for _ in range(200):
        text, value, length = lo.sample(rng, max_depth=2, min_length=1, max_length=10 ** 6)
        v, depth, ops, tokens = parse(text)
        assert depth == 2 and len(ops) == 1 and v == value and tokens == length


def test_same_seed_same_files_any_workers(generated, tmp_path):
    lo.generate(str(tmp_path), train=300, valid=40, test=40, seed=3, workers=2, progress=False,
                log=lambda m: None)
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        with open(os.path.join(generated, name)) as a, open(tmp_path / "listops-1000" / name) as b:
            assert a.read() == b.read()
    other = tmp_path / "other"
    lo.generate(str(other), train=20, valid=2, test=2, seed=4, workers=1, progress=False, log=lambda m: None)
    with open(os.path.join(generated, "basic_train.tsv")) as a, open(other / "listops-1000" / "basic_train.tsv") as b:
        assert a.read().splitlines()[1:21] != b.read().splitlines()[1:21]


@pytest.mark.integration
def test_cli_rerun_is_up_to_date_and_bad_options_are_one_line(tmp_path):
    cmd = [sys.executable, SCRIPT, "--dest", str(tmp_path), "--train", "5", "--valid", "2", "--test", "2",
           "--workers", "1", "--no-progress"]
    first = pyrun.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    again = pyrun.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0 and "up to date" in again.stdout
    bad = pyrun.run(cmd + ["--max-args", "1"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "--max-args 1" in bad.stderr
