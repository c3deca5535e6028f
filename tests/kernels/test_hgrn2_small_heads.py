"""HGRN2 with tiny heads as the HGRU real scan over the state's entries (kernels/hgrn2_small_heads.py):
forward, final state and every gradient against the float64 reference, both directions, with and without
an initial state, for K x V up to 4; hgrn2_scan on the Triton path routes only K x V = 1 there (the shape
where it is faster, see the module) and keeps the chunk kernels for the rest."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from hgrn_fairseq.kernels import hgrn2_scan, hgrn2_scan_reference  # noqa: E402
from hgrn_fairseq.kernels import hgrn2_small_heads  # noqa: E402
from tests.kernels.float64_compare import rel  # noqa: E402
from tests.kernels.test_hgrn2_triton import BF16_TOL, FP32_TOL, check_against_reference, make_inputs  # noqa: E402


@pytest.mark.integration
@pytest.mark.parametrize("K,V", [(1, 1), (2, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("h0,dtype", [(True, torch.float32), (False, torch.bfloat16)])
def test_small_heads_match_float64(K, V, reverse, h0, dtype, monkeypatch):
    calls = []
    real = hgrn2_small_heads.hgrn2_small_head_scan
    monkeypatch.setattr(hgrn2_small_heads, "hgrn2_small_head_scan", lambda *a: calls.append(1) or real(*a))
    q, v, g, s0 = make_inputs(2, 19, 3, K, V, dtype, h0=h0, seed=K * 7 + V)
    bf16 = dtype == torch.bfloat16
    routed = K * V <= hgrn2_small_heads.SMALL_HEAD_STATE
    scan = (lambda *a: hgrn2_scan(*a, backend="triton")) if routed else \
        (lambda *a: hgrn2_small_heads.hgrn2_small_head_scan(*a))
    check_against_reference(q, v, g, s0, reverse, None, BF16_TOL if bf16 else FP32_TOL, 1e-2 if bf16 else FP32_TOL,
                            seed=3, scan=scan)
    assert calls == [1], "the small-head path did not run"


@pytest.mark.parametrize("K,V", [(2, 2), (4, 4)])
def test_larger_heads_keep_the_chunk_kernels(K, V, monkeypatch):
    monkeypatch.setattr(hgrn2_small_heads, "hgrn2_small_head_scan", lambda *a: pytest.fail("small-head path"))
    q, v, g, s0 = make_inputs(1, 9, 2, K, V, torch.float32)
    o, _ = hgrn2_scan(q, v, g, s0, False, backend="triton")
    ro, _ = hgrn2_scan_reference(q.double(), v.double(), g.double(), s0.double(), False)
    assert rel(o, ro) < FP32_TOL
