"""The fused HGRN2 gates kernel (q activation + log-decay; with ``hgrn2_in_gates`` also v's activation from
the whole in-projection) against float64 equations.

The oracle is the plain formula in float64, ``log(gamma + (1 - gamma) * sigmoid(f))`` and
``SiLU`` / ``sigmoid``, with autograd for the gradients; it shares no code with the kernel or with
the stable branches of ``hgrn2_log_decay_reference``. Errors are norm-relative. Tolerances: fp32
inputs 1e-5 (fp32 math, observed ~1e-7 in the interpreter); bf16 inputs 1e-2 (bf16 outputs).
"""
import os

import torch

if not torch.cuda.is_available():  # before triton compiles anything
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from hgrn_fairseq.kernels.hgrn2_gates import hgrn2_gates, hgrn2_in_gates  # noqa: E402
from tests.kernels.float64_compare import KERNEL_DEVICE, rel  # noqa: E402

DEVICE = KERNEL_DEVICE
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def by_equation(z, f, gamma, activation):
    """float64 oracle: the formulas as written."""
    z, f = z.double(), f.double()
    q = z * torch.sigmoid(z) if activation == "silu" else torch.sigmoid(z)
    g = 0.0 if gamma is None else (gamma.double() if isinstance(gamma, torch.Tensor) else gamma)
    return q, torch.log(g + (1 - g) * torch.sigmoid(f))


def make(shape, dtype, spread=3.0, seed=0):
    """q_pre and f as strided slices of one [..., 3D] projection, like the module's in_proj."""
    gen = torch.Generator().manual_seed(seed)
    D = shape[-1]
    proj = (spread * torch.randn(*shape[:-1], 3 * D, generator=gen)).to(dtype).to(DEVICE)
    proj[..., 2 * D] = 30.0  # a saturated forget gate (lambda -> 1) and its opposite
    proj[..., 2 * D + 1] = -30.0
    return proj[..., D:2 * D], proj[..., 2 * D:]


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("bound", ["none", "float", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gates_match_equations(activation, bound, dtype):
    shape = (2, 5, 37)  # 10 rows, 37 channels: neither a multiple of the blocks
    z, f = make(shape, dtype)
    z.requires_grad_(True)
    f.requires_grad_(True)
    gamma = {"none": None, "float": 0.3,
             "tensor": torch.linspace(0.0, 0.9, shape[-1], device=DEVICE).requires_grad_(True)}[bound]
    q, g = hgrn2_gates(z, f, gamma, activation, backend="triton")
    assert q.dtype == g.dtype == dtype and q.shape == g.shape == shape
    assert (g <= 0).all()

    z64 = z.detach().double().cpu().requires_grad_(True)
    f64 = f.detach().double().cpu().requires_grad_(True)
    g64 = gamma.detach().double().cpu().requires_grad_(True) if bound == "tensor" else gamma
    q_ref, g_ref = by_equation(z64, f64, g64, activation)
    tol = TOL[dtype]
    assert rel(q, q_ref) < tol
    assert rel(g, g_ref) < tol

    gen = torch.Generator().manual_seed(1)
    dq = torch.randn(shape, generator=gen, dtype=torch.float64)
    dg = torch.randn(shape, generator=gen, dtype=torch.float64)
    (q.double().cpu() * dq).sum().add((g.double().cpu() * dg).sum()).backward()
    ((q_ref * dq).sum() + (g_ref * dg).sum()).backward()
    assert rel(z.grad, z64.grad) < tol
    assert rel(f.grad, f64.grad) < tol
    if bound == "tensor":
        assert rel(gamma.grad, g64.grad) < tol


def test_reference_path_matches_equations_in_float64():
    z, f = make((3, 4, 9), torch.float64)
    gamma = torch.linspace(0.0, 0.8, 9, dtype=torch.float64, device=DEVICE)
    q, g = hgrn2_gates(z, f, gamma, "silu", backend="reference")
    q_ref, g_ref = by_equation(z, f, gamma, "silu")
    torch.testing.assert_close(q, q_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_near_one_is_accurate():
    """lambda = 1 - 1e-6: log(lambda) ~ -1e-6 keeps its relative accuracy (no cancellation)."""
    f = torch.full((1, 4), 1.0, device=DEVICE)
    gamma = torch.full((4,), 1.0 - 1e-6 / torch.sigmoid(torch.tensor(-1.0)).item(), device=DEVICE)
    gamma = (1 - (1 - gamma))  # keep it as fp32 tensor
    _, g = hgrn2_gates(torch.zeros_like(f), f, gamma, "silu", backend="triton")
    exact = torch.log1p(-(1 - gamma.double()) * torch.sigmoid(-f.double()))
    assert rel(g, exact) < 1e-5


def test_bad_input():
    z = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="activation='relu'"):
        hgrn2_gates(z, z, None, "relu")
    with pytest.raises(ValueError, match=r"same shape"):
        hgrn2_gates(z, torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match=r"lower_bound has shape \(5,\), expected \(4,\)"):
        hgrn2_gates(z, z, torch.zeros(5))


def test_module_gates_take_the_kernel_and_match_the_reference():
    """HGRU2's gates through the kernel equal its reference path (same parameters)."""
    from hgrn_fairseq.modules import HGRU2

    torch.manual_seed(0)
    for variant in ("lm", "lra"):
        fused = HGRU2(16, 4, variant=variant, backend="triton").to(DEVICE)
        plain = HGRU2(16, 4, variant=variant, backend="reference").to(DEVICE)
        plain.load_state_dict(fused.state_dict())
        x = torch.randn(2, 6, 16, device=DEVICE)
        bound = torch.linspace(0.0, 0.5, 16, device=DEVICE)
        for a, b in zip(fused._gates(x, bound), plain._gates(x, bound)):
            assert rel(a, b) < 1e-5


@pytest.mark.parametrize("v_activation", ["none", "silu"])
@pytest.mark.parametrize("bound", ["none", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_gates_match_equations(v_activation, bound, dtype):
    """v, q, log-decay from the whole [..., 3D] projection, and its gradient written whole."""
    shape = (2, 5, 37)
    D = shape[-1]
    gen = torch.Generator().manual_seed(3)
    proj = (3.0 * torch.randn(*shape[:-1], 3 * D, generator=gen)).to(dtype)
    proj[..., 2 * D] = 30.0
    proj[..., 2 * D + 1] = -30.0
    proj = proj.to(DEVICE).requires_grad_(True)
    gamma = None if bound == "none" else torch.linspace(0.0, 0.9, D, device=DEVICE).requires_grad_(True)
    v, q, g = hgrn2_in_gates(proj, gamma, "sigmoid", v_activation, backend="triton")
    assert v.dtype == q.dtype == g.dtype == dtype and v.shape == q.shape == g.shape == shape
    assert v.is_contiguous() and q.is_contiguous() and g.is_contiguous()

    p64 = proj.detach().double().cpu().requires_grad_(True)
    g64 = None if gamma is None else gamma.detach().double().cpu().requires_grad_(True)
    v_pre, z, f = p64[..., :D], p64[..., D:2 * D], p64[..., 2 * D:]
    v_ref = v_pre * torch.sigmoid(v_pre) if v_activation == "silu" else v_pre
    q_ref, g_ref = by_equation(z, f, g64, "sigmoid")
    tol = TOL[dtype]
    assert rel(v, v_ref) < tol and rel(q, q_ref) < tol and rel(g, g_ref) < tol

    gen = torch.Generator().manual_seed(4)
    dv, dq, dg = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    ((v.double().cpu() * dv).sum() + (q.double().cpu() * dq).sum() + (g.double().cpu() * dg).sum()).backward()
    ((v_ref * dv).sum() + (q_ref * dq).sum() + (g_ref * dg).sum()).backward()
    assert proj.grad.shape == proj.shape
    for part in range(3):  # each third of the projection's gradient on its own
        sl = slice(part * D, (part + 1) * D)
        assert rel(proj.grad[..., sl], p64.grad[..., sl]) < tol
    if gamma is not None:
        assert rel(gamma.grad, g64.grad) < tol


def test_in_gates_unused_outputs_and_reference_path():
    """A gradient that reaches only q leaves zeros in v's and f's thirds; the reference path (float64)
    equals the equations."""
    D = 8
    proj = torch.randn(3, 3 * D, device=DEVICE, requires_grad=True)
    _, q, _ = hgrn2_in_gates(proj, 0.2, "silu", "silu", backend="triton")
    q.sum().backward()
    assert (proj.grad[:, :D] == 0).all() and (proj.grad[:, 2 * D:] == 0).all()
    z = proj.detach().double()[:, D:2 * D]
    assert rel(proj.grad[:, D:2 * D], torch.sigmoid(z) * (1 + z * (1 - torch.sigmoid(z)))) < 1e-5

    p64 = torch.randn(2, 4, 3 * D, dtype=torch.float64, device=DEVICE)
    v, q, g = hgrn2_in_gates(p64, 0.2, "silu", "silu", backend="reference")
    q_ref, g_ref = by_equation(p64[..., D:2 * D], p64[..., 2 * D:], 0.2, "silu")
    torch.testing.assert_close(v, p64[..., :D] * torch.sigmoid(p64[..., :D]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(q, q_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_in_gates_bad_input():
    p = torch.zeros(2, 12)
    with pytest.raises(ValueError, match="v_activation='gelu'"):
        hgrn2_in_gates(p, None, "silu", "gelu")
    with pytest.raises(ValueError, match="activation='relu'"):
        hgrn2_in_gates(p, None, "relu")
    with pytest.raises(ValueError, match="proj has 13 channels: need 3 \\* D"):
        hgrn2_in_gates(torch.zeros(2, 13))
    with pytest.raises(ValueError, match=r"lower_bound has shape \(5,\), expected \(4,\)"):
        hgrn2_in_gates(p, torch.zeros(5))


@pytest.mark.parametrize("variant", ["lm", "lra"])
@pytest.mark.parametrize("grid", [None, (2, 3)])
@pytest.mark.parametrize("fuse", [True, False])
def test_module_with_block_ops_matches_reference(variant, grid, fuse):
    """HGRU2 with block_ops (fused in-gates, the fused LayerNorm, the bias-by-product linear; or with
    ``fuse_in_gates`` off, the split path bench_image.py --ab-hgru2 compares with) against the same module
    on its reference path: output and every parameter's gradient."""
    from hgrn_fairseq.modules import HGRU2

    torch.manual_seed(0)
    fused = HGRU2(16, 4, variant=variant, causal=False, backend="triton").to(DEVICE)
    fused.block_ops, fused.fuse_in_gates = True, fuse
    plain = HGRU2(16, 4, variant=variant, causal=False, backend="reference").to(DEVICE)
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(2, 6, 16, device=DEVICE)
    bound = torch.linspace(0.0, 0.5, 16, device=DEVICE)
    y, _ = fused(x, bound, grid=grid)
    y_ref, _ = plain(x, bound, grid=grid)
    assert rel(y, y_ref) < 1e-5
    w = torch.randn_like(y)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    for (name, a), b in zip(fused.named_parameters(), plain.parameters()):
        assert rel(a.grad, b.grad) < 1e-5, name
