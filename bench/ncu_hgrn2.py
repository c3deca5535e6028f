"""One HGRN2 forward+backward under Nsight Compute, for per-kernel stall profiles (GPU machine).

Runs ``hgrn2_fused`` fwd+bwd a few times (compilation and autotuning), then once more between
``cudaProfilerStart`` / ``cudaProfilerStop``, so that ``ncu --profile-from-start off`` sees only that
call's kernels:

    ncu --clock-control none --profile-from-start off --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SpeedOfLight python3 -m bench.ncu_hgrn2 8 2048 8 128
"""
from __future__ import annotations

import sys

import torch

from bench.bench_hgrn2 import inputs, ours  # the bench's inputs and its fwd+bwd of ours


def main():
    B, T, H, K = (int(a) for a in (sys.argv[1:5] if len(sys.argv) >= 5 else (8, 2048, 8, 128)))
    step = ours(*inputs(B, T, H, K), bwd=True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
