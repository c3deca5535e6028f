#!/usr/bin/env python3
"""HGRU scan kernels against the memory floor and the public peers, on one GPU, in one run.

Ours (hgrn_fairseq.kernels.hgru_triton): real scan, complex scan, fused HGRU (gates + scan; real and
complex). Peers: an elementwise Triton kernel moving the same bytes as the scan (the floor; also
torch.add for the forward), fla ``chunk_hgrn`` and ``fused_recurrent_hgrn``, accelerated-scan (its own
time-contiguous [B, C, T] layout, transposes not timed; its complex scan takes complex64 and a complex
decay), and the unfused HGRU "PyTorch gates + fla chunk_hgrn". bf16, forward and forward+backward,
GPU time per call from CUDA-graph replays with the L2 flushed before each call (``graph_timing.py``;
``--timing eager``: ``triton.testing.do_bench`` medians). The table ends with the ratios the kernels
are held to (``TARGETS``).

    python3 -m bench.bench_scan --out DIR            # the table (bench_scan.json + .md in DIR)
    python3 -m bench.bench_scan --sweep --out DIR    # launch-parameter sweep of our kernels

Compilation (ours, and fla's autotuning candidates) is first done in parallel worker processes that
share Triton's on-disk cache, so the timing process starts warm.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import time
import traceback

import torch

from bench import graph_timing
from bench import provenance

SHAPES = [(8, 2048, 1024), (8, 4096, 1024), (1, 8192, 2048), (32, 512, 1536), (2, 16384, 1024)]
DTYPE = torch.bfloat16

# launch-parameter candidates for --sweep (keys of hgru_triton.tuning; None = the default plan).
# Each look-back configuration runs with every look-back window of SWEEP_WINDOWS (--windows):
# predecessors read per round trip, 1 = the walk of one predecessor per round trip.
SWEEP_LOOKBACK = [
    dict(mode="lookback"),
    dict(mode="lookback", block_t=8),
    dict(mode="lookback", block_t=32),
    dict(mode="lookback", block_d=64, num_warps=2),
]
SWEEP_OTHERS = [
    dict(mode="seq"),
    dict(mode="seq", block_t=8, prefetch=True),
    dict(mode="twopass"),
    dict(mode="stream"),  # real kernels only (the complex ones refuse it)
    dict(mode="stream", stages=3),
    dict(mode="stream", block_d=16, block_t=64),
    dict(mode="stream", block_d=64, block_t=16),
    dict(mode="stream", block_d=32, block_t=32),
    dict(mode="stream", stages=6),
]
SWEEP_WINDOWS = (1, 4, 8, 16, 32)


def sweep_configs(windows=SWEEP_WINDOWS):
    """The default plan, each look-back configuration with each window, then the other modes."""
    return ([dict()] + [dict(cfg, lookback_window=w) for cfg in SWEEP_LOOKBACK for w in windows]
            + [dict(cfg) for cfg in SWEEP_OTHERS])


SWEEP_CONFIGS = sweep_configs()
SWEEP_SHAPES = [(8, 2048, 1024), (32, 512, 1536), (1, 8192, 2048)]
SWEEP_CHUNKS = []  # (num_chunks, shape) pairs for the two-pass mode


# ---------------------------------------------------------------------------------------------
# the floor: an elementwise kernel that reads n_in and writes n_out tensors of N elements
# ---------------------------------------------------------------------------------------------
def _floor_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(I0, I1, I2, O0, O1, N, N_IN: tl.constexpr, N_OUT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        acc = tl.load(I0 + offs, mask=m, other=0.0).to(tl.float32)
        if N_IN > 1:
            acc += tl.load(I1 + offs, mask=m, other=0.0).to(tl.float32)
        if N_IN > 2:
            acc += tl.load(I2 + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(O0 + offs, acc.to(O0.dtype.element_ty), mask=m)
        if N_OUT > 1:
            tl.store(O1 + offs, (acc * 2).to(O1.dtype.element_ty), mask=m)

    return copy_kernel


_COPY = None


def floor_op(ins, outs):
    import triton

    global _COPY
    if _COPY is None:
        _COPY = _floor_kernel()
    n = ins[0].numel()
    n_in, n_out = len(ins), len(outs)
    i = list(ins) + [ins[0]] * (3 - n_in)
    o = list(outs) + [outs[0]] * (2 - n_out)
    _COPY[(triton.cdiv(n, 4096),)](*i, *o, n, N_IN=n_in, N_OUT=n_out, BLOCK=4096, num_warps=8)


# ---------------------------------------------------------------------------------------------
# ops: each builder returns (fwd, fwd_bwd, grad_leaves, bytes_fwd, bytes_fwd_bwd)
# ---------------------------------------------------------------------------------------------
def _leaf(t):
    return t.detach().requires_grad_(True)


def make_inputs(B, T, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    r = lambda *s: torch.randn(*s, device=dev, generator=g)  # noqa: E731
    inp = dict(
        x=r(B, T, D).to(DTYPE),
        a=(0.6 + 0.4 * torch.rand(B, T, D, device=dev, generator=g)).to(DTYPE),
        xc=r(B, T, D, 2).to(DTYPE),
        f=r(B, T, D).to(DTYPE),
        i=r(B, T, D).to(DTYPE),
        ic=r(B, T, D, 2).to(DTYPE),
        theta=torch.rand(D, device=dev, generator=g),
        gamma=(torch.rand(D, device=dev, generator=g) * 0.5),
    )
    inp["dh"] = r(B, T, D).to(DTYPE)
    inp["dhc"] = r(B, T, D, 2).to(DTYPE)
    return inp


def _fb(run, dout):
    def go():
        out = run()
        out.backward(dout)

    return go


def _floor_real(x, a, dh):
    N, e = x.numel(), x.element_size()
    o1, o2, h = torch.empty_like(x), torch.empty_like(x), dh.clone()

    def fwd():
        floor_op([x, a], [o1])

    def fwd_bwd():
        floor_op([x, a], [o1])
        floor_op([dh, a, h], [o1, o2])

    return fwd, fwd_bwd, [], 3 * N * e, 8 * N * e


def _floor_complex(xc, a, dhc):
    """Complex scan bytes: fwd reads x (2N) and a (N), writes h (2N); bwd reads dh (2N), a (N) and h (2N),
    writes dx (2N) and da (N)."""
    N, e = a.numel(), a.element_size()
    o1, o2, o3, h = torch.empty_like(xc), torch.empty_like(xc), torch.empty_like(a), dhc.clone()

    def fwd():
        floor_op([xc.view(-1)], [o1.view(-1)])
        floor_op([a], [o3])

    def fwd_bwd():
        fwd()
        floor_op([dhc.view(-1), h.view(-1)], [o2.view(-1)])
        floor_op([a], [o3])

    return fwd, fwd_bwd, [], 5 * N * e, 13 * N * e


def build_ops(B, T, D, which=None):
    """name -> (fwd callable, fwd+bwd callable, leaves, bytes fwd, bytes fwd+bwd)"""
    from hgrn_fairseq.kernels import hgru_triton as K

    inp = make_inputs(B, T, D)
    N = B * T * D
    e = 2  # bf16 bytes
    ops = {}

    def want(name):
        return which is None or name in which

    x, a, xc = _leaf(inp["x"]), _leaf(inp["a"]), _leaf(inp["xc"])
    f, i, ic = _leaf(inp["f"]), _leaf(inp["i"]), _leaf(inp["ic"])
    theta, gamma = _leaf(inp["theta"]), _leaf(inp["gamma"])
    dh, dhc = inp["dh"], inp["dhc"]

    # floor: fwd reads x, a and writes h; bwd reads dh, a, h and writes dx, da (fresh names in each
    # block: the closures must not see a later block's tensors)
    if want("floor"):
        ops["floor"] = _floor_real(x.detach(), a.detach(), dh)
    if want("torch.add"):
        xa_out = torch.empty_like(x)
        xa, aa = x.detach(), a.detach()
        ops["torch.add"] = (lambda: torch.add(xa, aa, out=xa_out), None, [], 3 * N * e, None)
    if want("floor_complex"):
        ops["floor_complex"] = _floor_complex(xc.detach(), a.detach(), dhc)

    if want("ours_real"):
        ops["ours_real"] = (lambda: K.real_scan(x, a), _fb(lambda: K.real_scan(x, a)[0], dh), [x, a],
                            3 * N * e, 8 * N * e)
    if want("ours_complex"):
        ops["ours_complex"] = (lambda: K.complex_scan(xc, a, theta),
                               _fb(lambda: K.complex_scan(xc, a, theta)[0], dhc), [xc, a, theta],
                               5 * N * e, 13 * N * e)
    if want("ours_fused_real"):
        ops["ours_fused_real"] = (lambda: K.hgru_fused(f, i, None, gamma),
                                  _fb(lambda: K.hgru_fused(f, i, None, gamma)[0], dh), [f, i, gamma],
                                  3 * N * e, 8 * N * e)
    if want("ours_fused_complex"):
        ops["ours_fused_complex"] = (lambda: K.hgru_fused(f, ic, theta, gamma),
                                     _fb(lambda: K.hgru_fused(f, ic, theta, gamma)[0], dhc), [f, ic, theta, gamma],
                                     5 * N * e, 13 * N * e)

    if any(want(n) for n in ("fla_chunk_hgrn", "fla_fused_recurrent_hgrn", "torch_gates+fla_chunk_hgrn")):
        try:
            from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn

            g_log = _leaf(torch.log(inp["a"].float()).to(DTYPE))
            if want("fla_chunk_hgrn"):
                ops["fla_chunk_hgrn"] = (lambda: chunk_hgrn(x, g_log), _fb(lambda: chunk_hgrn(x, g_log)[0], dh),
                                         [x, g_log], 3 * N * e, 8 * N * e)
            if want("fla_fused_recurrent_hgrn"):
                ops["fla_fused_recurrent_hgrn"] = (
                    lambda: fused_recurrent_hgrn(x, g_log), _fb(lambda: fused_recurrent_hgrn(x, g_log)[0], dh),
                    [x, g_log], 3 * N * e, 8 * N * e)
            if want("torch_gates+fla_chunk_hgrn"):
                def unfused():
                    mu = torch.sigmoid(f)
                    lam = gamma.to(DTYPE) + (1 - gamma.to(DTYPE)) * mu
                    xx = (1 - lam) * torch.nn.functional.silu(i)
                    return chunk_hgrn(xx, torch.log(lam))[0]

                ops["torch_gates+fla_chunk_hgrn"] = (unfused, _fb(unfused, dh), [f, i, gamma], None, None)
        except Exception as exc:  # noqa: BLE001
            ops["fla"] = ("unavailable", repr(exc))
    if want("torch_gates+ours_real"):
        def unfused_ours():
            mu = torch.sigmoid(f)
            lam = gamma.to(DTYPE) + (1 - gamma.to(DTYPE)) * mu
            xx = (1 - lam) * torch.nn.functional.silu(i)
            return K.real_scan(xx, lam)[0]

        ops["torch_gates+ours_real"] = (unfused_ours, _fb(unfused_ours, dh), [f, i, gamma], None, None)

    if want("accelerated_scan") or want("accelerated_scan_complex"):
        # its own layout: [B, C, T] contiguous (transposes not timed)
        xt = _leaf(inp["x"].transpose(1, 2).contiguous())
        at = _leaf(inp["a"].transpose(1, 2).contiguous())
        dht = dh.transpose(1, 2).contiguous()
        if want("accelerated_scan"):
            try:
                scan, impl = _accelerated_scan()
                ops[f"accelerated_scan[{impl}]"] = (lambda: scan(at, xt), _fb(lambda: scan(at, xt), dht), [xt, at],
                                                    3 * N * e, 8 * N * e)
            except Exception as exc:  # noqa: BLE001
                ops["accelerated_scan"] = ("unavailable", repr(exc))
        if want("accelerated_scan_complex"):
            try:
                from accelerated_scan.complex import scan as cscan

                th = inp["theta"].view(1, D, 1)
                fc = _leaf(torch.polar(inp["a"].float().transpose(1, 2).contiguous(), th.expand(B, D, T).contiguous()))
                xcc = _leaf(torch.view_as_complex(inp["xc"].float().transpose(1, 2).contiguous()))
                dcc = torch.view_as_complex(inp["dhc"].float().transpose(1, 2).contiguous())
                ops["accelerated_scan_complex[complex64]"] = (
                    lambda: cscan(fc, xcc), _fb(lambda: cscan(fc, xcc), dcc), [fc, xcc], 24 * N, 64 * N)
            except Exception as exc:  # noqa: BLE001
                ops["accelerated_scan_complex"] = ("unavailable", repr(exc))
    return ops


_ALL_OPS = {"floor", "torch.add", "floor_complex", "ours_real", "ours_complex", "ours_fused_real",
            "ours_fused_complex", "fla_chunk_hgrn", "fla_fused_recurrent_hgrn", "torch_gates+fla_chunk_hgrn",
            "torch_gates+ours_real", "accelerated_scan", "accelerated_scan_complex"}
_ACC = None


def _accelerated_scan():
    """accelerated-scan's CUDA warp kernel when it builds here (needs nvcc), else its Triton one."""
    global _ACC
    if _ACC is None:
        try:
            if os.environ.get("BENCH_SCAN_NO_WARP"):
                raise RuntimeError("skipped")
            from accelerated_scan.warp import scan as wscan

            _ACC = (wscan, "warp")
        except Exception:  # noqa: BLE001
            from accelerated_scan.scalar import scan as sscan

            _ACC = (sscan, "triton")
    return _ACC


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
TIMING = "graph"  # --timing: "graph" (GPU time, launch overhead excluded) or "eager" (do_bench)


def timeit(fn, leaves, rep=100):
    """(ms, "graph" or "eager"): see graph_timing.py."""
    return graph_timing.timeit(fn, leaves, rep, TIMING)


ISOLATED = {"accelerated_scan", "accelerated_scan_complex"}  # peers that have crashed the CUDA context


def _isolated_worker(shape, names, rep, q):
    try:
        q.put(run_table([shape], set(names), rep, log=lambda m: None, isolate=False))
    except Exception as exc:  # noqa: BLE001
        q.put([dict(shape=list(shape), op="+".join(sorted(names)), error=repr(exc)[:300])])


def _run_isolated(shape, names, rep, log):
    """Run ops in a child process: an illegal memory access there cannot take our numbers with it."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_isolated_worker, args=(shape, sorted(names), rep, q))
    p.start()
    p.join(timeout=300)
    rows = q.get() if not q.empty() else [dict(shape=list(shape), op="+".join(sorted(names)),
                                               error=f"child process exited with {p.exitcode}")]
    for r in rows:
        log(f"  {tuple(shape)} {r['op']}: fwd {r.get('fwd_ms', float('nan')):.4f} ms, "
            f"fwd+bwd {r.get('fwd_bwd_ms', float('nan')):.4f} ms {r.get('error', '')[:150]}")
    return rows


def run_table(shapes, which=None, rep=100, log=print, isolate=True):
    results = []
    for (B, T, D) in shapes:
        torch.cuda.empty_cache()
        names, iso = which, set()
        if isolate:
            iso = ISOLATED if which is None else set(which) & ISOLATED
            names = (_ALL_OPS if which is None else set(which)) - ISOLATED
        ops = build_ops(B, T, D, names)
        for name, op in ops.items():
            if op[0] == "unavailable":
                results.append(dict(shape=[B, T, D], op=name, error=op[1]))
                log(f"  {B}x{T}x{D} {name}: unavailable ({op[1][:120]})")
                continue
            fwd, fb, leaves, bytes_f, bytes_fb = op
            row = dict(shape=[B, T, D], op=name, bytes_fwd=bytes_f, bytes_fwd_bwd=bytes_fb)
            try:
                with torch.no_grad():
                    row["fwd_ms"], row["fwd_timing"] = timeit(fwd, None, rep)
                if fb is not None:
                    row["fwd_bwd_ms"], row["fwd_bwd_timing"] = timeit(fb, leaves, rep)
            except Exception as exc:  # noqa: BLE001
                row["error"] = repr(exc)[:300]
            results.append(row)
            log(f"  {B}x{T}x{D} {name}: fwd {row.get('fwd_ms', float('nan')):.4f} ms, "
                f"fwd+bwd {row.get('fwd_bwd_ms', float('nan')):.4f} ms {row.get('error', '')}")
        del ops
        if iso:
            torch.cuda.synchronize()
            results += _run_isolated((B, T, D), iso, rep, log)
    return results


def _find(results, shape, op, key):
    for r in results:
        if r["shape"] == list(shape) and r["op"].startswith(op) and key in r:
            return r[key]
    return None


def ratios(results, shapes):
    out = []
    for s in shapes:
        B, T, D = s
        g = lambda op, k: _find(results, s, op, k)  # noqa: E731
        row = dict(shape=list(s), BD=B * D)
        if g("ours_real", "fwd_ms") and g("floor", "fwd_ms"):
            row["real_fwd_over_floor"] = g("ours_real", "fwd_ms") / g("floor", "fwd_ms")
        if g("ours_real", "fwd_ms") and g("torch.add", "fwd_ms"):
            row["real_fwd_over_torch_add"] = g("ours_real", "fwd_ms") / g("torch.add", "fwd_ms")
        if g("fla_chunk_hgrn", "fwd_bwd_ms") and g("ours_real", "fwd_bwd_ms"):
            row["fla_chunk_over_real_fwd_bwd"] = g("fla_chunk_hgrn", "fwd_bwd_ms") / g("ours_real", "fwd_bwd_ms")
        if g("ours_complex", "fwd_bwd_ms") and g("ours_real", "fwd_bwd_ms"):
            row["complex_over_real_fwd_bwd"] = g("ours_complex", "fwd_bwd_ms") / g("ours_real", "fwd_bwd_ms")
        if g("torch_gates+fla_chunk_hgrn", "fwd_bwd_ms") and g("ours_fused_real", "fwd_bwd_ms"):
            row["unfused_over_fused_fwd_bwd"] = (g("torch_gates+fla_chunk_hgrn", "fwd_bwd_ms")
                                                 / g("ours_fused_real", "fwd_bwd_ms"))
        if g("ours_real", "fwd_bwd_ms") and g("floor", "fwd_bwd_ms"):
            row["real_fwd_bwd_over_floor"] = g("ours_real", "fwd_bwd_ms") / g("floor", "fwd_bwd_ms")
        out.append(row)
    return out


TARGETS = [
    ("real_fwd_over_floor", "real fwd / floor", "<= 1.3 (B*D >= 8192)", lambda v, r: r["BD"] < 8192 or v <= 1.3),
    ("fla_chunk_over_real_fwd_bwd", "fla chunk_hgrn / real, fwd+bwd", ">= 2.5", lambda v, r: v >= 2.5),
    ("complex_over_real_fwd_bwd", "complex / real, fwd+bwd", "<= 2.0", lambda v, r: v <= 2.0),
    ("unfused_over_fused_fwd_bwd", "(torch gates + fla) / fused, fwd+bwd", ">= 2.0", lambda v, r: v >= 2.0),
]


def markdown(meta, results, rat, shapes):
    lines = [f"# bench_scan: HGRU scans, bf16 ({meta['gpu']}, {meta['date']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}, fla {meta.get('fla')}, "
             f"accelerated-scan {meta.get('accelerated_scan')}, commit {meta.get('commit')}", "",
             ("Times are GPU times in ms of one call, L2 flushed before each: 20 calls captured in a CUDA "
              "graph, minus the same graph of flushes alone, median of 15 replays, so that Python and "
              "launch overhead (which the GPU would otherwise wait for) are left out; ops that cannot be "
              "captured are timed with do_bench (marked *eager*)." if TIMING == "graph" else
              "Times are do_bench medians in ms (L2 cleared before each call; any launch overhead the "
              "GPU waits for is included)."),
             "GB/s counts the fewest bytes the op must move (each input read once, each output written once).",
             ""]
    ops = []
    for r in results:
        if r["op"] not in ops:
            ops.append(r["op"])
    for s in shapes:
        lines += [f"## B, T, D = {tuple(s)}", "", "| op | fwd ms | fwd GB/s | fwd+bwd ms | fwd+bwd GB/s |",
                  "|---|---:|---:|---:|---:|"]
        for op in ops:
            r = next((r for r in results if r["shape"] == list(s) and r["op"] == op), None)
            if r is None:
                continue
            if "error" in r and "fwd_ms" not in r:
                lines.append(f"| {op} | unavailable | | | |")
                continue
            f = r.get("fwd_ms")
            fb = r.get("fwd_bwd_ms")
            gbs = lambda b, t: f"{b / t / 1e6:.0f}" if b and t else ""  # noqa: E731
            tag = lambda k: " *eager*" if TIMING == "graph" and r.get(k) == "eager" else ""  # noqa: E731
            lines.append(f"| {op} | {f:.4f}{tag('fwd_timing')} | {gbs(r.get('bytes_fwd'), f)} | "
                         f"{'' if fb is None else f'{fb:.4f}'}{tag('fwd_bwd_timing')} | "
                         f"{gbs(r.get('bytes_fwd_bwd'), fb)} |")
        lines.append("")
    lines += ["## Targets", "", "| B, T, D | " + " | ".join(t[1] + " (" + t[2] + ")" for t in TARGETS) + " |",
              "|---|" + "---:|" * len(TARGETS)]
    for r in rat:
        cells = []
        for key, _, _, ok in TARGETS:
            v = r.get(key)
            cells.append("n/a" if v is None else f"{v:.2f} {'ok' if ok(v, r) else 'MISSED'}")
        lines.append(f"| {tuple(r['shape'])} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def metadata():
    import triton

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, date=now, host=platform.node(),
                sms=torch.cuda.get_device_properties(0).multi_processor_count)
    for mod, key in (("fla", "fla"), ("accelerated_scan", "accelerated_scan")):
        try:
            meta[key] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            meta[key] = None
    meta["commit"] = provenance.git_version()
    return meta


# ---------------------------------------------------------------------------------------------
# parallel warm-up (compilation and fla's autotune candidates)
# ---------------------------------------------------------------------------------------------
def _warm_worker(tasks, q):
    from hgrn_fairseq.kernels import hgru_triton as K

    done = 0
    for cfg, shape, names in tasks:
        try:
            K.tuning.update({k: None for k in K.tuning})
            K.tuning.update(cfg)
            ops = build_ops(*shape, which=set(names) if names else None)
            for name, op in ops.items():
                if op[0] == "unavailable":
                    continue
                with torch.no_grad():
                    op[0]()
                if op[1] is not None:
                    op[1]()
            torch.cuda.synchronize()
            done += 1
        except Exception:  # noqa: BLE001
            q.put(traceback.format_exc()[-800:])
    q.put(f"worker done {done}/{len(tasks)}")


def warm(tasks, jobs, log=print):
    t0 = time.time()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_warm_worker, args=(tasks[k::jobs], q)) for k in range(jobs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    while not q.empty():
        log("  warm: " + q.get()[-400:])
    log(f"  warm-up of {len(tasks)} tasks in {jobs} processes: {time.time() - t0:.1f} s")


def smoke(log):
    """Every mode of every op on two shapes: outputs and gradients must agree, and print times."""
    from hgrn_fairseq.kernels import hgru_triton as K

    for shape in [(8, 2048, 1024), (1, 8192, 2048)]:
        inp = make_inputs(*shape)
        theta, gamma = inp["theta"], inp["gamma"]
        results = {}
        # twopass first: the reference of the others. "lb_walk": only chunk 0 publishes its state, so
        # every look-back crosses whole windows of maps, with the programs running concurrently.
        for mode, cfg in (("twopass", dict(mode="twopass")), ("lookback", dict(mode="lookback")),
                          ("lb_w1", dict(mode="lookback", lookback_window=1)),
                          ("lb_walk", dict(mode="lookback", publish_inclusive=False))):
            K.tuning.update({k: None for k in K.tuning})
            K.tuning["publish_inclusive"] = True
            K.tuning.update(cfg)
            for name, fn, args, dout in (
                ("real", K.real_scan, (inp["x"], inp["a"]), inp["dh"]),
                ("complex", K.complex_scan, (inp["xc"], inp["a"], theta), inp["dhc"]),
                ("fused_real", K.hgru_fused, (inp["f"], inp["i"], None, gamma), inp["dh"]),
                ("fused_complex", K.hgru_fused, (inp["f"], inp["ic"], theta, gamma), inp["dhc"]),
            ):
                leaves = [t.detach().requires_grad_(True) if t is not None else None for t in args]
                t0 = time.time()
                h, ht = fn(*leaves)
                grads = torch.autograd.grad((h, ht), [t for t in leaves if t is not None],
                                            (dout, torch.ones_like(ht)))
                torch.cuda.synchronize()
                dt = time.time() - t0
                with torch.no_grad():
                    ms_f = timeit(lambda: fn(*leaves), None, 20)[0]
                outs = [h, ht] + list(grads)
                ref = results.setdefault(name, outs)
                err = max(((o.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-6)).item()
                          for o, r in zip(outs, ref))
                log(f"  smoke {shape} {mode:8s} {name:14s} first call {dt:6.2f} s, fwd {ms_f:.4f} ms, "
                    f"max rel diff vs twopass {err:.2e}")
                if not err < 3e-2:
                    raise SystemExit(f"smoke: {mode} {name} disagrees with twopass ({err})")
    K.tuning.update({k: None for k in K.tuning})
    K.tuning["publish_inclusive"] = True
    log("  smoke ok")


def window_table(rows, windows):
    """Markdown: for each look-back configuration, shape and op, the times at each window (and the
    best window), so that the default window can be read off one sweep."""
    cells = {}
    for r in rows:
        cfg = r.get("config", {})
        if "lookback_window" not in cfg:
            continue
        base = {k: v for k, v in cfg.items() if k != "lookback_window"}
        key = (json.dumps(base, sort_keys=True), tuple(r["shape"]), r["op"])
        cells.setdefault(key, {})[cfg["lookback_window"]] = r
    head = " | ".join(f"W={w}" for w in windows)
    out = ["## Look-back window (fwd ms, fwd+bwd ms)", "",
           f"| config | shape | op | {head} | best W fwd | best W fwd+bwd |",
           "|---|---|---|" + "---:|" * (len(windows) + 2)]
    for (base, shape, op), byw in cells.items():
        row = []
        for w in windows:
            r = byw.get(w, {})
            row.append(f"{r.get('fwd_ms', float('nan')):.4f}, {r.get('fwd_bwd_ms', float('nan')):.4f}")
        best = []
        for key in ("fwd_ms", "fwd_bwd_ms"):
            got = [(r[key], w) for w, r in byw.items() if key in r]
            best.append(str(min(got)[1]) if got else "")
        out.append(f"| {base} | {shape} | {op} | " + " | ".join(row) + " | " + " | ".join(best) + " |")
    return out + [""]


def _wait(path, log, limit_s=150):
    if not path:
        return
    t0 = time.time()
    while not os.path.exists(path) and time.time() - t0 < limit_s:
        time.sleep(1)
    log(f"  waited {time.time() - t0:.0f} s for {path}")


# ---------------------------------------------------------------------------------------------
def main():
    from hgrn_fairseq.kernels import hgru_triton as K

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/bench_scan")
    ap.add_argument("--sweep", action="store_true", help="sweep our launch parameters instead of the table")
    ap.add_argument("--windows", default=",".join(str(w) for w in SWEEP_WINDOWS),
                    help="--sweep: look-back windows (powers of two) tried with each look-back configuration")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="parallel warm-up processes")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--shapes", default=None, help="e.g. 8x2048x1024,1x8192x2048 (also replaces the sweep's shapes)")
    ap.add_argument("--timing", default="graph", choices=["graph", "eager"],
                    help="graph: GPU time per call from CUDA-graph replays (default); eager: do_bench")
    ap.add_argument("--configs", default=None,
                    help="--sweep: a JSON list of tuning dicts to sweep instead of the built-in list")
    ap.add_argument("--mode", default=None, choices=K._MODES,
                    help="force one kernel mode (hgru_triton.tuning['mode']) for the table")
    ap.add_argument("--smoke", action="store_true",
                    help="quick check: each kernel mode on two bench shapes, against each other, with times")
    ap.add_argument("--wait-for", default=None,
                    help="after the warm-up, wait (up to 150 s) for this file to exist before timing "
                         "(lets GPU tests run during the compilation phase without disturbing timings)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "bench_scan_sweep.log" if args.sweep else "bench_scan.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    global TIMING
    TIMING = args.timing
    meta = metadata()
    meta["timing"] = TIMING
    log(json.dumps(meta))
    if args.smoke:
        smoke(log)
        return
    if args.mode:
        K.tuning["mode"] = args.mode
        meta["forced_mode"] = args.mode
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    if args.sweep:
        kinds = ["ours_real", "ours_complex", "ours_fused_real", "ours_fused_complex"]
        windows = [int(w) for w in args.windows.split(",") if w.strip()]
        sweep_shapes = shapes if args.shapes else SWEEP_SHAPES
        configs = json.loads(args.configs) if args.configs else sweep_configs(windows)
        tasks = [(cfg, s, kinds) for cfg in configs for s in sweep_shapes]
        tasks += [(dict(mode="twopass", num_chunks=nc), s, kinds) for nc, s in SWEEP_CHUNKS]
        if args.jobs > 1:
            warm(tasks, args.jobs, log)
        _wait(args.wait_for, log)
        rows = []
        for cfg, s, names in tasks:
            K.tuning.update({k: None for k in K.tuning})
            K.tuning.update(cfg)
            log(f"config {cfg}")
            for r in run_table([s], set(names), args.rep, log):
                r["config"] = cfg
                rows.append(r)
        K.tuning.update({k: None for k in K.tuning})
        with open(os.path.join(args.out, "bench_scan_sweep.json"), "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)
        lines = ["| config | shape | op | fwd ms | fwd+bwd ms |", "|---|---|---|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['config']} | {tuple(r['shape'])} | {r['op']} | {r.get('fwd_ms', float('nan')):.4f} | "
                         f"{r.get('fwd_bwd_ms', float('nan')):.4f} |")
        lines += [""] + window_table(rows, windows)
        with open(os.path.join(args.out, "bench_scan_sweep.md"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        log("\n".join(window_table(rows, windows)))
        return

    if args.jobs > 1:
        warm([({}, s, None) for s in shapes], min(args.jobs, len(shapes)), log)
    _wait(args.wait_for, log)
    results = run_table(shapes, None, args.rep, log)
    rat = ratios(results, shapes)
    md = markdown(meta, results, rat, shapes)
    with open(os.path.join(args.out, "bench_scan.json"), "w") as fh:
        plans = {f"{s} complex={c} fused={fu} backward={bw}": K._plan(*s, c, torch.device("cuda"), fu, bw)
                 for s in shapes for c in (False, True) for fu in (False, True) for bw in (False, True)}
        json.dump(dict(meta=meta, results=results, ratios=rat, plans=plans), fh, indent=1)
    with open(os.path.join(args.out, "bench_scan.md"), "w") as fh:
        fh.write(md)
    log(md)


if __name__ == "__main__":
    main()
