"""CUDA graphs for training steps whose cost is kernel launches, not arithmetic.

At 16 x 512 tokens per step a 6-layer d-512 model issues some 500 kernels, and the host takes longer
to issue them than the GPU takes to run them. :class:`GraphedCallCache` records the forward and the
backward of a module once per input shape with :func:`torch.cuda.make_graphed_callables` and then
replays each as one launch; the parameters' gradients come back through autograd as usual, so
optimizers, gradient accumulation, clipping and DDP's hooks see nothing different.

What a caller must respect (:meth:`GraphedCallCache.usable` checks the first point):

* CUDA, training mode, gradients enabled: evaluation and decoding run the module eagerly (or, where
  the owner asks for it, through :class:`InferenceGraphCache` below);
* the tensors the module returns are the graph's static buffers: they hold their values until the
  same shape is replayed again, i.e. until the next training forward, which is after the backward;
* parameters are updated in place (every torch and fairseq optimizer does); a module moved or cast
  after a capture (``.to()``, ``.half()``) gets new graphs, since the key holds the parameters'
  dtype and the address of the first one;
* the module has no host synchronisation and no data-dependent shapes inside;
* dropout is fine: the graph draws fresh random numbers on every replay;
* buffers updated in place in training (batch norm's running statistics) are updated by every replay,
  as by an eager step; the capture's warm-up runs do not count (their buffer values are put back);
* autocast: the capture runs under the caller's autocast device type and dtype, with autocast's
  weight cache off, as :func:`torch.cuda.make_graphed_callables` requires;
* DDP (fairseq's distributed training): the captures use the ``"thread_local"`` error mode, so NCCL's
  watchdog thread cannot break them; DDP's gradient hooks fire when the graph's backward hands the
  parameters their gradients.

At most ``max_graphs`` shapes are captured (each holds its own activation memory); further shapes
run eagerly, with one warning.

:class:`InferenceGraphCache` does the same for evaluation: a module in eval mode called under
``torch.no_grad`` (or ``torch.inference_mode``) is recorded once per input shape with
:class:`torch.cuda.CUDAGraph` and replayed. There the host's cost is all there is: an eager eval
forward of hgrn2_vit_tiny takes several times its GPU time in wall time. Each call copies its inputs into the
graph's input buffers and returns a *copy* of the graph's output, so results kept across calls stay
valid (a list of logits is a list of different tensors).
"""
from __future__ import annotations

import importlib
import inspect
import logging
from typing import Callable, Dict, Tuple

import torch
from torch import nn

logger = logging.getLogger(__name__)


def graph_with_parameter_aliases(module: nn.Module, samples: tuple, make_graphed: Callable) -> Callable:
    """``inputs -> module(*inputs)`` as a graphed function whose parameters are explicit inputs.

    The warm-up and the capture run ``module`` through :func:`torch.func.functional_call` on aliases
    of its parameters (``p.detach()``: the same memory, fresh autograd leaves), so the hooks that
    DDP keeps on the real parameters never fire inside a capture (their all-reduce cannot be
    captured). A replay takes the real parameters as inputs (same addresses: nothing is copied), and
    its backward hands them their gradients through autograd as an eager backward would."""
    names, params = zip(*module.named_parameters())
    aliases = tuple(p.detach().requires_grad_(p.requires_grad) for p in params)
    n = len(samples)

    def run(*args):
        return torch.func.functional_call(module, dict(zip(names, args[n:])), args[:n])

    graphed = make_graphed(run, samples + aliases)

    def replay(*inputs):
        return graphed(*inputs, *params)

    return replay


def make_graphed_thread_local(fn: Callable, samples: tuple) -> Callable:
    """:func:`torch.cuda.make_graphed_callables` with the captures in ``"thread_local"`` error mode.

    In the default ``"global"`` mode a capture fails when *another* thread makes a CUDA call that a
    capture forbids, and under DDP one always may: NCCL's watchdog thread queries its events. The
    capturing thread is held to the same rules either way. torch releases whose
    ``make_graphed_callables`` has no ``capture_error_mode`` argument get it through the
    ``torch.cuda.graph`` context they construct, swapped for the duration of the call."""
    if "capture_error_mode" in inspect.signature(torch.cuda.make_graphed_callables).parameters:
        return torch.cuda.make_graphed_callables(
            fn, samples, allow_unused_input=True, capture_error_mode="thread_local"
        )
    original = torch.cuda.graph

    class _ThreadLocalGraph(original):
        def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="thread_local", **kwargs):
            super().__init__(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode, **kwargs)

    graphs_module = importlib.import_module("torch.cuda.graphs")  # where make_graphed_callables lives
    patched = [m for m in (torch.cuda, graphs_module) if getattr(m, "graph", None) is original]
    for m in patched:
        m.graph = _ThreadLocalGraph
    try:
        return torch.cuda.make_graphed_callables(fn, samples, allow_unused_input=True)
    finally:
        for m in patched:
            m.graph = original


def _autocast_state() -> Tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")


class GraphedCallCache:
    """Graphed versions of ``module`` (which shares the owner's parameters), one per (input shapes
    and dtypes, autocast state, dtype and address of the module's first parameter)."""

    def __init__(self, module: nn.Module, max_graphs: int = 4, name: str = "module"):
        self.module = module
        self.max_graphs = max_graphs
        self.name = name
        self.graphed: Dict[tuple, Callable] = {}
        self._warned = False

    @staticmethod
    def usable(module: nn.Module, *inputs: torch.Tensor) -> bool:
        return (
            module.training
            and torch.is_grad_enabled()
            and all(t.is_cuda for t in inputs)
            and not torch.cuda.is_current_stream_capturing()
        )

    def _key(self, inputs) -> tuple:
        shapes = tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad) for t in inputs)
        first_param = next(self.module.parameters())
        return shapes, _autocast_state(), first_param.dtype, first_param.data_ptr()

    _KIND = ""  # (the warning's word for what was captured: "evaluation " in InferenceGraphCache)

    def __call__(self, *inputs: torch.Tensor):
        key = self._key(inputs)
        entry = self.graphed.get(key)
        if entry is None:
            if len(self.graphed) >= self.max_graphs:
                if not self._warned:
                    logger.warning(
                        f"cuda graphs: {self.name} already has {self.max_graphs} captured {self._KIND}shapes; "
                        f"shape {[tuple(t.shape) for t in inputs]} and later new ones run without a graph"
                    )
                    self._warned = True
                return self.module(*inputs)
            entry = self._capture(inputs)
            self.graphed[key] = entry
        return self._replay(entry, inputs)

    def _replay(self, graphed: Callable, inputs):
        return graphed(*inputs)

    def _capture(self, inputs) -> Callable:
        enabled, dtype = _autocast_state()
        logger.info(
            f"cuda graphs: capturing {self.name} for inputs {[tuple(t.shape) for t in inputs]}"
            + (f" under autocast({dtype})" if enabled else "")
        )
        # sample inputs of the same shapes; their values do not matter (warm-up and capture only)
        samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
        # the warm-up runs the module a few times for real: buffers it updates in training (a batch norm's
        # running statistics) get their values back, so that only the replays count, as eager steps would
        buffers = [(b, b.clone()) for b in self.module.buffers()]
        try:
            with torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False):
                return graph_with_parameter_aliases(self.module, samples, make_graphed_thread_local)
        finally:  # (a failed capture leaves them as it found them too)
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


class InferenceGraphCache(GraphedCallCache):
    """Graphed no-grad forwards of ``module`` (which shares the owner's parameters), one per (input
    shapes and dtypes, autocast state, inference mode, dtype and address of the module's first parameter).

    The parameters are read in place at each replay, so weights loaded or updated in place (an
    optimiser step, ``load_state_dict``, an EMA update) are what the next call uses; a module moved or
    cast gets new graphs. The module must return a tensor or a tuple of tensors."""

    _KIND = "evaluation "

    @staticmethod
    def usable(module: nn.Module, *inputs: torch.Tensor) -> bool:
        return (
            not module.training
            and not torch.is_grad_enabled()
            and all(t.is_cuda for t in inputs)
            and not torch.cuda.is_current_stream_capturing()
        )

    def _key(self, inputs) -> tuple:
        shapes = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        first_param = next(self.module.parameters())
        # (buffers made under inference_mode cannot be written outside it, and the other way round)
        return shapes, _autocast_state(), torch.is_inference_mode_enabled(), first_param.dtype, first_param.data_ptr()

    def _replay(self, entry: tuple, inputs):
        graph, static_inputs, static_output = entry
        for buffer, t in zip(static_inputs, inputs):
            buffer.copy_(t)
        graph.replay()
        if isinstance(static_output, tuple):
            return tuple(t.clone() for t in static_output)
        return static_output.clone()

    def _capture(self, inputs) -> tuple:
        enabled, dtype = _autocast_state()
        logger.info(
            f"cuda graphs: capturing {self.name}'s evaluation forward for inputs {[tuple(t.shape) for t in inputs]}"
            + (f" under autocast({dtype})" if enabled else "")
        )
        static_inputs = tuple(t.detach().clone() for t in inputs)
        # warm-up on a side stream (Triton's autotuning and lazy initialisation happen outside the capture)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False):
            for _ in range(2):
                self.module(*static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False), \
                torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static_output = self.module(*static_inputs)
        if not (isinstance(static_output, torch.Tensor)
                or (isinstance(static_output, tuple) and all(isinstance(t, torch.Tensor) for t in static_output))):
            raise TypeError(f"cuda graphs: {self.name} returned {type(static_output).__name__}; "
                            "an evaluation graph needs a tensor or a tuple of tensors")
        return graph, static_inputs, static_output
