"""HGRU: the HGRN1 token mixer, complex-valued by default, with a real variant."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import BACKENDS, hgru_scan
from ..kernels.block_ops import linear
from ..kernels.norm_gate import norm_gate
from .scan2d import check_grid, grid_scan

Tensor = torch.Tensor


def theta_init(dim: int) -> Tensor:
    """theta_j = 10000^(-2j/d), the rotation angle per step of complex channel j."""
    return 10000.0 ** (-2.0 * torch.arange(dim, dtype=torch.float64) / dim)


def check_mixer_call(
    mixer: nn.Module, x: Tensor, lower_bound, initial_state, output_final_state: bool, padding_mask=None, grid=None
):
    """Shared argument checks of the token mixers' ``forward`` (they expose ``dim``, ``causal``,
    ``gate_dim`` and ``state_shape(batch)``). Returns ``grid`` as ``(H, W)`` or None."""
    name = type(mixer).__name__
    if x.dim() != 3 or x.shape[-1] != mixer.dim:
        raise ValueError(f"{name} expects x of shape [B, T, {mixer.dim}], got {tuple(x.shape)}")
    if not mixer.causal and (initial_state is not None or output_final_state):
        raise ValueError(f"a bidirectional (causal=False) {name} has no recurrent state to carry")
    expected = mixer.state_shape(x.shape[0])
    if initial_state is not None and tuple(initial_state.shape) != expected:
        raise ValueError(f"initial_state has shape {tuple(initial_state.shape)}, expected {expected}")
    if isinstance(lower_bound, Tensor) and lower_bound.shape[-1] != mixer.gate_dim:
        raise ValueError(f"lower_bound has {lower_bound.shape[-1]} channels, expected {mixer.gate_dim}")
    if padding_mask is not None and (padding_mask.dtype != torch.bool or tuple(padding_mask.shape) != tuple(x.shape[:2])):
        raise ValueError(
            f"padding_mask must be a bool tensor of shape {tuple(x.shape[:2])} (True at padding), "
            f"got {padding_mask.dtype} {tuple(padding_mask.shape)}"
        )
    return None if grid is None else check_grid(grid, x.shape[1], mixer.causal, padding_mask, name)


def mask_padding(t: Tensor, padding_mask) -> Tensor:
    """Zero ``t`` (``[B, T, ...]``) at padded positions: a zero input (pre-SiLU, or SiLU'd value)
    leaves a zero state zero whatever the decay, so padding reaches no valid position in either
    scan direction."""
    if padding_mask is None:
        return t
    return t.masked_fill(padding_mask.reshape(*padding_mask.shape, *([1] * (t.dim() - 2))), 0)


def stack_old_projections(state_dict, name: str, old: Tuple[str, ...], new: str) -> None:
    """Replace the ``old`` Linear layers' entries of ``state_dict`` under ``name`` by one ``new``
    layer whose rows are theirs, in order (no-op when they are absent)."""
    prefix = f"{name}." if name else ""
    for suffix in ("weight", "bias"):
        keys = [f"{prefix}{o}.{suffix}" for o in old]
        if all(k in state_dict for k in keys):
            state_dict[f"{prefix}{new}.{suffix}"] = torch.cat([state_dict.pop(k) for k in keys], dim=0)


class BlockOpsSwitch:
    """``block_ops``: off by default, switched on by ``modules.block.use_block_ops``; ``ops_backend``: the
    backend of the module's ``kernels.block_ops`` calls, its kernel ``backend`` when on, else
    ``"reference"`` (PyTorch's own operations)."""

    block_ops = False

    @property
    def ops_backend(self) -> str:
        return self.backend if self.block_ops else "reference"


class HGRU(BlockOpsSwitch, nn.Module):
    """Hierarchically gated recurrent unit, batch-first ``[B, T, dim] -> [B, T, dim]``.

    Complex (default), ``state_dim = dim`` complex channels stored interleaved
    (``Re c_0, Im c_0, Re c_1, ...``)::

        c = SiLU(W_in x)                     W_in: dim -> 2*dim (interleaved re/im)
        lambda = gamma + (1 - gamma) * sigmoid(W_f x)     W_f: dim -> dim
        (W_in, W_f, W_g stacked in that order as ``in_proj``, dim -> 5*dim)
        h_t = lambda_t * exp(i theta) * h_{t-1} + (1 - lambda_t) * c_t
        y = W_out(LN([Re h, Im h]) * SiLU(W_g x))         (norm_before_gate=True, released code)
        y = W_out(LN([Re h, Im h] * SiLU(W_g x)))         (norm_before_gate=False, paper's equation)

    Real (``complex=False``): every projection is ``dim -> state_dim`` (``state_dim`` = dim, or
    2*dim for the HGRN2 paper's "2d state" row) and there is no rotation.

    Non-causal (``causal=False``): the scan runs forwards and backwards over the same gates and the
    two are summed before the norm; each direction has its own theta. ``padding_mask`` (``[B, T]``,
    True at padding) zeroes the input there, so padding never reaches a valid position. ``grid=(H, W)``
    (non-causal): the four-direction 2-D scan over the tokens as an H x W raster (scan2d.py); the
    rows and the columns share the forward theta and the reverse theta.

    Interleaving versus the released code's ``[Re | Im]`` halves is a fixed permutation of the
    projection rows and norm weights, so it changes neither the function class nor the parameter
    count.

    ``lower_bound`` (forward argument): ``gamma`` for this layer, a float or a ``[state_dim]``
    tensor (see ``LayerLowerBounds``); 0 when None.
    """

    def __init__(
        self,
        dim: int,
        complex: bool = True,
        state_dim: Optional[int] = None,
        causal: bool = True,
        norm_before_gate: bool = True,
        bias: bool = True,
        backend: str = "auto",
    ):
        super().__init__()
        if dim < 1:
            raise ValueError(f"dim={dim} must be >= 1")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
        state_dim = dim if state_dim is None else state_dim
        if complex and state_dim != dim:
            raise ValueError(
                f"state_dim={state_dim}: the complex HGRU has state_dim == dim ({dim}) complex "
                "channels; use complex=False for other state sizes"
            )
        if state_dim < 1:
            raise ValueError(f"state_dim={state_dim} must be >= 1")
        self.dim, self.state_dim, self.complex = dim, state_dim, complex
        self.causal, self.norm_before_gate, self.backend = causal, norm_before_gate, backend
        width = 2 * state_dim if complex else state_dim  # real channels of the hidden state
        self.width = width
        # W_in, W_f and W_g as one matrix: one product (and one bf16 cast of the weights under
        # autocast) instead of three; the scan kernels read the slices in place (strided views)
        self.projection_sizes = (width, state_dim, width)
        self.in_proj = nn.Linear(dim, sum(self.projection_sizes), bias=bias)
        self.out_proj = nn.Linear(width, dim, bias=bias)
        self.norm = nn.LayerNorm(width)
        if complex:
            self.theta = nn.Parameter(theta_init(state_dim).float())
            if not causal:
                self.theta_reverse = nn.Parameter(theta_init(state_dim).float())

    def upgrade_state_dict_named(self, state_dict, name: str) -> None:
        """Checkpoints with separate projections (``input_proj``, ``forget_proj``, ``gate_proj``) load
        as ``in_proj`` (fairseq calls this when it loads a checkpoint)."""
        stack_old_projections(state_dict, name, ("input_proj", "forget_proj", "gate_proj"), "in_proj")

    @property
    def gate_dim(self) -> int:
        """Width of the forget gate, i.e. of the lower bound this layer takes."""
        return self.state_dim

    def state_shape(self, batch: int) -> Tuple[int, ...]:
        return (batch, self.state_dim, 2) if self.complex else (batch, self.state_dim)

    def forward(
        self,
        x: Tensor,
        lower_bound: Union[float, Tensor, None] = None,
        initial_state: Optional[Tensor] = None,
        output_final_state: bool = False,
        padding_mask: Optional[Tensor] = None,
        grid: Optional[Tuple[int, int]] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """x: ``[B, T, dim]``. initial_state: ``[B, state_dim(, 2)]`` (causal only).
        padding_mask: ``[B, T]`` bool, True at padding. grid: ``(H, W)`` with ``H * W == T``.

        Returns ``(y [B, T, dim], final_state or None)``.
        """
        grid = check_mixer_call(self, x, lower_bound, initial_state, output_final_state, padding_mask, grid)
        B, T, _ = x.shape
        if isinstance(lower_bound, Tensor):
            lower_bound = lower_bound.to(x.dtype)
        inputs, forget, gate = linear(x, self.in_proj.weight, self.in_proj.bias, self.ops_backend).split(
            self.projection_sizes, dim=-1)
        inputs = mask_padding(inputs, padding_mask)
        if self.complex:
            inputs = inputs.unflatten(-1, (self.state_dim, 2))
        theta = self.theta if self.complex else None
        theta_r = self.theta_reverse if self.complex and not self.causal else None
        final = None
        if grid is not None:
            def both_ways(f, c):
                return (hgru_scan(f, c, theta, lower_bound, None, False, self.backend)[0]
                        + hgru_scan(f, c, theta_r, lower_bound, None, True, self.backend)[0])

            h = grid_scan(both_ways, (forget, inputs), grid)
        else:
            h, final = hgru_scan(forget, inputs, theta, lower_bound, initial_state, False, self.backend)
            if not self.causal:
                h = h + hgru_scan(forget, inputs, theta_r, lower_bound, None, True, self.backend)[0]
        h = h.reshape(B, T, self.width)
        if self.norm_before_gate:  # one kernel each way on the Triton path
            y = norm_gate(h, gate, self.norm.weight, self.norm.bias, self.norm.eps, backend=self.backend)
        else:
            y = self.norm(h * F.silu(gate))
        return linear(y, self.out_proj.weight, self.out_proj.bias, self.ops_backend), (final if output_final_state else None)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, state_dim={self.state_dim}, complex={self.complex}, causal={self.causal}, "
            f"norm_before_gate={self.norm_before_gate}, backend={self.backend!r}"
        )
