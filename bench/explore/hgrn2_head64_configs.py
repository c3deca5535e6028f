"""Which dq/dg backward config of the HGRN2 chunk kernels faults at head 64 (hgrn2_vit_tiny's shape)?

    python bench/explore/hgrn2_head64_configs.py            # every config x batch, one process each

Each case runs in its own process (an illegal address poisons the CUDA context) with the dq/dg
autotuner pinned to one config, forward + backward, bf16, and prints ok / FAULT and the error of the
gradients against the float64 reference. Found on an H100, 2026-11-24: the backward faulted at
B 128 x 3 heads of 64, T 196.
"""
import json
import subprocess
import sys

CHILD = r'''
import json, sys, torch
sys.path.insert(0, ".")
from hgrn_fairseq.kernels import hgrn2_triton as ht
from hgrn_fairseq.kernels.reference import hgrn2_scan_reference
import torch.nn.functional as F
idx, B, reverse, K = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
cfg = ht._FULL_SPACES[id(ht._bwd_dqdg.configs)][idx]
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


def main():
    from hgrn_fairseq.kernels import hgrn2_triton as ht

    n = len(ht._FULL_SPACES[id(ht._bwd_dqdg.configs)])
    rows = []
    for K in (64,):
        for B in (128,):
            for reverse in ("0", "1"):
                for idx in range(n):
                    p = subprocess.run([sys.executable, "-c", CHILD, str(idx), str(B), reverse, str(K)],
                                       capture_output=True, text=True, timeout=300)
                    ok = p.returncode == 0
                    info = json.loads(p.stdout.strip().splitlines()[-1]) if ok else {"error": p.stderr.strip().splitlines()[-1][:160]}
                    row = {"K": K, "B": B, "reverse": reverse, "config": idx, "ok": ok, **info}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
