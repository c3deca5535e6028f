"""The fused HGRU output gate LayerNorm(h) * SiLU(g) against float64.

Oracle: ``F.layer_norm`` and ``F.silu`` in float64 with autograd. Errors are norm-relative.
Tolerances: fp32 inputs 1e-5 (fp32 statistics; observed ~1e-7 in the interpreter); bf16 inputs and
output 1e-2.
"""
import os

import torch

if not torch.cuda.is_available():  # before triton compiles anything
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytest.importorskip("triton")

from hgrn_fairseq.kernels.norm_gate import norm_gate  # noqa: E402
from tests.kernels.float64_compare import KERNEL_DEVICE, rel  # noqa: E402

DEVICE = KERNEL_DEVICE
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 19, 24), (1, 1, 5), (3, 7, 130)])
def test_norm_gate_matches_float64(dtype, shape):
    gen = torch.Generator().manual_seed(0)
    C = shape[-1]
    h = (2 * torch.randn(shape, generator=gen) + 0.5).to(dtype).to(DEVICE).requires_grad_(True)
    proj = torch.randn(*shape[:-1], 3 * C, generator=gen).to(dtype).to(DEVICE)
    g = proj[..., C:2 * C].detach().requires_grad_(True)  # a strided slice, like the in-projection's
    assert shape[0] * shape[1] == 1 or not g.is_contiguous()
    weight = (1 + 0.3 * torch.randn(C, generator=gen)).to(DEVICE).requires_grad_(True)
    bias = (0.2 * torch.randn(C, generator=gen)).to(DEVICE).requires_grad_(True)
    y = norm_gate(h, g, weight, bias, 1e-5, backend="triton")
    assert y.dtype == dtype and y.shape == shape

    h64, g64, w64, b64 = (t.detach().double().cpu().requires_grad_(True) for t in (h, g, weight, bias))
    ref = F.layer_norm(h64, (C,), w64, b64, 1e-5) * F.silu(g64)
    tol = TOL[dtype]
    assert rel(y, ref) < tol
    dy = torch.randn(shape, generator=gen, dtype=torch.float64)
    (y.double().cpu() * dy).sum().backward()
    (ref * dy).sum().backward()
    for name, got, want in (("h", h, h64), ("g", g, g64), ("weight", weight, w64), ("bias", bias, b64)):
        assert rel(got.grad, want.grad) < tol, name


def test_bad_input():
    h = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="must have the same shape"):
        norm_gate(h, torch.zeros(2, 3, 5), torch.ones(4), torch.zeros(4))
    with pytest.raises(ValueError, match=r"affine LayerNorm of width 4"):
        norm_gate(h, h, None, None)


def test_hgru_module_uses_it_and_matches_the_reference_path():
    from hgrn_fairseq.modules import HGRU

    torch.manual_seed(0)
    fused = HGRU(6, backend="triton").to(DEVICE)
    plain = HGRU(6, backend="reference").to(DEVICE)
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(2, 5, 6, device=DEVICE)
    assert rel(fused(x, 0.3)[0], plain(x, 0.3)[0]) < 1e-5
