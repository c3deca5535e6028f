"""Pre-norm residual block (token mixer + GLU) shared by the LM, LRA and image models."""
from __future__ import annotations

import math
import os
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..kernels.block_ops import scaled_residual
from .glu import GLU
from .hgru import HGRU, BlockOpsSwitch
from .norms import NORMS, apply_norm, build_norm
from .transient import TransientAttrs

Tensor = torch.Tensor

TOKEN_MIXERS = ("hgru", "hgru_real", "hgru2", "lru", "mlgru")
TERNARY_MIXERS = ("lru", "mlgru")  # the mixers with BitLinear switches


def build_token_mixer(
    kind: str,
    dim: int,
    *,
    causal: bool = True,
    state_dim: Optional[int] = None,
    expand_ratio: int = 128,
    variant: str = "lm",
    norm_before_gate: bool = True,
    backend: str = "auto",
    ternary: bool = False,
    fully_mml: bool = False,
    lru_ring: Tuple[float, float, float] = (0.0, 1.0, 2 * math.pi),
) -> nn.Module:
    """``hgru``: complex HGRN1; ``hgru_real``: real HGRN1 (``state_dim`` = dim or 2*dim);
    ``hgru2``: HGRN2 with heads of size ``expand_ratio``; ``lru``: LRU with ``state_dim`` complex
    channels and ``lru_ring`` = (r_min, r_max, max_phase); ``mlgru``: MLGRU. ``ternary`` / ``fully_mml``:
    their BitLinear switches (an error for the other mixers)."""
    if (ternary or fully_mml) and kind not in TERNARY_MIXERS:
        raise ValueError(f"token mixer {kind!r} has no ternary (BitLinear) weights: the switches are for "
                         f"{', '.join(TERNARY_MIXERS)}")
    if kind == "lru":
        from .lru import LRU

        r_min, r_max, max_phase = lru_ring
        return LRU(dim, state_dim or dim, r_min=r_min, r_max=r_max, max_phase=max_phase, ternary=ternary,
                   fully_mml=fully_mml, causal=causal, backend=backend)
    if kind == "mlgru":
        from .mlgru import MLGRU

        return MLGRU(dim, ternary=ternary, fully_mml=fully_mml, causal=causal, backend=backend)
    if kind == "hgru":
        return HGRU(dim, complex=True, causal=causal, norm_before_gate=norm_before_gate, backend=backend)
    if kind == "hgru_real":
        return HGRU(
            dim,
            complex=False,
            state_dim=state_dim,
            causal=causal,
            norm_before_gate=norm_before_gate,
            backend=backend,
        )
    if kind == "hgru2":
        from .hgru2 import HGRU2

        return HGRU2(dim, expand_ratio=expand_ratio, variant=variant, causal=causal, backend=backend)
    raise ValueError(f"token mixer {kind!r} is not one of {TOKEN_MIXERS}")


COMPILE_MODES = ("none", "train")


def use_block_ops(module: nn.Module, on: bool = True) -> nn.Module:
    """Switch the blocks, mixers and GLUs inside ``module`` (``BlockOpsSwitch``) to the fused
    element-wise kernels of ``kernels/block_ops.py`` (LayerNorm to the autocast dtype, gated activation,
    residual with stochastic depth, bias gradients as a product with ones; in HGRU2 also the in-projection's
    gates in one kernel each way and its output LayerNorm, ``HGRU2.fuse_in_gates``). Off by default: they
    make the image models' training steps much faster but the WikiText-103 LMs slower (docs/design.md), so
    only the image models turn them on. Returns ``module``."""
    for m in module.modules():
        if isinstance(m, BlockOpsSwitch):
            m.block_ops = on
    return module


def _keep_scale(x: Tensor, p: float) -> Tensor:
    """``[B]``: 1 / (1 - p) for the kept samples of ``x``, 0 for the dropped ones (fp32 or fp64, so the
    scale is not rounded to bf16)."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape[0], dtype=dtype).bernoulli_(1.0 - p).div_(1.0 - p)


def residual_add(x: Tensor, branch: Tensor, p: float, training: bool, backend: str = "auto") -> Tensor:
    """``x + drop_path(branch, p)``: stochastic depth zeroes the branch of a random fraction ``p`` of the
    samples (dimension 0) in training and scales the others by 1 / (1 - p); the plain sum in evaluation.
    ``backend`` of kernels.block_ops.scaled_residual (one kernel each way on the Triton path)."""
    if p == 0.0 or not training:
        return x + branch
    return scaled_residual(x, branch, _keep_scale(branch, p), backend)


class HgrnBlock(BlockOpsSwitch, TransientAttrs, nn.Module):
    """x = x + drop(mixer(N x)); x = x + drop(GLU(N x)). ``[B, T, dim] -> [B, T, dim]``.

    ``glu_dim = 0`` leaves out the channel mixer (the MQAR models have no MLP).
    ``norm``: ``layer`` (LayerNorm), ``batch`` or ``syncbatch`` (batch norms whose statistics skip
    padded positions, norms.py). ``drop_path``: stochastic depth rate of both residual branches
    (per sample, training only), on top of ``dropout``.
    ``forward(..., padding_mask=[B, T] bool, grid=(H, W))`` passes both to the mixer (masks the
    batch norms' statistics; the 2-D scan); they are left out of the mixer call when None, so
    mixers without them (LRU, MLGRU) work unchanged. ``scan_padding=True`` keeps the mask from the
    mixer only: it scans through the padded positions (the batch norms normalise them too) while the
    norms' statistics still skip them (an LRA option).

    ``compile="train"``: training forwards (no recurrent state in or out) go through
    ``torch.compile`` of this block, which fuses the norms, activations, casts, dropouts and residual
    adds around the matrix products into a few generated kernels; the recurrence kernels stay ours
    (the dispatchers in ``hgrn_fairseq.kernels`` are excluded from tracing). The first steps at a new
    shape compile. Evaluation and incremental decoding run eagerly. The compiler backend is
    ``inductor``, or ``$HGRN_COMPILE_BACKEND`` (tests use ``aot_eager``, which needs no C compiler).
    """

    _TRANSIENT = ("_compiled_forward",)  # built on first use, never pickled (modules/transient.py)

    def __init__(
        self,
        mixer: nn.Module,
        dim: int,
        glu_dim: int,
        glu_activation: str = "none",
        glu_bias: bool = True,
        dropout: float = 0.0,
        compile: str = "none",
        norm: str = "layer",
        drop_path: float = 0.0,
    ):
        super().__init__()
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile={compile!r} is not one of {COMPILE_MODES}")
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r} is not one of {NORMS}")
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f"drop_path={drop_path} must be in [0, 1)")
        self.compile_mode = compile
        self.drop_path_rate = drop_path
        # the norms and the residual adds follow the mixer's kernel choice (kernels/block_ops.py)
        self.backend = getattr(mixer, "backend", "auto")
        self.mixer_norm = build_norm(norm, dim)
        self.mixer = mixer
        if glu_dim > 0:
            self.glu_norm = build_norm(norm, dim)
            self.glu = GLU(dim, glu_dim, activation=glu_activation, bias=glu_bias, backend=self.backend)
        else:
            self.glu_norm = self.glu = None
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        lower_bound: Union[float, Tensor, None] = None,
        initial_state: Optional[Tensor] = None,
        output_final_state: bool = False,
        padding_mask: Optional[Tensor] = None,
        grid: Optional[Tuple[int, int]] = None,
        scan_padding: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if self.compile_mode == "train" and self.training and initial_state is None and not output_final_state:
            compiled = self._transient("_compiled_forward", lambda: torch.compile(
                self._forward, backend=os.environ.get("HGRN_COMPILE_BACKEND", "inductor")))
            return compiled(x, lower_bound, None, False, padding_mask, grid, scan_padding)
        return self._forward(x, lower_bound, initial_state, output_final_state, padding_mask, grid, scan_padding)

    def _forward(self, x, lower_bound, initial_state, output_final_state, padding_mask=None, grid=None,
                 scan_padding=False):
        extra = {}
        if padding_mask is not None and not scan_padding:
            extra["padding_mask"] = padding_mask
        if grid is not None:
            extra["grid"] = grid
        ops, p = self.ops_backend, self.drop_path_rate
        zero_pads = not scan_padding  # (scan_padding: the pads' normalised values go into the scans)
        y, state = self.mixer(apply_norm(self.mixer_norm, x, padding_mask, ops, zero_pads), lower_bound, initial_state,
                              output_final_state, **extra)
        # (a fused dropout + add kernel is no faster here: at LM shapes the eager step is bound by the
        # host's kernel launches, which CUDA graphs remove)
        x = residual_add(x, self.dropout(y), p, self.training, ops)
        if self.glu is not None:
            y = self.glu(apply_norm(self.glu_norm, x, padding_mask, ops, zero_pads))
            x = residual_add(x, self.dropout(y), p, self.training, ops)
        return x, state
