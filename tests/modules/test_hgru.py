"""HGRU, lower bounds, GLU and the block, against an independent complex128 rewrite of the HGRN
paper's equations."""
import math

import pytest
import torch
import torch.nn.functional as F

from hgrn_fairseq.modules import GLU, HGRU, LayerLowerBounds, theta_init
from hgrn_fairseq.modules.block import HgrnBlock, build_token_mixer


def lin(layer, x):
    return x @ layer.weight.T + layer.bias


def hgru_projections(m: HGRU, x):
    """W_in x, W_f x, W_g x: ``in_proj`` stacks W_in's rows, then W_f's, then W_g's."""
    weights = m.in_proj.weight.split(m.projection_sizes)
    biases = m.in_proj.bias.split(m.projection_sizes)
    return [x @ w.T + b for w, b in zip(weights, biases)]


def hgru_by_hand(m: HGRU, x, gamma):
    """The HGRU in complex128, written from the paper's equations, not from the module's code path."""
    B, T, d = x.shape
    pre_c, pre_f, pre_g = hgru_projections(m, x)
    c = F.silu(pre_c)
    lam = gamma + (1 - gamma) * torch.sigmoid(pre_f)
    gate = F.silu(pre_g)

    def run(theta, reverse):
        if m.complex:
            cc = torch.complex(c[..., 0::2], c[..., 1::2])  # interleaved re/im channels
            rot = torch.exp(1j * theta)
        else:
            cc, rot = c, 1.0
        h = torch.zeros(B, m.state_dim, dtype=cc.dtype)
        out = torch.zeros(B, T, m.state_dim, dtype=cc.dtype)
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            h = lam[:, t] * rot * h + (1 - lam[:, t]) * cc[:, t]
            out[:, t] = h
        return out

    h = run(m.theta if m.complex else None, False)
    if not m.causal:
        h = h + run(m.theta_reverse if m.complex else None, True)
    feat = torch.stack([h.real, h.imag], dim=-1).reshape(B, T, 2 * m.state_dim) if m.complex else h
    ln = lambda z: F.layer_norm(z, (z.shape[-1],), m.norm.weight, m.norm.bias, m.norm.eps)
    y = ln(feat) * gate if m.norm_before_gate else ln(feat * gate)
    return lin(m.out_proj, y)


def randomise(module):
    torch.manual_seed(5)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(norm_before_gate=False),
        dict(causal=False),
        dict(complex=False),
        dict(complex=False, state_dim=12),
        dict(complex=False, causal=False),
    ],
)
def test_hgru_matches_equations(kwargs):
    d = 6
    m = HGRU(d, backend="reference", **kwargs).double()
    randomise(m)
    x = torch.randn(2, 11, d, dtype=torch.float64)
    gamma = torch.linspace(0.1, 0.7, m.gate_dim, dtype=torch.float64)
    y, state = m(x, gamma)
    assert state is None and y.shape == x.shape
    torch.testing.assert_close(y, hgru_by_hand(m, x, gamma), rtol=1e-10, atol=1e-10)


def test_norm_order_flag_changes_the_function():
    x = torch.randn(1, 5, 4, dtype=torch.float64)
    a = HGRU(4, norm_before_gate=True).double()
    b = HGRU(4, norm_before_gate=False).double()
    b.load_state_dict(a.state_dict())
    assert not torch.allclose(a(x)[0], b(x)[0])


def test_theta_init_and_parameter_shapes():
    torch.testing.assert_close(theta_init(4), torch.tensor([1.0, 10000 ** -0.5, 10000 ** -1.0, 10000 ** -1.5],
                                                           dtype=torch.float64))
    m = HGRU(8, causal=False)
    assert m.theta.shape == m.theta_reverse.shape == (8,)
    assert m.projection_sizes == (16, 8, 16) and m.in_proj.out_features == 40 and m.out_proj.in_features == 16
    r = HGRU(8, complex=False, state_dim=16)
    assert not hasattr(r, "theta") and r.projection_sizes == (16, 16, 16) and r.gate_dim == 16


@pytest.mark.parametrize("complex_", [True, False])
def test_state_carried_across_chunks_equals_whole_sequence(complex_):
    torch.manual_seed(0)
    m = HGRU(5, complex=complex_).double()
    x = torch.randn(3, 13, 5, dtype=torch.float64)
    whole, last = m(x, 0.2, output_final_state=True)
    first, s = m(x[:, :6], 0.2, output_final_state=True)
    second, s2 = m(x[:, 6:], 0.2, initial_state=s, output_final_state=True)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2, last, rtol=1e-12, atol=1e-12)
    assert tuple(last.shape) == m.state_shape(3)


def test_hgru_bad_inputs():
    with pytest.raises(ValueError, match="state_dim=12"):
        HGRU(6, complex=True, state_dim=12)
    with pytest.raises(ValueError, match="backend='cuda'"):
        HGRU(6, backend="cuda")
    m = HGRU(6)
    with pytest.raises(ValueError, match=r"expects x of shape \[B, T, 6\]"):
        m(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match=r"initial_state has shape \(2, 6\), expected \(2, 6, 2\)"):
        m(torch.randn(2, 3, 6), initial_state=torch.zeros(2, 6))
    with pytest.raises(ValueError, match="lower_bound has 4 channels, expected 6"):
        m(torch.randn(2, 3, 6), lower_bound=torch.zeros(4))
    with pytest.raises(ValueError, match="bidirectional"):
        HGRU(6, causal=False)(torch.randn(1, 3, 6), output_final_state=True)


def test_lower_bounds_layer0_zero_monotone_and_k_over_L_at_init():
    lb = LayerLowerBounds(4, 3)
    bounds = lb()
    torch.testing.assert_close(bounds, torch.arange(4.0).unsqueeze(1).expand(4, 3) / 4)
    with torch.no_grad():
        lb.gamma.normal_()
    bounds = lb()
    assert torch.all(bounds[0] == 0)
    assert torch.all(bounds[1:] >= bounds[:-1]) and torch.all(bounds < 1)
    p = torch.softmax(lb.gamma, 0)  # the LRA form: gamma_k = sum_{i<k} ... after removing P_0
    torch.testing.assert_close(bounds[2], p[1] + p[2])
    bounds.sum().backward()
    assert lb.gamma.grad is not None and torch.isfinite(lb.gamma.grad).all()


def test_lower_bounds_switch_off():
    lb = LayerLowerBounds(3, 2, enabled=False)
    assert list(lb.parameters()) == [] and torch.all(lb() == 0) and lb().shape == (3, 2)
    with pytest.raises(ValueError, match="num_layers=-1"):
        LayerLowerBounds(-1, 2)


@pytest.mark.parametrize("activation", ["none", "silu"])
def test_glu(activation):
    torch.manual_seed(0)
    g = GLU(4, 7, activation=activation).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    w1, w2 = g.in_proj.weight.split(7)  # in_proj holds W1's rows, then W2's
    b1, b2 = g.in_proj.bias.split(7)
    h1 = x @ w1.T + b1
    h1 = h1 if activation == "none" else h1 * torch.sigmoid(h1)
    torch.testing.assert_close(g(x), lin(g.out_proj, h1 * (x @ w2.T + b2)))
    assert sum(p.numel() for p in g.parameters()) == 2 * (4 * 7 + 7) + 7 * 4 + 4
    with pytest.raises(ValueError, match="activation='tanhh'"):
        GLU(4, 7, activation="tanhh")
    with pytest.raises(ValueError, match="align='gpu'"):
        GLU(4, 7, align="gpu")


@pytest.mark.parametrize("activation", ["none", "sigmoid"])
def test_glu_padding_to_aligned_width_is_exact(activation):
    """The zero-padded products (hidden 7 -> 8) give the same output and parameter gradients."""
    torch.manual_seed(0)
    padded = GLU(4, 7, activation=activation, align="always").double()
    plain = GLU(4, 7, activation=activation, align="never").double()
    plain.load_state_dict(padded.state_dict())
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    y_pad, y = padded(x), plain(x)
    torch.testing.assert_close(y_pad, y, rtol=1e-12, atol=1e-12)
    y_pad.square().sum().backward()
    y.square().sum().backward()
    for (name, p), q in zip(padded.named_parameters(), plain.parameters()):
        assert p.grad.shape == p.shape, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)


def test_block_is_prenorm_residual():
    torch.manual_seed(0)
    block = HgrnBlock(build_token_mixer("hgru", 6), 6, 12, dropout=0.0).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    y, _ = block(x, 0.3)
    mid = x + block.mixer(block.mixer_norm(x), 0.3)[0]
    torch.testing.assert_close(y, mid + block.glu(block.glu_norm(mid)))
    no_mlp = HgrnBlock(build_token_mixer("hgru", 6), 6, 0)
    assert no_mlp.glu is None
    with pytest.raises(ValueError, match="token mixer 'lstm'"):
        build_token_mixer("lstm", 6)


def test_gradients_reach_every_parameter():
    m = HGRU(4, causal=False)
    lb = LayerLowerBounds(2, 4)
    with torch.no_grad():
        lb.gamma.normal_()
    y, _ = m(torch.randn(2, 6, 4), lb()[1])
    y.square().sum().backward()
    for name, p in list(m.named_parameters()) + [("gamma", lb.gamma)]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.integration
@pytest.mark.parametrize("mixer", ["hgru", "hgru2"])
def test_compiled_block_matches_eager(monkeypatch, mixer):
    """compile='train' (torch.compile around our kernels, which stay eager behind a graph break)
    gives the eager block's output and gradients; evaluation and stateful calls stay eager."""
    monkeypatch.setenv("HGRN_COMPILE_BACKEND", "aot_eager")  # no C compiler needed on CPU
    torch._dynamo.reset()
    torch.manual_seed(0)
    kwargs = {"expand_ratio": 4} if mixer == "hgru2" else {}
    eager = HgrnBlock(build_token_mixer(mixer, 8, **kwargs), 8, 12, dropout=0.0)
    compiled = HgrnBlock(build_token_mixer(mixer, 8, **kwargs), 8, 12, dropout=0.0, compile="train")
    compiled.load_state_dict(eager.state_dict())
    bound = torch.linspace(0.0, 0.5, 8)
    x = torch.randn(2, 5, 8)
    y_e, _ = eager(x, bound)
    y_c, _ = compiled(x, bound)
    assert "_compiled_forward" in compiled.__dict__
    torch.testing.assert_close(y_c, y_e, rtol=1e-5, atol=1e-6)
    y_e.square().sum().backward()
    y_c.square().sum().backward()
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    compiled.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, bound)[0], eager.eval()(x, bound)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="compile='always'"):
        HgrnBlock(build_token_mixer(mixer, 8, **kwargs), 8, 12, compile="always")


def test_old_checkpoints_with_separate_projections_load():
    """State dicts from before the stacked projections (HGRU input/forget/gate_proj, GLU l1/l2/l3)
    are upgraded the way fairseq's upgrade_state_dict_named does on load."""
    torch.manual_seed(0)
    block = HgrnBlock(build_token_mixer("hgru", 4), 4, 6, dropout=0.0).double()
    old = {}
    for key, value in block.state_dict().items():
        if key.startswith("mixer.in_proj."):
            suffix = key.rsplit(".", 1)[1]
            for part, chunk in zip(("input_proj", "forget_proj", "gate_proj"),
                                   value.split(block.mixer.projection_sizes)):
                old[f"layers.0.mixer.{part}.{suffix}"] = chunk.clone()
        elif key.startswith("glu.in_proj."):
            suffix = key.rsplit(".", 1)[1]
            for part, chunk in zip(("l1", "l2"), value.chunk(2)):
                old[f"layers.0.glu.{part}.{suffix}"] = chunk.clone()
        elif key.startswith("glu.out_proj."):
            old["layers.0.glu.l3." + key.rsplit(".", 1)[1]] = value.clone()
        else:
            old["layers.0." + key] = value.clone()
    block.mixer.upgrade_state_dict_named(old, "layers.0.mixer")
    block.glu.upgrade_state_dict_named(old, "layers.0.glu")
    fresh = HgrnBlock(build_token_mixer("hgru", 4), 4, 6, dropout=0.0).double()
    fresh.load_state_dict({k[len("layers.0."):]: v for k, v in old.items()})
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(fresh(x, 0.2)[0], block(x, 0.2)[0])
