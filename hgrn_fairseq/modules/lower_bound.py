"""Layer-wise lower bounds on the forget gate: the "hierarchical" part of HGRN."""
from __future__ import annotations

import torch
from torch import nn


class LayerLowerBounds(nn.Module):
    """gamma_k = C_k - C_0 with C = cumsum(softmax(Gamma, dim=layers)).

    One learnable ``Gamma`` of shape ``[num_layers, dim]`` (initialised to ones) for the whole
    network. Layer 0 gets bound 0 and bounds grow monotonically with depth (``k / L`` at init), so
    upper layers are pushed towards long memory. With ``enabled=False`` (the paper's ablation)
    there is no parameter and every bound is 0.

    ``forward()`` returns a ``[num_layers, dim]`` tensor in the parameter's dtype.
    """

    def __init__(self, num_layers: int, dim: int, enabled: bool = True):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers={num_layers} must be >= 1")
        if dim < 1:
            raise ValueError(f"dim={dim} must be >= 1")
        self.num_layers, self.dim, self.enabled = num_layers, dim, enabled
        if enabled:
            self.gamma = nn.Parameter(torch.ones(num_layers, dim))
        else:
            self.register_parameter("gamma", None)
            # follows the module's device, so a disabled bound costs no host-to-device copy per step;
            # not persistent, so checkpoints do not carry it
            self.register_buffer("zeros", torch.zeros(num_layers, dim), persistent=False)

    def forward(self) -> torch.Tensor:
        if not self.enabled:
            return self.zeros
        c = torch.cumsum(torch.softmax(self.gamma, dim=0), dim=0)
        return c - c[:1]

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}, dim={self.dim}, enabled={self.enabled}"
