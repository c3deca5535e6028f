"""Recurrence ops of HGRN / HGRN2: Triton kernels and their pure-PyTorch references.

Public API (batch-first; complex numbers as a trailing dimension of size 2, see reference.py):

* ``hgru_scan(forget_logits, inputs, theta, lower_bound, initial_state, reverse, backend)``:
  gates + scan of one HGRU direction, returns ``(h, final_state)``.
* ``hgrn2_scan(q, v, log_decay, initial_state, reverse, backend)``: HGRN2 recurrence.
* ``hgrn2_scan_bidirectional(q, v, log_decay, backend)``: both directions summed (no state); on the
  chunked kernels the reverse scan adds into the forward scan's output and gradients.
* ``hgrn2_step(q, v, log_decay, state, backend)``: one HGRN2 decoding step.
* ``real_scan(x, a, initial_state, reverse, backend)`` and
  ``complex_scan(x, a, theta, initial_state, reverse, backend)``: the bare HGRU recurrences.
* ``hgru_fused``: the Triton HGRU op itself (gates + scan, CUDA tensors), imported on first use so
  that importing this package needs no Triton; ``hgru_scan`` dispatches to it.
* ``*_reference``: the float64-capable oracles.
* ``linear_cross_entropy(hidden, weight, target, ignore_index, reduction, chunk_rows, backend)``: output
  projection + cross entropy without fp32 logits (see linear_cross_entropy.py).

``backend`` is ``"auto"`` (Triton for CUDA tensors, the reference otherwise), ``"triton"`` or
``"reference"``.
"""
from .dispatch import (BACKENDS, complex_scan, hgrn2_scan, hgrn2_scan_bidirectional, hgrn2_step, hgru_scan, real_scan,
                       resolve_backend)
from .linear_cross_entropy import linear_cross_entropy
from .reference import (
    complex_scan_reference,
    hgrn2_scan_reference,
    hgru_gates_reference,
    hgru_reference,
    real_scan_reference,
)

__all__ = [
    "BACKENDS",
    "resolve_backend",
    "hgru_scan",
    "hgrn2_scan",
    "hgrn2_scan_bidirectional",
    "hgrn2_step",
    "real_scan",
    "complex_scan",
    "hgru_fused",
    "real_scan_reference",
    "complex_scan_reference",
    "hgru_gates_reference",
    "hgru_reference",
    "hgrn2_scan_reference",
    "linear_cross_entropy",
]


def __getattr__(name):
    # hgru_fused lives with the Triton kernels; import them only when asked for
    if name == "hgru_fused":
        from .hgru import hgru_fused

        return hgru_fused
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
