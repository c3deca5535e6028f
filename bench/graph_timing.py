"""GPU time of one call of an op, with the host out of the picture (shared by the bench scripts).

``gpu_time(fn, leaves)``: ``n`` calls of ``fn``, each after a 256 MiB write that flushes the L2 (and with
the ``.grad`` of ``leaves`` reset), are captured in one CUDA graph; the same graph of flushes alone is
subtracted; the result is the median over ``replays`` replays, divided by ``n``. Python work, allocator
calls and launch latency, which ``triton.testing.do_bench`` counts whenever the GPU has to wait for them,
are left out: this is what a step under CUDA graphs (``--cuda-graphs``) pays.

``timeit(fn, leaves, rep, mode)`` returns ``(ms, how)``: the graphed time when ``mode == "graph"`` and
``fn`` can be captured, else do_bench's median (``how`` says which).
"""
from __future__ import annotations

import torch

_FLUSH = None


def flush_l2():
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    _FLUSH.zero_()


def gpu_time(fn, leaves=None, n=20, replays=15, warmup=3):
    leaves = leaves or []

    def body(with_fn):
        for _ in range(n):
            flush_l2()
            if with_fn:
                for t in leaves:
                    t.grad = None
                fn()

    for _ in range(warmup):  # compilation and autotuning must not happen under capture
        body(True)
    torch.cuda.synchronize()
    times = {}
    for with_fn in (False, True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body(with_fn)
        graph.replay()
        torch.cuda.synchronize()
        ms = []
        for _ in range(replays):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            graph.replay()
            e1.record()
            torch.cuda.synchronize()
            ms.append(e0.elapsed_time(e1))
        times[with_fn] = sorted(ms)[len(ms) // 2]
        del graph
    for t in leaves:
        t.grad = None
    return (times[True] - times[False]) / n


def eager_time(fn, leaves=None, rep=100):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=rep, grad_to_none=leaves or None, return_mode="median")


def timeit(fn, leaves=None, rep=100, mode="graph", log=print):
    if mode == "graph":
        try:
            return gpu_time(fn, leaves), "graph"
        except Exception as exc:  # noqa: BLE001  (a host sync inside fn, say)
            torch.cuda.synchronize()
            log(f"    (not capturable, timed eagerly: {repr(exc)[:120]})")
    return eager_time(fn, leaves, rep), "eager"
