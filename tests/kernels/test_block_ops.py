"""kernels/block_ops.py: the Triton LayerNorm and gated activation against float64 formulas written
out here (the Triton kernels run through the interpreter on CPU tensors, or on a GPU when present)."""
import pytest
import torch

from hgrn_fairseq.kernels.block_ops import gated_act, layer_norm
from hgrn_fairseq.modules.block import HgrnBlock, build_token_mixer, use_block_ops
from hgrn_fairseq.modules.glu import GLU

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def ln64(x, w, b, eps):
    x = x.double()
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]
    y = (x - mean) / torch.sqrt(var + eps) * w.double()
    return y + b.double() if b is not None else y


def gated64(ab, hidden, act):
    ab = ab.double()
    half = ab.shape[-1] // 2
    a, b = ab[..., :hidden], ab[..., half:half + hidden]
    if act == "silu":
        a = a / (1 + torch.exp(-a))
    return a * b


def grads(fn, *inputs, dy):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    out.backward(dy.to(out.dtype))
    return out.detach(), [t.grad for t in inputs]


@pytest.mark.parametrize("shape", [(3, 7, 192), (2, 5, 7), (37, 48)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_float64(shape, with_bias):
    g = torch.Generator().manual_seed(0)
    C = shape[-1]
    x = (torch.randn(shape, generator=g) * 3 + 1).to(DEV)
    w = (torch.rand(C, generator=g) + 0.5).to(DEV)
    b = torch.randn(C, generator=g).to(DEV) if with_bias else None
    dy = torch.randn(shape, generator=g).to(DEV)
    inputs = (x, w) + ((b,) if with_bias else ())
    y, gr = grads(lambda x, w, *bb: layer_norm(x, w, bb[0] if bb else None, 1e-5, backend="triton"), *inputs, dy=dy)
    y64, gr64 = grads(lambda x, w, *bb: ln64(x, w, bb[0] if bb else None, 1e-5),
                      *[t.double() for t in inputs], dy=dy.double())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    for got, want in zip(gr, gr64):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_layer_norm_writes_the_autocast_dtype():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 40, generator=g).to(DEV)
    w, b = torch.rand(40, generator=g).to(DEV) + 0.5, torch.randn(40, generator=g).to(DEV)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = layer_norm(x, w, b, 1e-5, backend="triton")
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), ln64(x, w, b, 1e-5), rtol=1e-2, atol=2e-2)
    with pytest.raises(ValueError, match="affine weight of shape"):
        layer_norm(x, w[:-1], b)


@pytest.mark.parametrize("act", ["silu", "none"])
@pytest.mark.parametrize("rows,half,hidden", [(9, 24, 24), (5, 16, 13), (1, 3, 3)])
def test_gated_act_matches_float64(act, rows, half, hidden):
    g = torch.Generator().manual_seed(2)
    ab = (torch.randn(rows, 2, 2 * half, generator=g) * 2).to(DEV)
    dy = torch.randn(rows, 2, hidden, generator=g).to(DEV)
    y, (dab,) = grads(lambda t: gated_act(t, hidden, act, backend="triton"), ab, dy=dy)
    y64, (dab64,) = grads(lambda t: gated64(t, hidden, act), ab.double(), dy=dy.double())
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dab.double(), dab64, rtol=1e-5, atol=1e-5)
    if hidden < half:  # the columns past hidden in each half get no gradient
        assert dab[..., hidden:half].abs().max() == 0 and dab[..., half + hidden:].abs().max() == 0


def test_gated_act_bf16_and_bad_input():
    g = torch.Generator().manual_seed(3)
    ab = torch.randn(6, 32, generator=g).to(DEV).bfloat16()
    y = gated_act(ab, 16, "silu", backend="triton")
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), gated64(ab, 16, "silu"), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="not one of"):
        gated_act(ab, 16, "gelu")
    with pytest.raises(ValueError, match="even number"):
        gated_act(ab[:, :31], 15)


@pytest.mark.parametrize("activation", ["silu", "none"])
def test_glu_and_block_same_on_both_paths(activation):
    """The block with the Triton norms / activation equals the block on the PyTorch path."""
    torch.manual_seed(4)
    mixer = build_token_mixer("hgru", 16, causal=False, backend="triton")
    block = HgrnBlock(mixer, 16, 24, glu_activation=activation).to(DEV)
    ref_mixer = build_token_mixer("hgru", 16, causal=False, backend="triton")
    ref = HgrnBlock(ref_mixer, 16, 24, glu_activation=activation).to(DEV)
    ref.load_state_dict(block.state_dict())
    assert not block.block_ops and not block.glu.block_ops and not mixer.block_ops  # off unless asked for
    use_block_ops(block)
    assert block.block_ops and block.glu.block_ops and mixer.block_ops
    ref.backend = "reference"  # the PyTorch norms / activation, same scans
    ref.glu.backend = "reference"
    x = torch.randn(2, 6, 16, device=DEV)
    y, _ = block(x.clone().requires_grad_(True))
    y_ref, _ = ref(x.clone().requires_grad_(True))
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    for (name, p), p_ref in zip(block.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert isinstance(block.glu, GLU)


def test_residual_drop_path_keeps_or_drops_whole_samples():
    """Training: each sample's output is x (branch dropped) or x + branch / (1 - p); evaluation: x + branch."""
    from hgrn_fairseq.modules.block import residual_add

    torch.manual_seed(5)
    x, branch = torch.randn(400, 3, 4, dtype=torch.float64), torch.randn(400, 3, 4, dtype=torch.float64)
    out = residual_add(x, branch, 0.25, training=True)
    kept = torch.isclose(out, x + branch / 0.75).flatten(1).all(1)
    dropped = torch.isclose(out, x).flatten(1).all(1)
    assert bool((kept ^ dropped).all())
    assert 0.15 < dropped.double().mean().item() < 0.35
    torch.testing.assert_close(residual_add(x, branch, 0.25, training=False), x + branch)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                    (torch.bfloat16, torch.bfloat16)])
def test_scaled_residual_matches_float64(dtypes):
    from hgrn_fairseq.kernels.block_ops import scaled_residual

    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 7, 9, generator=g).to(DEV, dtypes[0])
    y = torch.randn(5, 7, 9, generator=g).to(DEV, dtypes[1])
    scale = torch.tensor([0.0, 1.25, 1.25, 0.0, 1.25]).to(DEV)
    dout = torch.randn(5, 7, 9, generator=g).to(DEV)
    out, (dx, dy) = grads(lambda a, b: scaled_residual(a, b, scale, backend="triton"), x, y, dy=dout)
    want = x.double() + y.double() * scale.double()[:, None, None]
    tol = 1e-2 if torch.bfloat16 in dtypes else 1e-6
    assert out.dtype == torch.promote_types(*dtypes)
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    assert dx.dtype == dtypes[0] and dy.dtype == dtypes[1]
    torch.testing.assert_close(dx.double(), dout.to(dtypes[0]).double(), rtol=tol, atol=tol)
    torch.testing.assert_close(dy.double(), dout.double() * scale.double()[:, None, None], rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="must be"):
        scaled_residual(x, y, scale[:3])


@pytest.mark.parametrize("autocast", [False, True])
def test_linear_matches_float64(autocast):
    """block_ops.linear (bias gradient as a product with a row of ones) against float64 formulas."""
    from hgrn_fairseq.kernels.block_ops import linear

    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, 12, generator=g).to(DEV)
    w = torch.randn(20, 12, generator=g).to(DEV) * 0.3
    b = torch.randn(20, generator=g).to(DEV)
    dy = torch.randn(3, 5, 20, generator=g).to(DEV)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        y, (dx, dw, db) = grads(lambda a, c, d: linear(a, c, d, backend="triton"), x, w, b, dy=dy)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    tol = 5e-2 if autocast else 1e-5
    assert y.dtype == (torch.bfloat16 if autocast else torch.float32)
    torch.testing.assert_close(y.double(), x64 @ w64.t() + b.double(), rtol=tol, atol=tol)
    assert (dx.dtype, dw.dtype, db.dtype) == (torch.float32,) * 3
    torch.testing.assert_close(dx.double(), dy64 @ w64, rtol=tol, atol=tol)
    torch.testing.assert_close(dw.double(), dy64.reshape(-1, 20).t() @ x64.reshape(-1, 12), rtol=tol, atol=tol)
    torch.testing.assert_close(db.double(), dy64.reshape(-1, 20).sum(0), rtol=tol, atol=tol * 4)


def test_only_the_image_models_use_the_block_ops():
    """The LMs keep PyTorch's operations (the fused ones are slower there); the image models turn
    them on."""
    from hgrn_fairseq.image import HgrnVit

    vit = HgrnVit(img_size=32, patch_size=8, embed_dim=16, depth=1, num_classes=3)
    assert vit.blocks[0].block_ops and vit.blocks[0].mixer.block_ops and vit.blocks[0].glu.block_ops
    assert vit.block_ops  # the patch embedding's linear
    plain = HgrnVit(img_size=32, patch_size=8, embed_dim=16, depth=1, num_classes=3, block_ops=False)
    assert not plain.blocks[0].block_ops and not plain.blocks[0].mixer.block_ops and not plain.block_ops
    lm_block = HgrnBlock(build_token_mixer("hgru2", 16, expand_ratio=8), 16, 24)
    assert not lm_block.block_ops and not lm_block.mixer.block_ops and not lm_block.glu.block_ops
