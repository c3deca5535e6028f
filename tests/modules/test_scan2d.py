"""The 2-D grid scans, padding masks, masked batch norms and drop-path of the shared blocks, against
float64 / complex128 loops written here from the papers' equations (rows and columns walked cell by cell)."""
import pytest
import torch
import torch.nn.functional as F

from hgrn_fairseq.modules import HGRU
from hgrn_fairseq.modules.block import HgrnBlock, build_token_mixer
from hgrn_fairseq.modules.hgru2 import HGRU2
from hgrn_fairseq.modules.norms import MaskedBatchNorm, build_norm
from hgrn_fairseq.modules.scan2d import Series2D

from .test_hgru import hgru_projections, lin, randomise


def grid_walks(H, W):
    """The eight walks of the four-direction scan: every row left-to-right and right-to-left, every
    column top-to-bottom and bottom-to-top, as lists of raster indices, tagged forward / reverse."""
    walks = []
    for r in range(H):
        cells = [r * W + c for c in range(W)]
        walks += [(cells, False), (cells[::-1], True)]
    for c in range(W):
        cells = [r * W + c for r in range(H)]
        walks += [(cells, False), (cells[::-1], True)]
    return walks


def hgru_2d_by_hand(m: HGRU, x, gamma, grid):
    B, T, d = x.shape
    pre_c, pre_f, pre_g = hgru_projections(m, x)
    c = F.silu(pre_c)
    lam = gamma + (1 - gamma) * torch.sigmoid(pre_f)
    cc = torch.complex(c[..., 0::2], c[..., 1::2])
    h_sum = torch.zeros(B, T, d, dtype=cc.dtype)
    for cells, reverse in grid_walks(*grid):
        rot = torch.exp(1j * (m.theta_reverse if reverse else m.theta))
        h = torch.zeros(B, d, dtype=cc.dtype)
        for t in cells:
            h = lam[:, t] * rot * h + (1 - lam[:, t]) * cc[:, t]
            h_sum[:, t] += h
    feat = torch.stack([h_sum.real, h_sum.imag], dim=-1).reshape(B, T, 2 * d)
    y = F.layer_norm(feat, (2 * d,), m.norm.weight, m.norm.bias, m.norm.eps) * F.silu(pre_g)
    return lin(m.out_proj, y)


def hgru2_2d_by_hand(m: HGRU2, x, gamma, grid):
    B, T, d = x.shape
    v, q, f = lin(m.in_proj, x).chunk(3, dim=-1)
    v, q = F.silu(v), torch.sigmoid(q)  # the LRA variant
    lam = gamma + (1 - gamma) * torch.sigmoid(f)
    Hh, e = m.num_heads, m.head_dim
    v, q, lam = (t.reshape(B, T, Hh, e) for t in (v, q, lam))
    o = torch.zeros(B, T, Hh, e, dtype=x.dtype)
    for cells, _ in grid_walks(*grid):
        S = torch.zeros(B, Hh, e, e, dtype=x.dtype)
        for t in cells:
            S = lam[:, t, :, :, None] * S + (1 - lam[:, t, :, :, None]) * v[:, t, :, None, :]
            o[:, t] += torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    o = o.reshape(B, T, d)
    return lin(m.out_proj, F.layer_norm(o, (d,), m.norm.weight, m.norm.bias, m.norm.eps))


@pytest.mark.parametrize("grid", [(3, 4), (1, 5), (4, 1)])
def test_hgru_grid_scan_equals_the_eight_walks(grid):
    d = 4
    m = HGRU(d, causal=False, backend="reference").double()
    randomise(m)
    x = torch.randn(2, grid[0] * grid[1], d, dtype=torch.float64)
    gamma = torch.linspace(0.1, 0.6, d, dtype=torch.float64)
    y, state = m(x, gamma, grid=grid)
    assert state is None
    torch.testing.assert_close(y, hgru_2d_by_hand(m, x, gamma, grid), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("grid", [(3, 4), (2, 2)])
def test_hgru2_grid_scan_equals_the_eight_walks(grid):
    d = 8
    m = HGRU2(d, expand_ratio=4, variant="lra", causal=False, backend="reference").double()
    randomise(m)
    x = torch.randn(2, grid[0] * grid[1], d, dtype=torch.float64)
    gamma = torch.linspace(0.1, 0.6, d, dtype=torch.float64)
    y, _ = m(x, gamma, grid=grid)
    torch.testing.assert_close(y, hgru2_2d_by_hand(m, x, gamma, grid), rtol=1e-10, atol=1e-10)


def test_grid_scan_triton_matches_reference():
    """The grid scan on the Triton path (on the GPU, or interpreted on CPU) equals the reference path,
    gradients too."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for make in (lambda b: HGRU(8, causal=False, backend=b),
                 lambda b: HGRU2(8, expand_ratio=4, variant="lra", causal=False, backend=b)):
        ref = make("reference").to(device)
        tri = make("triton").to(device)
        tri.load_state_dict(ref.state_dict())
        x = torch.randn(2, 12, 8, requires_grad=True, device=device)
        x2 = x.detach().clone().requires_grad_(True)
        y_ref, _ = ref(x, 0.3, grid=(3, 4))
        y_tri, _ = tri(x2, 0.3, grid=(3, 4))
        torch.testing.assert_close(y_tri, y_ref, rtol=1e-4, atol=1e-5)
        y_ref.square().sum().backward()
        y_tri.square().sum().backward()
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-5)


def test_series_2d_is_rows_then_columns():
    d, grid = 4, (3, 2)
    row = HGRU(d, causal=False, backend="reference").double()
    col = HGRU(d, causal=False, backend="reference").double()
    randomise(row)
    with torch.no_grad():
        for p in col.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    m = Series2D(row, col)
    x = torch.randn(2, 6, d, dtype=torch.float64)
    y, _ = m(x, 0.2, grid=grid)
    # by hand: each row as its own sequence, then each column of the result
    after_rows = torch.stack([row(x[:, r * 2:(r + 1) * 2], 0.2)[0] for r in range(3)], dim=1).reshape(2, 6, d)
    expect = torch.empty_like(x)
    for c in range(2):
        expect[:, c::2] = col(after_rows[:, c::2], 0.2)[0]
    torch.testing.assert_close(y, expect, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["hgru", "hgru2"])
def test_padding_reaches_no_valid_position(kind):
    """A non-causal mixer's outputs at valid positions do not change when padding (any values) is
    appended, and equal those of the unpadded sequence."""
    torch.manual_seed(1)
    m = build_token_mixer(kind, 8, causal=False, expand_ratio=4, variant="lra", backend="reference").double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    y, _ = m(x, 0.3)
    padded = torch.cat([x, 100 * torch.randn(2, 3, 8, dtype=torch.float64)], dim=1)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[:, 5:] = True
    y_pad, _ = m(padded, 0.3, padding_mask=mask)
    torch.testing.assert_close(y_pad[:, :5], y, rtol=1e-10, atol=1e-10)


def test_bad_grid_and_mask_arguments():
    m = HGRU(4, causal=False, backend="reference")
    x = torch.randn(1, 6, 4)
    with pytest.raises(ValueError, match="does not tile"):
        m(x, grid=(2, 2))
    with pytest.raises(ValueError, match="non-causal"):
        HGRU(4, backend="reference")(x, grid=(2, 3))
    with pytest.raises(ValueError, match="padding_mask must be a bool"):
        m(x, padding_mask=torch.zeros(1, 6))
    with pytest.raises(ValueError, match="grid and padding_mask"):
        m(x, padding_mask=torch.zeros(1, 6, dtype=torch.bool), grid=(2, 3))
    with pytest.raises(ValueError, match="norm='group'"):
        build_norm("group", 4)


def test_masked_batch_norm_statistics_skip_padding():
    torch.manual_seed(2)
    bn = MaskedBatchNorm(3).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    mask = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    x_junk = x.clone()
    x_junk[mask] = 1e3
    y = bn(x_junk, mask)
    valid = x[~mask]  # [8 + ... positions, 3]
    mean, var = valid.mean(0), valid.var(0, unbiased=False)
    expect = (x - mean) / torch.sqrt(var + bn.eps)
    torch.testing.assert_close(y[~mask], expect[~mask], rtol=1e-10, atol=1e-10)
    assert torch.all(y[mask] == 0)
    torch.testing.assert_close(bn.running_mean, 0.1 * mean)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * valid.var(0, unbiased=True))
    # without a mask it is torch's BatchNorm1d (training, then evaluation with the running stats)
    ref = torch.nn.BatchNorm1d(3).double()
    bn2 = MaskedBatchNorm(3).double()
    torch.testing.assert_close(bn2(x), ref(x.transpose(1, 2)).transpose(1, 2))
    bn2.eval(), ref.eval()
    torch.testing.assert_close(bn2(x), ref(x.transpose(1, 2)).transpose(1, 2))
    assert set(bn2.state_dict()) == set(ref.state_dict())


@pytest.mark.parametrize("norm", ["layer", "batch"])
def test_block_output_unchanged_by_padding(norm):
    torch.manual_seed(3)
    mixer = build_token_mixer("hgru", 8, causal=False, backend="reference")
    block = HgrnBlock(mixer, 8, 16, glu_activation="silu", norm=norm).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    y, _ = block(x, 0.2)
    padded = torch.cat([x, torch.randn(2, 4, 8, dtype=torch.float64)], dim=1)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[:, 5:] = True
    y_pad, _ = block(padded, 0.2, padding_mask=mask)
    torch.testing.assert_close(y_pad[:, :5], y, rtol=1e-9, atol=1e-9)


def test_block_drop_path_in_training_only():
    torch.manual_seed(4)
    mixer = build_token_mixer("hgru", 8, causal=False, backend="reference")
    block = HgrnBlock(mixer, 8, 16, glu_activation="silu", drop_path=0.5)
    x = torch.randn(64, 3, 8)
    block.train()
    y = block(x)[0]
    # a sample whose both branches were dropped is returned unchanged; with p = 0.5 about a quarter
    unchanged = (y - x).abs().amax(dim=(1, 2)) == 0
    assert 4 <= int(unchanged.sum()) <= 32
    block.eval()
    y1, y2 = block(x)[0], block(x)[0]
    assert torch.equal(y1, y2) and not (y1 - x).abs().amax(dim=(1, 2)).eq(0).any()
    with pytest.raises(ValueError, match="drop_path"):
        HgrnBlock(mixer, 8, 16, drop_path=1.0)


@pytest.mark.parametrize("kind", ["hgru", "hgru2"])
def test_two_d_mixers_commute_with_transposing_the_grid(kind):
    """Rows and columns share the mixer's gates and theta (one set of projections, the four
    directions summed), so transposing a square grid transposes the output: with mean pooling and no
    position encoding (the Pathfinder / Path-X archs) a 2-D classifier gives an image and its transpose
    the same logits. Pathfinder's labels share that symmetry; docs/lra.md says so."""
    torch.manual_seed(0)
    m = build_token_mixer(kind, 8, causal=False, expand_ratio=4, variant="lra", backend="reference").double()
    x = torch.randn(2, 5, 5, 8, dtype=torch.float64)
    y = m(x.reshape(2, 25, 8), grid=(5, 5))[0].reshape(2, 5, 5, 8)
    yt = m(x.transpose(1, 2).reshape(2, 25, 8), grid=(5, 5))[0].reshape(2, 5, 5, 8)
    torch.testing.assert_close(yt, y.transpose(1, 2), rtol=1e-12, atol=1e-12)
    assert (y - y.transpose(1, 2)).abs().max() > 1e-3  # (the output itself is not symmetric)
