"""Launch planner of the HGRU kernels: which mode, tile and grid each launch takes (``_plan``), from
the tables below; ``tuning`` overrides any of it (tests and benches). The tables come from graphed
sweeps of ``bench/bench_scan.py --sweep``; the rules and the measurements behind each table are in
docs/design.md#hgru-launch-planner.
"""
from __future__ import annotations

import contextlib
import numbers

import torch
import triton

# Launch parameters. ``tuning`` may be edited (tests force small tiles and chunking on CPU; the
# bench sweeps it). ``None`` means "let ``_plan`` decide".
tuning = {
    "block_t": None,  # BT, time steps per tile
    "block_d": None,  # BD, channels per program (at least 32)
    "num_warps": None,
    "mode": None,  # "seq", "lookback", "twopass", "chunklb", "stream" or "block" (see _plan)
    "num_chunks": None,  # NC for "twopass"
    "min_programs": None,  # below this many (batch, channel-block) programs, split time
    "publish_inclusive": None,  # False (tests only): look-back walks always reach chunk 0
    "prefetch": None,  # load tile j+1 while scanning tile j
    "fold": None,  # add the incoming state before the tile's scan (True) or after it (False)
    "agg_reverse": None,  # two-pass chunk maps walk their chunk from its end (see _walk_step)
    "programs_per_sm": None,  # "twopass" / "chunklb": chunks per column from this many programs per SM
    "vec": None,  # "chunklb", real scans: channels per load/store where alignment allows (see _vec_width)
    "lookback_window": None,  # predecessors read per look-back round trip (a power of two; 1: one)
    "stages": None,  # "stream" / "block": software-pipeline depth (tiles whose loads are in flight, plus one)
    "segment_steps": None,  # "block": R, consecutive steps a thread scans
    "segments": None,  # "block": NW, segments per block (a block is R * NW steps)
}


@contextlib.contextmanager
def tuned(**cfg):
    """``tuning`` updated with ``cfg`` inside the ``with`` block and restored after it (the tests and
    benches force launch parameters this way)."""
    saved = dict(tuning)
    tuning.update(cfg)
    try:
        yield
    finally:
        tuning.clear()
        tuning.update(saved)


_SM_COUNT = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small, so that the tests exercise the chunked path
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# (complex, fused, backward) -> (mode with few columns, BT of look-back, (BT, prefetch) of seq and two
# passes). With few (batch, channel-block) columns two passes are fastest, except the plain complex
# forward (look-back) and the plain real forward (chunklb).
_DEFAULTS = {
    (False, False, False): ("chunklb", 16, (16, True)),
    (False, False, True): ("twopass", 16, (8, True)),
    (False, True, False): ("twopass", 16, (16, True)),
    (False, True, True): ("twopass", 8, (8, True)),
    (True, False, False): ("lookback", 32, (16, True)),
    (True, False, True): ("twopass", 8, (8, True)),
    (True, True, False): ("twopass", 8, (8, True)),
    (True, True, True): ("twopass", 8, (8, False)),
}
_MODES = ("seq", "lookback", "twopass", "stream", "chunklb", "block")
# "stream": plain real scans with >= STREAM_WIDE_PROGRAMS 64-channel programs per SM (with fewer, two
# passes win; the fused kernels are slower streamed at every size). Its forward is never reached by
# default ("block" comes first) and is kept for forced modes.
_STREAM = {(False, False): True, (False, True): True, (True, False): False, (True, True): False}  # (fused, bwd)
STREAM_STAGES = 3
STREAM_WIDE_PROGRAMS = 4  # per SM, with 64-channel programs
# "block": plain real forward with >= BLOCK_MIN_COLUMNS_PER_SM 64-channel columns per SM; below that
# most SMs would idle and "chunklb" is faster. The fused forward is slower this way (the gates' registers).
BLOCK_FWD = dict(R=8, NW=16, BD=64, num_warps=4, STAGES=3)
BLOCK_MIN_COLUMNS_PER_SM = 0.45
# predecessors read per look-back round trip, real / complex: 1, since a predecessor has usually
# published by the time a tile looks, and wider windows only add L2 reads and registers
_LOOKBACK_WINDOW = {False: 1, True: 1}
# "twopass" programs per SM, real / complex (chunks = this * SMs / columns, <= 32); the complex kernels
# hold twice the state per program and do better with fewer
TWOPASS_PROGRAMS_PER_SM = {False: 16, True: 8}
# "chunklb" programs per SM, real / complex: many short chunks keep loads in flight
CHUNKLB_PROGRAMS_PER_SM = {False: 64, True: 48}
# channels per access of the "chunklb" real forward where _vec_width allows: 2 keeps each thread on
# whole channels, so the time scan stays in registers (8 would spread a channel's steps over lanes)
CHUNKLB_VEC = 2
# (channels, warps) per "chunklb" program: 32 * CHUNKLB_VEC channels a warp, so that no warp splits the
# tile's rows (the scan would then go through shared memory)
CHUNKLB_BLOCK = (64, 1)
# kernels whose mode differs from _DEFAULTS' with at most SMs / 2 columns
_FEW_COLUMNS_MODE = {(True, True, True): "lookback"}
# (AGG_REV: two-pass chunk maps walk back from the chunk end, so that the second pass starts on tiles
# still in L2; not when fused, whose chunk-map programs also carry the gates and are slower that way)


def _plan(B: int, T: int, D: int, is_complex: bool, device: torch.device, fused: bool = False,
          backward: bool = False) -> dict:
    """Launch parameters for one kernel launch: ``mode`` (one of ``_MODES``; the rules, in order, are in
    docs/design.md#hgru-launch-planner) and the constexprs and grid sizes of its kernel.
    ``tuning`` overrides any of them; launches the kernels cannot run are refused with a ValueError.
    """
    cfg = tuning
    key = (bool(is_complex), bool(fused), bool(backward))
    small_mode, bt_lb, (bt_seq, pf_default) = _DEFAULTS[key]
    # at least 32 channels per program, so that the lanes of a warp never split the time axis (with
    # 16-channel blocks the complex look-back backward gave wrong gradients for a few elements on the
    # GPU; not understood, and that layout is not used)
    bd = max(32, cfg["block_d"] or 32)
    num_warps = cfg["num_warps"] or 1
    programs = B * triton.cdiv(D, bd)
    mode = cfg["mode"]
    sms = _sm_count(device)
    wide = D % 64 == 0 and B * D // 64 >= STREAM_WIDE_PROGRAMS * sms  # enough 64-channel stream programs
    block_cols = B * triton.cdiv(D, BLOCK_FWD["BD"])
    if mode is None:
        if not is_complex and not fused and not backward and block_cols >= BLOCK_MIN_COLUMNS_PER_SM * sms:
            mode = "block"
        elif not is_complex and _STREAM[(bool(fused), bool(backward))] and wide and T > 16:
            mode = "stream"
        else:
            min_programs = cfg["min_programs"] or 8 * sms
            mode = "seq" if programs >= min_programs or T <= bt_seq else small_mode
            if mode == small_mode and 2 * programs <= sms:
                mode = _FEW_COLUMNS_MODE.get(key, mode)
    if mode not in _MODES:
        raise ValueError(f"tuning['mode']={mode!r} is not one of {_MODES}")
    if mode in ("chunklb", "block") and backward:  # forward kernels only: their backward takes two passes
        mode = "twopass"
    if mode == "block":
        if is_complex:
            raise ValueError("tuning['mode']='block' is for the real scans only")
        r, nw = int(cfg["segment_steps"] or BLOCK_FWD["R"]), int(cfg["segments"] or BLOCK_FWD["NW"])
        bd, warps = int(cfg["block_d"] or BLOCK_FWD["BD"]), int(cfg["num_warps"] or BLOCK_FWD["num_warps"])
        if any(v < 1 or v & (v - 1) for v in (r, nw, bd, warps)) or bd > 256 or nw * bd < 256 * warps:
            raise ValueError(
                f"tuning: the block forward needs powers of two with block_d <= 256 and segments * block_d >= "
                f"256 * num_warps (got segment_steps={r}, segments={nw}, block_d={bd}, num_warps={warps}): with "
                "8 channels per access, a warp's lanes must all fit on (segment, channel) pairs, or Triton spreads "
                "a segment's steps over lanes or warps, which is slow and gave wrong results with Triton 3.6")
        return dict(mode=mode, R=r, NW=nw, BD=bd, num_warps=warps, STAGES=int(cfg["stages"] or BLOCK_FWD["STAGES"]),
                    NC=1, CL=T, LBW=1)
    if mode == "chunklb":  # wider programs (CHUNKLB_BLOCK)
        bd = cfg["block_d"] or CHUNKLB_BLOCK[0]
        num_warps = cfg["num_warps"] or CHUNKLB_BLOCK[1]
        programs = B * triton.cdiv(D, bd)
    if mode == "stream":
        if is_complex:
            raise ValueError("tuning['mode']='stream' is for the real scans only")
        bd = cfg["block_d"] or (64 if wide else 16)
        bt = max(2, min(cfg["block_t"] or (16 if wide else 64), _pow2_at_least(T)))
        return dict(mode=mode, BT=bt, BD=bd, num_warps=num_warps, NC=1, CL=T, LBW=1,
                    STAGES=int(cfg["stages"] or STREAM_STAGES))
    bt = cfg["block_t"] or (bt_lb if mode == "lookback" else bt_seq)
    bt = max(2, min(bt, _pow2_at_least(T)))
    if mode == "lookback":
        nc = triton.cdiv(T, bt)
        cl = bt
    elif mode == "seq":
        nc, cl = 1, triton.cdiv(T, bt) * bt
    else:
        nc = cfg["num_chunks"]
        if nc is None:  # programs per SM from the tables (at most 32 chunks for two passes), chunks of >= 4 tiles
            per_sm = cfg.get("programs_per_sm") or (
                TWOPASS_PROGRAMS_PER_SM if mode == "twopass" else CHUNKLB_PROGRAMS_PER_SM)[bool(is_complex)]
            nc = min(triton.cdiv(per_sm * sms, programs), triton.cdiv(T, 4 * bt),
                     32 if mode == "twopass" else 1024)
        nc = max(1, min(int(nc), triton.cdiv(T, bt), 1024))
        cl = triton.cdiv(triton.cdiv(T, nc), bt) * bt
        nc = triton.cdiv(T, cl)
    prefetch = cfg["prefetch"] if cfg["prefetch"] is not None else pf_default
    fold = cfg["fold"] if cfg["fold"] is not None else True
    lbw = cfg.get("lookback_window")
    lbw = _LOOKBACK_WINDOW[bool(is_complex)] if lbw is None else lbw
    if isinstance(lbw, bool) or not isinstance(lbw, numbers.Integral) or lbw < 1 or lbw & (lbw - 1):
        raise ValueError(f"tuning['lookback_window']={lbw!r} is not a power of two >= 1 "
                         "(predecessors read per look-back round trip)")
    agg_rev = cfg.get("agg_reverse")
    agg_rev = not fused if agg_rev is None else agg_rev
    vec = int(cfg.get("vec") or CHUNKLB_VEC) if mode == "chunklb" and not is_complex else 1
    if vec < 1 or vec & (vec - 1) or vec > 8:
        raise ValueError(f"tuning['vec']={cfg.get('vec')!r} is not 1, 2, 4 or 8 (channels per load/store)")
    return dict(mode=mode, BT=bt, BD=bd, num_warps=num_warps, NC=nc, CL=cl, PREFETCH=bool(prefetch),
                FOLD=bool(fold), NCP=max(2, _pow2_at_least(nc - 1)), LBW=int(lbw), AGG_REV=bool(agg_rev),
                VEC=vec)
