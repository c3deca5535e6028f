#!/usr/bin/env python3
"""Which launch modes the HGRU planner picks, per kernel, over a grid of shapes and SM counts (no GPU).

``_plan(B, T, D, is_complex, device, fused, backward)`` decides the mode of every launch from the shape,
the SM count and the kernel (complex or real, fused or plain, forward or backward); the dtype and the
direction (``reverse``) do not enter it (the dtype only changes how many channels an access moves, at
launch). This script runs the planner with its default tables (``tuning`` all None) over B x T x D x SM
counts and prints, per kernel, each mode it picked with the first shape that picked it, then the modes
of ``_MODES`` that no kernel picked anywhere. Rerun it after changing the planner's tables, before
deciding that a mode is dead code:

    python3 -m bench.plan_modes [--sms 132,114,108,4]
"""
from __future__ import annotations

import argparse
import itertools
import sys


import torch  # noqa: E402

BATCH = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 1024]
LENGTHS = [1, 2, 7, 8, 9, 16, 17, 32, 64, 100, 512, 1000, 2048, 4096, 16384, 100000, 1_000_003]
WIDTHS = [1, 16, 31, 32, 48, 64, 96, 128, 192, 200, 256, 384, 512, 768, 1000, 1024, 1536, 2048, 4096, 8192]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", default="132,114,108,4",
                    help="SM counts to plan for (H100 SXM / H200 132, H100 PCIe 114, A100 108; 4 is what the "
                         "CPU interpreter reports)")
    args = ap.parse_args(argv)
    from hgrn_fairseq.kernels.hgru import plan as P

    assert all(v is None for v in P.tuning.values()), "tuning must hold the defaults (all None)"
    picked = {}  # (complex, fused, backward) -> {mode: first (sms, B, T, D)}
    for i, sms in enumerate(int(s) for s in args.sms.split(",")):
        P._SM_COUNT[100 + i] = sms  # a fake device index with this SM count: _sm_count never asks CUDA
        dev = torch.device("cuda", 100 + i) if sms != 4 else torch.device("cpu")
        for key in itertools.product((False, True), repeat=3):
            for B, T, D in itertools.product(BATCH, LENGTHS, WIDTHS):
                mode = P._plan(B, T, D, key[0], dev, key[1], key[2])["mode"]
                picked.setdefault(key, {}).setdefault(mode, (sms, B, T, D))
    print("| complex | fused | backward | modes picked (first SMs, B, T, D) |")
    print("|---|---|---|---|")
    for key in sorted(picked):
        modes = "; ".join(f"{m} {v}" for m, v in sorted(picked[key].items()))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {modes} |")
    used = {m for modes in picked.values() for m in modes}
    never = [m for m in P._MODES if m not in used]
    print(f"\nmodes never picked: {', '.join(never) if never else 'none'}")
    fwd_stream = any("stream" in picked[(False, fu, False)] for fu in (False, True))
    print(f"stream forward picked: {fwd_stream}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
