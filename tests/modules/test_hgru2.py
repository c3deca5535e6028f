"""HGRU2 against an independent float64 rewrite of the HGRN2 paper's equations; shapes, errors, parameter
count, incremental decoding, and the Triton backend (CPU interpreter) against the reference backend."""
import math
import os

import torch

if not torch.cuda.is_available():  # before triton compiles anything (tests/conftest.py does the same)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hgrn_fairseq.modules import HGRU2, LayerLowerBounds, hgrn2_log_decay  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def lin(layer, x):
    return x @ layer.weight.T + layer.bias


def hgru2_by_hand(m: HGRU2, x, gamma, reverse_too=False):
    """HGRU2 written from the equations, per head and per step, in the dtype of x."""
    B, T, d = x.shape
    e, H = m.expand_ratio, d // m.expand_ratio
    proj = lin(m.in_proj, x)
    v, q, f = proj[..., :d], proj[..., d : 2 * d], proj[..., 2 * d :]
    if m.variant == "lm":
        q = F.silu(q)
    else:
        v, q = F.silu(v), torch.sigmoid(q)
    lam = gamma + (1 - gamma) * torch.sigmoid(f)

    def scan(order):
        out = torch.zeros(B, T, d, dtype=x.dtype)
        for h in range(H):
            sl = slice(h * e, (h + 1) * e)
            S = torch.zeros(B, e, e, dtype=x.dtype)
            for t in order:
                S = lam[:, t, sl, None] * S + (1 - lam[:, t, sl, None]) * v[:, t, None, sl]
                out[:, t, sl] = torch.einsum("bk,bkv->bv", q[:, t, sl], S)
        return out

    o = scan(range(T))
    if reverse_too:
        o = o + scan(range(T - 1, -1, -1))
    o = F.layer_norm(o, (d,), m.norm.weight, m.norm.bias, m.norm.eps)
    return lin(m.out_proj, o)


def test_parameter_count_of_the_wikitext_config():
    m = HGRU2(512, 128, variant="lm")
    assert sum(p.numel() for p in m.parameters()) == 787_968 + 1_024 + 262_656
    assert (m.num_heads, m.head_dim, m.gate_dim) == (4, 128, 512)
    assert m.state_shape(3) == (3, 4, 128, 128)


@pytest.mark.parametrize("variant", ["lm", "lra"])
@pytest.mark.parametrize("causal", [True, False])
def test_matches_equations(variant, causal):
    torch.manual_seed(0)
    m = HGRU2(12, 4, variant=variant, causal=causal, backend="reference").double()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    gamma = torch.rand(12, dtype=torch.float64) * 0.9
    y, state = m(x, gamma)
    assert y.shape == (2, 9, 12) and state is None
    torch.testing.assert_close(y, hgru2_by_hand(m, x, gamma, reverse_too=not causal))


def test_scalar_and_missing_lower_bound():
    torch.manual_seed(1)
    m = HGRU2(8, 2, backend="reference").double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x, 0.3)[0], hgru2_by_hand(m, x, 0.3))
    torch.testing.assert_close(m(x)[0], hgru2_by_hand(m, x, 0.0))
    torch.testing.assert_close(m(x, torch.zeros(8, dtype=torch.float64))[0], hgru2_by_hand(m, x, 0.0))


def test_log_decay_is_stable():
    f = torch.linspace(-200, 200, 2001).double()  # fp32-representable logits
    for gamma in (0.0, 1e-6, 0.3, 0.999):
        g64 = torch.tensor(gamma, dtype=torch.float32).double()  # the bound as the module sees it
        # float64 reference: 1 - lambda = (1 - gamma) sigmoid(-f) exactly; for gamma = 0, logsigmoid
        ref = F.logsigmoid(f) if gamma == 0 else torch.log1p(-(1 - g64) * torch.sigmoid(-f))
        got = hgrn2_log_decay(f.float(), torch.full((2001,), gamma)).double()
        # relative accuracy near lambda = 1 (log lambda tiny) and elsewhere
        assert ((got - ref).abs() <= 1e-5 * ref.abs() + 1e-30)[ref > -80].all(), gamma
        assert (got <= 0).all() and torch.isfinite(got).all()
    # zero bounds (layer 0 of LayerLowerBounds) and extreme logits: finite gradients everywhere
    bounds = LayerLowerBounds(3, 4)
    f = torch.tensor([[-500.0, -50.0, 0.0, 500.0]], requires_grad=True)
    for layer in range(3):
        hgrn2_log_decay(f, bounds()[layer]).sum().backward()
    assert torch.isfinite(f.grad).all() and torch.isfinite(bounds.gamma.grad).all()


def test_bad_inputs():
    with pytest.raises(ValueError, match="expand_ratio=3 must divide dim=512"):
        HGRU2(512, 3)
    with pytest.raises(ValueError, match="variant='gla'"):
        HGRU2(8, 2, variant="gla")
    with pytest.raises(ValueError, match="backend='cuda'"):
        HGRU2(8, 2, backend="cuda")
    with pytest.raises(ValueError, match="expand_ratio=0"):
        HGRU2(8, 0)
    m = HGRU2(8, 2)
    with pytest.raises(ValueError, match=r"expects x of shape \[B, T, 8\], got \(2, 5, 6\)"):
        m(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"initial_state has shape \(2, 4, 2, 3\), expected \(2, 4, 2, 2\)"):
        m(torch.randn(2, 5, 8), None, torch.zeros(2, 4, 2, 3))
    with pytest.raises(ValueError, match="lower_bound has 4 channels, expected 8"):
        m(torch.randn(2, 5, 8), torch.zeros(4))
    with pytest.raises(ValueError, match="bidirectional"):
        HGRU2(8, 2, causal=False)(torch.randn(1, 3, 8), None, None, True)


def run_incrementally(m, x, gamma, pieces):
    state, outs, start = torch.zeros(m.state_shape(x.shape[0]), dtype=x.dtype), [], 0
    for n in pieces:
        y, state = m(x[:, start : start + n], gamma, state, True)
        outs.append(y)
        start += n
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("pieces", [[1] * 11, [4, 1, 6]])
def test_incremental_equals_full_forward(pieces):
    torch.manual_seed(2)
    m = HGRU2(16, 8, backend="reference")
    x, gamma = torch.randn(2, 11, 16), torch.rand(16) * 0.8
    y_full, s_full = m(x, gamma, None, True)
    y_inc, s_inc = run_incrementally(m, x, gamma, pieces)
    torch.testing.assert_close(y_inc, y_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s_inc, s_full, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not INTERPRET, reason="runs the Triton backend on CPU through TRITON_INTERPRET=1")
@pytest.mark.parametrize("causal", [True, False])
def test_triton_backend_matches_reference_backend(causal):
    """The module on backend='triton' (CPU interpreter) against backend='reference': output, final
    state, and the gradients of every parameter and of the input."""
    torch.manual_seed(3)
    ref = HGRU2(32, 16, variant="lm" if causal else "lra", causal=causal, backend="reference")
    tri = HGRU2(32, 16, variant="lm" if causal else "lra", causal=causal, backend="triton")
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(2, 70, 32)
    gamma = torch.rand(32) * 0.5
    s0 = torch.randn(ref.state_shape(2)) if causal else None
    outs = []
    for m in (ref, tri):
        xi = x.clone().requires_grad_()
        y, s = m(xi, gamma, s0, causal)
        loss = y.square().sum() + (s.square().sum() if causal else 0)
        loss.backward()
        outs.append((y, s, xi.grad, {n: p.grad for n, p in m.named_parameters()}))
    (y_r, s_r, dx_r, g_r), (y_t, s_t, dx_t, g_t) = outs
    torch.testing.assert_close(y_t, y_r, rtol=1e-4, atol=1e-4)
    if causal:
        torch.testing.assert_close(s_t, s_r, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dx_t, dx_r, rtol=1e-3, atol=1e-3)
    for name in g_r:
        torch.testing.assert_close(g_t[name], g_r[name], rtol=1e-3, atol=1e-3, msg=name)


@pytest.mark.skipif(not INTERPRET, reason="runs the Triton backend on CPU through TRITON_INTERPRET=1")
@pytest.mark.parametrize("grid", [None, (7, 10)])
def test_accumulate_directions_matches_reference_backend(monkeypatch, grid):
    """HGRU2.accumulate_directions, 1-D and 2-D, against backend='reference': output and every gradient.
    1-D (70 steps, Triton backend in the interpreter): the chunked kernels' adding path ran. 2-D: that the
    grid scan goes through hgrn2_scan_bidirectional, on the reference backend (the interpreter takes
    ~30 s for the rows and columns; on the Triton backend they reach the same kernels as 1-D)."""
    from hgrn_fairseq.kernels import hgrn2_triton
    from hgrn_fairseq.modules import hgru2 as hgru2_module

    added, bidir = [], []
    real_fwd, real_bidir = hgrn2_triton._chunk_fwd, hgru2_module.hgrn2_scan_bidirectional
    monkeypatch.setattr(hgrn2_triton, "_chunk_fwd",
                        lambda *a, **k: added.append(k.get("add_to") is not None) or real_fwd(*a, **k))
    monkeypatch.setattr(hgru2_module, "hgrn2_scan_bidirectional",
                        lambda *a, **k: bidir.append(1) or real_bidir(*a, **k))
    torch.manual_seed(4)
    ref = HGRU2(16, 8, variant="lra", causal=False, backend="reference")
    tri = HGRU2(16, 8, variant="lra", causal=False, backend="reference" if grid else "triton")
    tri.accumulate_directions = True
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(2, 70, 16)
    gamma = torch.rand(16) * 0.5
    outs = []
    for m in (ref, tri):
        xi = x.clone().requires_grad_()
        y, _ = m(xi, gamma, grid=grid)
        y.square().sum().backward()
        outs.append((y, xi.grad, {n: p.grad for n, p in m.named_parameters()}))
    (y_r, dx_r, g_r), (y_t, dx_t, g_t) = outs
    assert len(bidir) == (2 if grid else 1) and (grid is not None or any(added))
    torch.testing.assert_close(y_t, y_r, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dx_t, dx_r, rtol=1e-3, atol=1e-3)
    for name in g_r:
        torch.testing.assert_close(g_t[name], g_r[name], rtol=1e-3, atol=1e-3, msg=name)


@pytest.mark.skipif(not INTERPRET, reason="runs the Triton backend on CPU through TRITON_INTERPRET=1")
def test_triton_backend_incremental():
    torch.manual_seed(4)
    m = HGRU2(16, 8, backend="triton")
    x, gamma = torch.randn(1, 6, 16), torch.rand(16) * 0.8
    y_full, s_full = m(x, gamma, None, True)
    y_inc, s_inc = run_incrementally(m, x, gamma, [1, 1, 3, 1])
    torch.testing.assert_close(y_inc, y_full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_inc, s_full, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="GPU-only (CUDA, TRITON_INTERPRET unset)")
def test_gpu_module_bf16_and_decoding():
    torch.manual_seed(5)
    m = HGRU2(512, 128).cuda()
    x = torch.randn(2, 300, 512, device="cuda")
    gamma = torch.rand(512, device="cuda") * 0.5
    ref = HGRU2(512, 128, backend="reference").cuda()
    ref.load_state_dict(m.state_dict())
    with torch.no_grad():
        y_ref, s_ref = ref(x, gamma, None, True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y, s = m(x, gamma, None, True)
        err = (y.float() - y_ref).norm() / y_ref.norm()
        assert err < 3e-2, err
        # token by token through hgrn2_step equals the full forward (fp32)
        y_full, s_full = m(x[:, :40], gamma, None, True)
        state, outs = torch.zeros(m.state_shape(2), device="cuda"), []
        for t in range(40):
            y_t, state = m(x[:, t : t + 1], gamma, state, True)
            outs.append(y_t)
        # (the full forward's products run in tf32: hence the tolerance)
        torch.testing.assert_close(torch.cat(outs, 1), y_full, rtol=1e-2, atol=1e-2)
        assert math.isfinite(float(s.sum()))
