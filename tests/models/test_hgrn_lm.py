"""The fairseq model ``hgrn_lm``: sizes, incremental decoding, and the fairseq command-line tools
end to end on a tiny corpus (train, resume, eval-lm beyond the training length, generation)."""
import argparse
import math
import os
import re
import signal
import subprocess
import sys
import types

import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from fairseq.data import Dictionary, data_utils
from fairseq.models import ARCH_CONFIG_REGISTRY

from hgrn_fairseq.models.hgrn_lm import HgrnLanguageModel, UNBOUNDED_POSITIONS
from tests.lm_corpus import binarise, write_corpus
from tests import pyrun

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))


def gpt2_sized_dictionary(size=50264):
    d = Dictionary()  # 4 specials
    for i in range(size - len(d)):
        d.add_symbol(f"tok{i}")
    assert len(d) == size
    return d


def build(arch, dictionary, **overrides):
    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return HgrnLanguageModel.build_model(args, types.SimpleNamespace(target_dictionary=dictionary))


def num_params(model):
    return sum(p.numel() for p in model.parameters())


def test_hgrn_lm_base_parameter_count_matches_paper():
    model = build("hgrn_lm_base", gpt2_sized_dictionary())
    assert num_params(model) == 46_247_936


def test_hgrn2_lm_base_parameter_count_matches_paper():
    model = build("hgrn2_lm_base", gpt2_sized_dictionary())
    assert num_params(model) == 44_660_732
    heads = {build(f"hgrn2_lm_expand{e}", gpt2_sized_dictionary(100)).decoder.layers[0].mixer.expand_ratio
             for e in (1, 2, 4, 8, 16, 32, 64, 128)}
    assert heads == {1, 2, 4, 8, 16, 32, 64, 128}


@pytest.mark.parametrize("arch, width", [("hgrn_lm_real_d", 512), ("hgrn_lm_real_2d", 1024)])
def test_real_variant_parameter_counts(arch, width):
    V, d, L = 50264, 512, 6
    mixer = 3 * (d * width + width) + (width * d + d) + 2 * width  # in, forget, gate; out; LN
    glu = 2 * (d * 1024 + 1024) + 1024 * d + d
    expected = V * d + L * (mixer + 2 * 2 * d + glu) + 2 * d + L * width
    assert num_params(build(arch, gpt2_sized_dictionary())) == expected


def test_parameter_count_by_hand_for_other_widths():
    # The papers' count written out: embedding, per layer (HGRU + 2 LN + GLU), final LN, Gamma.
    V, d, L, g = 1000, 48, 3, 80
    model = build("hgrn_lm_tiny", gpt2_sized_dictionary(V), decoder_embed_dim=d, decoder_layers=L, glu_dim=g)
    hgru = (d * 2 * d + 2 * d) + (d * d + d) + (d * 2 * d + 2 * d) + (2 * d * d + d) + 2 * (2 * d) + d
    glu = 2 * (d * g + g) + g * d + d
    expected = V * d + L * (hgru + 2 * 2 * d + glu) + 2 * d + L * d
    assert num_params(model) == expected
    no_lb = build("hgrn_lm_tiny", gpt2_sized_dictionary(V), decoder_embed_dim=d, decoder_layers=L, glu_dim=g,
                  no_lower_bound=True)
    assert num_params(no_lb) == expected - L * d


def test_max_positions_is_unbounded():
    model = build("hgrn_lm_tiny", gpt2_sized_dictionary(100))
    assert model.max_positions() == UNBOUNDED_POSITIONS >= 2**31 - 1


@pytest.mark.parametrize("mixer", ["hgru", "hgru_real", "hgru2"])
def test_token_by_token_equals_full_forward(mixer):
    torch.manual_seed(0)
    dictionary = gpt2_sized_dictionary(60)
    model = build("hgrn_lm_tiny", dictionary, token_mixer=mixer, expand_ratio=16, dropout=0.0).double().eval()
    # Train the lower bounds away from their init so every layer has a distinct non-zero bound.
    with torch.no_grad():
        model.decoder.lower_bounds.gamma.normal_()
    tokens = torch.randint(4, 60, (3, 23))
    with torch.no_grad():
        full = model.get_normalized_probs(model(tokens), log_probs=True)
        state, steps = {}, []
        for t in range(tokens.size(1)):
            out = model(tokens[:, : t + 1], incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
        stepped = torch.cat(steps, dim=1)
    torch.testing.assert_close(stepped, full, rtol=0, atol=1e-10)

    # Streams of blocks (continue_stream) give the same answer too.
    with torch.no_grad():
        state, blocks = {}, []
        for start in range(0, tokens.size(1), 7):
            out = model(tokens[:, start : start + 7], incremental_state=state, continue_stream=True)
            blocks.append(model.get_normalized_probs(out, log_probs=True))
    torch.testing.assert_close(torch.cat(blocks, dim=1), full, rtol=0, atol=1e-10)


def test_token_by_token_fp32_tight():
    torch.manual_seed(1)
    model = build("hgrn_lm_tiny", gpt2_sized_dictionary(80), dropout=0.0).eval()
    tokens = torch.randint(4, 80, (2, 40))
    with torch.no_grad():
        full = model.get_normalized_probs(model(tokens), log_probs=True)
        state, steps = {}, []
        for t in range(tokens.size(1)):
            steps.append(model.get_normalized_probs(model(tokens[:, : t + 1], incremental_state=state), log_probs=True))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=2e-5)


def test_reorder_incremental_state_follows_beams():
    torch.manual_seed(2)
    model = build("hgrn_lm_tiny", gpt2_sized_dictionary(50), dropout=0.0).double().eval()
    a = torch.randint(4, 50, (3, 9))
    b = torch.randint(4, 50, (3, 5))
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        state = {}
        model(a, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        prefix = a[order]
        out = model(torch.cat([prefix, b], dim=1), incremental_state=state)
        full = model(torch.cat([prefix, b], dim=1))
    torch.testing.assert_close(out[0], full[0][:, 9:], rtol=0, atol=1e-10)


def test_incremental_decoding_refuses_stale_input():
    model = build("hgrn_lm_tiny", gpt2_sized_dictionary(50)).eval()
    tokens = torch.randint(4, 50, (1, 5))
    state = {}
    model(tokens, incremental_state=state)
    with pytest.raises(ValueError, match="already consumed 5"):
        model(tokens, incremental_state=state)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"decoder_layers": -2}, "--decoder-layers=-2 is invalid"),
        ({"glu_dim": -1}, "--glu-dim=-1 is invalid"),
        ({"dropout": 1.5}, "--dropout=1.5 is invalid"),
        ({"token_mixer": "hgru2", "expand_ratio": 3}, "--expand-ratio=3 does not divide --decoder-embed-dim=64"),
    ],
)
def test_bad_options_name_the_option(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build("hgrn_lm_tiny", gpt2_sized_dictionary(50), **overrides)


# ----------------------------------------------------------------------------------------------
# The fairseq command-line tools, as a user runs them.

TPS = 32  # training length
LR, WARMUP = 3e-3, 10


def fairseq(tool, *args, check=True, timeout=300):
    cmd = [sys.executable, "-m", f"fairseq_cli.{tool}", *map(str, args)]
    proc = pyrun.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def train_args(data, save_dir, max_update):
    return [
        data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling", "--arch", "hgrn_lm_tiny",
        "--tokens-per-sample", TPS, "--sample-break-mode", "none", "--batch-size", 8,
        "--optimizer", "adam", "--lr", LR, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", WARMUP,
        "--max-update", max_update, "--save-dir", save_dir, "--save-interval-updates", 10,
        "--validate-interval-updates", 10, "--log-interval", 1, "--log-format", "simple",
        "--num-workers", 0, "--cpu", "--seed", 3,
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    write_corpus(str(root / "text"))
    data = binarise(str(root / "text"), str(root / "bin"))
    return root, data


@pytest.fixture(scope="module")
def trained(corpus):
    root, data = corpus
    save_dir = root / "ckpt"
    fairseq("train", *train_args(data, save_dir, 30))
    return data, save_dir / "checkpoint_last.pt"


def split_tokens(data, split):
    dictionary = Dictionary.load(os.path.join(data, "dict.txt"))
    ds = data_utils.load_indexed_dataset(os.path.join(data, split), dictionary)
    return int(ds.sizes.sum())


def evaluated_tokens(output):
    m = re.search(r"Evaluated ([\d,]+) tokens", output)
    assert m, output[-2000:]
    return int(m.group(1).replace(",", ""))


def perplexity(output):
    return float(re.search(r"Perplexity: ([\d.]+)", output).group(1))


@pytest.mark.integration
@pytest.mark.parametrize("task", ["hgrn_language_modeling", "language_modeling"])
def test_eval_lm_far_beyond_training_length_scores_every_token(trained, task):
    data, ckpt = trained
    expected = split_tokens(data, "test")
    assert expected > 4 * TPS  # the test split really has blocks longer than the training length
    for length in (TPS, 4 * TPS, 16 * TPS):
        proc = fairseq("eval_lm", data, "--user-dir", PLUGIN, "--task", task, "--path", ckpt,
                       "--tokens-per-sample", length, "--gen-subset", "test", "--batch-size", 1,
                       "--cpu", "--num-workers", 0)
        out = proc.stdout + proc.stderr
        assert evaluated_tokens(out) == expected, f"L={length}"
        # It learned the corpus: far below the uniform perplexity over ~120 words.
        assert perplexity(out) < 40


@pytest.mark.integration
def test_interrupted_training_resumes_with_right_update_and_lr(corpus):
    root, data = corpus
    save_dir = root / "resume"
    args = train_args(data, save_dir, 60)
    cmd = [sys.executable, "-m", "fairseq_cli.train", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if re.search(r"Saved checkpoint .*@ 20 updates", line):
                proc.send_signal(signal.SIGKILL)  # an interruption, not a clean stop
                break
    finally:
        proc.kill()
        proc.wait()
    assert (save_dir / "checkpoint_last.pt").exists()
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    saved = state["optimizer_history"][-1]["num_updates"]
    assert saved >= 20 and saved % 10 == 0 and saved < 60

    out = fairseq("train", *args).stdout  # the very same command again
    assert f"Loaded checkpoint {save_dir}/checkpoint_last.pt (epoch 1 @ {saved} updates)" in out
    first = re.search(r"num_updates=(\d+), lr=([\d.e-]+)", out)
    assert int(first.group(1)) == saved + 1
    # inverse_sqrt after warm-up: lr = LR * sqrt(WARMUP / num_updates)
    assert math.isclose(float(first.group(2)), LR * math.sqrt(WARMUP / (saved + 1)), rel_tol=1e-4)
    final = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert final["optimizer_history"][-1]["num_updates"] == 60


@pytest.mark.integration
def test_interactive_and_generate_produce_text(trained):
    data, ckpt = trained
    words = {line.split()[0] for line in open(os.path.join(data, "dict.txt"))}
    cmd = [sys.executable, "-m", "fairseq_cli.interactive", data, "--user-dir", PLUGIN, "--task",
           "hgrn_language_modeling", "--path", str(ckpt), "--beam", "3", "--max-len-b", "12", "--cpu"]
    proc = pyrun.run(cmd, input="w5 w6 w7\nw40\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hyps = [line.split("\t")[2].split() for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 2
    for hyp in hyps:
        assert len(hyp) > 3 and set(hyp) <= words
    prompt_continued = [h for h in hyps if h[:3] == ["w5", "w6", "w7"]]
    assert prompt_continued, hyps

    proc = fairseq("generate", data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling", "--path", ckpt,
                   "--gen-subset", "test", "--sampling", "--beam", 1, "--max-len-b", 8, "--batch-size", 4,
                   "--max-sentences", 4, "--prefix-size", 2, "--tokens-per-sample", 64,
                   "--sample-break-mode", "eos", "--cpu", "--seed", 1, "--skip-invalid-size-inputs-valid-test")
    hyps = [line for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert hyps, proc.stdout[-2000:] + proc.stderr[-2000:]
