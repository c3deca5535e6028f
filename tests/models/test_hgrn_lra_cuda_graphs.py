"""``hgrn_lra --cuda-graphs``: LRA training steps replayed as CUDA graphs give the eager model's numbers.

The CPU tests check the option's plumbing and that it changes nothing off CUDA (and adds no state);
the GPU tests (skipped without CUDA, run on the GPU machine) train an eager model and a graphed copy
side by side through optimizer steps: token batches with padding (masked kernels, batch norms whose
statistics skip the pads), unpadded ones (a second capture), document pairs and 2-D pixel grids.
"""
import argparse
import copy

import pytest
import torch
import torch.nn.functional as F

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from fairseq import options

from hgrn_fairseq.models.hgrn_lra import HgrnLraConfig, validate_config
from hgrn_fairseq.modules.cuda_graph import GraphedCallCache
from hgrn_fairseq.modules.norms import MaskedBatchNorm
from tests.models.test_hgrn_lra import FakeTask, build

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU (run on the GPU machine)")

# (arch, task, overrides): small widths, no dropout (a graph's dropout masks are its own draws)
SMALL = dict(encoder_embed_dim=16, encoder_layers=2, position_dropout=0.0)
CASES = {
    "hgrn1_listops": ("hgrn1_lra_listops", FakeTask("tokens", 19, 10, max_len=64), SMALL),
    "hgrn2_listops": ("hgrn2_lra_listops", FakeTask("tokens", 19, 10, max_len=64), dict(SMALL, expand_ratio=4)),
    "hgrn1_retrieval": ("hgrn1_lra_retrieval", FakeTask("tokens", 30, 2, pair=True, max_len=64), SMALL),
    "hgrn2_pathfinder": ("hgrn2_lra_pathfinder", FakeTask("pixels", 1, 2, grid=(8, 8), max_len=64),
                         dict(SMALL, expand_ratio=2)),
}


def inputs_of(case, batch, length, padded, g):
    """net_input for one batch of the case's task; token batches padded (id 1) from position length - 3
    in every other row when ``padded``."""
    _, task, _ = CASES[case]
    if task.info["input"] == "pixels":
        return {"pixels": torch.randn(batch, length, 1, generator=g)}
    vocab = task.info["vocab_size"]

    def tokens():
        t = torch.randint(4, vocab, (batch, length), generator=g)
        if padded:
            t[::2, length - 3:] = 1
        return t

    net_input = {"src_tokens": tokens(), "padded": padded}
    if task.info["pair"]:
        net_input["src_tokens1"] = tokens()
    return net_input


def twin_models(case, device="cpu", **option):
    """The case's model and a twin built with ``option`` (default ``cuda_graphs=True``; the compile test
    passes ``compile_blocks=True``) that starts from the same weights and buffers, both in training mode."""
    arch, task, overrides = CASES[case]
    torch.manual_seed(0)
    eager = build(arch, task, kernel_backend="auto", **overrides)
    twin = build(arch, task, kernel_backend="auto", **(option or {"cuda_graphs": True}), **overrides)
    twin.load_state_dict(eager.state_dict())
    return eager.to(device).train(), twin.to(device).train()


def test_flag_reaches_the_model_config_and_refuses_compile_blocks():
    def parse(*flags):
        argv = ["/unused", "--task", "lra_text", "--arch", "hgrn1_lra_listops", *flags]
        return options.parse_args_and_arch(options.get_training_parser(), argv)

    assert parse("--cuda-graphs").cuda_graphs is True
    assert parse().cuda_graphs is False
    cfg = dict(HgrnLraConfig().__dict__, cuda_graphs=True, compile_blocks=True)
    with pytest.raises(ValueError, match=r"--cuda-graphs and --compile-blocks do not combine"):
        validate_config(argparse.Namespace(**cfg))


@pytest.mark.parametrize("case", sorted(CASES))
def test_off_cuda_the_option_changes_nothing(case):
    eager, graphed = twin_models(case)
    assert graphed.state_dict().keys() == eager.state_dict().keys()
    g = torch.Generator().manual_seed(1)
    net_input = inputs_of(case, 4, 64, padded=True, g=g)
    first = next(iter(v for v in net_input.values() if torch.is_tensor(v)))
    assert not GraphedCallCache.usable(graphed, first)  # CPU tensors
    torch.testing.assert_close(graphed(**net_input), eager(**net_input), rtol=0, atol=0)
    assert "_graphs" not in graphed.__dict__  # nothing was captured
    # the graph caches never travel with a copy of the model
    graphed._transient("_graphs", dict)
    assert "_graphs" in graphed.__dict__ and "_graphs" not in copy.deepcopy(graphed).__dict__


def batch_norm_state(model):
    return [(m.running_mean.clone(), m.running_var.clone(), int(m.num_batches_tracked))
            for m in model.modules() if isinstance(m, MaskedBatchNorm)]


def relative_errors(eager, graphed, values):
    """{name: max |a - b| / scale} over the twins' parameters (``values``: the parameter's data or its
    gradient), the scale being the tensor's own largest value but at least 1e-2 of the largest over all
    tensors: the biases a batch norm follows have a true gradient of zero (the norm removes any
    per-channel constant), so theirs are float noise (~1e-8) whose relative error means nothing."""
    pairs = [(name, values(p).float(), values(q).float())
             for (name, p), q in zip(eager.named_parameters(), graphed.parameters())]
    floor = 1e-2 * max(a.abs().max().item() for _, a, _ in pairs)
    return {name: (a - b).abs().max().item() / max(a.abs().max().item(), floor, 1e-12) for name, a, b in pairs}


def train_twins(eager, graphed, case, device, bf16):
    """Six optimizer steps of each twin on the same batches: one shape four times (the capture, then
    replays that must see the optimizer's in-place updates), the same shape unpadded (token tasks: the
    unmasked kernels, a second cache), a second shape. Returns the losses [(eager, graphed)], each step's
    largest relative gradient error (parameter name, error), the last batch and the shapes.

    SGD with momentum, not Adam: Adam divides each gradient by its own running RMS, which turns the
    float noise of a zero true gradient (the biases before a batch norm) into full-size steps of either
    sign, so eager and graphed twins drift apart in exactly those parameters (out_proj.bias by ~2e-2
    relative after six Adam steps, every loss within 1e-5). SGD is linear in the
    gradients and updates the weights in place as Adam does."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, graphed)]
    g = torch.Generator().manual_seed(2)
    pixels = CASES[case][1].info["input"] == "pixels"
    shapes = [(8, 64, True)] * 4 + [(8, 64, False), (4, 64 if pixels else 32, True)]  # (pixels: the 8 x 8 grid)
    labels = CASES[case][1].info["num_classes"]
    losses, grad_errors = [], []
    for batch, length, padded in shapes:
        net_input = inputs_of(case, batch, length, padded, g)
        net_input = {k: v.to(device) if torch.is_tensor(v) else v for k, v in net_input.items()}
        if "pixels" in net_input and bf16:
            net_input["pixels"] = net_input["pixels"].to(torch.bfloat16)
        target = torch.randint(0, labels, (batch,), generator=g).to(device)
        pair = []
        for model, opt in zip((eager, graphed), opts):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(**net_input).float(), target)
            loss.backward()
            pair.append(loss.item())
        grad_errors.append(max(relative_errors(eager, graphed, lambda p: p.grad).items(), key=lambda kv: kv[1]))
        for opt in opts:
            opt.step()
        losses.append(tuple(pair))
    return losses, grad_errors, net_input, shapes


@needs_cuda
@pytest.mark.parametrize("case", sorted(CASES))
def test_graphed_training_matches_eager(case):
    eager, graphed = twin_models(case, "cuda")
    bf16 = case.startswith("hgrn2")
    if bf16:  # as fairseq's --bf16 runs HGRN2's recipes: weights and activations in bf16
        eager, graphed = eager.to(torch.bfloat16), graphed.to(torch.bfloat16)
    pixels = CASES[case][1].info["input"] == "pixels"
    losses, grad_errors, net_input, shapes = train_twins(eager, graphed, case, "cuda", bf16)
    tol = 2e-2 if bf16 else 1e-4
    for step, (a, b) in enumerate(losses):
        assert abs(a - b) <= tol * abs(a), f"step {step}: eager loss {a} vs graphed {b}"
    for step, (name, err) in enumerate(grad_errors):
        assert err <= 10 * tol, f"step {step}: {name}.grad relative difference {err:.2e}"
    for name, err in relative_errors(eager, graphed, lambda p: p.detach()).items():
        assert err <= 10 * tol, f"{name}: relative difference {err:.2e} after {len(shapes)} steps"
    # batch norms: every replay updated the running statistics once, as an eager step; the captures'
    # warm-up runs did not
    for (m1, v1, n1), (m2, v2, n2) in zip(batch_norm_state(eager), batch_norm_state(graphed)):
        assert n1 == n2 == len(shapes)
        torch.testing.assert_close(m2, m1, rtol=10 * tol, atol=10 * tol)
        torch.testing.assert_close(v2, v1, rtol=10 * tol, atol=10 * tol)
    caches = graphed.__dict__["_graphs"]  # (pixels are never masked: one cache, and its shapes (8, 64), (4, 64))
    assert sorted(caches) == ([False] if pixels else [False, True])
    assert sum(len(c.graphed) for c in caches.values()) == (2 if pixels else 3)
    # evaluation runs eagerly (no graph) and agrees
    eager.eval(), graphed.eval()
    with torch.no_grad():
        torch.testing.assert_close(graphed(**net_input).float(), eager(**net_input).float(), rtol=10 * tol,
                                   atol=10 * tol)
    assert sum(len(c.graphed) for c in caches.values()) == (2 if pixels else 3)


@pytest.mark.parametrize("case", ["hgrn1_listops", "hgrn1_retrieval", "hgrn2_pathfinder"])
def test_training_forwards_go_through_one_cache_per_padding_mode(case, monkeypatch):
    """CPU, with the capture replaced by the eager call it records: a training forward with the option
    goes through the cache of its padding mode, keyed by shape, and returns the eager logits;
    evaluation does not."""
    captured = []

    def capture(self, inputs):
        captured.append((self.module.masked, tuple(tuple(t.shape) for t in inputs)))
        return self.module

    monkeypatch.setattr(GraphedCallCache, "usable", staticmethod(lambda module, *inputs: module.training))
    monkeypatch.setattr(GraphedCallCache, "_capture", capture)
    eager, graphed = twin_models(case)
    pixels = CASES[case][1].info["input"] == "pixels"
    g = torch.Generator().manual_seed(3)
    for batch, length, padded in [(4, 64, True), (4, 64, True), (4, 64, False), (2, 64, True)]:
        net_input = inputs_of(case, batch, length, padded, g)
        torch.testing.assert_close(graphed(**net_input), eager(**net_input), rtol=0, atol=0)
    n = len(next(iter(net_input.values())).shape)  # (pixels [B, T, C], tokens [B, T])
    if pixels:
        assert captured == [(False, ((4, 64, 1),)), (False, ((2, 64, 1),))]
    else:
        docs = 2 if CASES[case][1].info["pair"] else 1
        assert [(m, s[0]) for m, s in captured] == [(True, (4, 64)), (False, (4, 64)), (True, (2, 64))]
        assert all(len(s) == docs for _, s in captured) and n == 2
    assert sorted(graphed.__dict__["_graphs"]) == ([False] if pixels else [False, True])
    graphed.eval()
    with torch.no_grad():
        graphed(**net_input)
    assert len(captured) == (2 if pixels else 3)


def test_a_capture_puts_back_the_buffers_its_warm_up_changed(monkeypatch):
    """GraphedCallCache._capture with a stand-in for torch's make_graphed_callables that, like it, runs
    the function three times for real before capturing: the batch norm's running statistics are as
    before the capture, and each replay then updates them once (CPU)."""
    from hgrn_fairseq.modules import cuda_graph

    def warm_up_then_eager(fn, samples):
        for _ in range(3):
            fn(*samples).sum().backward()
        return fn

    monkeypatch.setattr(cuda_graph, "make_graphed_thread_local", warm_up_then_eager)
    bn = MaskedBatchNorm(4).train()
    x = torch.randn(2, 5, 4) * 3 + 1
    replay = GraphedCallCache(bn, name="bn")._capture((x,))
    [(mean, var, n)] = batch_norm_state(bn)
    assert n == 0 and torch.equal(mean, torch.zeros(4)) and torch.equal(var, torch.ones(4))
    replay(x)
    [(mean, var, n)] = batch_norm_state(bn)
    want = 0.1 * x.reshape(-1, 4).double().mean(0)  # one update from zero, momentum 0.1
    assert n == 1 and torch.allclose(mean.double(), want, atol=1e-6)
