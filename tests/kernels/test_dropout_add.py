"""The fused residual dropout x + dropout(y, p): kept/dropped elements exactly, keep rate, and a
backward that reuses the forward's mask (regenerated from the seed, never stored)."""
import os

import torch

if not torch.cuda.is_available():  # before triton compiles anything
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from hgrn_fairseq.kernels.dropout_add import dropout_add  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


@pytest.mark.parametrize("ydtype", [torch.float32, torch.bfloat16])
def test_dropout_add_forward_backward(ydtype):
    torch.manual_seed(0)
    p = 0.3
    x = torch.randn(4, 50, 101, device=DEVICE).requires_grad_(True)  # 20200 elements: not a block multiple
    y = (torch.rand(4, 50, 101, device=DEVICE) + 0.5).to(ydtype).requires_grad_(True)  # never 0
    out = dropout_add(x, y, p, training=True, backend="triton")
    assert out.dtype == torch.float32 and out.shape == x.shape
    delta = (out - x).detach().double()
    kept = delta != 0
    rate = kept.double().mean().item()
    assert abs(rate - (1 - p)) < 0.02  # binomial std ~0.003
    torch.testing.assert_close(delta[kept], y.detach().double()[kept] / (1 - p), rtol=1e-6, atol=1e-6)
    dout = torch.randn_like(out)
    out.backward(dout)
    torch.testing.assert_close(x.grad, dout)
    assert y.grad.dtype == ydtype
    want = torch.where(kept, dout.double() / (1 - p), torch.zeros_like(dout, dtype=torch.float64))
    tol = 1e-6 if ydtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.grad.double(), want, rtol=tol, atol=tol)


def test_seeded_and_off_when_not_training():
    x, y = torch.randn(3, 7, device=DEVICE), torch.randn(3, 7, device=DEVICE)
    torch.manual_seed(5)
    a = dropout_add(x, y, 0.5, backend="triton")
    torch.manual_seed(5)
    b = dropout_add(x, y, 0.5, backend="triton")
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(dropout_add(x, y, 0.5, training=False, backend="triton"), x + y)
    torch.testing.assert_close(dropout_add(x, y, 0.0, backend="triton"), x + y)
    with pytest.raises(ValueError, match="p=1.0 must be in"):
        dropout_add(x, y, 1.0)
    with pytest.raises(ValueError, match="must have the same shape"):
        dropout_add(x, y[:, :3], 0.1)
