"""Triton HGRU kernels (real scan, complex scan, fused gates + scan) against the float64 oracle.

On CPU the kernels run through the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1
when there is no GPU); on a GPU the same tests run compiled.

Tolerances (each checked element-wise with ``torch.testing.assert_close``, ``atol`` scaled by the
largest magnitude of the reference tensor):

* fp32 inputs: ``rtol = 1e-4``, ``atol = 1e-5 * max|ref|`` for outputs and every gradient. The
  kernels accumulate in fp32 (observed relative error around 1e-7 for the real scan and 1e-6 for
  the complex one, whose rotation powers cost a few ulps).
* bf16 inputs (the oracle sees the same bf16 values, in float64): outputs ``rtol = 2e-2``,
  ``atol = 1e-2 * max|ref|`` (one bf16 rounding of the result is 2^-9); gradients twice that, since
  the backward reads the saved bf16 output ``h``.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # normally done by tests/conftest.py; here for a lone run
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from hgrn_fairseq.kernels import reference  # noqa: E402
from hgrn_fairseq.kernels import hgru_triton as K  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not K.INTERPRETED:
    pytest.skip("hgru_triton was imported before TRITON_INTERPRET=1 was set; run under tests/conftest.py",
                allow_module_level=True)

TOL = {torch.float32: (1e-4, 1e-5, 1e-5), torch.bfloat16: (2e-2, 1e-2, 2e-2)}  # rtol, atol out, atol grad


def _speed_up_interpreter_scan():
    """The Triton interpreter runs a generic ``tl.associative_scan`` one element at a time (a Python
    call per element). The combine functions are element-wise, so applying them to whole slices
    along the scan axis, in the same left-to-right order, gives the same numbers at a fraction of
    the cost. Only the interpreter (CPU tests) is affected."""
    try:
        import numpy as np
        from triton.runtime import interpreter
    except Exception:
        return
    ops = getattr(interpreter, "ScanOps", None)
    if ops is None or not hasattr(ops, "generic_scan") or getattr(ops, "_hgru_fast", False):
        return

    def generic_scan(self, inputs):
        axis = self.axis
        datas = [np.asarray(arg.handle.data) for arg in inputs]
        outs = [np.empty_like(d) for d in datas]
        acc = None
        for i in range(datas[0].shape[axis]):
            cur = tuple(self.to_tensor(np.ascontiguousarray(np.take(d, i, axis=axis)), arg.dtype)
                        for d, arg in zip(datas, inputs))
            if acc is None:
                acc = cur
            else:
                ret = self.combine_fn.fn(*acc, *cur)
                acc = tuple(ret) if isinstance(ret, tuple) else (ret,)
            for o, a in zip(outs, acc):
                idx = [slice(None)] * o.ndim
                idx[axis] = i
                o[tuple(idx)] = a.handle.data.reshape(o[tuple(idx)].shape)
        return [self.to_tensor(o, arg.dtype) for o, arg in zip(outs, inputs)]

    ops.generic_scan = generic_scan
    ops._hgru_fast = True


if K.INTERPRETED:
    _speed_up_interpreter_scan()


# Force launch parameters (small tiles, time chunks) so that small shapes exercise every path.
tuning = K.tuned


# Launch configurations, so that small shapes exercise every path: the default plan (on CPU the
# interpreter reports few SMs, so this is the look-back or two-pass kernel, or the sequential one
# when T fits one tile); look-back with 16-step tiles; look-back whose walks compose every
# predecessor's map (no chunk but the first publishes its state); the sequential kernel over several
# tiles with prefetch; the two-pass chunked kernels with the state added after each tile's scan;
# the streaming kernels (real scans: 16-channel programs, a 3-deep software pipeline over 8-step
# tiles) and their 64-channel variant; the block forward of the real scans (32-step blocks of 8
# segments of 4 steps, 32-channel programs of one warp; its backward takes two passes).
CONFIGS = {
    "block": dict(mode="block", segment_steps=4, segments=8, block_d=32, num_warps=1),
    "stream": dict(mode="stream", block_t=8, stages=3),
    "stream_wide": dict(mode="stream", block_t=4, block_d=64),
    "default": {},
    "tiles": dict(mode="lookback", block_t=16),
    "walk": dict(mode="lookback", block_t=8, publish_inclusive=False),
    "seq": dict(mode="seq", block_t=8, prefetch=True),
    "chunks": dict(mode="twopass", block_t=8, num_chunks=3, fold=False, prefetch=False, agg_reverse=False),
    # chunk maps walking their chunks from the end (prefetching backwards, stopping at the chunk start)
    "chunks_back": dict(mode="twopass", block_t=8, num_chunks=3, prefetch=True, agg_reverse=True),
    # the one-launch chunked forward (its backward takes two passes); "_walk": look-back walks that
    # cross every predecessor, chunk maps walking forwards, no prefetch
    "chunklb": dict(mode="chunklb", block_t=8, num_chunks=3),
    "chunklb_walk": dict(mode="chunklb", block_t=4, num_chunks=5, publish_inclusive=False, agg_reverse=False,
                         prefetch=False),
}


def _close(name, got, ref, dtype, grad=False):
    rtol, atol_out, atol_grad = TOL[dtype]
    atol = (atol_grad if grad else atol_out) * max(ref.abs().max().item(), 1e-6)
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def _check(fn, ref_fn, inputs, names, dtype, grads_from=("h", "final")):
    """Run ``fn`` and the float64 ``ref_fn`` on the same values; compare outputs and gradients of a
    random linear function of the outputs (h and/or the final state) for every input that requires
    grad."""
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    leaf_names = [n for n, t in zip(names, inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    ref_inputs = [t.detach().double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
                  for t in inputs]
    ref_leaves = [t for t in ref_inputs if isinstance(t, torch.Tensor) and t.requires_grad]

    h, final = fn(*inputs)
    h_ref, final_ref = ref_fn(*ref_inputs)
    assert h.dtype == dtype and final.dtype == dtype
    assert h.shape == h_ref.shape and final.shape == final_ref.shape
    _close("h", h, h_ref, dtype)
    _close("final_state", final, final_ref, dtype)

    wh = torch.randn(h.shape, dtype=torch.float64, device=h.device)
    wf = torch.randn(final.shape, dtype=torch.float64, device=h.device)
    loss = 0.0
    loss_ref = 0.0
    if "h" in grads_from:
        loss = loss + (h.double() * wh).sum()
        loss_ref = loss_ref + (h_ref * wh).sum()
    if "final" in grads_from:
        loss = loss + (final.double() * wf).sum()
        loss_ref = loss_ref + (final_ref * wf).sum()
    got = torch.autograd.grad(loss, leaves)
    want = torch.autograd.grad(loss_ref, ref_leaves)
    for n, g, w, leaf in zip(leaf_names, got, want, leaves):
        assert g.shape == leaf.shape and g.dtype == leaf.dtype, n
        _close(f"d{n}", g, w, dtype, grad=True)


def _rand(*shape, dtype=torch.float32, grad=True, scale=1.0):
    t = (torch.randn(*shape, device=DEVICE) * scale).to(dtype)
    return t.requires_grad_(grad)


def _decay(*shape, dtype=torch.float32, grad=True):
    # in (0.05, 1): long memory, but far enough from 0 and 1 to keep the gradients informative
    t = (0.05 + 0.95 * torch.rand(*shape, device=DEVICE)).to(dtype)
    return t.requires_grad_(grad)


SCAN_CASES = [
    # (T, D, reverse, with initial state, config)
    (1, 3, False, True, "default"),
    (37, 33, True, True, "default"),
    (70, 33, False, False, "tiles"),
    (70, 130, True, True, "chunks"),  # 130 channels: five channel blocks, the last one partial
    (70, 33, False, True, "chunks_back"),  # chunks of 3 tiles, the last chunk's last tile partial
    (70, 33, True, True, "chunklb"),
    (37, 33, False, False, "chunklb_walk"),
    (37, 33, False, True, "walk"),
    (37, 33, True, True, "seq"),
    (70, 48, False, True, "stream"),  # aligned 16-channel blocks, 9 tiles, the last one partial
    (37, 48, True, False, "stream"),
    (37, 33, True, True, "stream"),  # D not a multiple of 16: a partial channel block, unaligned rows
    (29, 128, False, True, "stream_wide"),
    (1, 3, False, True, "block"),  # T = 1: one block, all but one step past the end
    (70, 48, False, True, "block"),  # 5 blocks (the last one partial), a partial channel block
    (37, 33, True, True, "block"),  # D not a multiple of 8: one channel per access
]
REAL_ONLY = ("stream", "stream_wide", "block")


@pytest.mark.parametrize("T,D,reverse,with_h0,config", SCAN_CASES)
def test_real_scan(T, D, reverse, with_h0, config):
    torch.manual_seed(T * 1000 + D)
    B = 2
    x, a = _rand(B, T, D), _decay(B, T, D)
    h0 = _rand(B, D) if with_h0 else None
    with tuning(**CONFIGS[config]):
        _check(lambda x, a, h0: K.real_scan(x, a, h0, reverse),
               lambda x, a, h0: reference.real_scan_reference(x, a, h0, reverse),
               [x, a, h0], ["x", "a", "initial_state"], torch.float32)


@pytest.mark.parametrize("T,D,reverse,with_h0,config", [c if c[1] != 130 else (70, 65, True, True, "chunks")
                                                         for c in SCAN_CASES if c[4] not in REAL_ONLY])
def test_complex_scan(T, D, reverse, with_h0, config):
    torch.manual_seed(T * 1000 + D + 1)
    B = 2
    x, a = _rand(B, T, D, 2), _decay(B, T, D)
    theta = (torch.rand(D, device=DEVICE) * 3.0).requires_grad_(True)  # up to ~pi per step
    h0 = _rand(B, D, 2) if with_h0 else None
    with tuning(**CONFIGS[config]):
        _check(lambda x, a, th, h0: K.complex_scan(x, a, th, h0, reverse),
               lambda x, a, th, h0: reference.complex_scan_reference(x, a, th, h0, reverse),
               [x, a, theta, h0], ["x", "a", "theta", "initial_state"], torch.float32)


FUSED_CASES = [
    # (complex, T, D, reverse, lower bound kind, with initial state, config)
    (False, 37, 33, False, "tensor", True, "default"),
    (False, 70, 130, True, "float", False, "chunks"),
    (False, 37, 33, True, "tensor", True, "chunks_back"),
    (False, 70, 33, False, "tensor", True, "chunklb"),
    (False, 37, 33, True, "tensor", True, "seq"),
    (False, 70, 48, True, "tensor", True, "stream"),
    (False, 37, 64, False, "float", False, "stream_wide"),
    (False, 70, 48, True, "tensor", True, "block"),
    (False, 37, 64, False, "float", False, "block"),
    (True, 1, 3, True, "tensor", True, "default"),
    (True, 37, 33, True, "none", True, "tiles"),
    (True, 70, 33, False, "tensor", True, "chunks"),
    (True, 70, 33, True, "float", True, "chunks_back"),
    (True, 70, 33, True, "float", False, "chunklb"),
    (True, 37, 33, False, "scalar_tensor", False, "default"),
    (True, 37, 33, True, "tensor", True, "walk"),
    (True, 37, 33, False, "float", True, "seq"),
]


def _lower_bound(kind, D):
    if kind == "none":
        return None
    if kind == "float":
        return 0.375
    if kind == "scalar_tensor":
        return torch.tensor(0.2, device=DEVICE, requires_grad=True)
    return (torch.rand(D, device=DEVICE) * 0.9).requires_grad_(True)


@pytest.mark.parametrize("is_complex,T,D,reverse,lb_kind,with_h0,config", FUSED_CASES)
def test_hgru_fused(is_complex, T, D, reverse, lb_kind, with_h0, config):
    torch.manual_seed(T * 1000 + D + 2)
    B = 2
    f = _rand(B, T, D, scale=2.0)
    with torch.no_grad():  # saturated gates must not produce NaN (sigmoid(+-60) is 0 or 1 in fp32)
        f.view(-1)[::7] = 60.0
        f.view(-1)[3::11] = -60.0
    inp = _rand(B, T, D, 2) if is_complex else _rand(B, T, D)
    theta = (torch.rand(D, device=DEVICE) * 3.0).requires_grad_(True) if is_complex else None
    lb = _lower_bound(lb_kind, D)
    h0 = (_rand(B, D, 2) if is_complex else _rand(B, D)) if with_h0 else None
    with tuning(**CONFIGS[config]):
        _check(lambda f, i, th, lb, h0: K.hgru_fused(f, i, th, lb, h0, reverse),
               lambda f, i, th, lb, h0: reference.hgru_reference(f, i, th, lb, h0, reverse),
               [f, inp, theta, lb, h0], ["forget_logits", "inputs", "theta", "lower_bound", "initial_state"],
               torch.float32)


@pytest.mark.parametrize("grads_from", [("h",), ("final",)])
def test_gradient_from_one_output(grads_from):
    torch.manual_seed(5)
    B, T, D = 2, 37, 33
    f, inp = _rand(B, T, D), _rand(B, T, D, 2)
    theta = torch.rand(D, device=DEVICE).requires_grad_(True)
    lb = (torch.rand(D, device=DEVICE) * 0.9).requires_grad_(True)
    h0 = _rand(B, D, 2)
    _check(lambda *t: K.hgru_fused(*t), lambda *t: reference.hgru_reference(*t),
           [f, inp, theta, lb, h0], ["forget_logits", "inputs", "theta", "lower_bound", "initial_state"],
           torch.float32, grads_from=grads_from)


def test_bf16_inputs():
    torch.manual_seed(7)
    B, T, D = 2, 37, 33
    dt = torch.bfloat16
    f, inp = _rand(B, T, D, dtype=dt), _rand(B, T, D, 2, dtype=dt)
    theta = torch.rand(D, device=DEVICE).requires_grad_(True)  # parameters stay fp32
    lb = (torch.rand(D, device=DEVICE) * 0.9).to(dt).requires_grad_(True)
    h0 = _rand(B, D, 2, dtype=dt)
    _check(lambda *t: K.hgru_fused(*t, True), lambda *t: reference.hgru_reference(*t, True),
           [f, inp, theta, lb, h0], ["forget_logits", "inputs", "theta", "lower_bound", "initial_state"], dt)
    x, a = _rand(B, T, D, dtype=dt), _decay(B, T, D, dtype=dt)
    with tuning(**CONFIGS["walk"]):
        _check(lambda x, a: K.real_scan(x, a), lambda x, a: reference.real_scan_reference(x, a),
               [x, a], ["x", "a"], dt)


def test_strided_inputs():
    """Views of a larger projection (as a model produces them) need no copy and give the same result."""
    torch.manual_seed(11)
    B, T, D = 2, 37, 33
    proj = torch.randn(B, T, 4 * D, device=DEVICE)
    inp = proj[..., : 2 * D].view(B, T, D, 2).requires_grad_(False)
    f = proj[..., 2 * D: 3 * D]
    assert not inp.is_contiguous() and not f.is_contiguous()
    inp_leaf = inp.detach().clone().requires_grad_(True)
    f_leaf = f.detach().clone().requires_grad_(True)
    theta = torch.rand(D, device=DEVICE).requires_grad_(True)

    # strided views built from leaves so that the gradients land in the leaves
    def fused(f_l, i_l, th):
        big = torch.cat([i_l.reshape(B, T, 2 * D), f_l, torch.zeros(B, T, D, device=DEVICE)], -1)
        return K.hgru_fused(big[..., 2 * D: 3 * D], big[..., : 2 * D].view(B, T, D, 2), th, 0.5)

    _check(fused, lambda f_l, i_l, th: reference.hgru_reference(f_l, i_l, th, 0.5),
           [f_leaf, inp_leaf, theta], ["forget_logits", "inputs", "theta"], torch.float32)

    x_t = torch.randn(B, D, T, device=DEVICE)  # time-contiguous, channel-strided
    a_t = 0.05 + 0.95 * torch.rand(B, 2 * T, D, device=DEVICE)  # every other step
    x = x_t.transpose(1, 2).requires_grad_(True)
    a = a_t[:, ::2].requires_grad_(True)
    _check(lambda x, a: K.real_scan(x, a), lambda x, a: reference.real_scan_reference(x, a),
           [x, a], ["x", "a"], torch.float32)


def test_stream_plan():
    """The streaming plan: the default for the plain real scan's backward when B * D gives enough
    64-channel programs (its forward takes the block kernel there), never for fused or complex ones (a
    forced complex stream is a clear error); forced with fewer programs, it takes 16-channel blocks."""
    dev = torch.device(DEVICE)
    sms = K._sm_count(dev)
    D = 128
    B = K.STREAM_WIDE_PROGRAMS * sms * 64 // D
    assert K._plan(B, 100, D, False, dev)["mode"] == "block"
    for backward in (False, True):
        with tuning(mode=None if backward else "stream"):  # (the forward forced: the tiles it would take)
            plan = K._plan(B, 100, D, False, dev, False, backward)
        assert plan["mode"] == "stream" and plan["STAGES"] == K.STREAM_STAGES
        assert plan["BD"] == 64 and plan["BT"] == 16
        assert K._plan(B, 100, D, False, dev, True, backward)["mode"] != "stream"  # fused
        assert K._plan(B, 100, D, True, dev, False, backward)["mode"] != "stream"  # complex
        assert K._plan(B - 1, 100, D, False, dev, False, backward)["mode"] != "stream"  # too few programs
    assert K._plan(B, 100, D + 16, False, dev)["mode"] != "stream"  # D not a multiple of 64
    with tuning(mode="stream"):
        assert K._plan(1, 100, 48, False, dev)["BD"] == 16
        with pytest.raises(ValueError, match="real scans"):
            K._plan(B, 100, D, True, dev)


def test_block_plan():
    """The block forward: the default for the plain real forward once the 64-channel columns number at
    least BLOCK_MIN_COLUMNS_PER_SM per SM, with BLOCK_FWD's launch; never for its backward, the fused or
    the complex scans, or fewer columns; forced, its backward takes two passes and a complex scan is a
    clear error."""
    dev = torch.device(DEVICE)
    sms = K._sm_count(dev)
    D = 64 * 3
    B = -(-int(K.BLOCK_MIN_COLUMNS_PER_SM * sms * 1000) // 3000)  # the fewest rows with enough columns
    plan = K._plan(B, 100, D, False, dev)
    assert plan["mode"] == "block"
    assert {k: plan[k] for k in ("R", "NW", "BD", "num_warps", "STAGES")} == K.BLOCK_FWD
    assert K._plan(B, 100, D, False, dev, False, True)["mode"] != "block"  # backward
    assert K._plan(B, 100, D, False, dev, True)["mode"] != "block"  # fused
    assert K._plan(B, 100, D, True, dev)["mode"] != "block"  # complex
    if B * 3 - 1 < K.BLOCK_MIN_COLUMNS_PER_SM * sms:
        assert K._plan(B, 100, D - 64, False, dev)["mode"] != "block"  # too few columns
    with tuning(mode="block", segment_steps=2, segments=8, block_d=32, stages=2, num_warps=1):
        plan = K._plan(1, 100, 48, False, dev)
        assert (plan["R"], plan["NW"], plan["BD"], plan["STAGES"], plan["num_warps"]) == (2, 8, 32, 2, 1)
        assert K._plan(1, 100, 48, False, dev, False, True)["mode"] == "twopass"
        with pytest.raises(ValueError, match="real scans"):
            K._plan(1, 100, 48, True, dev)
    # a warp's lanes must fit on (segment, channel) pairs at 8 channels per access
    for bad in (dict(segments=4, block_d=32, num_warps=1), dict(segments=8, block_d=64, num_warps=4),
                dict(segments=6), dict(block_d=512, segments=16)):
        with tuning(mode="block", **bad), pytest.raises(ValueError, match="segments \\* block_d"):
            K._plan(1, 100, 48, False, dev)


def _check_both_directions(x, a, h0, dtype):
    """real_scan forwards and in reverse against the float64 reference."""
    for reverse in (False, True):
        _check(lambda x, a, h0: K.real_scan(x, a, h0, reverse),
               lambda x, a, h0: reference.real_scan_reference(x, a, h0, reverse),
               [x, a, h0], ["x", "a", "initial_state"], dtype)


def _check_fused_real(B, T, D, h0, dtype):
    """hgru_fused (real, reverse, a per-channel lower bound) on random inputs against the reference."""
    f, inp = _rand(B, T, D, dtype=dtype), _rand(B, T, D, dtype=dtype)
    lb = (torch.rand(D, device=DEVICE) * 0.9).requires_grad_(True)
    _check(lambda *t: K.hgru_fused(*t, True), lambda *t: reference.hgru_reference(*t, True),
           [f, inp, None, lb, h0], ["forget_logits", "inputs", "theta", "lower_bound", "initial_state"], dtype)


@pytest.mark.integration
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_block_vector_access(dtype):
    """The block forward on views of a projection: rows at a multiple of 8 channels take 8 per access
    (_vec_width), a view at an odd offset one; plain and fused, both directions, agree with the
    reference."""
    torch.manual_seed(37)
    B, T, D = 2, 45, 40
    proj = torch.randn(B, T, 2 * D + 8, device=DEVICE).to(dtype)
    for offset, vec in ((0, 8), (1, 1)):
        x = proj[..., offset: offset + D].detach().requires_grad_(True)
        assert K._vec_width(D, 8, x) == vec
        a = _decay(B, T, D, dtype=dtype)
        h0 = _rand(B, D, dtype=dtype)
        with tuning(**CONFIGS["block"]):
            _check_both_directions(x, a, h0, dtype)
            f = proj[..., D + offset: 2 * D + offset].detach().requires_grad_(True)
            _check(lambda f, x, h0: K.hgru_fused(f, x, None, 0.25, h0),
                   lambda f, x, h0: reference.hgru_reference(f, x, None, 0.25, h0),
                   [f, x, h0], ["forget_logits", "inputs", "initial_state"], dtype)


def test_twopass_chunks_plan():
    """Two-pass plans split each column into enough chunks for TWOPASS_PROGRAMS_PER_SM programs per SM
    (real and complex differ), capped at 32 chunks; the one-launch chunked forward ("chunklb", the plain
    real forward's default) for CHUNKLB_PROGRAMS_PER_SM, and its backward takes two passes."""
    dev = torch.device(DEVICE)
    sms = K._sm_count(dev)
    B, T, D = 1, 100000, 64  # 2 columns of 32 channels (1 of 64: too few for the block forward)
    for is_complex, fused, backward in [(False, False, True), (False, True, False), (True, False, True)]:
        plan = K._plan(B, T, D, is_complex, dev, fused, backward)
        assert plan["mode"] == "twopass"
        per_sm = K.TWOPASS_PROGRAMS_PER_SM[is_complex]
        assert plan["NC"] == min(-(-per_sm * sms // 2), 32)
    assert K.TWOPASS_PROGRAMS_PER_SM[False] > K.TWOPASS_PROGRAMS_PER_SM[True]
    # the fused complex backward: look-back for at most half as many columns as SMs, two passes above
    cols = sms // 2
    assert K._plan(B, T, 32 * cols, True, dev, True, True)["mode"] == "lookback"
    assert K._plan(B, T, 32 * (cols + 1), True, dev, True, True)["mode"] == "twopass"
    assert K._plan(B, T, 32 * cols, True, dev, True, False)["mode"] == "twopass"  # its forward
    # the plain real forward: the chunks in one launch, CHUNKLB_PROGRAMS_PER_SM, not capped at 32 chunks
    plan = K._plan(B, T, D, False, dev, False, False)
    assert plan["mode"] == "chunklb" and (plan["BD"], plan["num_warps"]) == K.CHUNKLB_BLOCK
    assert plan["VEC"] == K.CHUNKLB_VEC == 2  # two channels per access by default (rows permitting)
    assert K._plan(B, T, D, True, dev, False, False)["VEC"] == 1  # complex: one
    cols = D // K.CHUNKLB_BLOCK[0]
    want = min(-(-K.CHUNKLB_PROGRAMS_PER_SM[False] * sms // cols), 1024)
    cl = -(-(-(-T // want)) // plan["BT"]) * plan["BT"]  # whole tiles per chunk
    assert (plan["CL"], plan["NC"]) == (cl, -(-T // cl))
    assert K._plan(B, T, D, False, dev, False, True)["mode"] == "twopass"  # its backward
    with tuning(mode="chunklb"):
        assert K._plan(B, T, D, False, dev, False, True)["mode"] == "twopass"


@pytest.mark.integration
@pytest.mark.parametrize("vec,dtype", [(2, torch.bfloat16), (2, torch.float32), (8, torch.bfloat16)])
def test_chunklb_vector_access(vec, dtype):
    """tuning['vec']: the one-launch chunked forward reads and writes VEC channels per access where rows
    start at a multiple of VEC channels (_vec_width), fewer otherwise (a view at an odd offset falls back
    to single channels); every case agrees with the reference (a partial channel block included)."""
    torch.manual_seed(31)
    B, T, D = 2, 45, 40
    proj = torch.randn(B, T, 2 * D + 8, device=DEVICE).to(dtype)
    assert K._vec_width(D, vec, proj[..., :D]) == vec and K._vec_width(D, vec, proj[..., 1:D + 1]) == 1
    assert K._vec_width(D, 8, proj[..., 2:D + 2]) == 2 and K._vec_width(D - 1, vec, proj[..., :D - 1]) == 1
    for offset in (0, 1):
        x = proj[..., offset: offset + D].detach().requires_grad_(True)
        a = _decay(B, T, D, dtype=dtype)
        h0 = _rand(B, D, dtype=dtype)
        with tuning(mode="chunklb", vec=vec, block_t=8, num_chunks=3, block_d=32 * vec, num_warps=1):
            assert K._plan(B, T, D, False, x.device)["VEC"] == vec
            _check(lambda x, a, h0: K.real_scan(x, a, h0), lambda x, a, h0: reference.real_scan_reference(x, a, h0),
                   [x, a, h0], ["x", "a", "initial_state"], dtype)
    with pytest.raises(ValueError, match="vec"), tuning(mode="chunklb", vec=3):
        K._plan(B, T, D, False, x.device)


def test_stream_bf16_views():
    """Streaming kernels on bf16 views of a projection: 16-byte aligned rows (offset 0; Triton
    specialises them to vector loads) and misaligned ones (offset 1) give the reference result."""
    torch.manual_seed(23)
    B, T, D = 2, 45, 32
    dt = torch.bfloat16
    for offset in (0, 1):
        proj = torch.randn(B, T, 3 * D + 1, device=DEVICE).to(dt)
        x = proj[..., offset: offset + D].detach().requires_grad_(True)  # still a strided view
        assert not x.is_contiguous()
        a = _decay(B, T, D, dtype=dt)
        h0 = _rand(B, D, dtype=dt)
        with tuning(**CONFIGS["stream"]):
            _check_both_directions(x, a, h0, dt)


def test_dispatch_uses_the_kernel():
    from hgrn_fairseq.kernels import hgru_scan

    torch.manual_seed(3)
    B, T, D = 2, 5, 3
    f, inp = torch.randn(B, T, D, device=DEVICE), torch.randn(B, T, D, 2, device=DEVICE)
    theta = torch.rand(D, device=DEVICE)
    h, final = hgru_scan(f, inp, theta, 0.1, None, False, backend="triton")
    h2, final2 = K.hgru_fused(f, inp, theta, 0.1)
    assert torch.equal(h, h2) and torch.equal(final, final2)
    from hgrn_fairseq.kernels import complex_scan, real_scan

    a = torch.sigmoid(f)
    for backend in ("triton", "reference"):
        h, final = real_scan(f, a, None, True, backend=backend)
        h_ref, final_ref = reference.real_scan_reference(f.double(), a.double(), None, True)
        _close("real_scan h", h, h_ref, torch.float32)
        h, final = complex_scan(inp, a, theta, None, False, backend=backend)
        h_ref, final_ref = reference.complex_scan_reference(inp.double(), a.double(), theta.double())
        _close("complex_scan h", h, h_ref, torch.float32)


def test_errors_name_the_argument():
    B, T, D = 2, 5, 3
    x, a = torch.randn(B, T, D, device=DEVICE), torch.rand(B, T, D, device=DEVICE)
    cases = [
        (lambda: K.real_scan(x[0], a), "x"),
        (lambda: K.real_scan(x, a[:, :4]), "a"),
        (lambda: K.real_scan(x.double(), a), "x"),
        (lambda: K.real_scan(x, a, torch.zeros(B, D + 1, device=DEVICE)), "initial_state"),
        (lambda: K.complex_scan(x, a, torch.zeros(D, device=DEVICE)), "x"),
        (lambda: K.complex_scan(torch.randn(B, T, D, 2, device=DEVICE), a, torch.zeros(D + 1, device=DEVICE)),
         "theta"),
        (lambda: K.hgru_fused(a, torch.randn(B, T, D, 2, device=DEVICE)), "theta"),
        (lambda: K.hgru_fused(a, x, torch.zeros(D, device=DEVICE)), "theta"),
        (lambda: K.hgru_fused(a, x, None, torch.zeros(D + 2, device=DEVICE)), "lower_bound"),
        (lambda: K.hgru_fused(a, x, None, "0.5"), "lower_bound"),
        (lambda: K.hgru_fused(a[:, :2], x), "forget_logits"),
        (lambda: K.real_scan(x[:, :0], a[:, :0]), "x"),
    ]
    for fn, name in cases:
        with pytest.raises(ValueError, match=rf"\b{name}\b"):
            fn()


# ---------------------------------------------------------------------------------------------
# GPU only: sizes the interpreter cannot afford
# ---------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")


@needs_cuda
@pytest.mark.parametrize("config", [dict(), dict(mode="seq"), dict(mode="lookback", publish_inclusive=False),
                                    dict(mode="lookback", publish_inclusive=False, lookback_window=1),
                                    dict(mode="lookback", publish_inclusive=False, lookback_window=4, block_t=8),
                                    dict(mode="twopass", num_chunks=7), dict(mode="chunklb", num_chunks=7),
                                    dict(mode="chunklb", num_chunks=7, publish_inclusive=False),
                                    dict(mode="chunklb", vec=2, block_d=64, num_warps=1),
                                    dict(mode="chunklb", vec=8, block_d=64, num_warps=2)])
def test_gpu_medium_sizes_against_reference(config):
    torch.manual_seed(13)
    B, T, D = 2, 1000, 200
    f, inp = _rand(B, T, D), _rand(B, T, D, 2)
    theta = torch.rand(D, device=DEVICE).requires_grad_(True)
    lb = (torch.rand(D, device=DEVICE) * 0.9).requires_grad_(True)
    h0 = _rand(B, D, 2)
    with tuning(**config):
        _check(lambda *t: K.hgru_fused(*t, True), lambda *t: reference.hgru_reference(*t, True),
               [f, inp, theta, lb, h0], ["forget_logits", "inputs", "theta", "lower_bound", "initial_state"],
               torch.float32)
        x, a = _rand(B, T, D, dtype=torch.bfloat16), _decay(B, T, D, dtype=torch.bfloat16)
        _check(lambda x, a: K.real_scan(x, a), lambda x, a: reference.real_scan_reference(x, a),
               [x, a], ["x", "a"], torch.bfloat16)


@needs_cuda
@pytest.mark.parametrize("config", [dict(), dict(mode="stream", block_d=32, block_t=32), dict(mode="stream", block_d=64, block_t=16),
                                    dict(mode="stream", stages=1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_stream_against_reference(config, dtype):
    """The streaming kernels at a size where they are the default plan of the plain real scan's
    backward (B * D / 64 >= 4 per SM), forward and backward, plain and (forced) fused."""
    torch.manual_seed(29)
    B, T, D = 36, 300, 1024
    assert K._plan(B, T, D, False, torch.device(DEVICE), False, True)["mode"] == "stream"  # the default here
    with tuning(**dict(config, mode="stream")):
        x, a = _rand(B, T, D, dtype=dtype), _decay(B, T, D, dtype=dtype)
        h0 = _rand(B, D, dtype=dtype)
        _check(lambda x, a, h0: K.real_scan(x, a, h0), lambda x, a, h0: reference.real_scan_reference(x, a, h0),
               [x, a, h0], ["x", "a", "initial_state"], dtype)
        _check_fused_real(B, T, D, h0, dtype)


@needs_cuda
@pytest.mark.parametrize("config", [dict(), dict(segments=8, segment_steps=8, num_warps=2), dict(stages=1),
                                    dict(stages=4), dict(block_d=32, segments=16, segment_steps=4, num_warps=2),
                                    dict(block_d=128, segments=8, segment_steps=4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_block_against_reference(config, dtype):
    """The block forward at a size where it is the default plan of the plain real forward (128
    64-channel columns), plain and (forced) fused, both directions, 3 blocks (the last one partial);
    the backward of the plain scan takes its own plan."""
    torch.manual_seed(41)
    B, T, D = 8, 300, 1024
    assert K._plan(B, T, D, False, torch.device(DEVICE))["mode"] == "block"  # the default plan here
    with tuning(**dict(config, mode="block")):
        x, a = _rand(B, T, D, dtype=dtype), _decay(B, T, D, dtype=dtype)
        h0 = _rand(B, D, dtype=dtype)
        _check_both_directions(x, a, h0, dtype)
        _check_fused_real(B, T, D, h0, dtype)


def _tail_check(B, T, D, dtype, tail, reverse=False):
    """Long sequences: the decay is 0 at one step, so the states after it (and the gradients of the
    inputs after it) depend only on the tail, which the float64 reference can afford."""
    x = torch.randn(B, T, D, device=DEVICE, dtype=dtype)
    a = (0.5 + 0.5 * torch.rand(B, T, D, device=DEVICE)).to(dtype)
    cut = T - tail if not reverse else tail - 1
    a[:, cut] = 0
    x.requires_grad_(True)
    a.requires_grad_(True)
    h, final = K.real_scan(x, a, None, reverse)
    dh = torch.zeros_like(h)
    sl = slice(T - tail, T) if not reverse else slice(0, tail)
    dh[:, sl] = torch.randn(B, tail, D, device=DEVICE, dtype=dtype)
    dx, da = torch.autograd.grad((h, final), (x, a), (dh, torch.ones_like(final)))
    xs, as_ = x.detach()[:, sl].double(), a.detach()[:, sl].double()
    ref_h, ref_final = reference.real_scan_reference(xs, as_, None, reverse)
    _close("h tail", h[:, sl], ref_h, dtype)
    _close("final", final, ref_final, dtype)
    xs.requires_grad_(True)
    as_.requires_grad_(True)
    ref_h, ref_final = reference.real_scan_reference(xs, as_, None, reverse)
    rdx, rda = torch.autograd.grad((ref_h * dh[:, sl].double()).sum() + ref_final.sum(), (xs, as_))
    _close("dx tail", dx[:, sl], rdx, dtype, grad=True)
    # da at the cut multiplies the state before it, which the tail reference does not know
    keep = slice(1, None) if not reverse else slice(0, -1)
    _close("da tail", da[:, sl][:, keep], rda[:, keep], dtype, grad=True)
    before = slice(0, T - tail) if not reverse else slice(tail, T)
    assert dx[:, before].abs().max().item() == 0  # nothing flows through a zero decay


@needs_cuda
@pytest.mark.parametrize("mode", [None, "block"])
def test_gpu_one_million_steps(mode):
    torch.manual_seed(17)
    with tuning(mode=mode):
        _tail_check(1, 1_000_003, 64, torch.float32, tail=300)
        _tail_check(1, 1_000_003, 64, torch.float32, tail=300, reverse=True)


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory < 60e9,
                    reason="needs about 40 GB of GPU memory")
@pytest.mark.parametrize("mode", [None, "block"])
def test_gpu_64bit_offsets(mode):
    """B * T * D above 2^31 elements: indices past 2^31 must not wrap."""
    torch.manual_seed(19)
    T = (1 << 31) // 1024 + 77
    with tuning(mode=mode):
        _tail_check(1, T, 1024, torch.bfloat16, tail=64)
