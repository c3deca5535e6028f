"""LRU: the Linear Recurrent Unit of Orvieto et al. (2023) as a token mixer."""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..kernels import BACKENDS, complex_scan
from .bitlinear import linear, straight_through, ternary_weight
from .hgru import check_mixer_call

Tensor = torch.Tensor
SLOW_PARAMETERS = ("nu_log", "theta_log", "gamma_log", "in_proj.weight")  # the paper's optimiser group
# Attribute that asks the optimizer for a parameter group of its own (read by fairseq_compat step 6):
# a dict of the group's settings, e.g. {"weight_decay": 0.0, "lr_scale": 0.5}.
OPTIM_GROUP_ATTR = "optim_group"


class LRU(nn.Module):
    """``[B, T, dim] -> [B, T, dim]`` with ``state_dim`` = N complex channels::

        lambda = exp(-exp(nu_log) + i exp(theta_log))                  (diagonal, |lambda| < 1)
        x_k = lambda * x_{k-1} + exp(gamma_log) * (B u_k)              B: complex N x dim
        y_k = Re(C x_k) + D * u_k                                      C: complex dim x N, D: [dim]

    Ring initialisation: u1, u2 ~ U(0, 1); |lambda| = sqrt(u1 (r_max^2 - r_min^2) + r_min^2), i.e.
    nu_log = log(-0.5 log(u1 (r_max^2 - r_min^2) + r_min^2)); phase = max_phase * u2, theta_log =
    log(phase); gamma_log = log sqrt(1 - |lambda|^2) (trainable); B ~ N(0, 1/(2 dim)) and C ~ N(0, 1/N)
    per real and imaginary part; D ~ N(0, 1).

    B is ``in_proj`` (dim -> 2N, rows interleaved Re, Im, no bias), C is ``out_proj`` (2N -> dim, no bias,
    columns [Re C_j, -Im C_j] so that it computes Re(C x)). ``ternary``: B is a ``BitLinear``
    (LRU-MML); ``fully_mml``: B, C and D are (D quantised to {-1, 0, 1} / s like a weight). The recurrence
    is ``complex_scan`` with a decay |lambda| constant over time and the rotation arg(lambda).
    ``SLOW_PARAMETERS`` names the parameters the paper trains without weight decay at a smaller learning
    rate (see ``lru_parameter_groups``).
    """

    def __init__(self, dim: int, state_dim: int, r_min: float = 0.0, r_max: float = 1.0,
                 max_phase: float = 2 * math.pi, ternary: bool = False, fully_mml: bool = False,
                 causal: bool = True, backend: str = "auto"):
        super().__init__()
        if dim < 1 or state_dim < 1:
            raise ValueError(f"LRU: dim={dim} and state_dim={state_dim} must be >= 1")
        if not 0.0 <= r_min < r_max <= 1.0:
            raise ValueError(f"LRU: r_min={r_min}, r_max={r_max}: need 0 <= r_min < r_max <= 1 (the ring of |lambda|)")
        if not 0.0 < max_phase <= 2 * math.pi:
            raise ValueError(f"LRU: max_phase={max_phase} must be in (0, 2 pi]")
        if backend not in BACKENDS:
            raise ValueError(f"LRU: backend={backend!r} is not one of {BACKENDS}")
        self.dim, self.state_dim, self.causal, self.backend = dim, state_dim, causal, backend
        self.r_min, self.r_max, self.max_phase = r_min, r_max, max_phase
        self.ternary, self.fully_mml = ternary or fully_mml, fully_mml
        u1, u2 = torch.rand(state_dim, dtype=torch.float64), torch.rand(state_dim, dtype=torch.float64)
        radius_sq = u1 * (r_max**2 - r_min**2) + r_min**2
        self.nu_log = nn.Parameter(torch.log(-0.5 * torch.log(radius_sq.clamp(min=1e-12))).float())
        self.theta_log = nn.Parameter(torch.log((max_phase * u2).clamp(min=1e-12)).float())
        self.gamma_log = nn.Parameter(torch.log(torch.sqrt((1 - radius_sq).clamp(min=1e-12))).float())
        self.in_proj = linear(dim, 2 * state_dim, self.ternary, bias=False)
        self.out_proj = linear(2 * state_dim, dim, fully_mml, bias=False)
        self.D = nn.Parameter(torch.randn(dim))
        with torch.no_grad():
            self.in_proj.weight.normal_(0.0, (1.0 / (2 * dim)) ** 0.5)
            c = torch.randn(dim, state_dim, 2) * state_dim**-0.5  # C = c[..., 0] + i c[..., 1]
            self.out_proj.weight.copy_(torch.stack([c[..., 0], -c[..., 1]], dim=-1).reshape(dim, 2 * state_dim))

    @property
    def gate_dim(self) -> int:
        return self.state_dim

    def state_shape(self, batch: int) -> Tuple[int, ...]:
        return (batch, self.state_dim, 2)

    def magnitude_and_phase(self) -> Tuple[Tensor, Tensor]:
        """|lambda| = exp(-exp(nu_log)) and arg(lambda) = exp(theta_log), each ``[state_dim]``, in float32
        (float64 for float64 parameters) whatever the parameters' dtype: in bf16 every |lambda| above
        ~0.998 would round to 1.0, a channel that never forgets."""
        dtype = torch.promote_types(self.nu_log.dtype, torch.float32)
        return torch.exp(-torch.exp(self.nu_log.to(dtype))), torch.exp(self.theta_log.to(dtype))

    def forward(self, x: Tensor, lower_bound: Union[float, Tensor, None] = None,
                initial_state: Optional[Tensor] = None, output_final_state: bool = False):
        """x ``[B, T, dim]``; ``lower_bound`` must be None or zero (the LRU has no forget gate)."""
        check_mixer_call(self, x, None, initial_state, output_final_state)
        # (checked on the host only: a CUDA check would synchronise every step; hgrn_lm refuses an LRU
        # with lower bounds when it is built)
        nonzero = (isinstance(lower_bound, (int, float)) and lower_bound != 0) or (
            isinstance(lower_bound, Tensor) and not lower_bound.is_cuda and bool(lower_bound.ne(0).any()))
        if nonzero:
            raise ValueError("LRU has no forget gate to bound: build it without lower bounds (--no-lower-bound)")
        B, T, _ = x.shape
        magnitude, phase = self.magnitude_and_phase()
        bu = self.in_proj(x).unflatten(-1, (self.state_dim, 2))
        inputs = torch.exp(self.gamma_log).to(x.dtype)[:, None] * bu
        # the decay stays float32 (the Triton scan reads mixed dtypes and accumulates in fp32; the
        # reference then runs in float32 and h is cast back)
        decay = magnitude.expand(B, T, self.state_dim)
        h, final = complex_scan(inputs, decay, phase, initial_state, False, self.backend)
        if not self.causal:
            h = h + complex_scan(inputs, decay, phase, None, True, self.backend)[0]
        h = h.to(x.dtype)
        final = None if final is None else final.to(x.dtype)
        d = straight_through(self.D, ternary_weight(self.D)) if self.fully_mml else self.D
        y = self.out_proj(h.flatten(-2)) + d.to(x.dtype) * x
        return y, (final if output_final_state else None)

    def mark_slow_parameters(self, lr_scale: float = 0.5) -> None:
        """Ask for the LRU paper's optimiser group: nu_log, theta_log, gamma_log and B without weight
        decay, at ``lr_scale`` x the learning rate (``OPTIM_GROUP_ATTR`` on each parameter)."""
        if not 0.0 < lr_scale <= 1.0:
            raise ValueError(f"LRU: lr_scale={lr_scale} must be in (0, 1]")
        for name in SLOW_PARAMETERS:
            setattr(self.get_parameter(name), OPTIM_GROUP_ATTR, {"weight_decay": 0.0, "lr_scale": float(lr_scale)})

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, state_dim={self.state_dim}, r_min={self.r_min}, r_max={self.r_max}, "
                f"max_phase={self.max_phase:.4f}, ternary={self.ternary}, fully_mml={self.fully_mml}")


def lru_parameter_groups(model: nn.Module, lr_scale: float = 0.5):
    """The LRU paper's optimiser detail: ``(slow, rest)`` parameter lists, ``slow`` being every LRU's
    nu_log, theta_log, gamma_log and B (to train with no weight decay and ``lr_scale`` x the rate)."""
    slow_ids = set()
    for module in model.modules():
        if isinstance(module, LRU):
            for name in SLOW_PARAMETERS:
                slow_ids.add(id(module.get_parameter(name)))
    slow = [p for p in model.parameters() if id(p) in slow_ids]
    rest = [p for p in model.parameters() if id(p) not in slow_ids]
    return slow, rest
