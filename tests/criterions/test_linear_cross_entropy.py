"""The ``linear_cross_entropy`` criterion against fairseq's ``cross_entropy``: same loss, sample_size,
logging outputs, logged metrics and parameter gradients on a tiny ``hgrn_lm_tiny`` (tied and untied) and
a tiny fairseq ``transformer_lm`` (tied and untied); clear errors for decoders it cannot fuse; and
``fairseq-train --criterion linear_cross_entropy`` logging the same training losses as
``--criterion cross_entropy`` over a few updates on the tiny corpus.

Models are built as ``bench/bench_train.py``'s ``build_fairseq`` builds them (fairseq's parser, the arch's
defaults, ``build_model``), in fp32 on CPU (the kernel's own tests cover bf16 and the Triton path).
Tolerances: loss rtol 1e-5; gradients: see ``assert_same_grads``.
"""
import json
import os
import subprocess
import sys
import types

import pytest
import torch
import torch.nn as nn

from fairseq import options
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.logging import metrics
from fairseq.models import build_model

from hgrn_fairseq.criterions.linear_cross_entropy import LinearCrossEntropyCriterion, output_weight
from tests.fixtures_corpus import subprocess_env
from tests.lm_corpus import binarise, write_corpus
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 101  # 4 specials + 97 words: not a power of two
TRANSFORMER = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
               "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4", "--decoder-normalize-before"]
MODELS = {
    "hgrn_lm_tiny": ["--arch", "hgrn_lm_tiny", "--kernel-backend", "reference"],
    "hgrn_lm_tiny_untied": ["--arch", "hgrn_lm_tiny", "--kernel-backend", "reference"],
    "transformer_lm": TRANSFORMER + ["--share-decoder-input-output-embed"],
    "transformer_lm_untied": TRANSFORMER,
}


def build(name, extra=()):
    dictionary = Dictionary()
    for i in range(VOCAB - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    argv = ["/unused-data-dir", "--task", "language_modeling", *MODELS[name], *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    if name == "hgrn_lm_tiny_untied":
        args.untie_embeddings = True
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    model = build_model(convert_namespace_to_omegaconf(args).model, task)
    return model.eval(), task  # eval: no dropout, so both criteria see the same network


def make_sample(task, batch=3, length=11, seed=1):
    gen = torch.Generator().manual_seed(seed)
    pad = task.target_dictionary.pad()
    tokens = torch.randint(4, VOCAB, (batch, length + 1), generator=gen)
    tokens[1, -4:] = pad  # a shorter sentence: padded targets are ignored
    tokens[2, -1:] = pad
    target = tokens[:, 1:].contiguous()
    return {"net_input": {"src_tokens": tokens[:, :-1].contiguous(), "src_lengths": torch.full((batch,), length)},
            "target": target, "ntokens": int(target.ne(pad).sum()), "id": torch.arange(batch)}


def loss_and_grads(criterion, model, sample, reduce=True):
    model.zero_grad(set_to_none=True)
    loss, sample_size, log = criterion(model, sample, reduce=reduce)
    loss.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, log, grads


def assert_same_grads(grads, ref_grads):
    """Every parameter's gradient within 1e-4 of its norm, plus 1e-6 of the whole gradient's norm (some
    are zero up to rounding, e.g. the attention key biases, which the softmax cancels)."""
    assert grads.keys() == ref_grads.keys()
    total = torch.cat([g.double().flatten() for g in ref_grads.values()]).norm().item()
    for n in grads:
        err = (grads[n].double() - ref_grads[n].double()).norm().item()
        assert err <= 1e-4 * ref_grads[n].double().norm().item() + 1e-6 * total, f"{n}: {err:.2e}"


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("sentence_avg", [False, True])
def test_same_numbers_as_cross_entropy(name, sentence_avg):
    model, task = build(name)
    tied = "untied" not in name
    weight = output_weight(model)
    assert (weight is model.decoder.embed_tokens.weight) == tied
    sample = make_sample(task)
    fused = LinearCrossEntropyCriterion(task, sentence_avg)
    plain = CrossEntropyCriterion(task, sentence_avg)

    loss, sample_size, log, grads = loss_and_grads(fused, model, sample)
    ref_loss, ref_sample_size, ref_log, ref_grads = loss_and_grads(plain, model, sample)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    assert sample_size == ref_sample_size == (3 if sentence_avg else sample["ntokens"])
    assert log.keys() == ref_log.keys()
    for key in log:
        if key == "loss":
            torch.testing.assert_close(log[key], ref_log[key], rtol=1e-5, atol=0)
        else:
            assert log[key] == ref_log[key], key
    assert_same_grads(grads, ref_grads)

    # the logged metrics (loss in base 2, nll_loss, ppl) come from the same reduce_metrics
    stats = []
    for criterion, logs in ((fused, [log, log]), (plain, [ref_log, ref_log])):
        with metrics.aggregate() as agg:
            criterion.reduce_metrics(logs)
            stats.append(agg.get_smoothed_values())
    assert stats[0].keys() == stats[1].keys() and "ppl" in stats[0]
    for key in stats[0]:
        assert stats[0][key] == pytest.approx(stats[1][key], rel=1e-4), key


@pytest.mark.parametrize("name", ["hgrn_lm_tiny", "transformer_lm"])
def test_reduce_false_gives_per_token_losses(name):
    model, task = build(name)
    sample = make_sample(task, seed=2)
    loss, _, _, grads = loss_and_grads(LinearCrossEntropyCriterion(task, False), model, sample, reduce=False)
    ref_loss, _, _, ref_grads = loss_and_grads(CrossEntropyCriterion(task, False), model, sample, reduce=False)
    assert loss.shape == ref_loss.shape == (sample["target"].numel(),)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert (loss[sample["target"].view(-1) == task.target_dictionary.pad()] == 0).all()
    assert_same_grads(grads, ref_grads)


def test_no_grad_validation():
    model, task = build("hgrn_lm_tiny")
    sample = make_sample(task, seed=3)
    with torch.no_grad():
        loss, _, _ = LinearCrossEntropyCriterion(task, False)(model, sample)
        ref_loss, _, _ = CrossEntropyCriterion(task, False)(model, sample)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)


def test_unfusable_decoders_say_use_cross_entropy():
    model, task = build("transformer_lm_untied", ["--adaptive-softmax-cutoff", "20,50"])
    criterion = LinearCrossEntropyCriterion(task, False)
    with pytest.raises(ValueError, match="TransformerDecoder uses an adaptive softmax; use --criterion cross_entropy"):
        criterion(model, make_sample(task))

    model, task = build("transformer_lm_untied")
    model.decoder.output_projection = nn.Linear(32, VOCAB, bias=True)
    with pytest.raises(ValueError, match="output_projection has a bias; use --criterion cross_entropy"):
        criterion(model, make_sample(task))

    class FeaturelessDecoder(nn.Module):
        def forward(self, prev_output_tokens):
            return prev_output_tokens

    with pytest.raises(ValueError, match="FeaturelessDecoder.forward takes no features_only argument; use --criterion"):
        output_weight(types.SimpleNamespace(decoder=FeaturelessDecoder()))
    with pytest.raises(ValueError, match="has no .decoder; use --criterion cross_entropy"):
        output_weight(nn.Linear(2, 2))


def train_losses(data, save_dir, criterion):
    """Per-update training losses logged by fairseq-train (hgrn_lm_tiny, 3 updates, CPU)."""
    cmd = [
        sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", os.path.join(REPO, "hgrn_fairseq"),
        "--task", "language_modeling", "--arch", "hgrn_lm_tiny", "--criterion", criterion,
        "--tokens-per-sample", "32", "--sample-break-mode", "none", "--batch-size", "8",
        "--optimizer", "adam", "--lr", "3e-3", "--max-update", "3", "--cpu", "--num-workers", "0", "--seed", "1",
        "--save-dir", save_dir, "--no-save", "--disable-validation", "--log-format", "json", "--log-interval", "1",
    ]
    proc = pyrun.run(cmd, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    inner = [line.split("| train_inner | ", 1)[1] for line in proc.stdout.splitlines() if "| train_inner | " in line]
    return [float(json.loads(record)["loss"]) for record in inner], proc.stdout


@pytest.mark.integration
def test_fairseq_train_end_to_end(tmp_path):
    write_corpus(str(tmp_path / "text"), sizes={"train": 300, "valid": 20, "test": 20})
    data = binarise(str(tmp_path / "text"), str(tmp_path / "bin"))
    fused, log = train_losses(data, str(tmp_path / "fused"), "linear_cross_entropy")
    plain, _ = train_losses(data, str(tmp_path / "plain"), "cross_entropy")
    assert len(fused) == 3, log[-3000:]
    assert fused == pytest.approx(plain, abs=2e-3)  # logged with 3 decimals
