"""``add_forget_gate_bias``: a long-memory initialisation of HGRN2's forget gates, shared by the Pathfinder ablation
(``lra_pathfinder_ablate.py``) and the grid probe (``lra_grid_toy_probe.py``). It imports no fairseq, so the probe
runs on a machine that has only PyTorch."""
from __future__ import annotations

import torch
from torch import nn

from hgrn_fairseq.modules.hgru2 import HGRU2


def add_forget_gate_bias(encoder: nn.Module, bias: float) -> None:
    """Add ``bias`` to the initial forget-gate logits of every HGRN2 mixer of ``encoder`` (in_proj = [v, q, f]:
    the last third; the series 2-D variant's row and column mixers alike); a layer without one is refused."""
    if not bias:
        return
    for layer in encoder.layers:
        mixers = [m for m in layer.mixer.modules() if isinstance(m, HGRU2) and m.in_proj.bias is not None]
        if not mixers:
            raise SystemExit(f"gatebias: {type(layer.mixer).__name__} is not an HGRN2 mixer with a bias: use mixer=hgru2")
        with torch.no_grad():
            for m in mixers:
                m.in_proj.bias[2 * m.dim:] += bias
