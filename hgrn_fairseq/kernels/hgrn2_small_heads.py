"""HGRN2 with tiny heads (K x V state of at most ``SMALL_HEAD_STATE`` numbers) as a scan of scalars.

Each entry of a head's state follows its own scalar recurrence::

    S_t[i, j] = lambda_t[i] S_{t-1}[i, j] + (1 - lambda_t[i]) v_t[j],      o_t[j] = sum_i q_t[i] S_t[i, j]

so the whole layer is the HGRU real scan over ``H * K * V`` channels (``hgru/ops.real_scan``, near the
bandwidth floor) and a contraction over ``i``. The decay, the inputs and the state are fp32 here (a bf16
decay near 1 would lose the long memory).

It pays for heads of one number (K = V = 1: LRA Path-X at expand ratio 1), where the layer *is* an HGRU
scan over d channels and this path is several times faster than the chunk kernels. Heads of 2 x 2 are
slower this way: the state's four entries per head are materialised in fp32 (``[B, T, 4d]``) and
contracted by PyTorch operators, forward and backward. So ``hgrn2_scan`` routes only K x V <=
``SMALL_HEAD_STATE`` = 1 here (measurements: docs/design.md); the function itself is exact for any K, V
(tested). Other small heads take ``hgrn2_triton``'s packed kernels.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

Tensor = torch.Tensor

SMALL_HEAD_STATE = 1  # K * V at or below which hgrn2_scan takes this path on the Triton backend (see above)


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
