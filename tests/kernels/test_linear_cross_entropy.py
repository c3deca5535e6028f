"""linear_cross_entropy (Triton row kernel and the PyTorch reference path) against F.cross_entropy on
float64 logits of the same inputs: loss, grad_hidden, grad_weight.

On a machine without a GPU the Triton path runs through the interpreter on CPU tensors
(TRITON_INTERPRET=1, set below before the kernel is built); with a GPU and TRITON_INTERPRET unset the
same tests run on CUDA. Cases: V not a multiple of the vocabulary block (MAX_BLOCK_V is set to 64 so that
several blocks run), N not a multiple of chunk_rows (several chunks), ignore_index rows, grad_output != 1,
reduction "none" with per-row grad_output, bf16 inputs and torch.autocast(bfloat16).

Errors are norm-relative, ||x - ref|| / ||ref||, against float64 on the same (rounded) inputs. Tolerances:

* fp32 inputs: 1e-5 in the interpreter and on the reference path (observed <= 4e-7), 1e-4 on the GPU.
* bf16 compute (bf16 inputs, or fp32 inputs under bf16 autocast): logits and the softmax gradient are
  rounded to bf16 once each: loss 2e-3 (observed <= 7e-4), gradients 2e-2 (observed <= 6e-3).
"""
import importlib
import importlib.util
import os

import torch

if not torch.cuda.is_available():  # before the kernel is built (tests/conftest.py does the same)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hgrn_fairseq.kernels import linear_cross_entropy  # noqa: E402
from tests.kernels.float64_compare import KERNEL_DEVICE, rel  # noqa: E402

# the module itself (the package attribute of that name is the function)
lce = importlib.import_module("hgrn_fairseq.kernels.linear_cross_entropy")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = KERNEL_DEVICE
TRITON_OK = importlib.util.find_spec("triton") is not None and (INTERPRET or DEVICE == "cuda")
BACKENDS = ["reference"] + (["triton"] if TRITON_OK else [])

FP32_TOL = 1e-4 if DEVICE == "cuda" else 1e-5
BF16_LOSS_TOL = 2e-3
BF16_GRAD_TOL = 2e-2
IGNORE = -100


@pytest.fixture(autouse=True)
def small_vocab_blocks(monkeypatch):
    monkeypatch.setattr(lce, "MAX_BLOCK_V", 64)


def make_inputs(n, d, vocab, dtype=torch.float32, ignored=(), ignore_index=IGNORE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen)
    weight = torch.randn(vocab, d, generator=gen) * (2.0 / d**0.5)  # logits of std ~2
    target = torch.randint(0, vocab, (n,), generator=gen)
    for i in ignored:
        target[i] = ignore_index
    return (hidden.to(dtype).to(DEVICE).requires_grad_(), weight.to(dtype).to(DEVICE).requires_grad_(),
            target.to(DEVICE))


def float64_reference(hidden, weight, target, ignore_index, reduction, grad_output):
    """Loss and gradients of F.cross_entropy on float64 logits of the given (already rounded) inputs."""
    h = hidden.detach().double().cpu().requires_grad_()
    w = weight.detach().double().cpu().requires_grad_()
    loss = F.cross_entropy(h @ w.t(), target.cpu(), ignore_index=ignore_index, reduction=reduction)
    (loss * grad_output.double().cpu()).sum().backward()
    return loss.detach(), h.grad, w.grad


def run(hidden, weight, target, grad_output, **kwargs):
    loss = linear_cross_entropy(hidden, weight, target, **kwargs)
    (loss * grad_output).sum().backward()
    return loss, hidden.grad, weight.grad


def grad_output_for(reduction, n, seed=5):
    if reduction == "sum":
        return torch.tensor(3.0, device=DEVICE)
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


CASES = [
    # N, d, V, chunk_rows, ignored rows
    (37, 16, 300, 10, (3, 10, 36)),  # 4 chunks (last one 7 rows), V = 4 blocks of 64 + 44
    (1, 8, 5, None, ()),  # one row, V smaller than a block
    (20, 32, 64, 7, (0,)),  # V exactly one block
    (9, 8, 129, 1, (1, 2)),  # one row per chunk, V = 2 blocks + 1 column
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("n,d,vocab,chunk_rows,ignored", CASES)
def test_fp32_matches_float64(backend, reduction, n, d, vocab, chunk_rows, ignored):
    hidden, weight, target = make_inputs(n, d, vocab, ignored=ignored)
    grad_output = grad_output_for(reduction, n)
    loss, gh, gw = run(hidden, weight, target, grad_output, reduction=reduction, chunk_rows=chunk_rows,
                       backend=backend)
    ref_loss, ref_gh, ref_gw = float64_reference(hidden, weight, target, IGNORE, reduction, grad_output)
    assert loss.dtype == torch.float32 and loss.shape == ref_loss.shape
    assert gh.dtype == torch.float32 and gw.dtype == torch.float32
    assert rel(loss, ref_loss) < FP32_TOL, f"loss: {rel(loss, ref_loss):.2e}"
    assert rel(gh, ref_gh) < FP32_TOL, f"grad_hidden: {rel(gh, ref_gh):.2e}"
    assert rel(gw, ref_gw) < FP32_TOL, f"grad_weight: {rel(gw, ref_gw):.2e}"
    if ignored:
        assert gh[list(ignored)].abs().max().item() == 0.0
        if reduction == "none":
            assert loss[list(ignored)].abs().max().item() == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_bf16_inputs(backend, reduction):
    n = 37
    hidden, weight, target = make_inputs(n, 16, 300, dtype=torch.bfloat16, ignored=(4, 20))
    grad_output = grad_output_for(reduction, n)
    loss, gh, gw = run(hidden, weight, target, grad_output, reduction=reduction, chunk_rows=16, backend=backend)
    ref_loss, ref_gh, ref_gw = float64_reference(hidden, weight, target, IGNORE, reduction, grad_output)
    assert loss.dtype == torch.float32
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    assert rel(loss, ref_loss) < BF16_LOSS_TOL, f"loss: {rel(loss, ref_loss):.2e}"
    assert rel(gh, ref_gh) < BF16_GRAD_TOL, f"grad_hidden: {rel(gh, ref_gh):.2e}"
    assert rel(gw, ref_gw) < BF16_GRAD_TOL, f"grad_weight: {rel(gw, ref_gw):.2e}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_bf16(backend):
    """fp32 hidden and weight under autocast(bfloat16): computed in bf16 (both cast once), gradients
    returned in fp32; the reference is float64 of the bf16-rounded inputs."""
    n = 30
    hidden, weight, target = make_inputs(n, 16, 200, ignored=(7,), seed=2)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, target, chunk_rows=8, backend=backend)
    (2.5 * loss).backward()
    assert loss.dtype == torch.float32
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    ref_loss, ref_gh, ref_gw = float64_reference(hidden.bfloat16(), weight.bfloat16(), target, IGNORE, "sum",
                                                 torch.tensor(2.5))
    assert rel(loss, ref_loss) < BF16_LOSS_TOL, f"loss: {rel(loss, ref_loss):.2e}"
    assert rel(hidden.grad, ref_gh) < BF16_GRAD_TOL, f"grad_hidden: {rel(hidden.grad, ref_gh):.2e}"
    assert rel(weight.grad, ref_gw) < BF16_GRAD_TOL, f"grad_weight: {rel(weight.grad, ref_gw):.2e}"
    # the fp32 master values were not rounded: without autocast the fp32 result differs
    fp32_loss = linear_cross_entropy(hidden, weight, target, backend=backend)
    assert (fp32_loss - loss).abs().item() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_other_ignore_index_and_all_ignored(backend):
    """fairseq's ignore_index is the padding index (1), a valid class: its rows add nothing."""
    hidden, weight, target = make_inputs(12, 8, 70, ignored=(0, 5, 11), ignore_index=1, seed=3)
    loss, gh, gw = run(hidden, weight, target, torch.tensor(1.0, device=DEVICE), ignore_index=1, chunk_rows=5,
                       backend=backend)
    ref_loss, ref_gh, ref_gw = float64_reference(hidden, weight, target, 1, "sum", torch.tensor(1.0))
    assert rel(loss, ref_loss) < FP32_TOL and rel(gh, ref_gh) < FP32_TOL and rel(gw, ref_gw) < FP32_TOL

    hidden, weight, _ = make_inputs(6, 8, 70, seed=4)
    target = torch.full((6,), IGNORE, device=DEVICE)
    loss, gh, gw = run(hidden, weight, target, torch.tensor(1.0, device=DEVICE), backend=backend)
    assert loss.item() == 0.0 and gh.abs().max().item() == 0.0 and gw.abs().max().item() == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunking_and_grad_needs(backend):
    """Any chunking gives the same numbers; only the gradients asked for are computed; no_grad works."""
    hidden, weight, target = make_inputs(23, 8, 100, ignored=(2,), seed=6)
    losses = [linear_cross_entropy(hidden, weight, target, chunk_rows=c, backend=backend).item()
              for c in (1, 4, 23, 1000, None)]
    assert max(losses) - min(losses) <= 1e-5 * abs(losses[0])

    frozen = weight.detach()
    loss = linear_cross_entropy(hidden, frozen, target, backend=backend)
    loss.backward()
    ref_loss, ref_gh, _ = float64_reference(hidden, frozen, target, IGNORE, "sum", torch.tensor(1.0))
    assert rel(hidden.grad, ref_gh) < FP32_TOL

    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, target, backend=backend)
    assert not loss.requires_grad and rel(loss, ref_loss) < FP32_TOL


def test_default_chunk_rows():
    # 8192 tokens x vocab 50264 in bf16 (824 MB of logits): two chunks of 4096 rows
    assert lce.default_chunk_rows(8192, 50264, torch.bfloat16) == 4096
    assert lce.default_chunk_rows(8192, 50264, torch.float32) == 2048  # four chunks
    assert lce.default_chunk_rows(100, 1000, torch.float32) == 100  # one chunk
    assert lce.default_chunk_rows(3, 2**40, torch.float32) == 1  # at least one row
    assert lce.default_chunk_rows(0, 50264, torch.bfloat16) == 1


@pytest.mark.skipif(not TRITON_OK, reason="needs triton (CUDA, or TRITON_INTERPRET=1)")
def test_triton_out_of_range_target_gives_nan_not_a_wild_read():
    """What the unchecked GPU path does with a bad target: a NaN loss for that row only."""
    logits = torch.randn(3, 70, device=DEVICE)
    target = torch.tensor([5, 70, -3], device=DEVICE)
    loss = lce.softmax_grad_rows_triton(logits, target, IGNORE, None, False)
    assert torch.isfinite(loss[0]) and torch.isnan(loss[1:]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input(backend):
    hidden, weight, target = make_inputs(4, 8, 10)
    call = lambda *a, **k: linear_cross_entropy(*a, backend=backend, **k)  # noqa: E731
    with pytest.raises(ValueError, match=r"disagree on d: hidden \(4, 8\), weight \(10, 7\)"):
        call(hidden, weight[:, :7], target)
    with pytest.raises(ValueError, match=r"hidden must be \[N, d\], got shape \(4, 2, 4\)"):
        call(hidden.reshape(4, 2, 4), weight, target)
    with pytest.raises(ValueError, match=r"weight must be \[V, d\], got shape \(80,\)"):
        call(hidden, weight.reshape(-1), target)
    with pytest.raises(ValueError, match=r"target must be \[N\] = \[4\].*got shape \(3,\)"):
        call(hidden, weight, target[:3])
    with pytest.raises(TypeError, match="target must hold integer class indices.*torch.float32"):
        call(hidden, weight, target.float())
    if DEVICE == "cpu" or backend == "reference":  # unchecked on the GPU's Triton path (no sync)
        with pytest.raises(ValueError, match=r"target\[2\] = 10 is outside \[0, 10\)"):
            call(hidden, weight, torch.tensor([0, IGNORE, 10, 3], device=DEVICE))
        with pytest.raises(ValueError, match=r"target\[0\] = -1 is outside"):
            call(hidden, weight, torch.tensor([-1, 0, 0, 0], device=DEVICE))
    with pytest.raises(ValueError, match="reduction='mean' is not one of"):
        call(hidden, weight, target, reduction="mean")
    with pytest.raises(ValueError, match="chunk_rows must be a positive int or None, got 0"):
        call(hidden, weight, target, chunk_rows=0)
    with pytest.raises(TypeError, match=r"hidden \(torch.float32\) and weight \(torch.float64\) must have one dtype"):
        call(hidden, weight.double(), target)
    with pytest.raises(ValueError, match="backend='cuda' is not one of"):
        linear_cross_entropy(hidden, weight, target, backend="cuda")
