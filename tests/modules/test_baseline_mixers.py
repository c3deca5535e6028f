"""LRU, MLGRU and BitLinear against float64 loops of their equations, written here
independently of the modules (complex numbers as Python complex tensors, one step at a time)."""
import math

import pytest
import torch

from hgrn_fairseq.modules.bitlinear import BitLinear, int8_activations, ternary_weight
from hgrn_fairseq.modules.lru import LRU, lru_parameter_groups
from hgrn_fairseq.modules.mlgru import MLGRU

B, T, D = 2, 9, 6


def test_lru_equals_the_loop_outputs_state_and_gradients():
    torch.manual_seed(0)
    m = LRU(D, 5, r_min=0.5, r_max=0.95, max_phase=math.pi).double()
    u = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, 5, 2, dtype=torch.float64)
    y, final = m(u, None, h0, True)
    y_ref, final_ref = lru_loop(m, u, h0)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(final, final_ref)
    g = torch.randn_like(y)
    params = [u, m.nu_log, m.theta_log, m.gamma_log, m.in_proj.weight, m.out_proj.weight, m.D]
    grads = torch.autograd.grad((y * g).sum(), params)
    grads_ref = torch.autograd.grad((y_ref * g).sum(), params)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


def test_lru_ring_initialisation():
    torch.manual_seed(1)
    m = LRU(16, 4096, r_min=0.9, r_max=0.999, max_phase=math.pi / 10)
    magnitude, phase = m.magnitude_and_phase()
    assert magnitude.min() >= 0.9 - 1e-5 and magnitude.max() <= 0.999 + 1e-5
    assert phase.min() >= 0 and phase.max() <= math.pi / 10 + 1e-6
    assert magnitude.max() - magnitude.min() > 0.05  # spread over the ring, not one value
    torch.testing.assert_close(torch.exp(m.gamma_log), torch.sqrt(1 - magnitude**2), rtol=1e-4, atol=1e-6)
    assert m.gamma_log.requires_grad
    assert m.in_proj.weight.std().item() == pytest.approx((1 / 32) ** 0.5, rel=0.1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(r_min=0.9, r_max=0.9), "need 0 <= r_min < r_max <= 1"),
    (dict(r_min=0.5, r_max=1.5), "need 0 <= r_min < r_max <= 1"),
    (dict(max_phase=0.0), "max_phase=0.0 must be in"),
])
def test_lru_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LRU(4, 4, **kwargs)
    with pytest.raises(ValueError, match="state_dim=0 must be >= 1"):
        LRU(4, 0)


def test_lru_refuses_a_lower_bound_and_groups_its_slow_parameters():
    m = LRU(4, 3)
    with pytest.raises(ValueError, match="no forget gate"):
        m(torch.randn(1, 2, 4), torch.full((3,), 0.5))
    slow, rest = lru_parameter_groups(torch.nn.Sequential(m))
    assert {id(p) for p in slow} == {id(m.nu_log), id(m.theta_log), id(m.gamma_log), id(m.in_proj.weight)}
    assert {id(p) for p in rest} == {id(m.out_proj.weight), id(m.D)}


def test_mlgru_ternary_switches():
    assert [type(p).__name__ for p in (MLGRU(8, ternary=True).forget_proj, MLGRU(8, ternary=True).input_proj,
                                       MLGRU(8, ternary=True).gate_proj, MLGRU(8, ternary=True).out_proj)] == \
        ["BitLinear", "BitLinear", "Linear", "Linear"]
    full = MLGRU(8, fully_mml=True)
    assert all(isinstance(p, BitLinear) for p in (full.forget_proj, full.input_proj, full.gate_proj, full.out_proj))
    lru = LRU(8, 4, ternary=True)
    assert isinstance(lru.in_proj, BitLinear) and not isinstance(lru.out_proj, BitLinear)
    assert isinstance(LRU(8, 4, fully_mml=True).out_proj, BitLinear)
    with pytest.raises(ValueError, match="num_heads=3 must be >= 1 and divide dim=8"):
        MLGRU(8, num_heads=3)


def test_bitlinear_weights_are_ternary_and_gradients_straight_through(monkeypatch):
    torch.manual_seed(3)
    layer = BitLinear(16, 8).double()
    w = layer.weight.detach()
    q = ternary_weight(w)
    scale = w.abs().mean()
    assert set((q / scale).round().unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert len(torch.unique(q)) == 3  # exactly three values per tensor
    torch.testing.assert_close(q, ((w / scale).round().clamp(-1, 1)) * scale)
    x = torch.randn(4, 5, 16, dtype=torch.float64)
    a = int8_activations(x)
    s = 127 / x.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(a, (x * s).round().clamp(-128, 127) / s)
    assert ((a * s).round() - a * s).abs().max() < 1e-9  # integers on the 8-bit grid
    # what reaches the matmul is exactly the quantised tensor (no rounding left by the straight-through
    # trick), in float32 too: three weight values per tensor
    layer32 = BitLinear(16, 8)
    eff = layer32.quantised_weight().detach()
    assert torch.equal(eff, ternary_weight(layer32.weight.detach())) and len(torch.unique(eff)) == 3
    seen, plain_linear = [], torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda inp, *rest: seen.append(inp.detach()) or plain_linear(inp, *rest))
    layer32(x.float())
    monkeypatch.undo()
    assert torch.equal(seen[0], int8_activations(layer32.norm(x.float()).detach()))

    # forward: RMSNorm, quantised activations and weights; backward: each quantiser's derivative is the
    # identity (straight through), so dL/dW = g^T x_q, dL/db = sum g, dL/d(normed x) = g W_q
    xr = x.clone().requires_grad_(True)
    y = layer(xr)
    normed = layer.norm(xr)
    xq = int8_activations(normed.detach())
    torch.testing.assert_close(y, xq @ q.T + layer.bias)
    g = torch.randn_like(y)
    got_x, got_w, got_b = torch.autograd.grad((y * g).sum(), [xr, layer.weight, layer.bias])
    torch.testing.assert_close(got_w, g.reshape(-1, 8).T @ xq.reshape(-1, 16))
    torch.testing.assert_close(got_b, g.reshape(-1, 8).sum(0))
    want_x, = torch.autograd.grad(normed, xr, grad_outputs=g @ q)
    torch.testing.assert_close(got_x, want_x)


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="runs the Triton scans through TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)")
@pytest.mark.parametrize("make", [lambda b: LRU(D, 5, r_min=0.4, backend=b), lambda b: MLGRU(D, backend=b),
                                  lambda b: LRU(D, 5, causal=False, backend=b)])
def test_triton_scans_match_the_reference(make):
    torch.manual_seed(4)
    ref = make("reference")
    tri = make("triton")
    tri.load_state_dict(ref.state_dict())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref, tri = ref.to(device), tri.to(device)
    x = torch.randn(B, T, D, device=device, requires_grad=True)
    bound = None if isinstance(ref, LRU) else torch.rand(D, device=device, requires_grad=True)
    y_ref = ref(x, bound)[0]
    y_tri = tri(x, bound)[0]
    torch.testing.assert_close(y_tri, y_ref, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(y_ref)
    extra = [x] if bound is None else [x, bound]  # the layer's lower bound is trained too
    for a, b in zip(torch.autograd.grad((y_tri * g).sum(), extra + list(tri.parameters())),
                    torch.autograd.grad((y_ref * g).sum(), extra + list(ref.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ---- the ternary (matmul-free) variants and the bidirectional LRU against float64 loops ----------------
# The quantisers are written again here from the equations (RMSNorm, 8-bit absmax per token, ternary
# absmean per tensor), each passing its gradient straight through, so that the loops below give the
# forward and the straight-through backward the modules should have.

def _st(v, q):
    return v + (q - v).detach()


def bitlinear_equation(layer, v):
    """RMSNorm(v) -> 8-bit absmax per token -> ternary absmean weights, straight-through; ``[..., in]``."""
    normed = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + layer.norm.eps) * layer.norm.weight.double()
    s_x = 127.0 / normed.detach().abs().amax(-1, keepdim=True)
    vq = _st(normed, torch.clamp(torch.round(normed.detach() * s_x), -128, 127) / s_x)
    w = layer.weight.double()
    m_w = w.detach().abs().mean()
    wq = _st(w, torch.clamp(torch.round(w.detach() / m_w), -1, 1) * m_w)
    out = vq @ wq.T
    return out if layer.bias is None else out + layer.bias.double()


def plain_or_bit(layer, v):
    if isinstance(layer, BitLinear):
        return bitlinear_equation(layer, v)
    out = v @ layer.weight.double().T
    return out if layer.bias is None else out + layer.bias.double()


def lru_loop(m: LRU, u, h0=None):
    """The LRU's equations with B, C (and D when fully_mml) through ``plain_or_bit``; both directions
    summed when the module is not causal (each direction's state includes the current step)."""
    lam = torch.exp(-torch.exp(m.nu_log.double()) + 1j * torch.exp(m.theta_log.double()))
    gamma = torch.exp(m.gamma_log.double())
    Bsz, T, _ = u.shape
    bu = plain_or_bit(m.in_proj, u).view(Bsz, T, m.state_dim, 2)
    bu = torch.complex(bu[..., 0], bu[..., 1])

    def run(order, x):
        states = [None] * T
        for k in order:
            x = lam * x + gamma * bu[:, k]
            states[k] = x
        return states, x

    zero = torch.zeros(Bsz, m.state_dim, dtype=torch.complex128)
    fwd, last = run(range(T), zero if h0 is None else torch.complex(h0[..., 0], h0[..., 1]))
    if not m.causal:
        bwd, _ = run(range(T - 1, -1, -1), zero)
        fwd = [a + b for a, b in zip(fwd, bwd)]
    h = torch.stack([torch.stack([x.real, x.imag], -1).flatten(-2) for x in fwd], 1)  # [B, T, 2N]: Re, Im
    d = m.D.double()
    if m.fully_mml:
        m_d = d.detach().abs().mean()
        d = _st(d, torch.clamp(torch.round(d.detach() / m_d), -1, 1) * m_d)
    return plain_or_bit(m.out_proj, h) + d * u, torch.stack([last.real, last.imag], -1)


@pytest.mark.parametrize("kwargs, T_", [(dict(ternary=True), 9), (dict(fully_mml=True), 9), (dict(fully_mml=True), 1),
                                        (dict(causal=False), 7), (dict(), 1)])
def test_lru_variants_equal_the_loop(kwargs, T_):
    torch.manual_seed(5)
    m = LRU(D, 5, r_min=0.3, r_max=0.9, **kwargs).double()
    u = torch.randn(B, T_, D, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, 5, 2, dtype=torch.float64) if m.causal else None
    y, final = m(u, None, h0, m.causal)  # a bidirectional mixer carries no state
    y_ref, final_ref = lru_loop(m, u, h0)
    torch.testing.assert_close(y, y_ref)
    if m.causal:
        torch.testing.assert_close(final, final_ref)
    g = torch.randn_like(y)
    params = [u] + list(m.parameters())
    for name, a, b in zip(["u"] + [n for n, _ in m.named_parameters()], torch.autograd.grad((y * g).sum(), params),
                          torch.autograd.grad((y_ref * g).sum(), params)):
        torch.testing.assert_close(a, b, msg=lambda s, name=name: f"{name}: {s}")


def mlgru_loop(m: MLGRU, x, gamma, h0):
    h, ys = h0.clone(), []
    for t in range(x.shape[1]):
        f = gamma + (1 - gamma) * torch.sigmoid(plain_or_bit(m.forget_proj, x[:, t]))
        c = torch.nn.functional.silu(plain_or_bit(m.input_proj, x[:, t]))
        g = torch.sigmoid(plain_or_bit(m.gate_proj, x[:, t]))
        h = f * h + (1 - f) * c
        ys.append(plain_or_bit(m.out_proj, g * h))
    return torch.stack(ys, 1), h


@pytest.mark.parametrize("kwargs, T_", [(dict(num_heads=2), 9), (dict(ternary=True), 9), (dict(fully_mml=True), 9),
                                        (dict(), 1)])
def test_mlgru_variants_equal_the_loop(kwargs, T_):
    torch.manual_seed(6)
    m = MLGRU(D, **kwargs).double()
    x = torch.randn(B, T_, D, dtype=torch.float64, requires_grad=True)
    gamma = torch.rand(D, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, D, dtype=torch.float64)
    y, final = m(x, gamma, h0, True)
    y_ref, final_ref = mlgru_loop(m, x, gamma, h0)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(final, final_ref)
    g = torch.randn_like(y)
    params = [x, gamma] + list(m.parameters())
    for a, b in zip(torch.autograd.grad((y * g).sum(), params), torch.autograd.grad((y_ref * g).sum(), params)):
        torch.testing.assert_close(a, b)


def test_mlgru_without_a_bound_and_bad_sizes():
    torch.manual_seed(7)
    m = MLGRU(D).double()
    x = torch.randn(B, 4, D, dtype=torch.float64)
    torch.testing.assert_close(m(x)[0], mlgru_loop(m, x, 0.0, torch.zeros(B, D, dtype=torch.float64))[0])
    with pytest.raises(ValueError, match="MLGRU: dim=0 must be >= 1"):
        MLGRU(0)
    with pytest.raises(ValueError, match="LRU: dim=0 and state_dim=3 must be >= 1"):
        LRU(0, 3)


def test_ternary_effective_weights_of_the_mml_mixers_take_three_values():
    torch.manual_seed(8)
    for layer in [LRU(8, 4, fully_mml=True).in_proj, LRU(8, 4, fully_mml=True).out_proj,
                  MLGRU(8, fully_mml=True).gate_proj, MLGRU(8, ternary=True).forget_proj]:
        q = layer.quantised_weight().detach()
        m_w = layer.weight.detach().abs().mean()
        assert sorted(torch.unique(q).tolist()) == pytest.approx([-m_w.item(), 0.0, m_w.item()], rel=1e-5)


def test_lru_decay_stays_float32_for_bf16_parameters(monkeypatch):
    """In bf16, exp(-exp(nu_log)) would round every |lambda| above ~0.998 to exactly 1.0."""
    import hgrn_fairseq.modules.lru as lru_module

    torch.manual_seed(9)
    m = LRU(D, 64, r_min=0.999, r_max=0.9999)
    m.bfloat16()
    seen, scan = [], lru_module.complex_scan
    monkeypatch.setattr(lru_module, "complex_scan", lambda x, a, theta, *rest: seen.append((a, theta)) or scan(x, a, theta, *rest))
    y, final = m(torch.randn(B, 3, D, dtype=torch.bfloat16), None, None, True)
    assert y.dtype == final.dtype == torch.bfloat16
    a, theta = seen[0]
    assert a.dtype == theta.dtype == torch.float32
    want = torch.exp(-torch.exp(m.nu_log.double()))
    assert want.max() < 1.0 and (want.to(torch.bfloat16) == 1.0).any()  # what bf16 would have made of it
    torch.testing.assert_close(a[0, 0].double(), want, rtol=0, atol=1e-7)


def _bf16_against_float64(make, loop, bound):
    """A bf16 module on CUDA against the float64 loop of the same (bf16) parameters, T = 512."""
    torch.manual_seed(10)
    m = make().cuda().bfloat16()
    ref = make().double()
    ref.load_state_dict({k: v.double().cpu() for k, v in m.state_dict().items()})
    x = torch.randn(2, 512, D, device="cuda").bfloat16()
    y = m(x, None if bound is None else bound.cuda().bfloat16())[0]
    y.float().square().mean().backward()  # the scans' backward with a float32 decay and bf16 inputs
    assert all(p.grad is not None and p.grad.dtype == p.dtype and bool(p.grad.isfinite().all()) for p in m.parameters())
    y_ref = loop(ref, x.double().cpu(), None if bound is None else bound.bfloat16().double())
    return ((y.detach().double().cpu() - y_ref).norm() / y_ref.norm()).item()


@pytest.mark.gpu
@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
                    reason="GPU-only (CUDA, TRITON_INTERPRET unset)")
def test_gpu_bf16_decays_near_one_keep_forgetting():
    def make_mlgru():
        m = MLGRU(D)
        with torch.no_grad():
            m.forget_proj.bias.fill_(7.0)  # f ~ 0.999: exactly 1.0 if the gate were stored in bf16
            m.out_proj.bias.zero_()  # (so that the output is all recurrence)
        return m

    def make_lru():
        m = LRU(D, 32, r_min=0.999, r_max=0.9999)  # every |lambda| would be 1.0 in bf16
        with torch.no_grad():
            m.D.zero_()  # (so that the output is all recurrence)
        return m

    # (bf16 logits and projections cost ~1%; a gate or decay rounded to 1.0 would cost ~100%)
    err = _bf16_against_float64(make_mlgru, lambda r, x, g: mlgru_loop(r, x, g, torch.zeros(2, D, dtype=torch.float64))[0],
                                torch.rand(D) * 0.5)
    assert err < 5e-2, f"MLGRU bf16 relative error {err:.3g}"
    err = _bf16_against_float64(make_lru, lambda r, x, g: lru_loop(r, x)[0], None)
    assert err < 5e-2, f"LRU bf16 relative error {err:.3g}"
