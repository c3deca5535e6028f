"""``--cuda-graphs``: training steps replayed as CUDA graphs give the eager model's numbers.

The CPU tests check that the option changes nothing off CUDA (and adds no state); the GPU tests
(skipped without CUDA, run on the GPU machine) train an eager model and a graphed copy side by side
through optimizer steps, new shapes and the capture limit.
"""
import copy
import logging
import os
import re
import sys

import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from fairseq import options

from hgrn_fairseq.modules.cuda_graph import GraphedCallCache
from tests.lm_corpus import binarise, write_corpus
from tests.models.test_hgrn_lm import build as build_lm, gpt2_sized_dictionary
from tests import pyrun

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU (run on the GPU machine)")
PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))


def build(arch, **overrides):
    return build_lm(arch, gpt2_sized_dictionary(300), **overrides)


def loss_of(model, tokens):
    logits, _ = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def test_flag_reaches_the_model_config():
    def parse(*flags):
        argv = ["/unused", "--task", "language_modeling", "--arch", "hgrn_lm_tiny", *flags]
        return options.parse_args_and_arch(options.get_training_parser(), argv)

    assert parse("--cuda-graphs").cuda_graphs is True
    assert parse().cuda_graphs is False


@pytest.mark.parametrize("arch", ["hgrn_lm_tiny", "hgrn2_lm_tiny"])
def test_off_cuda_the_option_changes_nothing(arch):
    torch.manual_seed(0)
    eager = build(arch, dropout=0.0)
    graphed = build(arch, dropout=0.0, cuda_graphs=True)
    graphed.load_state_dict(eager.state_dict())
    assert graphed.decoder.cuda_graphs and not eager.decoder.cuda_graphs
    assert graphed.state_dict().keys() == eager.state_dict().keys()
    tokens = torch.randint(4, 300, (2, 17))
    assert not GraphedCallCache.usable(graphed.decoder, tokens)  # CPU tensors
    for model in (eager, graphed):
        model.train()
    torch.testing.assert_close(loss_of(graphed, tokens), loss_of(eager, tokens), rtol=0, atol=0)
    assert "_graphs" not in graphed.decoder.__dict__  # nothing was captured
    # the graph cache never travels with a copy of the model (deepcopy for EMA and the like)
    graphed.decoder._graph_cache()
    assert "_graphs" in graphed.decoder.__dict__
    assert "_graphs" not in copy.deepcopy(graphed).decoder.__dict__


@pytest.mark.parametrize("has_mode_argument", [True, False])
def test_captures_use_thread_local_error_mode(monkeypatch, has_mode_argument):
    """NCCL's watchdog thread must not break a capture under DDP: whatever the torch release, the
    capture contexts are built in "thread_local" mode, and torch.cuda.graph is restored after."""
    import importlib
    import inspect

    from hgrn_fairseq.modules import cuda_graph

    graphs_module = importlib.import_module("torch.cuda.graphs")
    original = torch.cuda.graph
    seen = {}

    if has_mode_argument:
        def fake(module, samples, allow_unused_input=False, capture_error_mode="global"):
            seen["mode"] = capture_error_mode
            return module
    else:
        def fake(module, samples, allow_unused_input=False):
            init = inspect.signature(torch.cuda.graph.__init__).parameters
            seen["mode"] = init["capture_error_mode"].default
            seen["same_in_module"] = graphs_module.graph is torch.cuda.graph
            return module

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake)
    module = torch.nn.Linear(2, 2)
    assert cuda_graph.make_graphed_thread_local(module, ()) is module
    assert seen["mode"] == "thread_local"
    assert seen.get("same_in_module", True)
    assert torch.cuda.graph is original and graphs_module.graph is original


def test_parameter_aliases_keep_hooks_out_of_the_capture_and_grads_on_the_parameters():
    """The capture runs the module on aliases of its parameters (DDP's hooks on the real ones must
    not fire inside a capture); a replay's backward gives the real parameters the eager gradients.
    make_graphed is replaced by a recorder that runs the function as the warm-up would."""
    from hgrn_fairseq.modules.cuda_graph import graph_with_parameter_aliases

    torch.manual_seed(0)
    model = build("hgrn_lm_tiny", dropout=0.0).train()
    trunk_of = lambda: _trunk(model)  # noqa: E731
    tokens = torch.randint(4, 300, (2, 9))
    fired = []
    for p in model.parameters():
        p.register_hook(lambda g: fired.append(1))

    def make_graphed(fn, samples):  # stand-in: one warm-up forward/backward on the samples
        out = fn(*samples)
        grads = torch.autograd.grad(out.sum(), [t for t in samples if t.requires_grad], allow_unused=True)
        assert any(g is not None for g in grads)
        return fn

    replay = graph_with_parameter_aliases(trunk_of(), (tokens.clone(),), make_graphed)
    assert fired == []  # the warm-up touched only the aliases
    out = replay(tokens)
    (out * out).sum().backward()
    assert fired  # the replay's backward reached the real parameters
    graphed_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    ref = model.decoder._features(tokens)[0]
    (ref * ref).sum().backward()
    eager_grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(graphed_grads) == len(eager_grads) > 10
    for a, b in zip(graphed_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def _trunk(model):
    from hgrn_fairseq.models.hgrn_lm import _GraphedTrunk

    return _GraphedTrunk(model.decoder)


# ----------------------------------------------------------------------------------------------
# On the GPU


def twin_models(arch, dropout=0.0, **overrides):
    torch.manual_seed(0)
    eager = build(arch, dropout=dropout, **overrides).cuda().train()
    graphed = build(arch, dropout=dropout, cuda_graphs=True, **overrides).cuda().train()
    graphed.load_state_dict(eager.state_dict())
    return eager, graphed


def train_side_by_side(eager, graphed, batches, amp_dtype):
    """Adam steps on both models over ``batches``; returns the (eager, graphed) losses."""
    opts = [torch.optim.Adam(m.parameters(), lr=3e-3) for m in (eager, graphed)]
    losses = []
    for tokens in batches:
        pair = []
        for model, opt in zip((eager, graphed), opts):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                loss = loss_of(model, tokens)
            loss.backward()
            opt.step()
            pair.append(loss.item())
        losses.append(tuple(pair))
    return losses


@needs_cuda
@pytest.mark.parametrize("arch", ["hgrn_lm_tiny", "hgrn2_lm_tiny"])
@pytest.mark.parametrize("amp", ["fp32", "bf16"])
def test_graphed_training_matches_eager(arch, amp):
    eager, graphed = twin_models(arch)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16}[amp]
    # same shape four times (capture, then replays that must see Adam's in-place updates), then a
    # second shape (a second capture)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(4, 300, (4, 65), generator=g).cuda() for _ in range(4)]
    batches += [torch.randint(4, 300, (2, 33), generator=g).cuda() for _ in range(2)]
    losses = train_side_by_side(eager, graphed, batches, amp_dtype)
    tol = 1e-4 if amp_dtype is None else 2e-3
    for step, (a, b) in enumerate(losses):
        assert abs(a - b) <= tol * abs(a), f"step {step}: eager loss {a} vs graphed {b}"
    assert losses[3][0] < losses[0][0]  # it trained
    for (name, p), q in zip(eager.named_parameters(), graphed.parameters()):
        err = (p - q).abs().max().item() / max(p.abs().max().item(), 1e-6)
        assert err <= 10 * tol, f"{name}: relative difference {err:.2e} after 6 steps"
    assert len(graphed.decoder._graph_cache().graphed) == 2
    # evaluation runs eagerly (no graph) and agrees
    eager.eval(), graphed.eval()
    with torch.no_grad():
        torch.testing.assert_close(loss_of(graphed, batches[0]), loss_of(eager, batches[0]), rtol=tol, atol=0)
    assert len(graphed.decoder._graph_cache().graphed) == 2


@needs_cuda
def test_capture_limit_falls_back_to_eager(caplog):
    eager, graphed = twin_models("hgrn_lm_tiny")
    limit = graphed.decoder._graph_cache().max_graphs
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(4, 300, (1, 9 + 8 * i), generator=g).cuda() for i in range(limit + 2)]
    with caplog.at_level(logging.WARNING):
        losses = train_side_by_side(eager, graphed, batches, None)
    for a, b in losses:
        assert abs(a - b) <= 1e-4 * abs(a)
    assert len(graphed.decoder._graph_cache().graphed) == limit
    assert any("run without a graph" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cls", ["GraphedCallCache", "InferenceGraphCache"])
def test_caches_past_their_limit_run_eagerly_and_warn_once(caplog, cls):
    """Both caches, full (max_graphs 0): a call runs the module eagerly, captures nothing and warns once
    (CPU: nothing here needs a GPU)."""
    from hgrn_fairseq.modules import cuda_graph

    module = torch.nn.Linear(3, 2)
    cache = getattr(cuda_graph, cls)(module, max_graphs=0, name="tiny")
    x = torch.randn(4, 3)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cache(x), module(x), rtol=0, atol=0)
    assert cache.graphed == {}
    warnings = [r.getMessage() for r in caplog.records if "run without a graph" in r.getMessage()]
    assert len(warnings) == 1 and "tiny already has 0 captured" in warnings[0]
    assert ("evaluation shapes" in warnings[0]) == (cls == "InferenceGraphCache")


@needs_cuda
def test_graphed_dropout_draws_new_masks_each_step():
    _, graphed = twin_models("hgrn_lm_tiny", dropout=0.3)
    tokens = torch.randint(4, 300, (4, 65)).cuda()
    losses = []
    for _ in range(3):
        loss = loss_of(graphed, tokens)
        loss.backward()
        losses.append(loss.item())
    assert len(graphed.decoder._graph_cache().graphed) == 1
    assert len(set(losses)) == 3, f"the same dropout mask was replayed: {losses}"
    graphed.eval()
    with torch.no_grad():
        a, b = (loss_of(graphed, tokens).item() for _ in range(2))
    # no dropout in evaluation: equal up to the kernels' summation order (about 1e-7 relative on the
    # GPU), where the training losses above differ by dropout
    assert abs(a - b) <= 1e-5 * abs(a), (a, b)
    assert min(abs(x - y) for x, y in [(losses[0], losses[1]), (losses[1], losses[2])]) > 1e-4 * abs(a)


def fairseq_train(tmp_path, *extra, gpus=1, updates=20):
    """Train hgrn_lm_tiny with scripts/fairseq_train.py (fairseq-train as the recipes run it: --bf16
    means bfloat16 on CUDA, not TPU), on ``gpus`` processes through torchrun as train_wt103.sh
    launches them; returns (the log, the loss of every update)."""
    import subprocess

    data = tmp_path / "bin"
    if not data.exists():
        write_corpus(str(tmp_path / "text"))
        binarise(str(tmp_path / "text"), str(data))
    script = os.path.join(os.path.dirname(PLUGIN), "scripts", "fairseq_train.py")
    launch = [sys.executable, script] if gpus == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus), script]
    cmd = launch + [
        str(data), "--user-dir", PLUGIN, "--task", "hgrn_language_modeling", "--arch", "hgrn_lm_tiny",
        "--tokens-per-sample", "32", "--sample-break-mode", "none", "--batch-size", "8",
        "--distributed-world-size", str(gpus), "--optimizer", "adam", "--lr", "3e-3",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5", "--max-update", str(updates),
        "--save-dir", str(tmp_path / "ckpt"), "--no-save", "--disable-validation",
        "--log-interval", "1", "--log-format", "simple", "--num-workers", "0", "--seed", "3", *extra]
    proc = pyrun.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # ("... | train_inner | epoch 001: ... loss=9.1, ..." or "INFO:train_inner:epoch 001: ... loss=9.1, ...")
    losses = [float(m.group(1)) for m in re.finditer(r"train_inner\W.*? loss=([0-9.]+),", log)]
    assert len(losses) == updates, f"{len(losses)} losses logged for {updates} updates\n{log[-2000:]}"
    return log, losses


@pytest.mark.integration
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fairseq_train_with_cuda_graphs(tmp_path, precision):
    flags = ["--bf16"] if precision == "bf16" else []
    log, losses = fairseq_train(tmp_path, "--cuda-graphs", *flags)
    assert "cuda graphs: capturing hgrn_lm decoder" in log
    assert losses[-1] < losses[0] - 0.5, f"loss did not fall: {losses}"
    # dropout draws differ between the graph and eager runs: the curves agree only roughly
    _, eager = fairseq_train(tmp_path, *flags)
    assert abs(losses[-1] - eager[-1]) < 0.1 * eager[-1], (losses, eager)


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (DDP through torchrun)")
def test_fairseq_train_ddp_with_cuda_graphs_matches_eager(tmp_path):
    """Two processes, DDP's gradient all-reduce hooks on the graph's parameter gradients; no dropout,
    so the graphed run's per-update losses equal the eager run's."""
    log, graphed = fairseq_train(tmp_path, "--cuda-graphs", "--dropout", "0", gpus=2)
    assert "cuda graphs: capturing hgrn_lm decoder" in log
    _, eager = fairseq_train(tmp_path, "--dropout", "0", gpus=2)
    assert graphed[-1] < graphed[0] - 0.5, graphed
    for step, (a, b) in enumerate(zip(eager, graphed)):
        assert abs(a - b) <= 2e-3 * a + 2e-3, f"update {step + 1}: eager {a} vs graphed {b}"
