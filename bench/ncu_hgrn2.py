"""One HGRN2 forward+backward under Nsight Compute, for per-kernel stall profiles (GPU machine).

Runs ``hgrn2_fused`` fwd+bwd a few times (compilation and autotuning), then once more between
``cudaProfilerStart`` / ``cudaProfilerStop``, so that ``ncu --profile-from-start off`` sees only that
call's kernels:

    ncu --clock-control none --profile-from-start off --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SpeedOfLight python3 bench/ncu_hgrn2.py 8 2048 8 128
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from hgrn_fairseq.kernels.hgrn2_triton import hgrn2_fused  # noqa: E402


def main():
    B, T, H, K = (int(a) for a in (sys.argv[1:5] if len(sys.argv) >= 5 else (8, 2048, 8, 128)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, T, H, K, device="cuda", generator=gen).bfloat16().requires_grad_()
    v = torch.randn(B, T, H, K, device="cuda", generator=gen).bfloat16().requires_grad_()
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen)).bfloat16().requires_grad_()
    do = torch.randn(B, T, H, K, device="cuda", generator=gen).bfloat16()

    def step():
        o, _ = hgrn2_fused(q, v, g)
        o.backward(do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
