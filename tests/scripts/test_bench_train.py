"""bench/bench_train.py on CPU: it imports, its smoke path measures tiny models end to end, an
unavailable peer is reported instead of crashing, and the time budget is kept. (The numbers come from
the GPU run; see docs/wikitext103.md and bench/results/train_lm/.)"""
import importlib.util
import json
import os
import re
import shlex
import sys

import pytest
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("bench.bench_train")


def test_full_run_plan(bench):
    assert bench.SHAPES == ((16, 512), (4, 2048), (1, 8192)) and bench.VOCAB == 50264 and bench.EVAL_L == 14336
    assert set(bench.MODELS) == {"hgrn_lm_base", "hgrn2_lm_base", "transformer_lm", "fla_hgrn", "fla_hgrn2"}
    assert bench.LOSSES == ("fairseq", "fused")
    # every fairseq model once per loss, fla once, transformer_lm always with fairseq's loss (the speed targets' peer)
    assert bench.plan_jobs(["hgrn_lm_base", "transformer_lm", "fla_hgrn"], ["fused"]) == [
        ("hgrn_lm_base", "fused"), ("transformer_lm", "fairseq"), ("transformer_lm", "fused"), ("fla_hgrn", "fairseq")]
    assert bench.plan_jobs(["hgrn2_lm_base"], ["fairseq", "fused"]) == [
        ("hgrn2_lm_base", "fairseq"), ("hgrn2_lm_base", "fused")]
    assert bench.label("hgrn_lm_base", "fused") == "hgrn_lm_base (fused CE)"
    assert bench.label("fla_hgrn", "fused") == "fla_hgrn" and bench.label("transformer_lm", "fairseq") == "transformer_lm"
    with pytest.raises(SystemExit):
        bench.main(["--out", "/unused", "--loss", "fairseq,chunked"])
    flags = bench.fairseq_model_flags("hgrn2_lm_base+compile", tiny=False, kernel_backend="auto")
    assert flags[:2] == ["--arch", "hgrn2_lm_base"] and "--compile-blocks" in flags
    assert "--compile-blocks" not in bench.fairseq_model_flags("hgrn2_lm_base", tiny=False, kernel_backend="auto")
    flags = bench.fairseq_model_flags("hgrn_lm_base+graphs", tiny=True, kernel_backend="auto")
    assert flags[:2] == ["--arch", "hgrn_lm_tiny"] and "--cuda-graphs" in flags and "--compile-blocks" not in flags


def test_compiled_variant_runs_and_gets_target_rows(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("HGRN_COMPILE_BACKEND", "aot_eager")  # no C compiler needed on CPU
    out = tmp_path / "out"
    rc = bench.main(["--out", str(out), "--quick", "--device", "cpu", "--isolation", "none",
                     "--models", "hgrn_lm_base+compile,transformer_lm", "--shapes", "2x16"])
    assert rc == 0
    summary = json.loads((out / "bench_train.json").read_text())
    train = [r for r in summary["records"] if r["kind"] == "train" and r["model"] == "hgrn_lm_base+compile"]
    assert len(train) == 1 and train[0]["tokens_per_s"] > 0
    rows = [r for r in summary["ratios"] if r["model"] == "hgrn_lm_base+compile" and r["peer"] == "transformer_lm"]
    assert rows and all(r["target"] in (1.5, 2.0) for r in rows)
    assert not any(r["kind"] == "memory_vs_t" for r in summary["records"] if r["model"] == "hgrn_lm_base+compile")


def test_transformer_is_the_recipe_model(bench):
    """The benchmarked Transformer has the model flags of train_wt103.sh's transformer recipe."""
    script = open(os.path.join(REPO, "scripts", "train_wt103.sh")).read()
    block = re.search(r"transformer_lm_wt103_small\)\n\s*RECIPE_ARGS=\((.*?)\)\n", script, re.S)
    recipe = shlex.split(block.group(1).replace("\\\n", " "))
    flags = bench.fairseq_model_flags("transformer_lm", tiny=False, kernel_backend="auto")
    model_flags = [f for f in flags if f.startswith("--decoder") or f.startswith("--share") or f == "--arch"]
    assert len(model_flags) == 7
    for flag in model_flags:
        assert flag in recipe, flag
        value = flags[flags.index(flag) + 1] if flags.index(flag) + 1 < len(flags) else "--"
        if not value.startswith("--"):
            assert recipe[recipe.index(flag) + 1] == value, flag


def test_cpu_smoke_run(bench, tmp_path):
    out = tmp_path / "out"
    rc = bench.main(["--out", str(out), "--quick", "--device", "cpu", "--isolation", "none",
                     "--models", "hgrn_lm_base,transformer_lm,fla_hgrn", "--loss", "fairseq,fused"])
    assert rc == 0
    summary = json.loads((out / "bench_train.json").read_text())
    markdown = (out / "bench_train.md").read_text()
    env = summary["environment"]
    assert env["torch"] and env["date_utc"] and env["device"] == "cpu"
    train = {(r["model"], r["batch"], r["seq"]): r for r in summary["records"] if r["kind"] == "train"}
    for model in ("hgrn_lm_base", "transformer_lm"):
        for batch, seq in bench.QUICK["cpu"]["shapes"]:
            record = train[(model, batch, seq)]
            assert "error" not in record, record
            assert record["tokens_per_s"] > 0 and record["ms"] > 0
        assert summary["params"][model] > 0
        evals = [r for r in summary["records"] if r["kind"] == "eval" and r["model"] == model]
        assert {r["precision"] for r in evals} == {"fp32", "bf16"} and all(r["fits"] for r in evals)
        assert all(abs(r["mean_nll"]) < 50 for r in evals)  # a real log-likelihood, not garbage
    # fla and transformers are not installed here: the peer is reported, not a crash
    if importlib.util.find_spec("fla") is None:
        assert "fla" in summary["unavailable"]["fla_hgrn"]
        assert "fla_hgrn (unavailable: ModuleNotFoundError" in markdown
    assert "| hgrn_lm_base | 173,312 |" in markdown  # tiny arch on CPU
    assert "## Speed targets" in markdown and "## Evaluation at L = 48" in markdown

    # --loss fused: the same models trained with the linear_cross_entropy criterion, in rows of their own
    criterion = {r["model"]: r["criterion"] for r in summary["records"] if r["kind"] == "model" and "criterion" in r}
    assert criterion == {"hgrn_lm_base": "CrossEntropyCriterion", "transformer_lm": "CrossEntropyCriterion",
                         "hgrn_lm_base (fused CE)": "LinearCrossEntropyCriterion",
                         "transformer_lm (fused CE)": "LinearCrossEntropyCriterion"}
    for model in ("hgrn_lm_base (fused CE)", "transformer_lm (fused CE)"):
        assert summary["status"][model] == "ok"
        for batch, seq in bench.QUICK["cpu"]["shapes"]:
            assert train[(model, batch, seq)]["tokens_per_s"] > 0
    assert "| hgrn_lm_base (fused CE) | 173,312 |" in markdown
    # the speed targets keep fairseq's transformer_lm as the peer; the same-loss ratio is extra
    pairs = {(r["model"], r["peer"]): r["target"] for r in summary["ratios"] if r["batch"] == 16}
    assert pairs[("hgrn_lm_base", "transformer_lm")] == 1.5
    assert pairs[("hgrn_lm_base (fused CE)", "transformer_lm")] == 1.5
    assert pairs[("hgrn_lm_base (fused CE)", "transformer_lm (fused CE)")] is None
    assert "| hgrn_lm_base (fused CE) / transformer_lm (fused CE) | 16x512 |" in markdown


@pytest.mark.integration
def test_workers_run_in_subprocesses_and_budget_is_kept(tmp_path):
    out = tmp_path / "out"
    proc = pyrun.run([sys.executable, "-m", "bench.bench_train", "--out", str(out), "--quick", "--device", "cpu",
                      "--models", "fla_hgrn2"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "bench_train.json").read_text())
    assert summary["status"]["fla_hgrn2"] == "ok"  # the worker ran and reported
    assert any(r["kind"] == "env" for r in summary["records"])
    if importlib.util.find_spec("fla") is None:
        assert summary["unavailable"]["fla_hgrn2"]

    # the worker subprocess gets --loss: a fused-loss row, then the budget
    proc = pyrun.run([sys.executable, "-m", "bench.bench_train", "--out", str(out), "--quick", "--device", "cpu",
                      "--models", "hgrn_lm_base", "--loss", "fused", "--shapes", "1x8"],
                     capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "bench_train.json").read_text())
    assert summary["status"] == {"hgrn_lm_base (fused CE)": "ok"}
    model = next(r for r in summary["records"] if r["kind"] == "model")
    assert model["criterion"] == "LinearCrossEntropyCriterion" and model["loss"] == "fused"
    assert any(r["kind"] == "train" and r.get("tokens_per_s") for r in summary["records"])

    proc = pyrun.run([sys.executable, "-m", "bench.bench_train", "--out", str(out), "--quick", "--device", "cpu",
                      "--models", "hgrn_lm_base,transformer_lm", "--budget-s", "5", "--loss", "fairseq,fused"],
                     capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "bench_train.json").read_text())
    assert all(s.startswith("skipped: the run's time budget") for s in summary["status"].values())
    assert set(summary["status"]) == {"hgrn_lm_base", "hgrn_lm_base (fused CE)", "transformer_lm",
                                      "transformer_lm (fused CE)"}


@pytest.mark.integration
def test_profile_train_cpu_smoke(tmp_path):
    """bench/profile_train.py (which builds its models and batches through bench_train's helpers) runs
    a tiny model on CPU end to end and reports a row for it."""
    out = tmp_path / "profile"
    proc = pyrun.run([sys.executable, "-m", "bench.profile_train", "--out", str(out),
                      "--device", "cpu", "--models", "hgrn_lm_base", "--shapes", "2x16"],
                     capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "profile_train.json").read_text())
    assert summary["status"] == {"hgrn_lm_base": "ok"}, summary["status"]
    assert [(r["model"], r["batch"], r["seq"]) for r in summary["rows"]] == [("hgrn_lm_base", 2, 16)]


def test_block_ops_variant_switches_them_on_only_there(bench):
    """hgrn_lm_base+block_ops builds the same model with modules.block.use_block_ops applied; the plain
    name keeps PyTorch's operations (the LMs' default)."""
    import torch

    plain, *_ = bench.build_fairseq("hgrn_lm_base", True, "auto", 100, "cpu", torch)
    fused, *_ = bench.build_fairseq("hgrn_lm_base+block_ops", True, "auto", 100, "cpu", torch)
    flags = lambda m: {x.block_ops for x in m.modules() if hasattr(x, "block_ops")}  # noqa: E731
    assert flags(plain) == {False} and flags(fused) == {True}
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in fused.parameters())
    assert "hgrn2_lm_base+block_ops" in bench.VARIANTS
