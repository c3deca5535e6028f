"""Which dq/dg backward config of the HGRN2 chunk kernels faults at head 64 (hgrn2_vit_tiny's shape)?

    python -m bench.explore.hgrn2_head64_configs            # every config x batch, one process each
    python -m bench.explore.hgrn2_head64_configs --sanitize --batch 16   # each under compute-sanitizer

``--sanitize`` runs each case under ``compute-sanitizer --tool memcheck`` (on PATH or in
/usr/local/cuda/bin) and keeps its first report lines: whether a faulting config reads shared memory out of
bounds (a Triton layout-conversion fault, since only those conversions use shared memory there) or global
memory (an indexing error of ours), and whether the configs that run clean are clean under the sanitizer
too. The candidates are the dq/dg space (hgrn2_triton._DQDG_CONFIGS, pinned one at a time: a single config
is not pruned) plus BK 32 / 4 warps.

Each case runs in its own process (an illegal address poisons the CUDA context) with the dq/dg
autotuner pinned to one config, forward + backward, bf16, and prints ok / FAULT and the error of the
gradients against the float64 reference. Findings: docs/image.md.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

CHILD = r'''
import json, sys, torch
from hgrn_fairseq.kernels import hgrn2_triton as ht
from hgrn_fairseq.kernels.reference import hgrn2_scan_reference
import torch.nn.functional as F
import triton
idx, B, reverse, K = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
space = ht._FULL_SPACES[id(ht._bwd_dqdg.configs)]
cfg = space[idx] if idx < len(space) else triton.Config({"BK": 32}, num_warps=4)  # the extra: BK 32 / 4 warps
ht._bwd_dqdg.configs = [cfg]
g = torch.Generator().manual_seed(0)
T, H = 196, 3
q = torch.randn(B, T, H, K, generator=g); v = torch.randn(B, T, H, K, generator=g)
lg = F.logsigmoid(2 * torch.randn(B, T, H, K, generator=g) + 1)
leaves = [x.to(torch.bfloat16).cuda().requires_grad_() for x in (q, v, lg)]
o, st = ht.hgrn2_fused(*leaves, None, reverse, impl="chunk")
w = torch.randn(o.shape, generator=g)
(o.float().cpu() * w).sum().backward()
torch.cuda.synchronize()
ref = [x.to(torch.bfloat16).double().requires_grad_() for x in (q, v, lg)]
ro, _ = hgrn2_scan_reference(*ref, None, reverse)
(ro * w.double()).sum().backward()
err = {n: float((a.grad.double().cpu() - r.grad).norm() / r.grad.norm()) for n, a, r in zip("qvg", leaves, ref)}
print(json.dumps({"config": str(cfg), "err": err}))
'''


def sanitizer():
    for path in [shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer"]:
        if path and os.path.isfile(path):
            return path
    sys.exit("compute-sanitizer: not on PATH nor in /usr/local/cuda/bin (it comes with the CUDA toolkit)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sanitize", action="store_true", help="run each case under compute-sanitizer memcheck")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--timeout", type=int, default=300, help="seconds per case")
    args = p.parse_args(argv)
    from hgrn_fairseq.kernels import hgrn2_triton as ht

    n = len(ht._FULL_SPACES[id(ht._bwd_dqdg.configs)]) + 1  # the space and the BK 32 / 4-warp extra
    wrap = [sanitizer(), "--tool", "memcheck", "--error-exitcode", "9", "--print-limit", "5"] if args.sanitize else []
    rows = []
    for K in (64,):
        for B in (args.batch,):
            for reverse in ("0", "1"):
                for idx in range(n):
                    try:
                        p = subprocess.run(wrap + [sys.executable, "-c", CHILD, str(idx), str(B), reverse, str(K)],
                                           capture_output=True, text=True, timeout=args.timeout)
                        ok = p.returncode == 0
                        lines = p.stdout.strip().splitlines()
                        info = (json.loads([x for x in lines if x.startswith("{")][-1]) if ok
                                else {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:160]})
                        if args.sanitize:
                            # memcheck writes its reports to stdout, prefixed "========="
                            info["sanitizer"] = [x[:200] for x in lines if x.startswith("=========")][:8]
                    except subprocess.TimeoutExpired:
                        ok, info = False, {"error": f"timed out after {args.timeout} s"}
                    row = {"K": K, "B": B, "reverse": reverse, "config": idx, "ok": ok, **info}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
