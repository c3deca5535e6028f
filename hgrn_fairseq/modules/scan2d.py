"""Non-causal scans over an H x W grid of tokens (LRA Image / Pathfinder / Path-X, 2-D image models).

A sequence of ``T = H * W`` tokens in raster order (row by row) is a grid. The parallel 2-D scan (the
LRA 2-D models') runs the bidirectional 1-D scan along every row and down every column, each row and column
starting from a zero state, and sums the two. The mixers (``HGRU``, ``HGRU2``) call
``grid_scan`` with their own bidirectional scan, so the projections, gates and norm are computed once
and only the recurrences run per axis; on CUDA those are the same Triton kernels as in 1-D (rows and
columns become batch rows of the kernel), never a Python loop over time.

``Series2D`` is the HGRN2 paper's "series" variant (Path-X): one whole bidirectional mixer along the
rows, then a second one down the columns.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import nn

Tensor = torch.Tensor
Grid = Tuple[int, int]


def check_grid(grid, T: int, causal: bool, padding_mask, owner: str) -> Grid:
    """``grid`` as ``(H, W)`` after checking it against the sequence (one-line errors)."""
    if causal:
        raise ValueError(f"{owner}: a 2-D grid scan needs a non-causal (causal=False) mixer")
    if padding_mask is not None:
        raise ValueError(f"{owner}: grid and padding_mask together: 2-D inputs are full grids, pass no padding_mask")
    try:
        H, W = (int(v) for v in grid)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: grid={grid!r} must be a pair (H, W)") from None
    if H < 1 or W < 1 or H * W != T:
        raise ValueError(f"{owner}: grid={grid!r} does not tile the sequence of {T} tokens (need H * W == {T})")
    return H, W


def rows(t: Tensor, grid: Grid) -> Tensor:
    """``[B, H*W, ...] -> [B*H, W, ...]``: each row a sequence (a view when ``t``'s layout allows)."""
    H, W = grid
    return t.reshape(t.shape[0] * H, W, *t.shape[2:])


def columns(t: Tensor, grid: Grid) -> Tensor:
    """``[B, H*W, ...] -> [B*W, H, ...]``: each column a sequence, top to bottom (a copy)."""
    H, W = grid
    rest = t.shape[2:]
    return t.reshape(t.shape[0], H, W, *rest).transpose(1, 2).reshape(t.shape[0] * W, H, *rest)


def from_rows(t: Tensor, batch: int, grid: Grid) -> Tensor:
    return t.reshape(batch, grid[0] * grid[1], *t.shape[2:])


def from_columns(t: Tensor, batch: int, grid: Grid) -> Tensor:
    H, W = grid
    rest = t.shape[2:]
    return t.reshape(batch, W, H, *rest).transpose(1, 2).reshape(batch, H * W, *rest)


def grid_scan(scan: Callable[..., Tensor], tensors: Sequence[Tensor], grid: Grid) -> Tensor:
    """``scan(*tensors)`` (a bidirectional 1-D scan ``[N, L, ...] -> [N, L, ...]``) along the rows
    plus down the columns of the grid; ``tensors`` are ``[B, H*W, ...]``."""
    B = tensors[0].shape[0]
    along_rows = from_rows(scan(*(rows(t, grid) for t in tensors)), B, grid)
    down_columns = from_columns(scan(*(columns(t, grid) for t in tensors)), B, grid)
    return along_rows + down_columns


class Series2D(nn.Module):
    """The "series" 2-D mixer: ``col_mixer`` down the columns of ``row_mixer``'s output along the rows.

    Both are non-causal 1-D mixers of the same width (their own parameters, so the layer has twice a
    1-D mixer's parameters). Same call signature as the mixers; ``grid`` is required.
    """

    def __init__(self, row_mixer: nn.Module, col_mixer: nn.Module):
        super().__init__()
        for name, m in (("row_mixer", row_mixer), ("col_mixer", col_mixer)):
            if getattr(m, "causal", False):
                raise ValueError(f"Series2D: {name} must be non-causal (causal=False)")
        if row_mixer.dim != col_mixer.dim:
            raise ValueError(f"Series2D: row_mixer.dim={row_mixer.dim} != col_mixer.dim={col_mixer.dim}")
        self.row_mixer, self.col_mixer = row_mixer, col_mixer
        self.dim, self.causal = row_mixer.dim, False

    @property
    def gate_dim(self) -> int:
        return self.row_mixer.gate_dim

    def forward(
        self,
        x: Tensor,
        lower_bound=None,
        initial_state: Optional[Tensor] = None,
        output_final_state: bool = False,
        padding_mask: Optional[Tensor] = None,
        grid: Optional[Grid] = None,
    ) -> Tuple[Tensor, None]:
        if grid is None:
            raise ValueError("Series2D needs grid=(H, W): it is a 2-D mixer")
        if initial_state is not None or output_final_state:
            raise ValueError("Series2D is non-causal: it has no recurrent state to carry")
        grid = check_grid(grid, x.shape[1], False, padding_mask, "Series2D")
        B = x.shape[0]
        y, _ = self.row_mixer(rows(x, grid), lower_bound)
        y, _ = self.col_mixer(columns(from_rows(y, B, grid), grid), lower_bound)
        return from_columns(y, B, grid), None
