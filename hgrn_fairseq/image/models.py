"""HGRN1 / HGRN2 image classifiers (the papers' DeiT-style ImageNet models), registered with timm 1.x.

``import hgrn_fairseq.image`` registers the names below; then ``timm.create_model(name, ...)`` builds
them like any timm model (``num_classes``, ``img_size``, ``drop_rate``, ``drop_path_rate``, ...)::

    patches (linear embedding of each flattened p x p x 3 patch, raster order, no class token,
    no position embedding)
    -> depth x HgrnBlock [pre-norm LayerNorm; bidirectional HGRU / HGRU2; pre-norm LayerNorm; GLU SiLU]
       with the layer-wise lower bounds (one Gamma for the network)
    -> mean over the patches -> weightless RMS norm -> dropout -> linear head

The blocks, mixers, lower bounds and GLU are the package's shared modules (``hgrn_fairseq.modules``):
this file adds only the patch input and the pooled head.

=====================  ==========  ======  ======  ==========  =====  =========================
name                   mixer       d       GLU     patch       scan   parameters (1000 classes)
=====================  ==========  ======  ======  ==========  =====  =========================
hgrn1d_vit_tiny        HGRU        192     384     14          1-D    6,107,560 (paper 6.1M)
hgrn1d_vit_small       HGRU        384     768     14          1-D    23,715,688 (paper 23.7M)
hgrn2_vit_tiny         HGRU2 e=64  192     576     16          1-D    6,132,904 (paper 6.1M)
hgrn2_vit_small        HGRU2 e=64  384     1152    16          1-D    23,766,376 (paper 23.8M)
hgrn1_2d_vit_tiny/...  as above                               2-D    same as the 1-D model
=====================  ==========  ======  ======  ==========  =====  =========================

The HGRN2 image code was not published; docs/image.md explains the choices (GLU 3d and patch 16 are
what give the paper's 6.1M and 23.8M together; expand ratio 64 = DeiT's head size, no parameters).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Set, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from ..kernels.block_ops import linear as ops_linear
from ..modules.block import HgrnBlock, build_token_mixer, use_block_ops
from ..modules.hgru import BlockOpsSwitch
from ..modules.cuda_graph import GraphedCallCache, InferenceGraphCache
from ..modules.lower_bound import LayerLowerBounds
from ..modules.transient import TransientAttrs

Tensor = torch.Tensor
MIXERS = ("hgru", "hgru2")
SCANS = ("1d", "2d")
HGRU2_VARIANTS = ("lm", "lra")


class HgrnVit(BlockOpsSwitch, TransientAttrs, nn.Module):
    """HGRN image classifier. ``forward(x [B, in_chans, H, W]) -> logits [B, num_classes]``.

    ``H`` and ``W`` may be any multiples of ``patch_size`` (nothing depends on the resolution).

    Args:
        img_size: the nominal input size (only recorded for timm's data config; any size works).
        patch_size: side of the square patches.
        in_chans, num_classes: input channels and classes (``num_classes=0``: no head, the forward
            returns the pooled, normalised features).
        global_pool: ``'avg'`` (mean over the patches), the only pooling.
        embed_dim, depth: width and number of blocks.
        glu_dim: hidden width of the GLU (default ``2 * embed_dim``).
        token_mixer: ``'hgru'`` (HGRN1, complex) or ``'hgru2'`` (HGRN2).
        expand_ratio: HGRN2 head size (state ``e x e`` per head; ``embed_dim / e`` heads).
        hgru2_variant: ``'lra'`` (v = SiLU, q = sigmoid: the non-causal variant) or ``'lm'``.
        scan: ``'1d'`` (bidirectional over the raster order) or ``'2d'`` (rows and columns, both
            directions each, summed).
        lower_bound: the layer-wise lower bounds (False: the paper's ablation, all bounds 0).
        drop_rate: dropout before the head. proj_drop_rate: dropout on both residual branches.
        drop_path_rate: stochastic depth, rising linearly from 0 (first block) to this (last block).
        backend: recurrence kernels, ``'auto'`` (Triton on CUDA, PyTorch reference elsewhere).
        block_compile: ``'train'`` runs each block's training forward through ``torch.compile``
            (``HgrnBlock(compile=...)``: norms, activations and residual adds fused; the scans stay
            ours); ``'none'`` (default): eager.
        cuda_graphs: on CUDA, record each training forward and backward (per input shape) as CUDA
            graphs and replay them (``modules/cuda_graph.py``, as the LM's ``--cuda-graphs``): the host
            issues two launches a step instead of hundreds. Same numbers as eager. In eval mode under
            ``torch.no_grad`` the forward is recorded and replayed too (``InferenceGraphCache``: the
            logits come back as a new tensor each call); eval mode with gradients runs eagerly.
        block_ops: the blocks' fused element-wise kernels (``modules.block.use_block_ops``: LayerNorm,
            gated activation, residual with stochastic depth, bias gradients (the patch embedding's
            too); HGRU2's gates and output LayerNorm) on the Triton path;
            False gives PyTorch's operations (same function, for comparisons).
    """

    def __init__(
        self,
        img_size: Any = 224,
        patch_size: int = 14,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 192,
        depth: int = 12,
        glu_dim: Optional[int] = None,
        token_mixer: str = "hgru",
        expand_ratio: int = 64,
        hgru2_variant: str = "lra",
        scan: str = "1d",
        lower_bound: bool = True,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        backend: str = "auto",
        block_compile: str = "none",
        cuda_graphs: bool = False,
        grad_checkpointing: bool = False,
        block_ops: bool = True,
    ):
        super().__init__()
        if token_mixer not in MIXERS:
            raise ValueError(f"token_mixer={token_mixer!r} is not one of {MIXERS}")
        if scan not in SCANS:
            raise ValueError(f"scan={scan!r} is not one of {SCANS}")
        if hgru2_variant not in HGRU2_VARIANTS:
            raise ValueError(f"hgru2_variant={hgru2_variant!r} is not one of {HGRU2_VARIANTS}")
        if global_pool != "avg":
            raise ValueError(f"global_pool={global_pool!r}: these models only mean-pool ('avg')")
        if patch_size < 1 or depth < 1 or embed_dim < 1:
            raise ValueError(f"patch_size={patch_size}, depth={depth}, embed_dim={embed_dim} must all be >= 1")
        for name, p in (("drop_rate", drop_rate), ("proj_drop_rate", proj_drop_rate),
                        ("drop_path_rate", drop_path_rate)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name}={p} must be in [0, 1)")
        glu_dim = 2 * embed_dim if glu_dim is None else glu_dim
        self.img_size = img_size
        self.patch_size, self.in_chans, self.num_classes = patch_size, in_chans, num_classes
        self.global_pool, self.scan = global_pool, scan
        self.embed_dim = self.num_features = self.head_hidden_size = embed_dim
        self.grad_checkpointing, self.cuda_graphs = grad_checkpointing, cuda_graphs
        # a linear map of each flattened patch (p * p * in_chans inputs), its weight kept as timm's
        # strided convolution's (patch_embed.proj, [D, C, p, p]: checkpoints and timm's first_conv
        # handling see a ViT patch embedding) and applied as one matrix product (patch_tokens)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.backend = backend
        rates = torch.linspace(0.0, drop_path_rate, depth).tolist()  # stochastic depth rule of DeiT
        self.blocks = nn.ModuleList(
            HgrnBlock(
                build_token_mixer(token_mixer, embed_dim, causal=False, expand_ratio=expand_ratio,
                                  variant=hgru2_variant, backend=backend),
                embed_dim, glu_dim, glu_activation="silu", dropout=proj_drop_rate, drop_path=rates[i],
                compile=block_compile,
            )
            for i in range(depth)
        )
        use_block_ops(self, block_ops)  # the fused element-wise kernels (modules/block.py)
        self.lower_bounds = LayerLowerBounds(depth, self.blocks[0].mixer.gate_dim, enabled=lower_bound)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        # DeiT's initialisation of the linear maps; norms, theta and Gamma keep their own
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    # ---- timm's model interface
    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        # timm already exempts every 1-D parameter (biases, norms, theta); Gamma stays decayed as in
        # DeiT's optimiser (decay pulls it towards uniform softmax weights, i.e. towards its init)
        return set()

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool is not None and global_pool != "avg":
            raise ValueError(f"global_pool={global_pool!r}: these models only mean-pool ('avg')")
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def patch_grid(self, height: int, width: int) -> Tuple[int, int]:
        p = self.patch_size
        if height % p or width % p or height < p or width < p:
            raise ValueError(
                f"input of {height} x {width} pixels: height and width must be positive multiples of the "
                f"patch size {p} (resize or crop the images, e.g. to {max(p, height // p * p)} x "
                f"{max(p, width // p * p)})"
            )
        return height // p, width // p

    def forward_features(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, (H/p) * (W/p), embed_dim]`` (tokens in raster order)."""
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images [B, {self.in_chans}, H, W], got {tuple(x.shape)}")
        grid = self.patch_grid(x.shape[2], x.shape[3])  # (checks the size)
        x = self.patch_tokens(x)
        bounds = self.lower_bounds()
        grid_arg = grid if self.scan == "2d" else None
        for i, block in enumerate(self.blocks):
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(lambda t, b=block, i=i: b(t, bounds[i], grid=grid_arg)[0], x, use_reentrant=False)
            else:
                x = block(x, bounds[i], grid=grid_arg)[0]
        return x

    def patch_tokens(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, (H/p) * (W/p), embed_dim]``: each p x p patch flattened in the
        convolution weight's (channel, row, column) order, raster order over the patches, then one matrix
        product with ``patch_embed.proj``'s weight: the same function as the strided convolution, without
        cuDNN's layout conversions (the gather is one copy of the images at the autocast dtype). The
        tokens come out contiguous: element-wise ops keep their input's memory layout, so a strided view
        here would leave the whole residual stream strided."""
        B, C = x.shape[:2]
        gh, gw = self.patch_grid(x.shape[2], x.shape[3])
        p = self.patch_size
        kind = x.device.type
        if kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind) and x.dtype == torch.float32:
            x = x.to(torch.get_autocast_dtype(kind))  # gather half the bytes; autocast would cast anyway
        patches = x.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
        patches = patches.reshape(B, gh * gw, C * p * p)
        proj = self.patch_embed.proj
        return ops_linear(patches, proj.weight.reshape(proj.weight.shape[0], -1), proj.bias, self.ops_backend)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = F.rms_norm(x.mean(dim=1), (self.embed_dim,), eps=1e-6)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    _TRANSIENT = ("_graphs", "_eval_graphs")  # built on first use, never pickled or deep-copied (modules/transient.py)

    def forward(self, x: Tensor) -> Tensor:
        if self.cuda_graphs and GraphedCallCache.usable(self, x):
            # (the logits are the graph's output buffer: valid until the next training forward)
            return self._transient("_graphs", lambda: GraphedCallCache(_Eager(self), name=type(self).__name__))(x)
        if self.cuda_graphs and InferenceGraphCache.usable(self, x):
            return self._transient("_eval_graphs", lambda: InferenceGraphCache(_Eager(self), name=type(self).__name__))(x)
        return self.forward_head(self.forward_features(x))


class _Eager(nn.Module):
    """The eager forward of a model (whose parameters it shares): what a CUDA graph records."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.forward_head(self.model.forward_features(x))


def _cfg(**overrides) -> Dict[str, Any]:
    # no published weights: url/hf_hub_id empty, so timm refuses pretrained=True
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.875, "interpolation": "bicubic", "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit", **overrides,
    }


ARCHS: Dict[str, Dict[str, Any]] = {
    "hgrn1d_vit_tiny": dict(token_mixer="hgru", embed_dim=192, depth=12, glu_dim=384, patch_size=14),
    "hgrn1d_vit_small": dict(token_mixer="hgru", embed_dim=384, depth=12, glu_dim=768, patch_size=14),
    "hgrn2_vit_tiny": dict(token_mixer="hgru2", embed_dim=192, depth=12, glu_dim=576, patch_size=16,
                           expand_ratio=64),
    "hgrn2_vit_small": dict(token_mixer="hgru2", embed_dim=384, depth=12, glu_dim=1152, patch_size=16,
                            expand_ratio=64),
}
ARCHS.update({
    "hgrn1_2d_vit_tiny": dict(ARCHS["hgrn1d_vit_tiny"], scan="2d"),
    "hgrn1_2d_vit_small": dict(ARCHS["hgrn1d_vit_small"], scan="2d"),
    "hgrn2_2d_vit_tiny": dict(ARCHS["hgrn2_vit_tiny"], scan="2d"),
    "hgrn2_2d_vit_small": dict(ARCHS["hgrn2_vit_small"], scan="2d"),
})

default_cfgs = generate_default_cfgs({name: _cfg() for name in ARCHS})


def _create(variant: str, pretrained: bool = False, **kwargs) -> HgrnVit:
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights are published for this model; use pretrained=False "
                         "(or load your own checkpoint with checkpoint_path=...)")
    model_args = dict(ARCHS[variant])
    model_args.update(kwargs)  # the caller's values (num_classes, img_size, drop_path_rate, ...) win
    return build_model_with_cfg(HgrnVit, variant, pretrained, **model_args)


@register_model
def hgrn1d_vit_tiny(pretrained: bool = False, **kwargs) -> HgrnVit:
    """HGRN1, d 192, 12 blocks, patch 14, 1-D bidirectional scan: 6,107,560 parameters."""
    return _create("hgrn1d_vit_tiny", pretrained, **kwargs)


@register_model
def hgrn1d_vit_small(pretrained: bool = False, **kwargs) -> HgrnVit:
    """HGRN1, d 384, 12 blocks, patch 14, 1-D bidirectional scan: 23,715,688 parameters."""
    return _create("hgrn1d_vit_small", pretrained, **kwargs)


@register_model
def hgrn2_vit_tiny(pretrained: bool = False, **kwargs) -> HgrnVit:
    """HGRN2, d 192, 12 blocks, head size 64, GLU 576, patch 16: 6,132,904 parameters."""
    return _create("hgrn2_vit_tiny", pretrained, **kwargs)


@register_model
def hgrn2_vit_small(pretrained: bool = False, **kwargs) -> HgrnVit:
    """HGRN2, d 384, 12 blocks, head size 64, GLU 1152, patch 16: 23,766,376 parameters."""
    return _create("hgrn2_vit_small", pretrained, **kwargs)


@register_model
def hgrn1_2d_vit_tiny(pretrained: bool = False, **kwargs) -> HgrnVit:
    """hgrn1d_vit_tiny with the four-direction 2-D scan (rows and columns)."""
    return _create("hgrn1_2d_vit_tiny", pretrained, **kwargs)


@register_model
def hgrn1_2d_vit_small(pretrained: bool = False, **kwargs) -> HgrnVit:
    """hgrn1d_vit_small with the four-direction 2-D scan (rows and columns)."""
    return _create("hgrn1_2d_vit_small", pretrained, **kwargs)


@register_model
def hgrn2_2d_vit_tiny(pretrained: bool = False, **kwargs) -> HgrnVit:
    """hgrn2_vit_tiny with the four-direction 2-D scan (rows and columns)."""
    return _create("hgrn2_2d_vit_tiny", pretrained, **kwargs)


@register_model
def hgrn2_2d_vit_small(pretrained: bool = False, **kwargs) -> HgrnVit:
    """hgrn2_vit_small with the four-direction 2-D scan (rows and columns)."""
    return _create("hgrn2_2d_vit_small", pretrained, **kwargs)
