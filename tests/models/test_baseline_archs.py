"""The baselines' archs of hgrn_lm: parameter counts by hand, incremental decoding equals the
full forward, bad switches, and fairseq-train end to end on a tiny corpus for each mixer."""
import importlib
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from fairseq import options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import build_model
from tests.lm_corpus import write_corpus
from tests import pyrun

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))
V, d, L = 50264, 512, 6


def dictionary(size):
    dct = Dictionary()
    for i in range(size - len(dct)):
        dct.add_symbol(f"w{i}")
    return dct


def build(arch, size=V, *flags):
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["/x", "--task", "language_modeling", "--arch", arch, *flags])
    task = argparse.Namespace(source_dictionary=dictionary(size), target_dictionary=dictionary(size))
    return build_model(convert_namespace_to_omegaconf(args).model, task)


def count(model):
    return sum(p.numel() for p in model.parameters())


# per layer outside the mixer: two LayerNorms and the bilinear GLU 512 -> 2 x 1024 -> 512 with biases
REST = 2 * 2 * d + (d * 2048 + 2048) + (1024 * d + d)
EMBED_AND_FINAL_NORM = V * d + 2 * d


def test_lru_lm_base_has_the_papers_46_24m():
    N = 897
    lru = (d * 2 * N) + (2 * N * d) + d + 3 * N  # B, C (no biases), D, nu/theta/gamma
    expected = EMBED_AND_FINAL_NORM + L * (lru + REST)  # no lower bound
    assert count(build("lru_lm_base")) == expected == 46_242_578
    assert count(build("lru_mml_lm_base")) == expected + L * d  # BitLinear's RMSNorm weight on B's input


def test_mlgru_lm_base_count():
    mlgru = 4 * (d * d + d)
    expected = EMBED_AND_FINAL_NORM + L * (mlgru + REST) + L * d  # + the lower bounds' Gamma
    assert count(build("mlgru_lm_base")) == expected == 41_507_840
    assert count(build("mlgru_mml_lm_base")) == expected + L * 2 * d  # RMSNorm weights of W_f, W_c


@pytest.mark.parametrize("arch, flags", [("lru_lm_tiny", []), ("mlgru_lm_tiny", []), ("lru_lm_tiny", ["--fully-mml"]),
                                         ("mlgru_lm_tiny", ["--fully-mml"])])
def test_incremental_decoding_equals_the_full_forward(arch, flags):
    torch.manual_seed(0)
    model = build(arch, 200, "--kernel-backend", "reference", *flags).eval()
    tokens = torch.randint(4, 200, (2, 11))
    with torch.no_grad():
        full = model(tokens)[0]
        state = {}
        steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_bad_switches_are_one_line_errors():
    with pytest.raises(ValueError, match="--ternary / --fully-mml are for --token-mixer lru or mlgru, not hgru"):
        build("hgrn_lm_tiny", 100, "--ternary")
    with pytest.raises(ValueError, match="--token-mixer lru has no forget gate to bound: add --no-lower-bound"):
        build("hgrn_lm_tiny", 100, "--token-mixer", "lru")
    with pytest.raises(ValueError, match="need 0 <= r_min < r_max <= 1"):
        build("lru_lm_tiny", 100, "--lru-r-min", "0.9", "--lru-r-max", "0.5")


def test_lru_optimiser_groups_reach_fairseqs_optimizer():
    from fairseq import optim

    model = build("lru_lm_tiny", 100, "--lru-slow-lr-scale", "0.5")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "/x", "--task", "language_modeling", "--arch", "lru_lm_tiny", "--optimizer", "adam", "--lr", "0.001",
        "--weight-decay", "0.1"])
    optimizer = optim.build_optimizer(convert_namespace_to_omegaconf(args).optimizer, list(model.parameters()))
    optimizer.set_lr(0.002)  # what the lr scheduler does every update
    base, slow = optimizer.param_groups
    slow_names = {n for n, _ in model.named_parameters()
                  if n.split(".")[-1] in ("nu_log", "theta_log", "gamma_log") or n.endswith("mixer.in_proj.weight")}
    assert len(slow_names) == 2 * 4
    by_id = {id(p): n for n, p in model.named_parameters()}
    assert {by_id[id(p)] for p in slow["params"]} == slow_names
    assert {by_id[id(p)] for p in base["params"]} == set(by_id.values()) - slow_names
    assert (base["lr"], base["weight_decay"]) == (0.002, 0.1)
    assert (slow["lr"], slow["weight_decay"]) == (0.001, 0.0)
    assert optimizer.get_lr() == 0.002
    # without the option: one group, as before
    plain = optim.build_optimizer(convert_namespace_to_omegaconf(args).optimizer, list(build("lru_lm_tiny", 100).parameters()))
    assert len(plain.param_groups) == 1
    with pytest.raises(ValueError, match="--lru-slow-lr-scale=0.5 is for --token-mixer lru"):
        build("mlgru_lm_tiny", 100, "--lru-slow-lr-scale", "0.5")


# fairseq-preprocess and every fairseq-train run below share one Python process: importing fairseq and
# torch costs several times more CPU than a 30-update run of a tiny model.
DRIVER = r"""
import json, sys, traceback
from fairseq_cli import train  # first: its logging format (preprocess imports fairseq before setting one)
from fairseq_cli import preprocess
for name, tool, argv in json.loads(sys.argv[1]):
    print(f"=== begin {name}", flush=True)
    sys.argv = ["fairseq-" + tool, *argv]
    try:
        (preprocess if tool == "preprocess" else train).cli_main()
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception:
        traceback.print_exc(file=sys.stdout)
        rc = 1
    print(f"=== end {name} rc={rc}", flush=True)
    if tool == "preprocess" and rc:
        break
"""

TRAIN_RUNS = {  # name: (arch, extra flags); each tiny arch is its base arch with smaller sizes
    "lru": ("lru_lm_tiny", []),
    "lru_slow_lr": ("lru_lm_tiny", ["--lru-slow-lr-scale", "0.5"]),
    "lru_mml": ("lru_lm_tiny", ["--ternary"]),
    "lru_fully_mml": ("lru_lm_tiny", ["--fully-mml"]),
    "mlgru": ("mlgru_lm_tiny", []),
    "mlgru_mml": ("mlgru_lm_tiny", ["--ternary"]),
    "mlgru_fully_mml": ("mlgru_lm_tiny", ["--fully-mml"]),
}


def train_argv(data, save_dir, arch, flags, max_update=30):
    return [data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling", "--arch", arch, *flags,
            "--tokens-per-sample", "32", "--sample-break-mode", "none", "--batch-size", "8", "--optimizer", "adam",
            "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5", "--max-update", str(max_update),
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "10",
            "--num-workers", "0", "--cpu", "--seed", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (rc, output, save_dir)} of fairseq-train on a tiny corpus for every baseline configuration,
    plus one with --bf16 that must be refused."""
    root = tmp_path_factory.mktemp("baselines")
    text = write_corpus(str(root / "text"))
    data = str(root / "bin")
    jobs = [("preprocess", "preprocess", ["--only-source", "--destdir", data, "--workers", "1", "--trainpref", text["train"],
                                          "--validpref", text["valid"], "--testpref", text["test"]])]
    for name, (arch, flags) in TRAIN_RUNS.items():
        jobs.append((name, "train", train_argv(data, str(root / name), arch, flags)))
    jobs.append(("bf16_slow_lr", "train", train_argv(data, str(root / "bf16"), "lru_lm_tiny",
                                                     ["--lru-slow-lr-scale", "0.5", "--bf16"], max_update=2)))
    proc = pyrun.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = proc.stdout  # one stream, in order: fairseq logs to stderr
    results = {}
    for name, _, argv in jobs:
        begin, end = f"=== begin {name}\n", f"=== end {name} rc="
        assert begin in out and end in out, f"{name} did not finish (driver rc {proc.returncode}):\n{out[-3000:]}"
        body = out[out.index(begin) + len(begin): out.index(end)]
        rc = int(out[out.index(end) + len(end):].split("\n", 1)[0])
        results[name] = (rc, body, argv[argv.index("--save-dir") + 1] if "--save-dir" in argv else None)
    return results


@pytest.mark.integration
def test_lru_optimiser_groups_refuse_flattened_bf16(runs):
    rc, out, _ = runs["bf16_slow_lr"]
    assert rc != 0
    assert "which fairseq's --fp16/--bf16 optimizer cannot keep" in out


@pytest.mark.integration
@pytest.mark.parametrize("name", list(TRAIN_RUNS))
def test_fairseq_train_end_to_end(name, runs):
    rc, out, save_dir = runs[name]
    assert rc == 0, out[-3000:]
    losses = [float(x.split("loss=")[1].split(",")[0]) for x in out.splitlines() if "train_inner" in x and "loss=" in x]
    assert len(losses) == 3 and losses[-1] < losses[0]  # it learns the corpus's successor rule
    assert os.path.isfile(os.path.join(save_dir, "checkpoint_last.pt"))
    arch, flags = TRAIN_RUNS[name]
    assert f"'_name': '{arch}'" in out  # the run trained the configuration it names
    for i, flag in enumerate(flags):  # and the switches it names reached the model's config
        if flag.startswith("--"):
            value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else "True"
            assert f"'{flag[2:].replace('-', '_')}': {value}" in out


def test_bench_train_measures_the_baselines_with_cuda_graphs():

    bench = importlib.import_module("bench.bench_train")
    assert {f"{m}+graphs" for m in ("lru_lm_base", "lru_mml_lm_base", "mlgru_lm_base", "mlgru_mml_lm_base")} <= set(bench.VARIANTS)
    flags = bench.fairseq_model_flags("lru_mml_lm_base+graphs", tiny=True, kernel_backend="auto")
    assert flags[:2] == ["--arch", "lru_lm_tiny"] and "--cuda-graphs" in flags and "--ternary" in flags
    assert bench.fairseq_model_flags("mlgru_lm_base+graphs", tiny=False, kernel_backend="auto")[:2] == ["--arch", "mlgru_lm_base"]
