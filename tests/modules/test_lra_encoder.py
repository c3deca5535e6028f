"""The LRA encoder classifier (modules/lra_encoder.py): a whole forward against a float64 loop written
here from the papers' equations (embedding, positions, bidirectional scans as two explicit loops, GLU,
norms, masked mean, head), padding invariance with batch norms, the retrieval head, bad input."""
import math

import pytest
import torch
import torch.nn.functional as F

from hgrn_fairseq.modules.lra_encoder import (
    LraClassifier,
    LraEncoder,
    LraPairClassifier,
    masked_max,
    masked_mean,
    sinusoidal_positions,
)
from hgrn_fairseq.modules.norms import MaskedBatchNorm


def lin(layer, x):
    return x @ layer.weight.T + (layer.bias if layer.bias is not None else 0)


def randomise(module, seed=0):
    """Move every parameter off its init (norm weights 1, biases 0, theta's schedule) so that a wrong
    index, a missing bias or a swapped direction shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def norm_by_hand(norm, x, mask):
    """LayerNorm, or batch norm with statistics over the valid positions (training mode)."""
    if isinstance(norm, MaskedBatchNorm):
        valid = ~mask if mask is not None else torch.ones(x.shape[:2], dtype=torch.bool)
        rows = x[valid]
        mean = rows.mean(0)
        var = rows.var(0, unbiased=False)
        y = (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias
        return y * valid.unsqueeze(-1)
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def hgru_bidirectional_by_hand(m, x, gamma, mask):
    """HGRU (complex, non-causal): the forward loop plus the loop over the reversed sequence, each
    with its own theta, padding zeroing the input."""
    B, T, d = x.shape
    pre = lin(m.in_proj, x)
    pre_c, pre_f, pre_g = pre[..., : 2 * d], pre[..., 2 * d: 3 * d], pre[..., 3 * d:]
    c = F.silu(pre_c)
    if mask is not None:
        c = c * (~mask).unsqueeze(-1)
    lam = gamma + (1 - gamma) * torch.sigmoid(pre_f)
    cc = torch.complex(c[..., 0::2], c[..., 1::2])
    total = torch.zeros(B, T, d, dtype=cc.dtype)
    for theta, order in ((m.theta, range(T)), (m.theta_reverse, range(T - 1, -1, -1))):
        h = torch.zeros(B, d, dtype=cc.dtype)
        rot = torch.exp(1j * theta.to(torch.float64))
        for t in order:
            h = lam[:, t] * rot * h + (1 - lam[:, t]) * cc[:, t]
            total[:, t] += h
    feat = torch.stack([total.real, total.imag], dim=-1).reshape(B, T, 2 * d)
    y = F.layer_norm(feat, (2 * d,), m.norm.weight, m.norm.bias, m.norm.eps) * F.silu(pre_g)
    return lin(m.out_proj, y)


def hgru2_bidirectional_by_hand(m, x, gamma, mask):
    """HGRU2, LRA variant (SiLU v, sigmoid q), forward loop plus reversed loop."""
    B, T, d = x.shape
    v, q, f = lin(m.in_proj, x).chunk(3, dim=-1)
    v, q = F.silu(v), torch.sigmoid(q)
    if mask is not None:
        v = v * (~mask).unsqueeze(-1)
    lam = gamma + (1 - gamma) * torch.sigmoid(f)
    H, e = m.num_heads, m.head_dim
    v, q, lam = (t.reshape(B, T, H, e) for t in (v, q, lam))
    o = torch.zeros(B, T, H, e, dtype=x.dtype)
    for order in (range(T), range(T - 1, -1, -1)):
        S = torch.zeros(B, H, e, e, dtype=x.dtype)
        for t in order:
            S = lam[:, t, :, :, None] * S + (1 - lam[:, t, :, :, None]) * v[:, t, :, None, :]
            o[:, t] += torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return lin(m.out_proj, F.layer_norm(o.reshape(B, T, d), (d,), m.norm.weight, m.norm.bias, m.norm.eps))


def lower_bounds_by_hand(gamma_param):
    p = torch.softmax(gamma_param, dim=0)
    return torch.cumsum(p, 0) - p[0]


def classifier_by_hand(model: LraClassifier, tokens, mask):
    enc = model.encoder
    x = enc.embed.weight[tokens]
    T, d = tokens.shape[1], enc.dim
    if enc.positions == "sin":
        pe = torch.tensor([[math.sin(t / 10000 ** (i / d)) if i % 2 == 0 else math.cos(t / 10000 ** ((i - 1) / d))
                            for i in range(d)] for t in range(T)], dtype=torch.float64)
        x = x + pe
    bounds = lower_bounds_by_hand(enc.lower_bounds.gamma)
    for k, block in enumerate(enc.layers):
        m = block.mixer
        by_hand = hgru_bidirectional_by_hand if enc.mixer_kind == "hgru" else hgru2_bidirectional_by_hand
        x = x + by_hand(m, norm_by_hand(block.mixer_norm, x, mask), bounds[k], mask)
        a, b = lin(block.glu.in_proj, norm_by_hand(block.glu_norm, x, mask)).chunk(2, dim=-1)
        x = x + lin(block.glu.out_proj, F.silu(a) * b)
    x = norm_by_hand(enc.final_norm, x, mask)
    valid = (~mask).unsqueeze(-1).double()
    pooled = (x * valid).sum(1) / valid.sum(1)
    return lin(model.head, pooled)


# MaskedBatchNorm keeps float32 statistics and cannot run in float64 (its running buffers would have to
# be float32 too): the batch-norm cases run in float32 against the float64 loop at float32 tolerances.
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-9), torch.float32: dict(rtol=2e-5, atol=2e-5)}


def dtype_for(norm):
    return torch.float64 if norm == "layer" else torch.float32


def tiny_classifier(mixer, norm, seed=0, positions="sin", layers=2, dim=8, vocab=11):
    torch.manual_seed(seed)
    enc = LraEncoder(mixer=mixer, dim=dim, num_layers=layers, glu_multiple=2, norm=norm, input="tokens",
                     vocab_size=vocab, padding_idx=1, positions=positions, position_dropout=0.0,
                     expand_ratio=4, backend="reference", max_len=64)
    return randomise(LraClassifier(enc, num_classes=3).to(dtype_for(norm)), seed)


def as_float64(model):
    """A float64 copy of the model's parameters for the loops (buffers stay as they are)."""
    import copy

    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.data = p.data.double()
    return twin


@pytest.mark.parametrize("mixer", ["hgru", "hgru2"])
@pytest.mark.parametrize("norm", ["layer", "batch"])
def test_classifier_matches_float64_loops(mixer, norm):
    model = tiny_classifier(mixer, norm).train()  # batch norm: batch statistics (no dropout anywhere)
    lengths = [9, 5, 7]
    T = max(lengths)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(4, 11, (3, T), generator=g)
    mask = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]
    tokens[mask] = 1
    out = model(tokens, mask)
    ref = classifier_by_hand(as_float64(model), tokens, mask)
    torch.testing.assert_close(out.double(), ref, **TOL[dtype_for(norm)])


def test_sinusoidal_positions_formula():
    pe = sinusoidal_positions(7, 6, dtype=torch.float64)
    for t in range(7):
        for i in range(3):
            assert pe[t, 2 * i].item() == pytest.approx(math.sin(t / 10000 ** (2 * i / 6)), abs=1e-12)
            assert pe[t, 2 * i + 1].item() == pytest.approx(math.cos(t / 10000 ** (2 * i / 6)), abs=1e-12)
    assert sinusoidal_positions(4, 5).shape == (4, 5)  # odd width: the last channel is a sine


@pytest.mark.parametrize("mixer", ["hgru", "hgru2", "attention"])
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_output_unchanged_when_padding_is_added(mixer, norm):
    """Training mode (batch statistics): widening the batch with more padding changes nothing; in
    evaluation a sequence alone gives what it gives inside a padded batch."""
    if mixer == "attention" and norm == "batch":
        norm = "layer"
    model = tiny_classifier(mixer, norm, seed=1).train()
    lengths = torch.tensor([6, 3, 5])
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(4, 11, (3, 6), generator=g)
    mask = torch.arange(6)[None, :] >= lengths[:, None]
    tokens[mask] = 1
    out = model(tokens, mask)
    wide = F.pad(tokens, (0, 9), value=1)
    wide_mask = F.pad(mask, (0, 9), value=True)
    tol = dict(rtol=1e-10, atol=1e-10) if norm == "layer" else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model(wide, wide_mask), out, **tol)
    # garbage (not the pad id) at padded positions does not leak either
    noisy = wide.clone()
    noisy[wide_mask] = 7
    torch.testing.assert_close(model(noisy, wide_mask), out, **tol)
    model.eval()
    batch = model(wide, wide_mask)
    for i, n in enumerate(lengths.tolist()):
        alone = model(tokens[i: i + 1, :n])
        torch.testing.assert_close(alone, batch[i: i + 1], **tol)


@pytest.mark.parametrize("mixer", ["hgru", "hgru2"])
def test_unmasked_padding_ablation_lets_the_padding_in_and_pools_the_valid_positions(mixer):
    """``unmasked_padding`` (the official LRA code's handling): the pad token has its own learned
    embedding, padding changes the valid positions' outputs through the reverse scan and the batch
    norms, and the pooled vector is still the mean over the valid positions only."""
    torch.manual_seed(3)
    enc = LraEncoder(mixer=mixer, dim=8, num_layers=2, norm="batch", input="tokens", vocab_size=11, padding_idx=1,
                     position_dropout=0.0, expand_ratio=4, backend="reference", max_len=64, unmasked_padding=True)
    enc = randomise(enc.double(), 3).eval()
    assert enc.embed.padding_idx is None and enc.embed.weight[1].abs().sum() > 0  # a learned pad vector
    tokens = torch.randint(4, 11, (2, 6), generator=torch.Generator().manual_seed(2))
    padded = F.pad(tokens, (0, 4), value=1)
    mask = padded.eq(1)
    alone = enc(tokens)
    out = enc(padded, mask)
    assert (out - alone).abs().max() > 1e-3  # the padding reaches the valid positions
    # pooling: by hand, the mean of the per-position outputs at the 6 valid positions of each row
    feats = enc.features(padded)
    torch.testing.assert_close(out, feats[:, :6].sum(1) / 6, rtol=1e-12, atol=1e-12)
    # the same weights with the default handling: padding changes nothing
    enc.unmasked_padding = False
    torch.testing.assert_close(enc(padded, mask), enc(tokens), rtol=1e-10, atol=1e-10)


def test_masked_mean_and_batch_norm_statistics_skip_padding():
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    mask = torch.tensor([[False, False, True, True, True], [False, False, False, False, True]])
    torch.testing.assert_close(masked_mean(x, mask)[0], x[0, :2].mean(0))
    torch.testing.assert_close(masked_mean(x, mask)[1], x[1, :4].mean(0))
    enc = LraEncoder(mixer="hgru", dim=4, num_layers=1, norm="batch", vocab_size=9, padding_idx=1,
                     position_dropout=0.0, backend="reference")
    tokens = torch.tensor([[4, 5, 1, 1], [6, 7, 8, 1]])
    pad = tokens.eq(1)
    enc.train()(tokens, pad)
    h = enc.embed.weight.double()[tokens] + sinusoidal_positions(4, 4, dtype=torch.float64)
    valid = h[~pad]
    bn = enc.layers[0].mixer_norm
    # first update of the running mean (momentum 0.1 from 0) saw the 5 valid positions only
    torch.testing.assert_close(bn.running_mean.double(), 0.1 * valid.mean(0), rtol=1e-6, atol=1e-7)
    # a row with no valid position pools to zeros (refusing it would read the device on the host;
    # the LRA collaters refuse empty examples instead)
    empty = torch.tensor([[True] * 5, [False] * 2 + [True] * 3])
    pooled = masked_mean(x, empty)
    assert torch.equal(pooled[0], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(pooled[1], x[1, :2].mean(0))


def test_batch_norm_with_one_valid_position_and_too_small_batches():
    bn = MaskedBatchNorm(3).double().train()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[1, 2] = False  # one valid position in the whole batch: variance 0, no error
    y = bn(x, mask)
    # (x - mean) is exactly 0 at the one valid position: the output there is the bias
    torch.testing.assert_close(y[1, 2], bn.bias.detach(), rtol=0, atol=1e-12)
    assert torch.equal(y[mask], torch.zeros_like(y[mask]))
    # running variance: n / max(n - 1, 1) = 1 times the batch's 0, so 0.9 * 1
    torch.testing.assert_close(bn.running_var, torch.full((3,), 0.9, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"at least 2 positions in the batch, got \(1, 1, 3\)"):
        bn(torch.randn(1, 1, 3, dtype=torch.float64))


def _no_host_reads(model, *inputs_fn):
    """Forward and backward of ``model`` under FakeTensorMode: any read of a device value on the host
    (``float(t)``, ``bool(t.any())``, ``.item()``, a data-dependent shape) raises there, as it would
    stall a GPU step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        out = model(*(f() for f in inputs_fn))
        out.float().sum().backward()
    return out.shape


@pytest.mark.integration
@pytest.mark.parametrize("mixer", ["hgru", "hgru2"])
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_training_step_reads_nothing_back_from_the_device(mixer, norm):
    """The LRA training forward and backward never wait for the GPU: no padding check
    (``bool(mask.any())``), batch-norm count check or empty-row check reads a device value on the host
    (each would stall it once per call, ~15 times a step at 6 layers)."""
    torch.manual_seed(0)

    def tokens():
        return torch.randint(2, 12, (3, 9))

    def mask():
        m = torch.zeros(3, 9, dtype=torch.bool)
        m[1, 6:] = True
        return m

    enc = LraEncoder(mixer=mixer, dim=8, num_layers=2, norm=norm, vocab_size=12, padding_idx=1,
                     expand_ratio=4, backend="reference")
    assert _no_host_reads(LraClassifier(enc, 3).train(), tokens, mask) == (3, 3)
    pair = LraPairClassifier(enc, 2).train()
    assert _no_host_reads(pair, tokens, mask, lambda: torch.randint(2, 12, (3, 5)), lambda: None) == (3, 2)
    assert _no_host_reads(pair, tokens, lambda: None, tokens, lambda: None) == (3, 2)
    img = LraEncoder(mixer=mixer, dim=8, num_layers=1, norm=norm, input="pixels", in_channels=1, positions="none",
                     expand_ratio=4, scan_2d="parallel", backend="reference")
    assert _no_host_reads(LraClassifier(img, 2).train(), lambda: torch.randn(2, 16, 1)) == (2, 2)


def test_retrieval_head_and_shared_encoder():
    torch.manual_seed(0)
    enc = LraEncoder(mixer="hgru2", dim=8, num_layers=1, norm="layer", vocab_size=12, padding_idx=1,
                     expand_ratio=2, backend="reference")
    model = randomise(LraPairClassifier(enc, 2).double()).eval()
    g = torch.Generator().manual_seed(1)
    a = torch.randint(4, 12, (2, 7), generator=g)
    b = torch.randint(4, 12, (2, 4), generator=g)  # documents of different lengths
    mask_a = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])
    a[mask_a] = 1
    logits = model(a, mask_a, b, None, pad_value=1)
    assert logits.shape == (2, 2)
    for i in range(2):
        n = int((~mask_a[i]).sum())
        u = enc(a[i: i + 1, :n])[0]
        v = enc(b[i: i + 1])[0]
        feats = torch.cat([u, v, u - v, u * v])
        want = lin(model.head.fc2, F.gelu(lin(model.head.fc1, feats)))
        torch.testing.assert_close(logits[i], want, rtol=1e-10, atol=1e-10)
    # the encoder is shared: one set of parameters (no copy for the second document)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in enc.parameters()) + \
        (4 * 8 * 8 + 8) + (8 * 2 + 2)


def test_2d_parallel_and_series_encoders_run_on_square_grids():
    for scan in ("parallel", "series"):
        enc = LraEncoder(mixer="hgru2", dim=8, num_layers=1, norm="batch", input="pixels", in_channels=1,
                         positions="none", expand_ratio=4, scan_2d=scan, backend="reference")
        out = enc(torch.randn(2, 16, 1))  # 4 x 4
        assert out.shape == (2, 8)
        assert enc(torch.randn(2, 12, 1), grid=(3, 4)).shape == (2, 8)
    # the series variant has two mixers per layer
    one = sum(p.numel() for p in LraEncoder(mixer="hgru2", dim=8, num_layers=1, input="pixels", in_channels=1,
                                            expand_ratio=4, scan_2d="parallel").layers[0].mixer.parameters())
    two = sum(p.numel() for p in LraEncoder(mixer="hgru2", dim=8, num_layers=1, input="pixels", in_channels=1,
                                            expand_ratio=4, scan_2d="series").layers[0].mixer.parameters())
    assert two == 2 * one


def test_bad_input_messages():
    enc = LraEncoder(mixer="hgru", dim=4, num_layers=1, input="pixels", in_channels=1, scan_2d="parallel",
                     positions="none", backend="reference", max_len=64)
    with pytest.raises(ValueError, match="15 tokens is not a square grid"):
        enc(torch.randn(1, 15, 1))
    with pytest.raises(ValueError, match=r"grid 3x4 = 12 does not match the sequence of 16 tokens"):
        enc(torch.randn(1, 16, 1), grid=(3, 4))
    with pytest.raises(ValueError, match="longer than the model's max_len 64"):
        enc(torch.randn(1, 81, 1))
    with pytest.raises(ValueError, match=r"norm='group' is not one of \('layer', 'batch', 'syncbatch'\)"):
        LraEncoder(mixer="hgru", dim=4, num_layers=1, norm="group", vocab_size=5)
    with pytest.raises(ValueError, match="mixer='lstm' is not one of"):
        LraEncoder(mixer="lstm", dim=4, num_layers=1, vocab_size=5)
    with pytest.raises(ValueError, match="needs vocab_size"):
        LraEncoder(mixer="hgru", dim=4, num_layers=1)
    with pytest.raises(ValueError, match="2-D inputs are full grids: pass padding_mask=None"):
        enc(torch.randn(1, 16, 1), torch.zeros(1, 16, dtype=torch.bool))
    one_d = LraEncoder(mixer="hgru", dim=4, num_layers=1, vocab_size=5, backend="reference")
    with pytest.raises(ValueError, match="grid given to a 1-D encoder"):
        one_d(torch.zeros(1, 4, dtype=torch.long), grid=(2, 2))


# ----------------------------------------------------------------------------------------------
# The Triton scans under the encoder (padding masks, 2-D grids, series) against the PyTorch reference,
# outputs and gradients: on CPU through the Triton interpreter at small sizes, on a GPU at larger ones
# (bench/gpu_lra.sh runs those).
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)")
TRITON_CASES = [("hgru", "1d_padded"), ("hgru", "2d_parallel"), ("hgru2", "1d_padded"), ("hgru2", "2d_parallel"),
                ("hgru2", "2d_series")]  # series: HGRN2's Path-X variant


def triton_vs_reference(mixer, case, device, dim, layers, T, lengths, grid, tol, expand_ratio=8):
    outs = {}
    for backend in ("reference", "triton"):
        torch.manual_seed(0)
        kw = dict(mixer=mixer, dim=dim, num_layers=layers, norm="batch", expand_ratio=expand_ratio, backend=backend,
                  position_dropout=0.0, max_len=4096)
        if case == "1d_padded":
            enc = LraEncoder(input="tokens", vocab_size=20, padding_idx=1, **kw)
        else:
            enc = LraEncoder(input="pixels", in_channels=1, scan_2d=case[3:], positions="none", **kw)
        model = randomise(LraClassifier(enc, 4)).to(device).train()
        g = torch.Generator().manual_seed(1)
        if case == "1d_padded":
            x = torch.randint(4, 20, (len(lengths), T), generator=g)
            mask = torch.arange(T)[None] >= torch.tensor(lengths)[:, None]
            x[mask] = 1
            logits = model(x.to(device), mask.to(device))
        else:
            x = torch.randn(3, grid[0] * grid[1], 1, generator=g)
            logits = model(x.to(device), None, grid)
        logits.square().sum().backward()
        outs[backend] = (logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(outs["triton"][0], outs["reference"][0], rtol=tol, atol=tol)
    for name, grad in outs["reference"][1].items():
        torch.testing.assert_close(outs["triton"][1][name], grad, rtol=5 * tol, atol=5 * tol, msg=name)


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the larger case below")
@pytest.mark.parametrize("mixer, case", TRITON_CASES)
def test_triton_encoder_matches_reference_interpreted(mixer, case):
    triton_vs_reference(mixer, case, "cpu", dim=16, layers=1, T=23, lengths=[23, 9], grid=(5, 3), tol=2e-4)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mixer, case", TRITON_CASES)
def test_triton_encoder_matches_reference_on_gpu(mixer, case):
    triton_vs_reference(mixer, case, "cuda", dim=32, layers=2, T=777, lengths=[777, 500, 13], grid=(37, 29), tol=2e-3)


@pytest.mark.integration
@pytest.mark.parametrize("case", ["2d_parallel", "2d_series"])
def test_small_heads_2d_matches_reference(case):
    """HGRN2's LRA 2-D models use expand ratio 2 (heads of 2 x 2): rows and columns of at most 32 steps take
    the packed kernels (many heads per program), longer ones the chunked kernels; the whole encoder with
    both against the PyTorch reference, outputs and every parameter's gradient."""
    if torch.cuda.is_available():
        triton_vs_reference("hgru2", case, "cuda", dim=32, layers=2, T=0, lengths=[], grid=(37, 29), tol=2e-3,
                            expand_ratio=2)
    else:
        triton_vs_reference("hgru2", case, "cpu", dim=16, layers=1, T=0, lengths=[], grid=(5, 3), tol=2e-4,
                            expand_ratio=2)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mixer", ["hgru", "hgru2"])
def test_padding_invariance_with_triton_kernels(mixer):
    torch.manual_seed(0)
    enc = LraEncoder(mixer=mixer, dim=32, num_layers=2, norm="batch", vocab_size=20, padding_idx=1,
                     expand_ratio=8, position_dropout=0.0)
    model = randomise(LraClassifier(enc, 4)).cuda().train()
    x = torch.randint(4, 20, (2, 300)).cuda()
    mask = (torch.arange(300)[None] >= torch.tensor([300, 120])[:, None]).cuda()
    x[mask] = 1
    out = model(x, mask)
    wide = F.pad(x, (0, 211), value=7)  # garbage, not the pad id, in the new padding
    wide_mask = F.pad(mask, (0, 211), value=True)
    # HGRU2's chunked kernels take their intra-chunk products in TF32 for fp32 inputs, and a longer
    # padded sequence puts the reverse scan's chunk boundaries elsewhere: rounding differs by ~1e-3;
    # the kernel tests allow 5e-3 on the GPU. Padding leaking in would differ at order 1 (garbage of value 7).
    rtol, atol = (5e-3, 1e-4) if mixer == "hgru2" else (1e-4, 1e-5)
    torch.testing.assert_close(model(wide, wide_mask), out, rtol=rtol, atol=atol)


def test_max_pooling_takes_each_channels_largest_valid_value():
    """``pool="max"`` (an ablation beside the papers' mean): per channel, the largest value over the valid
    positions, by a loop here; padding added to the batch (training-mode batch norms) changes nothing."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, 3, dtype=torch.float64, generator=g)
    x[0, 3] = 50.0  # a padded position with the largest values must not win
    mask = torch.tensor([[False, False, True, True, True], [False, False, False, False, True]])
    for b, n in enumerate((2, 4)):
        for c in range(3):
            want = max(x[b, t, c].item() for t in range(n))
            assert masked_max(x, mask)[b, c].item() == want
    torch.testing.assert_close(masked_max(x, None), x.max(dim=1).values)
    torch.manual_seed(2)
    enc = LraEncoder(mixer="hgru2", dim=8, num_layers=2, norm="batch", input="tokens", vocab_size=11, padding_idx=1,
                     position_dropout=0.0, expand_ratio=4, backend="reference", max_len=64, pool="max")
    enc = randomise(enc.double(), 2).train()
    tokens = torch.randint(4, 11, (3, 6), generator=torch.Generator().manual_seed(6))
    pad = torch.arange(6)[None, :] >= torch.tensor([6, 3, 5])[:, None]
    tokens[pad] = 1
    out = enc(tokens, pad)
    torch.testing.assert_close(out, torch.stack([enc.features(tokens, pad)[i, :n].max(0).values
                                                 for i, n in enumerate((6, 3, 5))]), rtol=1e-12, atol=1e-12)
    wide, wide_pad = F.pad(tokens, (0, 5), value=1), F.pad(pad, (0, 5), value=True)
    torch.testing.assert_close(enc(wide, wide_pad), out, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"pool='last' is not one of \('mean', 'max'\)"):
        LraEncoder(mixer="hgru", dim=4, num_layers=1, vocab_size=9, padding_idx=1, pool="last")
