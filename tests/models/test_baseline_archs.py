"""The baselines' archs of hgrn_lm (issue 22): parameter counts by hand, incremental decoding equals the
full forward, bad switches, and fairseq-train end to end on a tiny corpus for each mixer."""
import argparse
import os
import subprocess
import sys

import pytest
import torch

import hgrn_fairseq
from fairseq import options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import build_model
from tests.lm_corpus import binarise, write_corpus

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


@pytest.mark.parametrize("arch", ["lru_lm_tiny", "mlgru_lm_tiny"])
def test_incremental_decoding_equals_the_full_forward(arch):
    torch.manual_seed(0)
    model = build(arch, 200, "--kernel-backend", "reference").eval()
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


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("baselines")
    write_corpus(str(root / "text"))
    return binarise(str(root / "text"), str(root / "bin"))


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


def test_lru_optimiser_groups_refuse_flattened_bf16(data, tmp_path):
    cmd = [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling",
           "--arch", "lru_lm_tiny", "--lru-slow-lr-scale", "0.5", "--bf16", "--tokens-per-sample", "32",
           "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3", "--max-update", "2", "--save-dir", str(tmp_path),
           "--cpu", "--num-workers", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode != 0
    assert "which fairseq's --fp16/--bf16 optimizer cannot keep" in proc.stdout + proc.stderr


@pytest.mark.parametrize("arch, flags", [("lru_lm_tiny", ["--lru-slow-lr-scale", "0.5"]), ("lru_lm_tiny", ["--ternary"]),
                                         ("mlgru_lm_tiny", []), ("mlgru_lm_tiny", ["--fully-mml"])])
def test_fairseq_train_end_to_end(arch, flags, data, tmp_path):
    cmd = [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling",
           "--arch", arch, *flags, "--tokens-per-sample", "32", "--sample-break-mode", "none", "--batch-size", "8",
           "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
           "--max-update", "30", "--save-dir", str(tmp_path), "--no-epoch-checkpoints", "--log-format", "simple",
           "--log-interval", "10", "--num-workers", "0", "--cpu", "--seed", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    losses = [float(x.split("loss=")[1].split(",")[0]) for x in out.splitlines() if "train_inner" in x and "loss=" in x]
    assert len(losses) >= 2 and losses[-1] < losses[0]  # it learns the corpus's successor rule
    assert os.path.isfile(tmp_path / "checkpoint_last.pt")
