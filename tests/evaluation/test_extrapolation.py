"""The extrapolation evaluator on tiny trained checkpoints (hgrn_lm_tiny and a capped transformer_lm).

Expected values never come from the evaluator itself: token counts from the tokenizer's text
output, perplexities from a direct forward pass over the token stream.
"""
import csv
import json
import math
import os
import shutil
import sys

import pytest
import torch

from tests import fixtures_corpus
import hgrn_fairseq
from hgrn_fairseq.evaluation import extrapolation as ex
from tests import pyrun

pytestmark = pytest.mark.integration
hgrn_fairseq.register()  # (_direct_nll loads checkpoints through fairseq before the tool has registered)

TRAIN_LEN = 32
TRANSFORMER_ARGS = [
    "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
    "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2",
    "--max-target-positions", str(TRAIN_LEN),
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("extrap")
    data = fixtures_corpus.build_lm_data(str(root))
    hgrn = fixtures_corpus.train_checkpoint(data, str(root / "hgrn"), ["--arch", "hgrn_lm_tiny"], TRAIN_LEN)
    transformer = fixtures_corpus.train_checkpoint(data, str(root / "tf"), TRANSFORMER_ARGS, TRAIN_LEN)
    with open(root / "spm" / "test.bpe", encoding="utf-8") as f:
        test_tokens = sum(len(line.split()) + 1 for line in f)  # pieces + one </s> per line
    return {"root": root, "data": data, "hgrn": hgrn, "transformer": transformer, "test_tokens": test_tokens}


def _direct_nll(checkpoint, data, block):
    """Sum of NLL over the test stream scored in blocks of ``block`` tokens (None: one block),
    by a plain forward pass, without the evaluator's code."""
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    model = models[0].eval()
    ds = data_utils.load_indexed_dataset(os.path.join(data, "test"), task.dictionary, "mmap")
    stream = torch.cat([ds[i] for i in range(len(ds))]).long()
    source = torch.cat([stream.new_tensor([task.dictionary.eos()]), stream[:-1]])
    block = block or len(stream)
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(stream), block):
            logits = model.decoder(source[None, s : s + block])[0].double()
            lp = torch.log_softmax(logits, -1)[0]
            total -= lp.gather(-1, stream[s : s + block, None]).sum().item()
    return total, len(stream)


def test_hgrn_three_lengths_every_token_scored_and_matches_direct_forward(setup):
    results, info = ex.evaluate_extrapolation(setup["hgrn"], setup["data"], [16, 64, 200], mode="auto",
                                              progress=False, log=lambda *_: None)
    assert info["expected_tokens"] == setup["test_tokens"]
    assert [(r.mode, r.length) for r in results] == [
        (m, L) for L in (16, 64, 200) for m in ("stateless", "stateful")]
    for r in results:
        assert r.scored_tokens == setup["test_tokens"]
        assert r.blocks == math.ceil(setup["test_tokens"] / r.length)
    stateless = {r.length: r for r in results if r.mode == "stateless"}
    stateful = {r.length: r for r in results if r.mode == "stateful"}
    for L in (16, 64):
        nll, n = _direct_nll(setup["hgrn"], setup["data"], L)
        assert stateless[L].nll == pytest.approx(nll / n, rel=1e-5)
    # stateful mode: the state runs through the whole stream, whatever the block length
    full, n = _direct_nll(setup["hgrn"], setup["data"], None)
    for L in (16, 64, 200):
        assert stateful[L].nll == pytest.approx(full / n, rel=1e-4)
    # and stateless really restarts each block (differs from carrying the state)
    assert abs(stateless[16].nll - stateful[16].nll) > 1e-4


def test_transformer_lengths_beyond_max_positions_are_lifted(setup):
    results, info = ex.evaluate_extrapolation(setup["transformer"], setup["data"], [16, TRAIN_LEN, 100],
                                              progress=False, log=lambda *_: None)
    assert [r.mode for r in results] == ["stateless"] * 3  # no recurrent state to carry
    assert info["lifted_max_positions"] == 100
    assert all(r.scored_tokens == setup["test_tokens"] for r in results)
    nll, n = _direct_nll(setup["transformer"], setup["data"], 16)
    assert results[0].nll == pytest.approx(nll / n, rel=1e-5)


def test_token_count_check_fires_when_fairseq_skips_long_blocks(setup):
    # without the lift, fairseq drops every 100-token block of a model capped at 32 positions
    ok, _ = ex.evaluate_extrapolation(setup["transformer"], setup["data"], [16], lift_max_positions=False,
                                      progress=False, log=lambda *_: None)
    assert ok[0].scored_tokens == setup["test_tokens"]
    with pytest.raises(ex.TokenCountMismatch, match=r"L=100 \(stateless\): scored \d+ tokens but the test split has"):
        ex.evaluate_extrapolation(setup["transformer"], setup["data"], [16, 100], lift_max_positions=False,
                                  progress=False, log=lambda *_: None)


def test_stateful_needs_a_recurrent_model(setup):
    with pytest.raises(ex.ExtrapolationError, match="stateful"):
        ex.evaluate_extrapolation(setup["transformer"], setup["data"], [16], mode="stateful",
                                  progress=False, log=lambda *_: None)


def test_data_from_another_tokenizer_is_refused(setup, tmp_path):
    # same size, different symbol order: ids would silently mean other pieces
    swapped = str(tmp_path / "swapped")
    shutil.copytree(setup["data"], swapped)
    with open(os.path.join(swapped, "dict.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    with open(os.path.join(swapped, "dict.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(ex.ExtrapolationError, match=r"tokenizer mismatch: .*same size \(\d+ entries\), different "
                                                    r"symbols: first at id 4 \(dict.txt line 1\)"):
        ex.evaluate_extrapolation(setup["hgrn"], swapped, [16], progress=False, log=lambda *_: None)
    # a different vocabulary size
    other = fixtures_corpus.build_lm_data(str(tmp_path / "other"), vocab_size=90)
    with pytest.raises(ex.ExtrapolationError, match="tokenizer mismatch: the checkpoint's embedding has"):
        ex.evaluate_extrapolation(setup["hgrn"], other, [16], progress=False, log=lambda *_: None)


def test_missing_inputs(setup, tmp_path):
    with pytest.raises(ex.ExtrapolationError, match="not found"):
        ex.evaluate_extrapolation(str(tmp_path / "none.pt"), setup["data"], [16], log=lambda *_: None)
    no_test = str(tmp_path / "no_test")
    shutil.copytree(setup["data"], no_test)
    os.remove(os.path.join(no_test, "test.bin"))
    with pytest.raises(ex.ExtrapolationError, match="test.bin is missing"):
        ex.evaluate_extrapolation(setup["hgrn"], no_test, [16], log=lambda *_: None)


@pytest.mark.parametrize("spec", ["0", "-3", "16,0", "abc", "10:5:1", "1:10:0", ""])
def test_bad_lengths(spec):
    with pytest.raises(ex.ExtrapolationError):
        ex.parse_lengths(spec)


def test_length_specs():
    assert ex.parse_lengths("128,256, 128") == [128, 256]
    assert ex.parse_lengths("512:1280:256,2048") == [512, 768, 1024, 1280, 2048]
    assert list(ex.DEFAULT_LENGTHS) == [512 + 256 * i for i in range(55)]
    assert ex.DEFAULT_LENGTHS[-1] == 14336
    assert ex.parse_lengths(ex.build_parser().get_default("lengths")) == list(ex.DEFAULT_LENGTHS)


def test_cli_writes_csv_markdown_json_and_plot(setup, tmp_path, capsys):
    out = str(tmp_path / "report")
    assert ex.main([setup["hgrn"], setup["data"], "--lengths", "16,64", "--out-dir", out, "--no-progress"]) == 0
    with open(os.path.join(out, "extrapolation.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], int(r["length"])) for r in rows] == [
        ("stateless", 16), ("stateful", 16), ("stateless", 64), ("stateful", 64)]
    for r in rows:
        assert int(r["scored_tokens"]) == int(r["expected_tokens"]) == setup["test_tokens"]
        assert float(r["ppl"]) == pytest.approx(math.exp(float(r["nll"])))
    md = open(os.path.join(out, "extrapolation.md")).read()
    assert "| 16 |" in md and "| 64 |" in md and "**avg**" in md and "not the paper's protocol" in md
    assert "NOT comparable" in md  # the sentencepiece marker travels into the report
    report = json.load(open(os.path.join(out, "extrapolation.json")))
    assert len(report["results"]) == 4
    assert os.path.getsize(os.path.join(out, "extrapolation.png")) > 1000
    assert "| **avg** |" in capsys.readouterr().out


def test_cli_exit_code_on_token_count_failure(setup, tmp_path, capsys):
    code = ex.main([setup["transformer"], setup["data"], "--lengths", "100", "--no-lift-max-positions",
                    "--out-dir", str(tmp_path / "r"), "--no-progress"])
    assert code == 3
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("extrapolation:")]
    assert len(err) == 1 and "token count check failed" in err[0]


def test_plot_is_skipped_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    r = ex.ExtrapolationResult("stateless", 16, 3, 40, 40, 1.5, 0.1)
    messages = []
    paths = ex.write_reports([r], {"arch": "x", "split": "test"}, str(tmp_path), log=messages.append)
    assert "png" not in paths and not os.path.exists(tmp_path / "extrapolation.png")
    assert any("matplotlib is not installed" in m for m in messages)
    assert os.path.isfile(paths["csv"]) and os.path.isfile(paths["md"])


def test_shell_entry_point(setup, tmp_path):
    script = os.path.join(fixtures_corpus.REPO, "scripts", "eval_extrapolation.sh")
    proc = pyrun.run(["bash", script, setup["hgrn"], setup["data"], "--lengths", "48", "--mode", "stateless",
                      "--out-dir", str(tmp_path / "sh"), "--no-plot", "--no-progress"],
                     capture_output=True, text=True, env=fixtures_corpus.subprocess_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| 48 |" in proc.stdout
    bad = pyrun.run(["bash", script, setup["hgrn"], setup["data"], "--lengths", "0"],
                    capture_output=True, text=True, env=fixtures_corpus.subprocess_env())
    assert bad.returncode == 2 and "L=0 is invalid" in bad.stderr


def test_shell_entry_point_defaults_to_one_omp_thread_on_cpu(tmp_path):
    """On the CPU (--cpu, or no GPU) the evaluation runs with OMP_NUM_THREADS=1 unless it is set."""
    script = os.path.join(fixtures_corpus.REPO, "scripts", "eval_extrapolation.sh")
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\necho "OMP=${OMP_NUM_THREADS:-unset} $*"\n')
    fake_python.chmod(0o755)
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_text("")

    def omp(env, *args):
        full = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        full.update(PYTHON=str(fake_python), **env)
        proc = pyrun.run(["bash", script, str(checkpoint), *args], capture_output=True, text=True, env=full)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()[0]

    assert omp({"NUM_GPUS": "0"}) == "OMP=1"
    assert omp({"NUM_GPUS": "1"}, "--cpu") == "OMP=1"
    assert omp({"NUM_GPUS": "1"}) == "OMP=unset"
    assert omp({"NUM_GPUS": "0", "OMP_NUM_THREADS": "3"}) == "OMP=3"


def _one_error_line(argv, tmp_path):
    """Run the command; return its single stderr line (warnings off: the line is what the user reads)."""
    env = dict(fixtures_corpus.subprocess_env(), PYTHONWARNINGS="ignore")
    proc = pyrun.run([sys.executable, "-m", "hgrn_fairseq.evaluation.extrapolation", *argv, "--out-dir",
                      str(tmp_path / "out"), "--no-progress", "--no-plot", "--cpu"],
                     capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def test_a_length_longer_than_the_split_is_refused_naming_its_length(setup, tmp_path):
    n = setup["test_tokens"]  # counted from the tokenizer's text output
    line = _one_error_line([setup["hgrn"], setup["data"], "--lengths", f"16,{n + 1},{10 * n}"], tmp_path)
    assert f"L={n + 1} is longer than the test split" in line and f"holds {n:,} tokens" in line, line
    assert f"pass lengths <= {n}" in line and "(2 of the 3 lengths are longer)" in line, line
    assert not os.path.exists(tmp_path / "out" / "extrapolation.csv")  # no row was written, not even L=16


def _damaged_checkpoints(real, folder):
    """{kind: path} of checkpoints that must be refused naming the file."""
    import torch

    os.makedirs(folder, exist_ok=True)
    data = open(real, "rb").read()
    paths = {kind: os.path.join(folder, f"{kind}.pt") for kind in ("truncated", "random", "empty", "image")}
    open(paths["truncated"], "wb").write(data[: len(data) * 2 // 3])
    open(paths["random"], "wb").write(bytes(range(256)) * 40)
    open(paths["empty"], "wb").close()
    # a checkpoint of another kind: an image classifier's weights and epoch, no fairseq keys
    torch.save({"state_dict": {"head.weight": torch.zeros(10, 4)}, "epoch": 3, "arch": "resnet18"}, paths["image"])
    return paths


@pytest.mark.parametrize("kind, message", [
    ("truncated", "cannot be read .*truncated or damaged"),
    ("random", "cannot be read .*truncated or damaged"),
    ("empty", "is empty \\(0 bytes\\)"),
    ("image", "is not a fairseq checkpoint"),
])
def test_a_damaged_or_foreign_checkpoint_is_one_line_naming_the_file(setup, tmp_path, kind, message):
    import re

    path = _damaged_checkpoints(setup["hgrn"], str(tmp_path / "ckpts"))[kind]
    line = _one_error_line([path, setup["data"], "--lengths", "16"], tmp_path)
    assert path in line and re.search(message, line) and "pass a checkpoint_*.pt" in line, line
