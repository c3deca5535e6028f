"""The oracle itself, checked against closed forms in complex128 (h_t = sum_s prod a * x_s)."""
import pytest
import torch

from hgrn_fairseq.kernels import (
    complex_scan_reference,
    hgrn2_scan_reference,
    hgru_reference,
    real_scan_reference,
)


def closed_form(x, decay, h0, reverse):
    """h_t = (prod_{r<=t} decay_r) h0 + sum_{s<=t} (prod_{s<r<=t} decay_r) x_s, by dense matrices.

    x, decay: [B, T, D] (complex or real); h0: [B, D]. Reverse runs the same on flipped time.
    """
    if reverse:
        h, last = closed_form(x.flip(1), decay.flip(1), h0, False)
        return h.flip(1), last
    B, T, D = x.shape
    out = torch.zeros_like(x)
    for t in range(T):
        acc = h0 * torch.prod(decay[:, : t + 1], dim=1)
        for s in range(t + 1):
            acc = acc + torch.prod(decay[:, s + 1 : t + 1], dim=1) * x[:, s]
        out[:, t] = acc
    return out, out[:, -1]


@pytest.mark.parametrize("reverse", [False, True])
def test_real_scan_reference_matches_closed_form(reverse):
    torch.manual_seed(0)
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    a = torch.rand(2, 9, 5, dtype=torch.float64)
    h0 = torch.randn(2, 5, dtype=torch.float64)
    h, last = real_scan_reference(x, a, h0, reverse=reverse)
    want, want_last = closed_form(x, a, h0, reverse)
    torch.testing.assert_close(h, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, (want[:, 0] if reverse else want_last), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_complex_scan_reference_matches_complex128_closed_form(reverse):
    torch.manual_seed(1)
    B, T, D = 2, 8, 4
    x = torch.randn(B, T, D, 2, dtype=torch.float64)
    a = torch.rand(B, T, D, dtype=torch.float64)
    theta = torch.randn(D, dtype=torch.float64)
    h0 = torch.randn(B, D, 2, dtype=torch.float64)
    h, last = complex_scan_reference(x, a, theta, h0, reverse=reverse)
    xc, h0c = torch.view_as_complex(x), torch.view_as_complex(h0)
    decay = a * torch.exp(1j * theta)
    want, _ = closed_form(xc, decay, h0c, reverse)
    torch.testing.assert_close(torch.view_as_complex(h.contiguous()), want, rtol=1e-12, atol=1e-12)
    edge = want[:, 0] if reverse else want[:, -1]
    torch.testing.assert_close(torch.view_as_complex(last.contiguous()), edge, rtol=1e-12, atol=1e-12)


def test_hgru_reference_gates():
    torch.manual_seed(2)
    f = torch.randn(1, 6, 3, dtype=torch.float64)
    i = torch.randn(1, 6, 3, 2, dtype=torch.float64)
    theta = torch.rand(3, dtype=torch.float64)
    gamma = torch.tensor([0.0, 0.3, 0.9], dtype=torch.float64)
    h, _ = hgru_reference(f, i, theta, gamma)
    lam = gamma + (1 - gamma) / (1 + torch.exp(-f))
    c = torch.view_as_complex(i * torch.sigmoid(i))
    want, _ = closed_form((1 - lam) * c, lam * torch.exp(1j * theta), torch.zeros(1, 3, dtype=c.dtype), False)
    torch.testing.assert_close(torch.view_as_complex(h.contiguous()), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="need theta"):
        hgru_reference(f, i, None)
    with pytest.raises(ValueError, match="take no theta"):
        hgru_reference(f, i[..., 0], theta)


@pytest.mark.parametrize("reverse", [False, True])
def test_hgrn2_reference_matches_attention_form(reverse):
    """o_t = sum_s q_t . (prod_{s<r<=t} lambda_r * (1 - lambda_s)) v_s  (+ the decayed initial state)."""
    torch.manual_seed(3)
    B, T, H, K, V = 1, 7, 2, 3, 4
    q = torch.randn(B, T, H, K, dtype=torch.float64)
    v = torch.randn(B, T, H, V, dtype=torch.float64)
    g = -torch.rand(B, T, H, K, dtype=torch.float64) * 2
    S0 = torch.randn(B, H, K, V, dtype=torch.float64)
    o, S = hgrn2_scan_reference(q, v, g, S0, reverse=reverse)
    if reverse:
        q, v, g = q.flip(1), v.flip(1), g.flip(1)
    lam, k = torch.exp(g), 1 - torch.exp(g)
    want = torch.zeros(B, T, H, V, dtype=torch.float64)
    for t in range(T):
        decay0 = torch.prod(lam[:, : t + 1], dim=1)  # [B, H, K]
        want[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * decay0, S0)
        for s in range(t + 1):
            w = torch.prod(lam[:, s + 1 : t + 1], dim=1) * k[:, s]
            want[:, t] += torch.einsum("bhk,bhk->bh", q[:, t], w).unsqueeze(-1) * v[:, s]
    if reverse:
        want = want.flip(1)
    torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-12)
    final = torch.prod(lam, dim=1).unsqueeze(-1) * S0 + sum(
        (torch.prod(lam[:, s + 1 :], dim=1) * k[:, s]).unsqueeze(-1) * v[:, s].unsqueeze(-2) for s in range(T)
    )
    torch.testing.assert_close(S, final, rtol=1e-12, atol=1e-12)
