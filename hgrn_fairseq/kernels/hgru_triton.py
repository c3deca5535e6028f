"""Every name of the package ``hgrn_fairseq.kernels.hgru`` (its docstring says which file holds what),
re-exported under one module, so that ``hgru_triton.X`` and ``from hgrn_fairseq.kernels.hgru_triton
import X`` work.

``tuning`` is the package's own dict, so editing it here (``hgru_triton.tuning[...] = ...``,
``hgru_triton.tuned(...)``) changes the plans. Rebinding a name here (``hgru_triton.X = ...``) changes
nothing in the package: set it on the file that defines it (e.g. ``hgru.plan`` for the planner's tables).
"""
# flake8: noqa: F401
from .hgru.scan_math import (_combine_affine_complex, _combine_cmul, _combine_pair, _combine_real, _cos_sin,
                             _extract_row, _first_decay, _gamma, _gate_decay, INTERPRETED, libdevice,
                             _rotation_tiles, _scan_carry, _sigmoid, _sigmoid_pair)
from .hgru.tiles import (_carry_in, _frame, _load_pair, _load_state, _MODE_AGG, MODE_AGG, MODE_APPLY, _MODE_APPLY,
                         MODE_SEQ, _prepend_map, _scan_tile, _store_final, _store_pair, _stream_column, _walk_next,
                         _walk_scan, _walk_step)
from .hgru.lookback import (_chunk_map, _epoch_done, _launch_tag, _lb_program, _lookback, _lookback_single,
                            _lookback_window, _MAX_SPINS, _pack, _unpack)
from .hgru.forward import (_fwd_gates, _fwd_load, _fwd_setup, _fwd_walk, _hgru_block_fwd_kernel, _hgru_fwd_kernel,
                           _hgru_fwd_lb_kernel, _hgru_fwd_lbc_kernel, _hgru_stream_fwd_kernel)
from .hgru.backward import (_bwd_grads, _bwd_load, _hgru_bwd_kernel, _hgru_bwd_lb_kernel,
                            _hgru_stream_bwd_kernel)
from .hgru.plan import (BLOCK_FWD, BLOCK_MIN_COLUMNS_PER_SM, CHUNKLB_BLOCK, CHUNKLB_PROGRAMS_PER_SM, CHUNKLB_VEC,
                        _DEFAULTS, _FEW_COLUMNS_MODE, _LOOKBACK_WINDOW, _MODES, _plan, _pow2_at_least, _sm_count,
                        _SM_COUNT, _STREAM, STREAM_STAGES, STREAM_WIDE_PROGRAMS, tuned, tuning,
                        TWOPASS_PROGRAMS_PER_SM)
from .hgru.autograd import (_agg_buffers, _device_guard, _gamma_mode, _HGRUScanFunction, _LB_BUFFERS, _LB_CAPTURED,
                            _lookback_buffers, _NullContext, _strides, _tile_input, _vec_width)
from .hgru.ops import (_check_sequence, _check_state, _check_tensor, _check_theta, complex_scan, _describe,
                       hgru_fused, real_scan, _SUPPORTED_DTYPES, Tensor)
