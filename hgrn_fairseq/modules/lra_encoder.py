"""The Long Range Arena encoder classifier of both papers, in plain PyTorch (no fairseq imports).

::

    tokens [B, T] (Embedding)  or  pixels [B, T, C] (Linear(C, d))
    -> + sinusoidal positions, dropout 0.1          (positions="sin"; nothing for "none")
    -> L pre-norm blocks [non-causal token mixer, GLU(SiLU, d * multiple, bias)]   (HgrnBlock)
    -> final norm -> mean over the valid positions -> head

Token mixers: ``hgru`` (HGRN1, complex, a theta per scan direction), ``hgru2`` (HGRN2, LRA
variant: SiLU on v, sigmoid on q), both with the layer-wise lower bounds (one ``[L, d]`` matrix,
``LayerLowerBounds``); ``attention`` (softmax self-attention, no lower bounds: the Transformer baseline of the
throughput comparison, same blocks and GLU otherwise).

Padding: ``padding_mask`` ``[B, T]`` bool, True at padding. It zeroes the mixers' inputs there (no
padding reaches a valid position in either scan direction), keeps padded positions out of the
batch norms' statistics and out of the mean pooling: a sequence's output does not depend on how
much padding its batch carries. ``unmasked_padding=True`` is the ablation of the official LRA code's
handling: the pad token has a learned embedding, and the mixers and norms see the padded positions
(the reverse scan starts in the padding, batch norms count it); only the pooling still averages the
valid positions. ``scan_padding=True`` lets only the mixers see the padding (learned pad embedding,
scans through the pads, as the official code's), while the batch norms' statistics and the pooling
still skip it; like the ablation, a prediction then depends on the padding, so it is meant for
batches padded to one fixed width (the task's ``--pad-to-length``).

2-D (``scan_2d`` = "parallel" or "series"): the T tokens are an H x W raster. "parallel" scans the
rows and the columns, each forwards and backwards, inside each mixer and sums the four
(``grid=(H, W)`` of HGRU / HGRU2); "series" (HGRN2's Path-X variant, ``Series2D``) runs a whole
bidirectional mixer along the rows, then a second one down the columns. 2-D inputs are full grids
(no padding). ``grid`` is given per call, or else T must be a perfect square.

Heads: ``LraClassifier`` (Linear(d, classes)) and, for the two documents of Retrieval,
``LraPairClassifier``: one shared encoder, pooled u and v, [u, v, u - v, u * v] -> Linear(4d, d) ->
GELU -> Linear(d, classes).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .block import HgrnBlock, build_token_mixer
from .lower_bound import LayerLowerBounds
from .norms import NORMS, apply_norm, build_norm

Tensor = torch.Tensor

LRA_MIXERS = ("hgru", "hgru2", "attention")
INPUT_KINDS = ("tokens", "pixels")
POSITIONS = ("sin", "none")
SCAN_2D = ("none", "parallel", "series")
POOLS = ("mean", "max")


def sinusoidal_positions(length: int, dim: int, device=None, dtype=torch.float32) -> Tensor:
    """``[length, dim]``: channel 2i is sin(t / 10000^(2i/d)), channel 2i+1 cos of the same (the
    Transformer's fixed encoding; an odd last channel gets the sine only)."""
    t = torch.arange(length, dtype=torch.float64, device=device).unsqueeze(1)
    freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
    pe = torch.zeros(length, dim, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(t * freq)
    pe[:, 1::2] = torch.cos(t * freq[: dim // 2])
    return pe.to(dtype)


def masked_mean(x: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
    """Mean of ``x`` ``[B, T, D]`` over the positions where ``padding_mask`` ``[B, T]`` is False
    (all positions when it is None). ``[B, D]``, computed in float32 at least (bf16 inputs).

    A row with no valid position pools to zeros: checking for one here would read a device value on
    the host in every step; the LRA collaters refuse empty examples instead (on the host)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    if padding_mask is None:
        return x.mean(dim=1)
    valid = (~padding_mask).unsqueeze(-1).to(x.dtype)
    return (x * valid).sum(dim=1) / valid.sum(dim=1).clamp_min(1.0)


def masked_max(x: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
    """Channel-wise maximum of ``x`` ``[B, T, D]`` over the positions where ``padding_mask`` is False (all
    when None), float32 at least. (A row with no valid position gives -inf; the collaters refuse those.)"""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    if padding_mask is not None:
        x = x.masked_fill(padding_mask.unsqueeze(-1), float("-inf"))
    return x.amax(dim=1)


def square_grid(T: int) -> Tuple[int, int]:
    """``(s, s)`` with ``s * s == T``, or a one-line error naming the fix."""
    s = math.isqrt(T)
    if s * s != T:
        raise ValueError(f"2-D scan: a sequence of {T} tokens is not a square grid (nearest {s}x{s} = {s * s}); "
                         f"pass grid=(H, W) with H * W == {T}, or use a 1-D model (scan_2d='none')")
    return s, s


class SelfAttentionMixer(nn.Module):
    """Multi-head softmax self-attention with the token mixers' call signature (no state, no lower
    bound; ``grid`` is ignored: attention is global). ``[B, T, dim] -> [B, T, dim]``.
    Uses ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on CUDA)."""

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if num_heads < 1 or dim % num_heads != 0:
            raise ValueError(f"num_heads={num_heads} must divide dim={dim}")
        self.dim, self.num_heads, self.causal, self.attn_dropout = dim, num_heads, False, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)

    @property
    def gate_dim(self) -> int:
        return self.dim

    def forward(self, x, lower_bound=None, initial_state=None, output_final_state=False, padding_mask=None,
                grid=None):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, self.dim // self.num_heads).permute(2, 0, 3, 1, 4)
        mask = None if padding_mask is None else (~padding_mask)[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.attn_dropout if self.training else 0.0)
        return self.out_proj(o.transpose(1, 2).reshape(B, T, self.dim)), None


class LraEncoder(nn.Module):
    """Input layer, optional positions, ``num_layers`` blocks, final norm, masked mean pooling.

    ``forward(x, padding_mask=None, grid=None) -> pooled [B, dim]`` (float32 at least); ``features`` gives the
    per-position outputs ``[B, T, dim]`` as well. ``x``: token ids ``[B, T]`` (``input="tokens"``) or
    pixel values ``[B, T, in_channels]`` (``input="pixels"``). ``max_len``: the longest sequence
    accepted (an error names the fix beyond it).
    """

    def __init__(
        self,
        *,
        mixer: str,
        dim: int,
        num_layers: int,
        glu_multiple: float = 1.0,
        norm: str = "layer",
        input: str = "tokens",
        vocab_size: Optional[int] = None,
        padding_idx: Optional[int] = None,
        in_channels: Optional[int] = None,
        positions: str = "sin",
        position_dropout: float = 0.1,
        dropout: float = 0.0,
        expand_ratio: int = 1,
        num_heads: int = 1,
        scan_2d: str = "none",
        lower_bound: bool = True,
        max_len: int = 4096,
        backend: str = "auto",
        compile: str = "none",
        unmasked_padding: bool = False,
        scan_padding: bool = False,
        pool: str = "mean",
    ):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool={pool!r} is not one of {POOLS}")
        if unmasked_padding and scan_padding:
            raise ValueError("unmasked_padding and scan_padding are two settings of the padding: give one")
        if mixer not in LRA_MIXERS:
            raise ValueError(f"mixer={mixer!r} is not one of {LRA_MIXERS}")
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r} is not one of {NORMS}")
        if input not in INPUT_KINDS:
            raise ValueError(f"input={input!r} is not one of {INPUT_KINDS}")
        if positions not in POSITIONS:
            raise ValueError(f"positions={positions!r} is not one of {POSITIONS}")
        if scan_2d not in SCAN_2D:
            raise ValueError(f"scan_2d={scan_2d!r} is not one of {SCAN_2D}")
        if dim < 1 or num_layers < 1:
            raise ValueError(f"dim={dim} and num_layers={num_layers} must be >= 1")
        if glu_multiple <= 0:
            raise ValueError(f"glu_multiple={glu_multiple} must be > 0")
        if max_len < 1:
            raise ValueError(f"max_len={max_len} must be >= 1")
        if scan_2d == "series" and mixer == "attention":
            raise ValueError("scan_2d='series' needs a recurrent mixer (hgru or hgru2), not attention")
        self.mixer_kind, self.dim, self.input_kind = mixer, dim, input
        self.positions, self.scan_2d, self.max_len = positions, scan_2d, max_len
        self.unmasked_padding, self.scan_padding = bool(unmasked_padding), bool(scan_padding)
        self.pool = pool
        if input == "tokens":
            if not vocab_size or vocab_size < 1:
                raise ValueError(f"input='tokens' needs vocab_size >= 1, got {vocab_size}")
            learned_pad = unmasked_padding or scan_padding  # (the official code's pad has an embedding)
            self.embed = nn.Embedding(vocab_size, dim, padding_idx=None if learned_pad else padding_idx)
        else:
            if not in_channels or in_channels < 1:
                raise ValueError(f"input='pixels' needs in_channels >= 1, got {in_channels}")
            self.embed = nn.Linear(in_channels, dim)
        self.position_dropout = nn.Dropout(position_dropout if positions == "sin" else 0.0)
        glu_dim = int(glu_multiple * dim)

        def one_mixer():
            if mixer == "attention":
                return SelfAttentionMixer(dim, num_heads)
            return build_token_mixer(mixer, dim, causal=False, expand_ratio=expand_ratio, variant="lra",
                                     backend=backend)

        def layer_mixer():
            if scan_2d == "series":
                from .scan2d import Series2D

                return Series2D(one_mixer(), one_mixer())
            return one_mixer()

        self.layers = nn.ModuleList(
            HgrnBlock(layer_mixer(), dim, glu_dim, glu_activation="silu", glu_bias=True, dropout=dropout,
                      compile=compile, norm=norm)
            for _ in range(num_layers)
        )
        use_bounds = lower_bound and mixer != "attention"
        self.lower_bounds = LayerLowerBounds(num_layers, self.layers[0].mixer.gate_dim) if use_bounds else None
        self.final_norm = build_norm(norm, dim)

    def _grid(self, T: int, grid: Optional[Sequence[int]]) -> Optional[Tuple[int, int]]:
        if self.scan_2d == "none":
            if grid is not None:
                raise ValueError("grid given to a 1-D encoder (scan_2d='none'): build it with scan_2d='parallel' "
                                 "or 'series' for 2-D inputs")
            return None
        if grid is None:
            return square_grid(T)
        H, W = (int(v) for v in grid)
        if H * W != T:
            raise ValueError(f"2-D scan: grid {H}x{W} = {H * W} does not match the sequence of {T} tokens; "
                             f"pass the image's (H, W)")
        return H, W

    def _positions(self, T: int, like: Tensor) -> Tensor:
        """The sinusoidal table for T positions, kept per (device, dtype) and grown when needed (not in
        the state dict: it is a fixed function)."""
        cache = self.__dict__.setdefault("_pe_cache", {})
        key = (like.device, like.dtype)
        table = cache.get(key)
        if table is None or table.shape[0] < T:
            table = cache[key] = sinusoidal_positions(max(T, 1), self.dim, like.device, like.dtype)
        return table[:T]

    def features(self, x: Tensor, padding_mask: Optional[Tensor] = None,
                 grid: Optional[Sequence[int]] = None) -> Tensor:
        """Per-position outputs after the final norm, ``[B, T, dim]``."""
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"a sequence of {T} positions is longer than the model's max_len {self.max_len}: "
                             f"truncate the data (data_prep/prepare_lra.py --max-len) or use a longer max length")
        if self.input_kind == "tokens" and x.dim() != 2:
            raise ValueError(f"token input must be [B, T] ids, got shape {tuple(x.shape)}")
        if self.input_kind == "pixels" and (x.dim() != 3 or x.shape[-1] != self.embed.in_features):
            raise ValueError(f"pixel input must be [B, T, {self.embed.in_features}], got shape {tuple(x.shape)}")
        g = self._grid(T, grid)
        if g is not None and padding_mask is not None:
            raise ValueError("2-D inputs are full grids: pass padding_mask=None (padded images are not supported)")
        # (No "is anything padded?" test here: it would read a device value on the host in every step.
        # Callers that know a batch is unpadded pass padding_mask=None: the unmasked kernels are faster.)
        h = self.embed(x)
        if self.positions == "sin":
            h = self.position_dropout(h + self._positions(T, h))
        bounds = self.lower_bounds().to(h.device) if self.lower_bounds is not None else None
        inner = None if self.unmasked_padding else padding_mask  # (the ablation: padding seen everywhere)
        for i, layer in enumerate(self.layers):
            h, _ = layer(h, None if bounds is None else bounds[i], None, False, padding_mask=inner, grid=g,
                         scan_padding=self.scan_padding)
        return apply_norm(self.final_norm, h, inner)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None,
                grid: Optional[Sequence[int]] = None, pool_exclude: Optional[Tensor] = None) -> Tensor:
        """Mean (``pool="max"``: channel-wise maximum) of the features over the valid positions;
        ``pool_exclude`` ``[B, T]`` (True: left out of the pooling only) marks positions the layers see but the
        pooling skips (the task's scratch positions)."""
        h = self.features(x, padding_mask, grid)
        if pool_exclude is not None:
            padding_mask = pool_exclude if padding_mask is None else padding_mask | pool_exclude
        return (masked_max if self.pool == "max" else masked_mean)(h, padding_mask)


class LraClassifier(nn.Module):
    """``LraEncoder`` + Linear(d, num_classes). ``forward(x, padding_mask=None, grid=None) -> [B, classes]``."""

    def __init__(self, encoder: LraEncoder, num_classes: int):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes={num_classes} must be >= 2")
        self.encoder, self.num_classes = encoder, num_classes
        self.head = nn.Linear(encoder.dim, num_classes)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, grid=None,
                pool_exclude: Optional[Tensor] = None) -> Tensor:
        pooled = self.encoder(x, padding_mask, grid, pool_exclude)
        return self.head(pooled.to(self.head.weight.dtype))


class RetrievalHead(nn.Module):
    """[u, v, u - v, u * v] -> Linear(4d, d) -> GELU -> Linear(d, num_classes)."""

    def __init__(self, dim: int, num_classes: int = 2):
        super().__init__()
        self.fc1 = nn.Linear(4 * dim, dim)
        self.fc2 = nn.Linear(dim, num_classes)

    def forward(self, u: Tensor, v: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(torch.cat([u, v, u - v, u * v], dim=-1))))


class LraPairClassifier(nn.Module):
    """Retrieval: both documents through one shared encoder, then ``RetrievalHead``.

    ``forward(x0, mask0, x1, mask1) -> [B, classes]``. The two documents run as one batch of 2B
    sequences (padded to their common maximum length), so each layer runs once and the batch norm
    statistics cover both documents; the masks keep every document's output independent of the
    other's length.
    """

    def __init__(self, encoder: LraEncoder, num_classes: int = 2):
        super().__init__()
        self.encoder, self.num_classes = encoder, num_classes
        self.head = RetrievalHead(encoder.dim, num_classes)

    def forward(self, x0: Tensor, mask0: Optional[Tensor], x1: Tensor, mask1: Optional[Tensor],
                pad_value: int = 0, exclude_value: Optional[int] = None) -> Tensor:
        """``exclude_value``: a token id whose positions the pooling leaves out (the task's scratch
        positions; see ``LraEncoder.forward``)."""
        B = x0.shape[0]
        T = max(x0.shape[1], x1.shape[1])

        def widen(x, mask):
            if mask is None:
                mask = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
            extra = T - x.shape[1]
            if extra:
                x = F.pad(x, (0, extra), value=pad_value)
                mask = F.pad(mask, (0, extra), value=True)
            return x, mask

        if mask0 is None and mask1 is None and x0.shape[1] == x1.shape[1]:
            x, mask = torch.cat([x0, x1]), None  # nothing padded: the unmasked kernels
        else:
            (x0, mask0), (x1, mask1) = widen(x0, mask0), widen(x1, mask1)
            x, mask = torch.cat([x0, x1]), torch.cat([mask0, mask1])
        pooled = self.encoder(x, mask, None, None if exclude_value is None else x.eq(exclude_value))
        u, v = pooled[:B], pooled[B:]
        return self.head(u.to(self.head.fc1.weight.dtype), v.to(self.head.fc1.weight.dtype))
