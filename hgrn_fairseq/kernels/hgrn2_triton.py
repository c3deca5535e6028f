"""HGRN2 recurrence on Triton: ``hgrn2_fused`` (training and prefill) and ``hgrn2_step`` (decoding).

    S_t = Diag(lambda_t) S_{t-1} + (1 - lambda_t)^T v_t,   o_t = q_t S_t,   lambda_t = exp(log_decay_t)

``k = 1 - lambda`` is derived inside the kernels from ``log_decay`` (it is never passed in nor
materialised) and the scale is 1. Three implementations behind one signature (``impl``; "auto" picks
one by shape, ``_resolve_impl``):

* chunked (``hgrn2_chunk_kernels``, ``hgrn2_state_kernels``): chunks of ``chunk_size`` steps; chunk
  states from chunk-parallel products and a light sequential pass, then chunk-parallel kernels for the
  outputs and gradients; training and long sequences;
* recurrent (``hgrn2_recurrent_kernels``): one step at a time with a head's state in registers; short
  sequences (``T <= RECURRENT_MAX_T``) of heads larger than ``PACKED_MAX_STATE``, and single-step
  decoding;
* packed (``hgrn2_packed_kernels``): the recurrent walk with a block of small heads per program; heads
  of at most ``PACKED_MAX_STATE`` numbers of state (the LRA models' heads of 2 x 2 and 4 x 4), where the
  other kernels' 16 x 16 minimum tiles would be mostly padding, for short sequences and, past
  ``RECURRENT_MAX_T``, when there are at least ``PACKED_MIN_ROWS`` (sequence, head) rows.

All accumulate in fp32, read and write the input dtype (bf16, fp16 or fp32), keep states in fp32 at
the API boundary, support an initial state, return the final state, run forwards or in reverse, and
have full autograd (q, v, log_decay, initial_state, including gradients flowing from the final state).
Matrix products take bf16 operands for 16-bit inputs and tf32 for fp32 inputs (for the intra-chunk
products: see ``INTRA_DOT``). The measurements behind the constants below are in docs/design.md.
"""
from __future__ import annotations

import functools
import os
from typing import Optional, Tuple

import torch
import triton

from .hgrn2_chunk_kernels import (
    hgrn2_bwd_dqdg_kernel,
    hgrn2_bwd_dstates_kernel,
    hgrn2_bwd_dv_kernel,
    hgrn2_fwd_output_kernel,
    hgrn2_fwd_states_kernel,
)
from .hgrn2_packed_kernels import hgrn2_packed_bwd_kernel, hgrn2_packed_dq_kernel, hgrn2_packed_fwd_kernel
from .hgrn2_recurrent_kernels import hgrn2_rec_bwd_kernel, hgrn2_rec_dq_kernel, hgrn2_rec_fwd_kernel
from .hgrn2_state_kernels import (
    hgrn2_chunk_decay_kernel,
    hgrn2_chunk_outer_kernel,
    hgrn2_state_pass_kernel,
    hgrn2_state_scan_kernel,
)

Tensor = torch.Tensor

# Steps per chunk (BT); the intra-chunk code works in four blocks of BT // 4 rows (BC). Each forward
# picks it by chunk_size(): CHUNK None (the default) applies the rule below, 64 or 32 forces that size
# (the sizes tested against float64). The backward takes the size its forward used (from the saved A),
# whatever CHUNK holds by then.
CHUNK: Optional[int] = None
CHUNK_SIZES = (32, 64)
# Chunks of 32 where K = V = SHORT_CHUNK_HEAD and the scan has at most SHORT_CHUNK_MAX_T steps, else 64:
# the HGRN2 image models' heads of 64 at 196-784 steps are faster in chunks of 32. Other heads and
# longer scans were not measured that way and keep 64.
SHORT_CHUNK_HEAD = 64
SHORT_CHUNK_MAX_T = 1024
MAX_HEAD_DIM = 128  # K and V: whole [BT, K] tiles live in registers in the chunk kernels
RECURRENT_MAX_T = 32  # at or below this length the recurrent kernel is used
_IMPLS = ("auto", "chunk", "recurrent", "packed")
MAX_GRID_ROWS = 65535  # CUDA's limit on grid dimensions y and z, where the kernels put B * H
PACKED_MAX_STATE = 16  # K * V at or below which "auto" takes the packed kernels (many heads a program)
# Past RECURRENT_MAX_T steps the packed walk (one step at a time) beats the chunked kernels only when
# there are enough (sequence, head) rows, B * H, to fill the GPU.
PACKED_MIN_ROWS = 4096
PACKED_TILE = 256  # state numbers per program of the packed kernels: BH = PACKED_TILE // (BK * BV) heads
# Intra-chunk products exp(b_i - b_j) are factorised as exp(b_i - r) * exp(r - b_j) with a reference r.
# CHUNK_SAFE_LOG_DECAY: one reference in the middle of the chunk, used when the decay of each half chunk
# stays within it (natural log units, every channel), so that every factor lies in exp(+-60). Otherwise
# four block references (both factors <= 1 across blocks), and inside a block the factorisation only
# when its decay stays within SAFE_LOG_DECAY; steeper blocks are computed exactly element by element.
# exp(60) keeps every factor far inside the bf16 / fp32 range. Tests set these to 0 to force each path.
CHUNK_SAFE_LOG_DECAY = 60.0
SAFE_LOG_DECAY = 60.0
# How the chunk states (and their gradients) are computed: "split" = chunk-parallel products, then a
# scan that only multiplies and adds (hgrn2_state_kernels); "fused" = one sequential kernel doing the
# products inside its loop over chunks; "pre" = the decay-dependent operands of the products computed
# chunk-parallel first, then a sequential kernel with the products but no cumulative sums or
# exponentials (hgrn2_state_kernels). "auto" = "pre", the fastest of the three at every benchmarked
# shape. Read from HGRN2_STATE_IMPL at import.
STATE_IMPL = os.environ.get("HGRN2_STATE_IMPL", "auto")
_STATE_IMPLS = ("auto", "split", "fused", "pre")
# Operands of the intra-chunk products (A = Q K^T with the decay factorised through one mid-chunk
# reference, and the two dA products of the backward) and storage of A / dA: "input" = the dot dtype
# (bf16 for 16-bit inputs, as the inter-chunk products; A and dA stored in it), "fp32" = fp32 operands
# (tf32 on the GPU) with A and dA stored in fp32. The four-block and element-by-element paths of steep
# decays stay in fp32 either way. fp32 inputs are unaffected (their dot dtype is fp32). Read from
# HGRN2_INTRA_DOT at import.
INTRA_DOT = os.environ.get("HGRN2_INTRA_DOT", "input")


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _state_impl() -> str:
    """How the chunk states are computed: "split", "fused" or "pre" (see STATE_IMPL)."""
    if STATE_IMPL not in _STATE_IMPLS:
        raise ValueError(f"hgrn2_triton.STATE_IMPL = {STATE_IMPL!r}: expected one of {_STATE_IMPLS} (HGRN2_STATE_IMPL)")
    return "pre" if STATE_IMPL == "auto" else STATE_IMPL

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# HGRN2_AUTOTUNE=0 takes the first config of each space (fewer compilations, e.g. for GPU test runs)
_AUTOTUNE = os.environ.get("HGRN2_AUTOTUNE", "1") != "0"


# Every autotune space in full, whatever HGRN2_AUTOTUNE says (tests pin each config in turn),
# keyed by id() of the list ``_configs`` returned.
_FULL_SPACES = {}


def _configs(configs, interpret_config):
    if _INTERPRET:
        used = [interpret_config]
    else:
        used = list(configs) if _AUTOTUNE else list(configs[:1])
    _FULL_SPACES[id(used)] = [interpret_config] if _INTERPRET else list(configs)
    return used


def _autotune(configs, key):
    return triton.autotune(configs=configs, key=key)


def _pad(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


# Small autotune spaces on purpose: every config is one more compilation (tests pin each config in
# turn, and a cold cache compiles them all). Sequential state passes: the state tile, and
# whether the next chunk's loads are issued before the current chunk is computed (PREFETCH).
_STATE_CONFIGS = _configs(
    [
        triton.Config({"BK": 64, "BV": 64, "PREFETCH": False}, num_warps=4, num_stages=2),
        triton.Config({"BK": 32, "BV": 64, "PREFETCH": False}, num_warps=4, num_stages=2),
        triton.Config({"BK": 32, "BV": 32, "PREFETCH": False}, num_warps=2, num_stages=2),
        triton.Config({"BK": 64, "BV": 64, "PREFETCH": True}, num_warps=4, num_stages=1),
        triton.Config({"BK": 32, "BV": 64, "PREFETCH": True}, num_warps=4, num_stages=1),
    ],
    triton.Config({"BK": 16, "BV": 16, "PREFETCH": True}, num_warps=4, num_stages=1),
)

# Chunk-parallel kernels: channels per step of the loop over K (fwd_output) or per program
# (bwd_dqdg), and the warp count. Configs whose BK exceeds the padded head dim are pruned.
_OUTPUT_CONFIGS = _configs(
    [
        triton.Config({"BK": 32, "PREFETCH": False}, num_warps=8),
        triton.Config({"BK": 64, "PREFETCH": False}, num_warps=8),
        triton.Config({"BK": 32, "PREFETCH": True}, num_warps=8),
        triton.Config({"BK": 64, "PREFETCH": False}, num_warps=4),  # heads of exactly 64: _small_head_only
        # heads of exactly 64 in chunks of 32 steps: _prune_output
        triton.Config({"BK": 64, "PREFETCH": False}, num_warps=4, maxnreg=128),
    ],
    triton.Config({"BK": 16, "PREFETCH": True}, num_warps=4),
)
# Occupancy on sm_90 (bf16, K = V = 128, path-1-only launches): fwd_output BK 32 / 8 warps fits two
# programs per SM; dq/dg BK 32 / 8 warps one, two when capped at 128 registers (maxnreg, a few spills),
# and BK 16 / 4 warps capped at 128 four, without spills.
_DQDG_CONFIGS = _configs(
    [
        triton.Config({"BK": 32}, num_warps=8),
        triton.Config({"BK": 32}, num_warps=8, maxnreg=128),
        triton.Config({"BK": 16}, num_warps=4, maxnreg=128),
        triton.Config({"BK": 16}, num_warps=4),
        triton.Config({"BK": 64}, num_warps=4),  # heads of exactly 64: _small_head_only
    ],
    triton.Config({"BK": 16}, num_warps=4),
)
# what a prune falls back to when it has dropped every config it was given
_OUTPUT_FALLBACK = triton.Config({"BK": 32, "PREFETCH": False}, num_warps=8)
_DQDG_FALLBACK = triton.Config({"BK": 32}, num_warps=8)
_DV_CONFIGS = _configs(
    [triton.Config({}, num_warps=8), triton.Config({}, num_warps=8, maxnreg=128)], triton.Config({}, num_warps=4)
)


def _launch_arg(named_args, kwargs, name, default=None):
    """A launch's argument ``name`` as a prune sees it: a keyword of the launch, else a named argument."""
    return kwargs.get(name, named_args.get(name, default))


def _head_dims(named_args, kwargs):
    """(K, V) of a launch, as a prune sees them (V taken as K where a caller gives K alone)."""
    K = kwargs["K"] if "K" in kwargs else named_args["K"]
    return K, _launch_arg(named_args, kwargs, "V", K)


def _prune_bk(configs, named_args, **kwargs):
    """Drop configs whose BK exceeds the padded head dim (keep the smallest BK if none fits)."""
    limit = _pad(_head_dims(named_args, kwargs)[0])
    kept = [c for c in configs if c.kwargs["BK"] <= limit]
    return kept or [min(configs, key=lambda c: c.kwargs["BK"])]


def _small_head_only(configs, K, V, instead):
    """Keep the BK 64 / 4-warp configs only where K = V = 64 (``instead`` if nothing else is left).

    They serve the HGRN2 image models' heads of 64 (one step over the channels), where they are faster
    and were checked against float64. At larger heads they would take several channel steps with 4 warps,
    the dq/dg configurations that read out of bounds (see _prune_dqdg); heads of 33-63 and heads whose K
    and V differ were not measured. Triton's autotuner prunes only kernels with several configs: one
    pinned config runs as is."""
    if K == 64 and V == 64:
        return configs
    kept = [c for c in configs if not (c.kwargs["BK"] == 64 and c.num_warps == 4)]
    return kept or [instead]


def _prune_output(configs, named_args, **kwargs):
    """_prune_bk, and for the path-1-only output launch (FAST_ONLY) only configs with BK < K, i.e. at
    least two steps of its loop over channels: with one step, Triton 3.6 hands A to the final product
    through a register layout conversion instead of shared memory, and those specialisations read
    shared memory out of bounds on the GPU (compute-sanitizer; A wrong by orders of magnitude).
    Register-capped configs (maxnreg) are kept only in chunks of 32 steps (BT 32), see below."""
    K, V = _head_dims(named_args, kwargs)
    kept = _prune_bk(configs, named_args, **kwargs)
    if kwargs.get("FAST_ONLY"):
        kept = [c for c in kept if c.kwargs["BK"] < K] or [min(configs, key=lambda c: c.kwargs["BK"])]
    if _launch_arg(named_args, kwargs, "BT") != 32:
        # Register caps only in chunks of 32 steps (with _small_head_only: heads of 64): there the BK 64 /
        # 4-warp config capped at 128 registers runs four programs an SM instead of two without spilling,
        # and is faster at the image models' shapes; in chunks of 64 the caps gain nothing.
        kept = [c for c in kept if not c.maxnreg] or [_OUTPUT_FALLBACK]
    return _small_head_only(kept, K, V, _OUTPUT_FALLBACK)


def _prune_dqdg(configs, named_args, **kwargs):
    """_prune_bk, and BK 16 only for heads of at most 16: at head 64 the dq/dg kernel with BK 16 (four
    steps over the channels) reads shared memory out of bounds at the fast path's products (Triton's
    layout conversions, not our indexing; illegal addresses or NaN gradients), while the BK 32 configs
    match the reference."""
    K, V = _head_dims(named_args, kwargs)
    kept = _prune_bk(configs, named_args, **kwargs)
    if _pad(K) > 16:
        # (BK 32 / 8 warps if only BK 16 was given. A config pinned alone is not pruned, and BK 16
        # pinned at head 64 faults)
        kept = [c for c in kept if c.kwargs["BK"] >= 32] or [_DQDG_FALLBACK]
    return _small_head_only(kept, K, V, _DQDG_FALLBACK)


def _autotune_bk(configs, key):
    return triton.autotune(configs=configs, key=key, prune_configs_by={"early_config_prune": _prune_bk})


_OUTER_CONFIGS = _configs(
    [
        triton.Config({"BK": 64, "BV": 64}, num_warps=4),
        triton.Config({"BK": 64, "BV": 128}, num_warps=8),
        triton.Config({"BK": 32, "BV": 64}, num_warps=4),
    ],
    triton.Config({"BK": 16, "BV": 16}, num_warps=4),
)
_SCAN_CONFIGS = _configs(
    [
        triton.Config({"BK": 32, "BV": 32}, num_warps=2, num_stages=3),
        triton.Config({"BK": 64, "BV": 64}, num_warps=4, num_stages=3),
        triton.Config({"BK": 32, "BV": 64}, num_warps=4, num_stages=4),
    ],
    triton.Config({"BK": 16, "BV": 16}, num_warps=4, num_stages=1),
)

# "pre": the chunk-parallel operand pass and the sequential product pass (the latter with the state
# passes' space)
_DECAY_CONFIGS = _configs(
    [triton.Config({"BK": 64}, num_warps=4), triton.Config({"BK": 32}, num_warps=2),
     triton.Config({"BK": 128}, num_warps=8)],
    triton.Config({"BK": 16}, num_warps=4),
)
_chunk_decay = _autotune_bk(_DECAY_CONFIGS, ["K", "KEYS", "BT"])(hgrn2_chunk_decay_kernel)
_state_pass = _autotune(_STATE_CONFIGS, ["K", "V", "BH", "NT", "BACKWARD", "BT"])(hgrn2_state_pass_kernel)
_chunk_outer = _autotune(_OUTER_CONFIGS, ["K", "V", "KEYS", "BT"])(hgrn2_chunk_outer_kernel)
_state_scan = _autotune(_SCAN_CONFIGS, ["K", "V", "BH", "NT"])(hgrn2_state_scan_kernel)
_fwd_states = _autotune(_STATE_CONFIGS, ["K", "V", "BH", "NT", "BT"])(hgrn2_fwd_states_kernel)
_bwd_dstates = _autotune(_STATE_CONFIGS, ["K", "V", "BH", "NT", "BT"])(hgrn2_bwd_dstates_kernel)
# (the redo list's count is zeroed before each benchmarked launch; after autotuning, the list holds the
# entries of the last benchmarked launch as well as the real one's: duplicates, hence room for twice
# the chunks, see _redo_list)
# (ACCUM launches add to their output: restore_value puts it back after each timed run of the autotuner)
_fwd_output = triton.autotune(configs=_OUTPUT_CONFIGS, key=["K", "V", "STORE_A", "LOWP", "FAST_ONLY", "ACCUM", "BT"],
                              reset_to_zero=["redo"], restore_value=["o"],
                              prune_configs_by={"early_config_prune": _prune_output})(hgrn2_fwd_output_kernel)
_bwd_dv = triton.autotune(configs=_DV_CONFIGS, key=["K", "V", "ACCUM", "BT"], restore_value=["dv"])(hgrn2_bwd_dv_kernel)
_bwd_dqdg = triton.autotune(configs=_DQDG_CONFIGS, key=["K", "V", "LOWP", "FAST_ONLY", "ACCUM", "BT"],
                            restore_value=["dq", "dg"],
                            prune_configs_by={"early_config_prune": _prune_dqdg})(hgrn2_bwd_dqdg_kernel)
# The REDO launches (chunks whose decay is too steep for the one-reference path: rare) are not
# autotuned: one config each, sized to fit without spilling on sm_90.
_REDO_CONFIG = {"BK": 16, "num_warps": 4} if _INTERPRET else {"BK": 32, "num_warps": 8, "num_stages": 1}
# The two-launch scheme (path 1 alone, then the listed chunks; see hgrn2_fwd_output_kernel) is used
# when K and V are at least this; smaller heads take one launch with every path. Heads of 16 and 32
# cannot take it (the path-1-only output kernel reads shared memory out of bounds there with Triton
# 3.6, see _prune_output); at 64 it is correct but no faster for the image models, and their inference
# slower, so 64 takes one launch too. Tests set it to 0 to exercise the two launches on small shapes in
# the interpreter.
SPLIT_MIN_HEAD = 128
# (autotuned kernel, its full config space), for tests that pin each config in turn
AUTOTUNED = [
    (kernel, _FULL_SPACES[id(space)]) for kernel, space in (
        (_chunk_outer, _OUTER_CONFIGS), (_state_scan, _SCAN_CONFIGS), (_fwd_states, _STATE_CONFIGS),
        (_bwd_dstates, _STATE_CONFIGS), (_fwd_output, _OUTPUT_CONFIGS), (_bwd_dv, _DV_CONFIGS),
        (_bwd_dqdg, _DQDG_CONFIGS), (_chunk_decay, _DECAY_CONFIGS), (_state_pass, _STATE_CONFIGS))
]


def _intra_lowp() -> bool:
    if INTRA_DOT not in ("input", "fp32"):
        raise ValueError(f"hgrn2_triton.INTRA_DOT = {INTRA_DOT!r}: expected 'input' or 'fp32' (HGRN2_INTRA_DOT)")
    return INTRA_DOT == "input"


def _dot_dtype(dtype: torch.dtype) -> Tuple[torch.dtype, bool]:
    """Storage dtype of states / A for inputs of ``dtype``, and whether to emulate bf16 rounding in
    fp32 (the CPU interpreter's bf16 matrix product is unreliable)."""
    if dtype == torch.float32:
        return torch.float32, False
    if _INTERPRET:
        return torch.float32, True
    return torch.bfloat16, False


def _check_inputs(q: Tensor, v: Tensor, log_decay: Tensor, initial_state: Optional[Tensor]) -> None:
    for name, x in (("q", q), ("v", v), ("log_decay", log_decay)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be [B, T, H, D], got shape {tuple(x.shape)}")
        if not x.is_floating_point() or x.dtype == torch.float64:
            raise ValueError(f"{name} has dtype {x.dtype}; the Triton kernels take float32, bfloat16 or float16")
    if log_decay.shape != q.shape:
        raise ValueError(f"log_decay has shape {tuple(log_decay.shape)}, expected q's shape {tuple(q.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v has shape {tuple(v.shape)}; its [B, T, H] must match q's {tuple(q.shape[:3])}")
    if q.dtype != v.dtype:
        raise ValueError(f"q ({q.dtype}) and v ({v.dtype}) must have the same dtype")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T < 1:
        raise ValueError(f"sequence length T={T} must be >= 1")
    for name, d in (("K (q/log_decay head dim)", K), ("V (v head dim)", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(
                f"head dim {name} = {d}: the HGRN2 Triton kernels tile head dims 1..{MAX_HEAD_DIM}; "
                "use more heads (a smaller expand ratio) or backend='reference'"
            )
    if initial_state is not None and tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(
            f"initial_state has shape {tuple(initial_state.shape)}, expected [B, H, K, V] = {(B, H, K, V)}"
        )
    devices = {x.device for x in (q, v, log_decay) + ((initial_state,) if initial_state is not None else ())}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")


# ----------------------------------------------------------------------------------------------
# chunked implementation


def chunk_size(T: int, K: int, V: int) -> int:
    """Steps per chunk of the chunked kernels for a ``T``-step scan at head dims ``K``, ``V``: CHUNK if
    set, else 32 when ``K == V == SHORT_CHUNK_HEAD`` and ``T <= SHORT_CHUNK_MAX_T``, else 64."""
    if CHUNK is not None:
        if CHUNK not in CHUNK_SIZES:
            raise ValueError(f"hgrn2_triton.CHUNK={CHUNK} is not one of the tested chunk sizes {CHUNK_SIZES}; "
                             "set it to one of them, or to None for the automatic choice")
        return CHUNK
    return 32 if K == V == SHORT_CHUNK_HEAD and T <= SHORT_CHUNK_MAX_T else 64


def _chunk_states(x, g, y, s0, reverse, backward, dt, emu, store_sT, bt):
    """States before each chunk (forward: x unused, y = v, s0 = initial state) or state gradients after
    each chunk (backward: x = q, y = dO, s0 = gradient of the final state), ``[BH, NT, K, V]`` in the
    dot dtype, and the last one (final state / initial-state gradient, fp32; None unless store_sT), by
    STATE_IMPL."""
    B, T, H, K = g.shape
    V = y.shape[-1]
    BH, NT = B * H, triton.cdiv(T, bt)
    h = g.new_empty(BH, NT, K, V, dtype=dt)
    sT = g.new_empty(B, H, K, V, dtype=torch.float32) if store_sT else None
    tiles = lambda m: (triton.cdiv(K, m["BK"]), triton.cdiv(V, m["BV"]), BH)  # noqa: E731
    _STATE_PASSES[_state_impl()](x, g, y, s0, h, sT, reverse, backward, emu, tiles, bt)
    return h, sT


def _split_states(x, g, y, s0, h, sT, reverse, backward, emu, tiles, bt):
    """"split": the chunk-parallel products, then the scan."""
    B, T, H, K = g.shape
    BH, NT, _, V = h.shape
    D = g.new_empty(BH, NT, K, V, dtype=torch.float32)
    LB = g.new_empty(BH, NT, K, dtype=torch.float32)
    _chunk_outer[lambda m: (NT * BH, triton.cdiv(K, m["BK"]), triton.cdiv(V, m["BV"]))](
        g if x is None else x, g, y, D, LB, T, H, NT, K=K, V=V, BT=bt,
        REVERSE=reverse, KEYS=not backward, DOT_BF16=y.dtype != torch.float32, EMU=emu,
    )
    _state_scan[tiles](D, LB, h, s0, sT, NT, BH, K=K, V=V, BACKWARD=backward, HAS_S0=s0 is not None,
                       STORE_ST=sT is not None)


def _pre_states(x, g, y, s0, h, sT, reverse, backward, emu, tiles, bt):
    """"pre": the operand pass, then the sequential product pass."""
    B, T, H, K = g.shape
    BH, NT, _, V = h.shape
    xt = g.new_empty(BH, NT, bt, K, dtype=h.dtype)
    LB = g.new_empty(BH, NT, K, dtype=torch.float32)
    _chunk_decay[lambda m: (NT * BH, triton.cdiv(K, m["BK"]))](
        g if x is None else x, g, xt, LB, T, H, NT, K=K, BT=bt, REVERSE=reverse, KEYS=not backward, EMU=emu,
    )
    _state_pass[tiles](xt, y, LB, h, s0, sT, T, H, NT, BH, K=K, V=V, BT=bt, REVERSE=reverse, BACKWARD=backward,
                       HAS_S0=s0 is not None, STORE_ST=sT is not None, EMU=emu)


def _fused_states(x, g, y, s0, h, sT, reverse, backward, emu, tiles, bt):
    """"fused": one sequential kernel with the products inside its loop."""
    B, T, H, K = g.shape
    BH, NT, _, V = h.shape
    if backward:
        _bwd_dstates[tiles](x, g, y, h, s0, sT, T, H, NT, BH, K=K, V=V, BT=bt, REVERSE=reverse,
                            HAS_DHT=s0 is not None, STORE_DH0=sT is not None, EMU=emu)
    else:
        _fwd_states[tiles](g, y, h, s0, sT, T, H, NT, BH, K=K, V=V, BT=bt, REVERSE=reverse,
                           HAS_H0=s0 is not None, STORE_HT=sT is not None, EMU=emu)


_STATE_PASSES = {"split": _split_states, "fused": _fused_states, "pre": _pre_states}


def _chunk_fwd(q, v, g, h0, reverse, store_a, lowp, add_to=None):
    """The chunked forward; ``add_to``: a tensor like v that receives o added to it (the other scan
    direction's output) instead of a new o."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    bt = chunk_size(T, K, V)
    BH, NT = B * H, triton.cdiv(T, bt)
    dt, emu = _dot_dtype(q.dtype)
    h, ht = _chunk_states(None, g, v, h0, reverse, False, dt, emu, True, bt)
    o = torch.empty_like(v) if add_to is None else add_to
    A = q.new_empty(BH, NT, bt, bt, dtype=dt if lowp else torch.float32) if store_a else None
    split = min(K, V) >= SPLIT_MIN_HEAD
    redo, cap = _redo_list(q, BH * NT if split else 0)  # (one launch: an empty list, room for none)
    kw = dict(_intra_chunk_args(K, V, reverse, emu, lowp, bt), STORE_A=store_a, ACCUM=add_to is not None)
    _fwd_output[(NT, BH)](q, v, g, h, o, A, redo, T, H, NT, cap, **kw, FAST_ONLY=split, REDO=False)
    if split:
        hgrn2_fwd_output_kernel[(_redo_programs(q, BH * NT),)](
            q, v, g, h, o, A, redo, T, H, NT, cap, **kw, FAST_ONLY=False, REDO=True, PREFETCH=False,
            **_REDO_CONFIG)
    return o, ht, h, A, redo


def _intra_chunk_args(K: int, V: int, reverse: bool, emu: bool, lowp: bool, bt: int) -> dict:
    """The constexpr arguments the output and dq/dg kernels share (their launches and REDO launches)."""
    return dict(K=K, V=V, BT=bt, BC=bt // 4, BV=_pad(V), SAFE=SAFE_LOG_DECAY, CSAFE=CHUNK_SAFE_LOG_DECAY,
                REVERSE=reverse, EMU=emu, LOWP=lowp)


def _redo_list(x: Tensor, chunks: int) -> Tuple[Tensor, int]:
    """The list of chunks for the REDO launches: int32 ``[count, ids...]``, count 0, room for
    ``2 * chunks`` ids (see the autotune note above). A list with room for none marks the one-launch
    scheme (the backward follows the forward's scheme from it)."""
    cap = 2 * chunks
    if cap + 1 >= 2**31:
        raise ValueError(f"{chunks} chunks (batch * heads * chunks a sequence) exceed the kernels' int32 chunk ids")
    return torch.zeros(cap + 1, dtype=torch.int32, device=x.device), cap


def _redo_programs(x: Tensor, chunks: int) -> int:
    """Programs of a REDO launch: each one reads the count and takes every P-th listed chunk."""
    return min(chunks, 2 if not x.is_cuda else _sm_count(x.device.index or 0))


def _chunk_bwd(q, v, g, h0, h, A, redo, do, dht, reverse, need_dh0, lowp, add_to=None):
    """The chunked backward; ``add_to``: (dq, dv, dg) of the other scan direction, which receive this
    direction's gradients added to them (one-launch scheme only) instead of new tensors."""
    cap = redo.numel() - 1
    split = cap > 0
    accum = add_to is not None
    if accum and split:
        raise ValueError("_chunk_bwd: add_to needs the one-launch scheme (the REDO launch overwrites dq / dg)")
    bt = A.shape[-1]  # the forward's chunk size
    B, T, H, K = q.shape
    V = v.shape[-1]
    BH, NT = B * H, triton.cdiv(T, bt)
    dt, emu = _dot_dtype(q.dtype)
    dh, dh0 = _chunk_states(q, g, do, dht, reverse, True, dt, emu, need_dh0, bt)
    dq, dv, dg = add_to if accum else (torch.empty_like(q), torch.empty_like(v), torch.empty_like(g))
    dA = q.new_empty(BH, NT, bt, bt, dtype=A.dtype)
    _bwd_dv[(NT, BH)](
        v, g, do, dh, A, dv, dA, T, H, NT, K=K, V=V, BT=bt, BK=_pad(K), BV=_pad(V), REVERSE=reverse, EMU=emu,
        LOWP=lowp, ACCUM=accum,
    )
    kw = _intra_chunk_args(K, V, reverse, emu, lowp, bt)
    _bwd_dqdg[lambda m: (triton.cdiv(K, m["BK"]), NT, BH)](
        q, v, g, h, do, dh, dA, dq, dg, redo, T, H, NT, cap, **kw, FAST_ONLY=split, REDO=False, ACCUM=accum)
    if split:
        hgrn2_bwd_dqdg_kernel[(_redo_programs(q, BH * NT),)](
            q, v, g, h, do, dh, dA, dq, dg, redo, T, H, NT, cap, **kw, FAST_ONLY=False, REDO=True, ACCUM=False,
            **_REDO_CONFIG)
    return dq, dv, dg, dh0


class _ChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, v, g, h0, reverse):
        lowp = _intra_lowp()
        o, ht, h, A, redo = _chunk_fwd(q, v, g, h0, reverse, store_a=True, lowp=lowp)
        ctx.save_for_backward(q, v, g, h0, h, A, redo)
        ctx.reverse = reverse
        ctx.lowp = lowp  # the backward uses the forward's intra-chunk precision (A's dtype follows it)
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, v, g, h0, h, A, redo = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(v)
        do = do.contiguous()
        dht = None if dht is None else dht.contiguous()
        need_dh0 = h0 is not None and ctx.needs_input_grad[3]
        dq, dv, dg, dh0 = _chunk_bwd(q, v, g, h0, h, A, redo, do, dht, ctx.reverse, need_dh0, ctx.lowp)
        return dq, dv, dg, dh0, None


def _bi_chunk_fwd(q, v, g, store_a, lowp):
    """Both directions' chunked forwards, the reverse one adding into the forward one's o: ``(o, (h, A,
    redo) forwards, (h, A, redo) backwards)``."""
    o, _, h_f, A_f, redo_f = _chunk_fwd(q, v, g, None, False, store_a=store_a, lowp=lowp)
    o, _, h_r, A_r, redo_r = _chunk_fwd(q, v, g, None, True, store_a=store_a, lowp=lowp, add_to=o)
    return o, (h_f, A_f, redo_f), (h_r, A_r, redo_r)


class _BiChunkFunction(torch.autograd.Function):
    """o = scan(q, v, g) + scan(q, v, g, reverse) through the chunked kernels (no initial state), the
    reverse direction's output and gradients added inside its kernels (ACCUM) rather than by separate
    element-wise adds (one each for o, dq, dv and dg). One-launch scheme only (``_chunk_bwd``)."""

    @staticmethod
    def forward(ctx, q, v, g):
        lowp = _intra_lowp()
        o, (h_f, A_f, redo_f), (h_r, A_r, redo_r) = _bi_chunk_fwd(q, v, g, True, lowp)
        ctx.save_for_backward(q, v, g, h_f, A_f, redo_f, h_r, A_r, redo_r)
        ctx.lowp = lowp
        return o

    @staticmethod
    def backward(ctx, do):
        q, v, g, h_f, A_f, redo_f, h_r, A_r, redo_r = ctx.saved_tensors
        do = do.contiguous()
        grads = _chunk_bwd(q, v, g, None, h_f, A_f, redo_f, do, None, False, False, ctx.lowp)[:3]
        _chunk_bwd(q, v, g, None, h_r, A_r, redo_r, do, None, True, False, ctx.lowp, add_to=grads)
        return grads


# ----------------------------------------------------------------------------------------------
# recurrent implementation


def _rec_fwd(q, v, g, h0, reverse):
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty_like(v)
    ht = q.new_empty(B, H, K, V, dtype=torch.float32)
    BV = min(_pad(V), 32)
    hgrn2_rec_fwd_kernel[(triton.cdiv(V, BV), B * H)](
        q, v, g, o, h0, ht, T, H, K=K, V=V, BK=_pad(K), BV=BV,
        REVERSE=reverse, HAS_H0=h0 is not None, num_warps=4,
    )
    return o, ht


def _rec_bwd(q, v, g, h0, ht, do, dht, reverse, need_dh0):
    B, T, H, K = q.shape
    V = v.shape[-1]
    dq = q.new_empty(B, T, H, K, dtype=torch.float32)
    BK = min(_pad(K), 32)
    hgrn2_rec_dq_kernel[(triton.cdiv(K, BK), B * H)](
        v, g, do, h0, dq, T, H, K=K, V=V, BK=BK, BV=_pad(V),
        REVERSE=reverse, HAS_H0=h0 is not None, num_warps=4,
    )
    dv = torch.empty_like(v)
    dg = torch.empty_like(g)
    dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if need_dh0 else None
    hgrn2_rec_bwd_kernel[(B * H,)](
        q, v, g, do, dq, ht, dht, dv, dg, dh0, T, H, K=K, V=V, BK=_pad(K), BV=_pad(V),
        REVERSE=reverse, HAS_DHT=dht is not None, STORE_DH0=need_dh0, num_warps=8,
    )
    return dq.to(q.dtype), dv, dg, dh0


# ----------------------------------------------------------------------------------------------
# packed implementation (small heads, many per program)


def _packed_blocks(H: int, K: int, V: int) -> dict:
    BK, BV = max(2, triton.next_power_of_2(K)), max(2, triton.next_power_of_2(V))
    BH = max(2, min(triton.next_power_of_2(H), PACKED_TILE // (BK * BV)))
    return dict(K=K, V=V, BH=BH, BK=BK, BV=BV, num_warps=2 if BH * BK * BV <= 256 else 4)


def _packed_fwd(q, v, g, h0, reverse):
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty_like(v)
    ht = q.new_empty(B, H, K, V, dtype=torch.float32)
    blocks = _packed_blocks(H, K, V)
    hgrn2_packed_fwd_kernel[(B, triton.cdiv(H, blocks["BH"]))](
        q, v, g, o, h0, ht, T, H, REVERSE=reverse, HAS_H0=h0 is not None, **blocks,
    )
    return o, ht


def _packed_bwd(q, v, g, h0, ht, do, dht, reverse, need_dh0):
    B, T, H, K = q.shape
    V = v.shape[-1]
    blocks = _packed_blocks(H, K, V)
    grid = (B, triton.cdiv(H, blocks["BH"]))
    dq = q.new_empty(B, T, H, K, dtype=torch.float32)
    hgrn2_packed_dq_kernel[grid](v, g, do, h0, dq, T, H, REVERSE=reverse, HAS_H0=h0 is not None, **blocks)
    dv = torch.empty_like(v)
    dg = torch.empty_like(g)
    dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if need_dh0 else None
    hgrn2_packed_bwd_kernel[grid](
        q, v, g, do, dq, ht, dht, dv, dg, dh0, T, H,
        REVERSE=reverse, HAS_DHT=dht is not None, STORE_DH0=need_dh0, **blocks,
    )
    return dq.to(q.dtype), dv, dg, dh0


def _step_impl(impl: str):
    """(forward, backward) of a step-by-step implementation: "recurrent" (one head a program) or "packed"."""
    return (_packed_fwd, _packed_bwd) if impl == "packed" else (_rec_fwd, _rec_bwd)


class _StepFunction(torch.autograd.Function):
    """Autograd of the step-by-step implementations, which save the same tensors (the final state among
    them) and recompute the states in their backward."""

    @staticmethod
    def forward(ctx, q, v, g, h0, reverse, impl):
        o, ht = _step_impl(impl)[0](q, v, g, h0, reverse)
        ctx.save_for_backward(q, v, g, h0, ht)
        ctx.reverse, ctx.impl = reverse, impl
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, v, g, h0, ht = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(v)
        do = do.contiguous()
        dht = None if dht is None else dht.contiguous()
        need_dh0 = h0 is not None and ctx.needs_input_grad[3]
        dq, dv, dg, dh0 = _step_impl(ctx.impl)[1](q, v, g, h0, ht, do, dht, ctx.reverse, need_dh0)
        return dq, dv, dg, dh0, None, None


# ----------------------------------------------------------------------------------------------
# public API

def _resolve_impl(impl: str, B: int, T: int, H: int, K: int, V: int) -> str:
    """The implementation ``impl="auto"`` stands for at this shape (see hgrn2_fused)."""
    if impl not in _IMPLS:
        raise ValueError(f"impl={impl!r} is not one of {_IMPLS}")
    if impl != "auto":
        return impl
    if K * V <= PACKED_MAX_STATE and (T <= RECURRENT_MAX_T or B * H >= PACKED_MIN_ROWS):
        return "packed"
    return "recurrent" if T <= RECURRENT_MAX_T else "chunk"


def hgrn2_fused(
    q: Tensor,
    v: Tensor,
    log_decay: Tensor,
    initial_state: Optional[Tensor] = None,
    reverse: bool = False,
    *,
    impl: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """HGRN2 recurrence with k = 1 - exp(log_decay) and scale 1 (see ``reference.hgrn2_scan_reference``).

    Args:
        q, log_decay: ``[B, T, H, K]`` (float32 / bfloat16 / float16; ``log_decay <= 0``).
        v: ``[B, T, H, V]``, the dtype of q. ``1 <= K, V <= 128``.
        initial_state: ``[B, H, K, V]`` or None (zeros); any float dtype, used in fp32.
        reverse: run from ``t = T-1`` down to 0.
        impl: ``"auto"`` (packed when ``K * V <= PACKED_MAX_STATE`` and either ``T <= RECURRENT_MAX_T``
            or ``B * H >= PACKED_MIN_ROWS``; else recurrent for ``T <= RECURRENT_MAX_T`` and chunked for
            longer sequences), ``"chunk"``, ``"recurrent"`` or ``"packed"``.
    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in q's dtype, ``final_state`` ``[B, H, K, V]`` fp32.
    """
    _check_inputs(q, v, log_decay, initial_state)
    B, T, H, K = q.shape
    impl = _resolve_impl(impl, B, T, H, K, v.shape[-1])
    if impl != "packed" and B * H > MAX_GRID_ROWS:
        # the kernels put B * H on a grid dimension that CUDA caps at 65,535; the LRA 2-D models, with
        # an image's rows and columns as batch rows, pass it
        step = max(1, MAX_GRID_ROWS // H)
        if H > MAX_GRID_ROWS:
            raise ValueError(f"hgrn2_fused: {H} heads is more than the kernels' {MAX_GRID_ROWS} grid rows")
        parts = [hgrn2_fused(q[i:i + step], v[i:i + step], log_decay[i:i + step],
                             None if initial_state is None else initial_state[i:i + step], reverse, impl=impl)
                 for i in range(0, B, step)]
        return torch.cat([o for o, _ in parts]), torch.cat([s for _, s in parts])
    q, v, log_decay = q.contiguous(), v.contiguous(), log_decay.contiguous()
    h0 = None if initial_state is None else initial_state.contiguous()
    reverse = bool(reverse)
    needs_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, v, log_decay, h0)
    )
    # the kernels read the initial state as fp32 (autograd casts its gradient back)
    h0 = None if h0 is None else h0.float()
    if impl in ("recurrent", "packed"):
        if needs_grad:
            return _StepFunction.apply(q, v, log_decay, h0, reverse, impl)
        return _step_impl(impl)[0](q, v, log_decay, h0, reverse)
    if needs_grad:
        return _ChunkFunction.apply(q, v, log_decay, h0, reverse)
    o, ht, _, _, _ = _chunk_fwd(q, v, log_decay, h0, reverse, store_a=False, lowp=_intra_lowp())
    return o, ht


def hgrn2_fused_bidirectional(q: Tensor, v: Tensor, log_decay: Tensor, *, impl: str = "auto") -> Tensor:
    """``hgrn2_fused(q, v, g)[0] + hgrn2_fused(q, v, g, reverse=True)[0]`` (no initial state): the
    non-causal mixers' two directions. Where both run through the chunked kernels' one-launch scheme
    (``impl`` resolving to "chunk", ``min(K, V) < SPLIT_MIN_HEAD``, ``B * H`` within the grid), the
    reverse direction adds its output, and in the backward its dq, dv and dg, into the forward
    direction's inside its kernels; elsewhere the two scans are summed."""
    _check_inputs(q, v, log_decay, None)
    B, T, H, K = q.shape
    V = v.shape[-1]
    impl = _resolve_impl(impl, B, T, H, K, V)
    if impl == "chunk" and min(K, V) < SPLIT_MIN_HEAD and B * H <= MAX_GRID_ROWS:
        q, v, log_decay = q.contiguous(), v.contiguous(), log_decay.contiguous()
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, v, log_decay)):
            return _BiChunkFunction.apply(q, v, log_decay)
        return _bi_chunk_fwd(q, v, log_decay, False, _intra_lowp())[0]
    return (hgrn2_fused(q, v, log_decay, None, False, impl=impl)[0]
            + hgrn2_fused(q, v, log_decay, None, True, impl=impl)[0])


def hgrn2_step(q: Tensor, v: Tensor, log_decay: Tensor, state: Tensor) -> Tuple[Tensor, Tensor]:
    """One decoding step: ``S' = Diag(exp(g)) S + (1 - exp(g))^T v``, ``o = q S'``.

    Args:
        q, log_decay: ``[B, H, K]``; v: ``[B, H, V]``; state: ``[B, H, K, V]`` (any float dtype).
    Returns:
        ``(o [B, H, V] in q's dtype, new_state [B, H, K, V] fp32)``. Differentiable in every input.
    """
    for name, x in (("q", q), ("v", v), ("log_decay", log_decay)):
        if x.dim() != 3:
            raise ValueError(f"hgrn2_step: {name} must be [B, H, D], got shape {tuple(x.shape)}")
    if state is None:
        raise ValueError("hgrn2_step needs a state [B, H, K, V] (use zeros for the first token)")
    o, new_state = hgrn2_fused(
        q.unsqueeze(1), v.unsqueeze(1), log_decay.unsqueeze(1), state, False, impl="recurrent"
    )
    return o.squeeze(1), new_state
