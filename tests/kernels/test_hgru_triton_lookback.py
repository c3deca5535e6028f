"""The windowed decoupled look-back of the single-pass HGRU kernels against the float64 oracle.

Each case forces the look-back kernels with 4-step tiles, so T = 37 gives 10 chunks per column
(up to 9 predecessors), and a look-back window (``tuning["lookback_window"]``) of 1 (the walk of one
predecessor per round trip), 2, 4 or 64 (larger than the number of predecessors, so the window
reaches below chunk 0). With ``publish_inclusive=False`` only chunk 0 publishes its state, so the
walks cross whole windows of maps before they find it. D = 33 gives a second channel block with
one live channel (the others must count as published).

The interpreter runs the programs one after another in launch order, so every predecessor has
published before its successor looks back: these tests check the composition of the windows, not
the waiting (the GPU tests in test_hgru_triton.py run the same walks concurrently).

Tolerances are those of test_hgru_triton.py for fp32 (``rtol = 1e-4``, ``atol = 1e-5 * max|ref|``
for outputs and every gradient). Window 1 runs the walk of one predecessor per round trip, the
code path that existed before the window (``_lookback_single``).
"""
from __future__ import annotations

import pytest
import torch

from tests.kernels.test_hgru_triton import DEVICE, K, _check, _decay, _rand, reference, tuning

pytestmark = pytest.mark.integration

B, T, D, BT = 2, 37, 33, 4
WINDOWS = [1, 2, 4, 64]


def _lb(window, publish_inclusive):
    return dict(mode="lookback", block_t=BT, lookback_window=window, publish_inclusive=publish_inclusive)


@pytest.mark.parametrize("publish_inclusive", [True, False])
@pytest.mark.parametrize("window", WINDOWS)
def test_real_scan_window(window, publish_inclusive):
    torch.manual_seed(100 + window)
    reverse = window % 4 == 0
    x, a, h0 = _rand(B, T, D), _decay(B, T, D), _rand(B, D)
    with tuning(**_lb(window, publish_inclusive)):
        _check(lambda x, a, h0: K.real_scan(x, a, h0, reverse),
               lambda x, a, h0: reference.real_scan_reference(x, a, h0, reverse),
               [x, a, h0], ["x", "a", "initial_state"], torch.float32)


@pytest.mark.parametrize("publish_inclusive", [True, False])
@pytest.mark.parametrize("window", WINDOWS)
def test_complex_scan_window(window, publish_inclusive):
    torch.manual_seed(200 + window)
    reverse = window % 4 != 0
    x, a, h0 = _rand(B, T, D, 2), _decay(B, T, D), _rand(B, D, 2)
    theta = (torch.rand(D, device=DEVICE) * 3.0).requires_grad_(True)
    with tuning(**_lb(window, publish_inclusive)):
        _check(lambda x, a, th, h0: K.complex_scan(x, a, th, h0, reverse),
               lambda x, a, th, h0: reference.complex_scan_reference(x, a, th, h0, reverse),
               [x, a, theta, h0], ["x", "a", "theta", "initial_state"], torch.float32)


@pytest.mark.parametrize("is_complex,window", [(False, 4), (True, 2)])
def test_fused_window_walk(is_complex, window):
    torch.manual_seed(300 + window)
    f = _rand(B, T, D, scale=2.0)
    inp = _rand(B, T, D, 2) if is_complex else _rand(B, T, D)
    theta = (torch.rand(D, device=DEVICE) * 3.0).requires_grad_(True) if is_complex else None
    lb = (torch.rand(D, device=DEVICE) * 0.9).requires_grad_(True)
    h0 = _rand(B, D, 2) if is_complex else _rand(B, D)
    with tuning(**_lb(window, False)):
        _check(lambda f, i, th, lb, h0: K.hgru_fused(f, i, th, lb, h0, True),
               lambda f, i, th, lb, h0: reference.hgru_reference(f, i, th, lb, h0, True),
               [f, inp, theta, lb, h0], ["forget_logits", "inputs", "theta", "lower_bound", "initial_state"],
               torch.float32)


@pytest.mark.parametrize("window", [1, 4])
def test_window_ignores_older_launches(window):
    """Every word of the look-back buffer carries a tag of the previous launch (maps and states
    with random values): the windows (which also read rows the walk does not use) must not take
    them for this launch's words."""
    torch.manual_seed(400 + window)
    nc = -(-T // BT)
    lbuf, state = K._lookback_buffers(torch.device(DEVICE), 4 * nc * B * D)
    epoch = int(state[0].item()) & 0x0FFFFFFF
    prev = (epoch - 1) * 4  # the tags E + 1 and E + 2 of the previous launch
    vals = torch.randn(lbuf.numel(), device=DEVICE).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    tags = prev + 1 + (torch.arange(lbuf.numel(), device=DEVICE) % 2)
    lbuf.copy_(vals | (tags << 32))
    x, a = _rand(B, T, D, 2), _decay(B, T, D)
    theta = (torch.rand(D, device=DEVICE) * 3.0).requires_grad_(True)
    with tuning(**_lb(window, False)):
        _check(lambda x, a, th: K.complex_scan(x, a, th), lambda x, a, th: reference.complex_scan_reference(x, a, th),
               [x, a, theta], ["x", "a", "theta"], torch.float32)


def test_window_plan_and_errors():
    dev = torch.device(DEVICE)
    with tuning(mode="lookback"):
        assert K._plan(2, 64, 32, False, dev)["LBW"] == K._LOOKBACK_WINDOW[False]
        assert K._plan(2, 64, 32, True, dev)["LBW"] == K._LOOKBACK_WINDOW[True]
    with tuning(mode="lookback", lookback_window=8):
        assert K._plan(2, 64, 32, True, dev, backward=True)["LBW"] == 8
    x, a = torch.randn(1, 9, 4, device=DEVICE), torch.rand(1, 9, 4, device=DEVICE)
    for bad in (0, 3, 2.0, True):
        with tuning(mode="lookback", lookback_window=bad):
            with pytest.raises(ValueError, match=r"lookback_window"):
                K.real_scan(x, a)
