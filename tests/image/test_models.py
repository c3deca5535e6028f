"""hgrn_fairseq.image.models: timm registration, parameter counts by hand, any resolution, drop-path and
dropout, and the whole forward (1-D and 2-D scans, HGRN1 and HGRN2) against a float64 loop written
here from the papers' equations (HGRU, HGRU2, lower bounds, blocks, patches)."""
import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

timm = pytest.importorskip("timm")
from hgrn_fairseq.image import ARCHS, HgrnVit  # noqa: E402  (registers the models)

NAMES = sorted(ARCHS)


# ------------------------------------------------------------------------------------ parameter counts
def hgrn1_count(d, depth, glu, patch, classes=1000):
    patch_embed = patch * patch * 3 * d + d
    hgru = (d * 5 * d + 5 * d) + (2 * d * d + d) + 2 * (2 * d) + 2 * d  # in (2d+d+2d), out, LN(2d), 2 thetas
    glu_p = (d * 2 * glu + 2 * glu) + (glu * d + d)
    block = 2 * (2 * d) + hgru + glu_p  # two LayerNorms
    return patch_embed + depth * block + depth * d + (d * classes + classes)  # + Gamma + head


def hgrn2_count(d, depth, glu, patch, classes=1000):
    patch_embed = patch * patch * 3 * d + d
    hgru2 = (d * 3 * d + 3 * d) + 2 * d + (d * d + d)  # in (v, q, f), LN(d), out
    glu_p = (d * 2 * glu + 2 * glu) + (glu * d + d)
    block = 2 * (2 * d) + hgru2 + glu_p
    return patch_embed + depth * block + depth * d + (d * classes + classes)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_every_name_is_registered_and_builds():
    listed = set(timm.list_models("hgrn*"))
    assert set(NAMES) <= listed, set(NAMES) - listed
    for name in NAMES:
        model = timm.create_model(name, pretrained=False, num_classes=7, drop_path_rate=0.1, drop_rate=0.1,
                                  img_size=112, depth=1)
        assert isinstance(model, HgrnVit)
        assert model.pretrained_cfg["architecture"] == name
        assert model(torch.randn(2, 3, 112, 112)).shape == (2, 7)  # 112 = 8 x 14 = 7 x 16
        assert model.get_classifier().out_features == 7


@pytest.mark.parametrize("name,count", [
    ("hgrn1d_vit_tiny", 6_107_560), ("hgrn1d_vit_small", 23_715_688),
    ("hgrn1_2d_vit_tiny", 6_107_560), ("hgrn1_2d_vit_small", 23_715_688),
])
def test_hgrn1_parameter_counts(name, count):
    d = 192 if "tiny" in name else 384
    assert hgrn1_count(d, 12, 2 * d, 14) == count  # the formula reproduces the paper's numbers
    assert n_params(timm.create_model(name)) == count


@pytest.mark.parametrize("name,paper", [("hgrn2_vit_tiny", 6.1), ("hgrn2_vit_small", 23.8),
                                        ("hgrn2_2d_vit_tiny", 6.1), ("hgrn2_2d_vit_small", 23.8)])
def test_hgrn2_parameter_counts(name, paper):
    d = 192 if "tiny" in name else 384
    count = hgrn2_count(d, 12, 3 * d, 16)
    assert n_params(timm.create_model(name)) == count
    assert round(count / 1e6, 1) == paper
    assert n_params(timm.create_model(name, num_classes=10)) == hgrn2_count(d, 12, 3 * d, 16, classes=10)


def test_timm_keyword_arguments():
    # what timm's own train.py passes, pretrained_cfg_overlay included; num_classes=0 gives features
    model = timm.create_model("hgrn1d_vit_tiny", pretrained=False, num_classes=0, drop_rate=0.0,
                              drop_path_rate=0.0, global_pool="avg", pretrained_cfg_overlay=dict(crop_pct=0.9),
                              depth=1)
    assert model(torch.randn(1, 3, 28, 28)).shape == (1, 192)
    assert model.pretrained_cfg["crop_pct"] == 0.9
    model.reset_classifier(5)
    assert model(torch.randn(1, 3, 28, 28)).shape == (1, 5)
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("hgrn2_vit_tiny", pretrained=True)
    with pytest.raises(TypeError):
        timm.create_model("hgrn2_vit_tiny", not_an_option=1)
    with pytest.raises(ValueError, match="global_pool"):
        timm.create_model("hgrn2_vit_tiny", global_pool="token")


def test_any_resolution_multiple_of_the_patch():
    model = timm.create_model("hgrn1d_vit_tiny", num_classes=3, depth=1).eval()
    for h, w in [(14, 14), (28, 70), (56, 42)]:
        assert model(torch.randn(1, 3, h, w)).shape == (1, 3)
    model2 = timm.create_model("hgrn2_2d_vit_tiny", num_classes=3, depth=1).eval()
    assert model2(torch.randn(2, 3, 48, 16)).shape == (2, 3)
    with pytest.raises(ValueError, match="multiples of the patch size 14"):
        model(torch.randn(1, 3, 30, 28))
    with pytest.raises(ValueError, match=r"expected images \[B, 3, H, W\]"):
        model(torch.randn(1, 28, 28))


@pytest.mark.parametrize("in_chans,patch,hw", [(3, 16, (32, 48)), (1, 4, (12, 8)), (3, 14, (28, 14))])
def test_patch_tokens_are_the_strided_convolution(in_chans, patch, hw):
    """The patch embedding (a gather and one matrix product) against PyTorch's strided convolution with the
    same weight, float64, tokens in raster order: [B, C, H, W] -> [B, (H/p)(W/p), D]."""
    torch.manual_seed(0)
    model = HgrnVit(patch_size=patch, in_chans=in_chans, embed_dim=8, depth=1, num_classes=3).double()
    with torch.no_grad():
        model.patch_embed.proj.bias.normal_()
    x = torch.randn(2, in_chans, *hw, dtype=torch.float64)
    proj = model.patch_embed.proj
    want = F.conv2d(x, proj.weight, proj.bias, stride=patch).flatten(2).transpose(1, 2)
    got = model.patch_tokens(x)
    assert got.shape == (2, (hw[0] // patch) * (hw[1] // patch), 8) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the gather runs at the autocast dtype
        assert model.float().patch_tokens(x.float()).dtype == torch.bfloat16


@pytest.mark.integration
def test_fairseq_start_up_does_not_import_the_image_package():
    code = "import sys, hgrn_fairseq; print('timm' in sys.modules, 'hgrn_fairseq.image' in sys.modules)"
    # (a real interpreter: tests.pyrun's server has preloaded packages, which would hide what start-up imports)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False False"


# ------------------------------------------------------------------------------ drop-path and dropout
def test_blocks_see_a_contiguous_residual_stream():
    """The patch tokens reach the blocks contiguous: element-wise ops keep their input's layout, so a
    strided view would make every block's adds, norms and copies run on strides."""
    m = HgrnVit(img_size=32, patch_size=8, embed_dim=16, depth=2, num_classes=3, drop_path_rate=0.2)
    seen = []
    for block in m.blocks:
        block.register_forward_pre_hook(lambda mod, args: seen.append(args[0].is_contiguous()))
    m.train()(torch.randn(2, 3, 32, 32))
    assert seen == [True, True]


def test_drop_path_rates_rise_linearly_and_act_only_in_training():
    torch.manual_seed(0)
    model = timm.create_model("hgrn1d_vit_tiny", num_classes=4, depth=3, embed_dim=16, glu_dim=32,
                              drop_path_rate=0.5)
    assert [b.drop_path_rate for b in model.blocks] == pytest.approx([0.0, 0.25, 0.5])
    plain = timm.create_model("hgrn1d_vit_tiny", num_classes=4, depth=3, embed_dim=16, glu_dim=32)
    plain.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 28, 28).expand(16, -1, -1, -1)  # 16 copies of one image
    model.eval()
    plain.eval()
    torch.testing.assert_close(model(x), plain(x))
    torch.testing.assert_close(model(x), model(x))
    model.train()
    plain.train()
    reference = plain(x)[0]
    y = model(x)
    # per-sample masks: the copies get different outputs, and not all equal the undropped one
    per_sample = (y - reference).abs().amax(dim=1)
    assert per_sample.max() > 1e-4
    assert len({round(float(v), 5) for v in per_sample.detach()}) > 1
    # without drop-path or dropout, training and evaluation agree
    torch.testing.assert_close(plain(x), plain.eval()(x))


def test_dropout_before_the_head_and_in_the_blocks():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 28, 28)
    for kwargs in (dict(drop_rate=0.5), dict(proj_drop_rate=0.5)):
        model = timm.create_model("hgrn2_vit_tiny", num_classes=4, depth=2, embed_dim=16, glu_dim=32,
                                  expand_ratio=8, patch_size=14, **kwargs)
        model.eval()
        a = model(x)
        torch.testing.assert_close(a, model(x))
        model.train()
        assert not torch.allclose(model(x), a)


# ------------------------------------------------------------------- the forward against a float64 loop
def layer_norm(x, norm):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def linear(x, layer):
    return x @ layer.weight.T + layer.bias


def lower_bounds(gamma):
    L = gamma.shape[0]
    e = torch.exp(gamma)
    p = [e[k] / e.sum(0) for k in range(L)]
    c = [sum(p[: k + 1]) for k in range(L)]
    return [c[k] - c[0] for k in range(L)]


def hgru_direction(f, c, theta, g, reverse):
    """One direction of the complex HGRU over a single sequence: f [T, d], c [T, d] complex."""
    T, d = f.shape
    lam = g + (1 - g) * torch.sigmoid(f)
    rot = torch.exp(1j * theta.to(torch.complex128))
    h = torch.zeros(d, dtype=torch.complex128)
    out = [None] * T
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        h = lam[t] * rot * h + (1 - lam[t]) * c[t]
        out[t] = h
    return torch.stack(out)


def hgrn2_direction(q, v, f, g, e, reverse):
    """One direction of the HGRN2 recurrence over a single sequence (heads of size e)."""
    T, d = q.shape
    lam = g + (1 - g) * torch.sigmoid(f)
    out = torch.zeros(T, d, dtype=q.dtype)
    for h in range(d // e):
        sl = slice(h * e, (h + 1) * e)
        S = torch.zeros(e, e, dtype=q.dtype)
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            S = torch.diag(lam[t, sl]) @ S + torch.outer(1 - lam[t, sl], v[t, sl])
            out[t, sl] = q[t, sl] @ S
    return out


def sequences(H, W, scan):
    """Token index lists the scans run along: the raster order (1-D), or every row and column (2-D)."""
    if scan == "1d":
        return [list(range(H * W))]
    return [[i * W + j for j in range(W)] for i in range(H)] + [[i * W + j for i in range(H)] for j in range(W)]


def mixer_reference(mixer, x, g, H, W, scan):
    """The bidirectional mixer of one image's tokens x [T, d], summed over the scans' sequences."""
    T, d = x.shape
    proj = linear(x, mixer.in_proj)
    if hasattr(mixer, "theta"):  # HGRN1
        inputs, f, gate = proj[:, : 2 * d], proj[:, 2 * d: 3 * d], proj[:, 3 * d:]
        act = F.silu(inputs)
        c = torch.complex(act[:, 0::2], act[:, 1::2])  # interleaved Re, Im
        h = torch.zeros(T, d, dtype=torch.complex128)
        for seq in sequences(H, W, scan):
            for theta, rev in ((mixer.theta, False), (mixer.theta_reverse, True)):
                h[seq] += hgru_direction(f[seq], c[seq], theta, g, rev)
        z = torch.stack([h.real, h.imag], dim=-1).reshape(T, 2 * d)
        return linear(layer_norm(z, mixer.norm) * F.silu(gate), mixer.out_proj)
    v, q, f = proj[:, :d], proj[:, d: 2 * d], proj[:, 2 * d:]
    v, q = F.silu(v), torch.sigmoid(q)
    o = torch.zeros(T, d, dtype=x.dtype)
    for seq in sequences(H, W, scan):
        for rev in (False, True):
            o[seq] += hgrn2_direction(q[seq], v[seq], f[seq], g, mixer.head_dim, rev)
    return linear(layer_norm(o, mixer.norm), mixer.out_proj)


def model_reference(model, image):
    """The whole classifier on one image [3, H, W] in float64, by loops."""
    p = model.patch_size
    H, W = image.shape[1] // p, image.shape[2] // p
    w = model.patch_embed.proj.weight.reshape(model.embed_dim, -1)
    b = model.patch_embed.proj.bias
    x = torch.stack([w @ image[:, i * p:(i + 1) * p, j * p:(j + 1) * p].reshape(-1) + b
                     for i in range(H) for j in range(W)])
    bounds = lower_bounds(model.lower_bounds.gamma)
    for k, block in enumerate(model.blocks):
        x = x + mixer_reference(block.mixer, layer_norm(x, block.mixer_norm), bounds[k], H, W, model.scan)
        y = linear(layer_norm(x, block.glu_norm), block.glu.in_proj)
        a, gate = y[:, : block.glu.hidden_dim], y[:, block.glu.hidden_dim:]
        x = x + linear(F.silu(a) * gate, block.glu.out_proj)
    pooled = x.mean(0)
    pooled = pooled / torch.sqrt((pooled ** 2).mean() + 1e-6)
    return linear(pooled, model.head)


@pytest.mark.parametrize("name", ["hgrn1d_vit_tiny", "hgrn1_2d_vit_tiny", "hgrn2_vit_tiny", "hgrn2_2d_vit_tiny"])
def test_forward_matches_float64_loop(name):
    torch.manual_seed(1)
    kwargs = dict(num_classes=5, depth=2, embed_dim=8, glu_dim=12, patch_size=4)
    if name.startswith("hgrn2"):
        kwargs["expand_ratio"] = 4
    model = timm.create_model(name, **kwargs).double().eval()
    with torch.no_grad():  # away from the initial values, so that every parameter matters
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    images = torch.randn(2, 3, 12, 16, dtype=torch.float64)  # a 3 x 4 grid of patches
    got = model(images)
    with torch.no_grad():
        want = torch.stack([model_reference(model, im) for im in images])
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_two_d_scan_differs_from_raster_scan():
    # the same weights give different outputs under the two scans (the 2-D option is not a no-op)
    torch.manual_seed(2)
    a = timm.create_model("hgrn1d_vit_tiny", num_classes=3, depth=1, embed_dim=8, glu_dim=8, patch_size=4).eval()
    b = timm.create_model("hgrn1_2d_vit_tiny", num_classes=3, depth=1, embed_dim=8, glu_dim=8, patch_size=4).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 12, 12)
    assert not torch.allclose(a(x), b(x), atol=1e-5)
    assert math.isfinite(float(b(x).detach().sum()))


@pytest.mark.integration
def test_block_compile_option_gives_the_eager_numbers(monkeypatch):
    monkeypatch.setenv("HGRN_COMPILE_BACKEND", "aot_eager")  # no C compiler needed
    torch.manual_seed(4)
    kwargs = dict(num_classes=3, depth=2, embed_dim=8, glu_dim=8, patch_size=4)
    eager = timm.create_model("hgrn2_2d_vit_tiny", expand_ratio=4, **kwargs)
    compiled = timm.create_model("hgrn2_2d_vit_tiny", expand_ratio=4, block_compile="train", **kwargs)
    compiled.load_state_dict(eager.state_dict())
    assert all(b.compile_mode == "train" for b in compiled.blocks)
    x = torch.randn(2, 3, 8, 12)
    a, b = eager(x), compiled(x)  # training mode: the compiled path
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.sum().backward()
    b.sum().backward()
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def full_fp32():
    """No TF32 in CUDA matrix products or convolutions (the patch embedding) while comparing with float64."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.integration
@pytest.mark.parametrize("name", ["hgrn1d_vit_tiny", "hgrn1_2d_vit_tiny", "hgrn2_vit_tiny", "hgrn2_2d_vit_tiny"])
def test_triton_path_matches_the_reference(name):
    """backend='triton': the Triton scans (TRITON_INTERPRET on a CPU, compiled on a GPU), both directions,
    rows and columns, forward and gradients, against the float64 reference path of the same model."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(7)
    kwargs = dict(num_classes=3, depth=1, embed_dim=16, glu_dim=16, patch_size=4)
    if name.startswith("hgrn2"):
        kwargs["expand_ratio"] = 8
    ref = timm.create_model(name, backend="reference", **kwargs).double()
    tri = timm.create_model(name, backend="triton", **kwargs).to(device)
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    y_ref = ref(x)
    y_ref.sum().backward()
    with full_fp32():
        y = tri(x.float().to(device))
        y.sum().backward()
    torch.testing.assert_close(y.double().cpu(), y_ref, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(ref.named_parameters(), tri.parameters()):
        torch.testing.assert_close(q.grad.double().cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=n)


# ------------------------------------------------------------------------- GPU: Triton path vs float64
@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
                    reason="GPU-only (CUDA, TRITON_INTERPRET unset)")
@pytest.mark.parametrize("name", ["hgrn1d_vit_tiny", "hgrn1_2d_vit_tiny", "hgrn2_vit_tiny", "hgrn2_2d_vit_tiny"])
def test_gpu_kernels_match_float64_forward_and_gradients(name):
    """The training path on CUDA (Triton scans, fp32 and bf16 autocast) against the float64 reference."""
    torch.manual_seed(3)
    kwargs = dict(num_classes=10, depth=2, embed_dim=64, glu_dim=128)
    ref = timm.create_model(name, backend="reference", **kwargs).double()
    gpu = timm.create_model(name, **kwargs).cuda()
    gpu.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)  # 16 x 16 or 14 x 14 patches
    w = torch.randn(2, 10, dtype=torch.float64)
    (ref(x) * w).sum().backward()
    with full_fp32():
        y = gpu(x.float().cuda())
        (y * w.float().cuda()).sum().backward()
    y_ref = ref(x).detach()
    # HGRN2's chunked kernels take their intra-chunk products in the input precision (TF32 for fp32):
    # the kernel tests allow 5e-3 on the GPU; HGRN1's scans are exact fp32
    fwd_tol, grad_tol = (5e-3, 5e-3) if name.startswith("hgrn2") else (1e-4, 1e-3)
    assert (y.double().cpu() - y_ref).norm() / y_ref.norm() < fwd_tol
    for (n, p_ref), p in zip(ref.named_parameters(), gpu.parameters()):
        err = (p.grad.double().cpu() - p_ref.grad).norm() / p_ref.grad.norm().clamp_min(1e-12)
        assert err < grad_tol, (n, float(err))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        y16 = gpu(x.float().cuda()).float()
    assert (y16.double().cpu() - y_ref).norm() / y_ref.norm() < 5e-2


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
                    reason="GPU-only (CUDA, TRITON_INTERPRET unset)")
def test_gpu_cuda_graphs_give_the_eager_numbers():
    torch.manual_seed(6)
    kwargs = dict(num_classes=10, depth=2, embed_dim=64, glu_dim=128)
    eager = timm.create_model("hgrn2_2d_vit_tiny", **kwargs).cuda()
    graphed = timm.create_model("hgrn2_2d_vit_tiny", cuda_graphs=True, **kwargs).cuda()
    graphed.load_state_dict(eager.state_dict())
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_g = torch.optim.AdamW(graphed.parameters(), lr=1e-3)
    for step in range(3):  # capture, then replays after in-place optimiser updates
        x = torch.randn(4, 3, 64, 96, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ye, yg = eager(x), graphed(x)
        torch.testing.assert_close(yg.float(), ye.float(), rtol=2e-2, atol=2e-2)
        ye.float().square().mean().backward()
        yg.float().square().mean().backward()
        for a, b in zip(eager.parameters(), graphed.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=5e-2, atol=1e-3)
        opt_e.step(), opt_g.step(), opt_e.zero_grad(), opt_g.zero_grad()
    assert len(graphed.__dict__["_graphs"].graphed) == 1


def test_evaluation_graphs_stay_out_of_cpu_and_gradient_calls():
    """InferenceGraphCache only takes CUDA inputs in eval mode without gradients; anything else runs the
    eager forward (on CPU the model with cuda_graphs gives the model's numbers and builds no cache)."""
    from hgrn_fairseq.modules.cuda_graph import InferenceGraphCache

    torch.manual_seed(8)
    model = timm.create_model("hgrn1d_vit_tiny", num_classes=5, depth=1, embed_dim=32, glu_dim=64,
                              cuda_graphs=True).eval()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert not InferenceGraphCache.usable(model, x)  # CPU
        y = model(x)
        model.cuda_graphs = False
        torch.testing.assert_close(y, model(x), rtol=0, atol=0)
    assert "_eval_graphs" not in model.__dict__
    model.cuda_graphs = True
    assert not InferenceGraphCache.usable(model.train(), x)


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
                    reason="GPU-only (CUDA, TRITON_INTERPRET unset)")
@pytest.mark.parametrize("name", ["hgrn1d_vit_tiny", "hgrn2_vit_tiny", "hgrn2_2d_vit_tiny"])
def test_gpu_evaluation_graphs_give_the_eager_numbers(name):
    """Eval forwards under no_grad / inference_mode replayed from CUDA graphs: the eager logits for new
    inputs at each call, a new tensor each time (earlier results unchanged), weights updated in place
    seen at the next call, one graph per input shape, eager beyond max_graphs."""
    torch.manual_seed(9)
    kwargs = dict(num_classes=10, depth=2, embed_dim=64, glu_dim=128)
    eager = timm.create_model(name, **kwargs).cuda().eval()
    graphed = timm.create_model(name, cuda_graphs=True, **kwargs).cuda().eval()
    graphed.load_state_dict(eager.state_dict())
    p = graphed.patch_size
    kept = []
    for step in range(3):
        x = torch.randn(4, 3, 4 * p, 6 * p, device="cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            ye, yg = eager(x), graphed(x)
        torch.testing.assert_close(yg, ye, rtol=1e-2, atol=1e-2)
        kept.append((yg, ye.clone()))
        with torch.no_grad():  # an in-place update (an optimiser step, EMA) reaches the next replay
            for a, b in zip(eager.parameters(), graphed.parameters()):
                a.mul_(0.9)
                b.mul_(0.9)
    for yg, ye in kept:  # each call returned its own tensor
        torch.testing.assert_close(yg, ye, rtol=1e-2, atol=1e-2)
    cache = graphed.__dict__["_eval_graphs"]
    assert len(cache.graphed) == 1
    with torch.inference_mode():
        x = torch.randn(3, 3, 4 * p, 4 * p, device="cuda")
        torch.testing.assert_close(graphed(x), eager(x), rtol=1e-2, atol=1e-2)
    assert len(cache.graphed) == 2
    cache.max_graphs = 2
    with torch.no_grad():
        x = torch.randn(2, 3, 2 * p, 2 * p, device="cuda")
        torch.testing.assert_close(graphed(x), eager(x), rtol=1e-2, atol=1e-2)
    assert len(cache.graphed) == 2  # (ran eagerly)
    ye = eager(x)  # gradients enabled: eager, nothing captured
    torch.testing.assert_close(graphed(x), ye, rtol=1e-2, atol=1e-2)
    assert len(cache.graphed) == 2 and "_graphs" not in graphed.__dict__
