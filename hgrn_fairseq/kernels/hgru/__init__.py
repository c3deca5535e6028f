"""Triton kernels for the HGRU recurrences: real scan, complex scan and the fused HGRU (gates + scan).

Public ops (batch-first; complex numbers are a trailing dimension of size 2, as in ``reference.py``):

* ``real_scan(x, a, initial_state=None, reverse=False) -> (h, final_state)``:
  ``h_t = a_t * h_{t-1} + x_t``; ``x, a: [B, T, D]``, ``initial_state: [B, D]``.
* ``complex_scan(x, a, theta, initial_state=None, reverse=False) -> (h, final_state)``:
  ``h_t = a_t * exp(i theta) * h_{t-1} + x_t``; ``x: [B, T, D, 2]``, ``a: [B, T, D]``,
  ``theta: [D]``, ``initial_state: [B, D, 2]``.
* ``hgru_fused(forget_logits, inputs, theta=None, lower_bound=None, initial_state=None, reverse=False)``:
  ``lambda = gamma + (1 - gamma) * sigmoid(f)`` and ``x = (1 - lambda) * SiLU(inputs)`` computed in
  registers (never written to memory; the backward recomputes them), then the real scan
  (``inputs: [B, T, D]``, ``theta=None``) or the complex one (``inputs: [B, T, D, 2]``, ``theta: [D]``).

All are autograd Functions with gradients for every tensor input (including ``initial_state``,
``theta`` and a tensor ``lower_bound``) and for both outputs. Inputs may be bf16, fp16 or fp32 and may
be strided views (the kernels take strides, so the usual contiguous case costs no copy); outputs come
in the dtype of ``x`` / ``inputs``; the recurrence is carried in fp32.

The recurrence is memory-bound. A program's threads own channels of one sequence and each holds a tile
of ``BT`` consecutive steps, so a tile is scanned along time in registers while loads stay coalesced
along channels. Parallelism over time comes in six launch modes, one picked per launch by
``plan._plan`` (``tuning`` overrides; docs/design.md#hgru-launch-planner has each mode and the
measurements behind the choice): ``seq`` (a program walks a whole sequence), ``twopass`` (chunk maps, then the chunks),
``chunklb`` (forward: the chunks in one launch, look-back over chunk maps), ``lookback`` (one tile per
program, decoupled look-back), ``stream`` (real scans: a software pipeline over tiles) and ``block``
(real forward: a CTA scans blocks of R * NW steps).

Files, each readable on its own:

* ``scan_math.py``: the associative combines, the gates, the rotation of the complex scan;
* ``tiles.py``: tile loads and stores, the walk of a chunk, the composition of chunk maps;
* ``lookback.py``: the decoupled look-back protocol (tagged words, launch epochs);
* ``forward.py`` / ``backward.py``: the kernels of each mode;
* ``plan.py``: ``tuning`` and the launch planner with its measured tables;
* ``autograd.py``: the autograd Function (launches, scratch buffers);
* ``ops.py``: the public ops and their argument checks.

``hgrn_fairseq.kernels.hgru_triton`` re-exports every name of these files under that module name.
"""
from .ops import complex_scan, hgru_fused, real_scan
from .plan import tuned, tuning

__all__ = ["real_scan", "complex_scan", "hgru_fused", "tuning", "tuned"]
