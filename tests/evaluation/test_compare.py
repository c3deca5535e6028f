"""hgrn_fairseq.evaluation.compare: several models' extrapolation reports -> one table, CSV and plot."""
import csv
import math
import os

import pytest

from hgrn_fairseq.evaluation import compare as C
from hgrn_fairseq.evaluation.extrapolation import ExtrapolationResult, write_reports

TOKENS = 5000


def _report(tmp_path, name, arch, ppls, modes=("stateless",), tokens=TOKENS, scored=None):
    results = [
        ExtrapolationResult(mode=m, length=L, blocks=-(-tokens // L), scored_tokens=scored or tokens,
                            expected_tokens=tokens, nll=math.log(p), seconds=0.1)
        for m in modes for L, p in ppls.items()
    ]
    info = dict(arch=arch, parameters=1234, num_updates=10, trained_tokens_per_sample=512, split="test")
    out = os.path.join(tmp_path, name)
    write_reports(results, info, out, plot=False)
    return out


def test_table_csv_and_ratio(tmp_path):
    rnn = _report(tmp_path, "rnn", "hgrn_lm_tiny", {512: 20.0, 1024: 19.0, 2048: 18.0}, modes=("stateless", "stateful"))
    tf = _report(tmp_path, "tf", "transformer_lm", {512: 10.0, 1024: 40.0, 2048: 90.0})
    out = os.path.join(tmp_path, "cmp")
    paths = C.compare([f"rnn={rnn}", f"tf={tf}"], out, title="t", plot=True)
    md = open(paths["md"]).read()
    assert "| 1024 | 19.00 | 19.00 | 40.00 |" in md
    assert "rnn (stateful)" in md and "tf (stateless)" in md
    # 18/20 and 90/10: PPL at the longest L over PPL at the training length
    assert "| PPL(max L) / PPL(train L) | 0.90x | 0.90x | 9.00x |" in md
    assert f"all {TOKENS:,} test tokens" in md
    rows = list(csv.reader(open(paths["csv"])))
    assert rows[0] == ["length", "rnn:stateless", "rnn:stateful", "tf:stateless"]
    assert [float(x) for x in rows[3][1:]] == pytest.approx([18.0, 18.0, 90.0])
    assert os.path.getsize(paths["png"]) > 1000


def test_degradation_falls_back_to_shortest_length():
    assert C.degradation({1024: 10.0, 4096: 30.0}, trained=512) == pytest.approx(3.0)
    assert C.degradation({}, trained=512) is None


def test_runs_on_different_data_are_refused(tmp_path):
    a = _report(tmp_path, "a", "x", {512: 5.0})
    b = _report(tmp_path, "b", "y", {512: 5.0}, tokens=TOKENS + 1)
    with pytest.raises(C.CompareError, match="different data"):
        C.compare([f"a={a}", f"b={b}"], os.path.join(tmp_path, "o"), plot=False)


def test_incomplete_scoring_and_bad_arguments(tmp_path):
    short = _report(tmp_path, "s", "x", {512: 5.0}, scored=TOKENS - 7)
    with pytest.raises(C.CompareError, match="tokens scored of"):
        C.compare([f"s={short}"], os.path.join(tmp_path, "o"), plot=False)
    with pytest.raises(C.CompareError, match="not found"):
        C.compare([f"m={tmp_path}/missing"], os.path.join(tmp_path, "o"), plot=False)
    with pytest.raises(C.CompareError, match="LABEL=DIR"):
        C.parse_run("=dir")
    ok = _report(tmp_path, "ok", "x", {512: 5.0})
    with pytest.raises(C.CompareError, match="not unique"):
        C.compare([f"m={ok}", f"m={ok}"], os.path.join(tmp_path, "o"), plot=False)
    assert C.main([f"m={tmp_path}/missing", "--out-dir", str(tmp_path / "o")]) == 2
