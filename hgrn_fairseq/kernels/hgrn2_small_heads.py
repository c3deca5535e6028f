"""HGRN2 with tiny heads (K x V state of at most ``SMALL_HEAD_STATE`` numbers) as a scan of scalars.

Each entry of a head's state follows its own scalar recurrence::

    S_t[i, j] = lambda_t[i] S_{t-1}[i, j] + (1 - lambda_t[i]) v_t[j],      o_t[j] = sum_i q_t[i] S_t[i, j]

so for K = V = 2 (the LRA HGRN2 Image / Pathfinder / Retrieval models, expand ratio 2) or 1 (Path-X) the
whole layer is the HGRU real scan over ``H * K * V`` channels (``hgru/ops.real_scan``, near the bandwidth
floor) and a contraction over ``i``. The chunked HGRN2 kernels are built for heads of 64-128; at heads of
2, after the 2-D scan turned every image row and column into a sequence of 32 steps, the HGRN2 image models
trained at 0.07x a Transformer (H100, 2026-11-24, docs/lra.md). The decay, the inputs and the state are fp32
here (a bf16 decay near 1 would lose the long memory). The speed of this path on a GPU has not been measured
yet (bench/bench_lra.py's HGRN2 rows).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

Tensor = torch.Tensor

SMALL_HEAD_STATE = 4  # K * V at or below which hgrn2_scan takes this path on the Triton backend


def hgrn2_small_head_scan(q: Tensor, v: Tensor, log_decay: Tensor, initial_state: Optional[Tensor] = None,
                          reverse: bool = False) -> Tuple[Tensor, Tensor]:
    """Same contract as ``dispatch.hgrn2_scan`` (``q, log_decay: [B, T, H, K]``, ``v: [B, T, H, V]``,
    state ``[B, H, K, V]``); returns ``(o [B, T, H, V] in q's dtype, final_state fp32)``."""
    from .hgru.ops import real_scan

    B, T, H, K = q.shape
    V = v.shape[-1]
    log_decay = log_decay.float()
    lam = torch.exp(log_decay)
    k = -torch.expm1(log_decay)  # 1 - lambda without cancellation near 1
    x = (k.unsqueeze(-1) * v.float().unsqueeze(-2)).reshape(B, T, H * K * V)
    a = lam.unsqueeze(-1).expand(B, T, H, K, V).reshape(B, T, H * K * V)
    h0 = None if initial_state is None else initial_state.float().reshape(B, H * K * V)
    S, final = real_scan(x, a, h0, reverse)
    o = torch.einsum("bthk,bthkv->bthv", q.float(), S.view(B, T, H, K, V))
    return o.to(q.dtype), final.view(B, H, K, V)
