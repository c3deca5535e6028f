"""HGRN2 recurrence on the GPU: our Triton kernels against fla's GLA kernels and causal SDPA.

One run, one GPU, bf16, scale 1, (B, T, H, K=V) in ``SHAPES``:

* ours: ``hgrn2_fused(q, v, log_decay)`` (k = 1 - exp(log_decay) derived inside the kernels);
* fla ``chunk_gla(q, k, v, g, scale=1)`` and ``fused_recurrent_gla`` with ``k = 1 - exp(g)`` computed by
  PyTorch inside the timed region (what an HGRN2 layer on fla has to do);
* ``F.scaled_dot_product_attention(..., is_causal=True)`` with the same B, T, H and head dim;
* decoding: one ``hgrn2_step`` with the state after a 1K and a 16K-token prefill (against an SDPA
  decoding step over a KV cache of the same length, for contrast).

Times are GPU ms per call from CUDA-graph replays with the L2 flushed (``graph_timing.py``; ``--timing
eager``: medians of ``triton.testing.do_bench``); fwd runs under no_grad, fwd+bwd takes the gradients of
q, v and the log-decay. Every kernel is run once before timing (Triton autotuning).
Results go to ``<out>/bench_hgrn2.json`` and ``<out>/bench_hgrn2.md`` (printed as they come).

    python -m bench.bench_hgrn2 --out results/            # everything
    python -m bench.bench_hgrn2 --warm-peers-only         # only run fla once per shape (autotune)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from bench import graph_timing

import triton  # noqa: E402

from hgrn_fairseq.kernels import hgrn2_triton
from hgrn_fairseq.kernels import hgrn2_scan_reference
from hgrn_fairseq.kernels.hgrn2_triton import hgrn2_fused, hgrn2_step

SHAPES = [(8, 2048, 8, 128), (8, 4096, 8, 128), (16, 1024, 8, 128), (2, 16384, 8, 128)]
DTYPE = torch.bfloat16

try:
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    import fla

    FLA_VERSION = getattr(fla, "__version__", "?")
except Exception as exc:  # noqa: BLE001
    chunk_gla = fused_recurrent_gla = None
    FLA_VERSION = f"unavailable ({exc.__class__.__name__}: {exc})"


def log(*args):
    print(*args, flush=True)


TIMING = "graph"  # --timing: see graph_timing.py


def timed(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def inputs(B, T, H, K, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, H, K, device="cuda", generator=gen).to(DTYPE)
    v = torch.randn(B, T, H, K, device="cuda", generator=gen).to(DTYPE)
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen)).to(DTYPE)
    do = torch.randn(B, T, H, K, device="cuda", generator=gen).to(DTYPE)
    return q, v, g, do


def with_settings(fn, **settings):
    """Run fn with module settings of hgrn2_triton changed, e.g. STATE_IMPL ('auto', 'split' or 'fused')
    or INTRA_DOT ('input' or 'fp32')."""
    def run():
        saved = {name: getattr(hgrn2_triton, name) for name in settings}
        for name, value in settings.items():
            setattr(hgrn2_triton, name, value)
        try:
            return fn()
        finally:
            for name, value in saved.items():
                setattr(hgrn2_triton, name, value)

    return run


def with_state_impl(impl, fn):
    return with_settings(fn, STATE_IMPL=impl)


def ours(q, v, g, do, bwd):
    if not bwd:
        def run_fwd():
            with torch.no_grad():
                return hgrn2_fused(q, v, g)[0]

        return run_fwd
    leaves = [x.detach().requires_grad_() for x in (q, v, g)]

    def run():
        o, _ = hgrn2_fused(*leaves)
        return torch.autograd.grad(o, leaves, do)

    return run


def fla_fn(fn, q, v, g, do, bwd):
    if not bwd:
        def run():
            with torch.no_grad():
                return fn(q, -torch.expm1(g), v, g, scale=1.0)[0]

        return run
    leaves = [x.detach().requires_grad_() for x in (q, v, g)]

    def run_bwd():
        qq, vv, gg = leaves
        o, _ = fn(qq, -torch.expm1(gg), vv, gg, scale=1.0)
        return torch.autograd.grad(o, leaves, do)

    return run_bwd


def fla_recurrent(q, k, v, g, scale):
    return fused_recurrent_gla(q, k, v, gk=g, scale=scale)


def sdpa(B, T, H, K, bwd):
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(B, H, T, K, device="cuda", generator=gen).to(DTYPE) for _ in range(4))
    if not bwd:
        def run():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return run
    leaves = [x.requires_grad_() for x in (q, k, v)]

    def run_bwd():
        o = F.scaled_dot_product_attention(*leaves, is_causal=True)
        return torch.autograd.grad(o, leaves, do)

    return run_bwd


def rel(a, b):
    """Norm-relative difference ||a - b|| / ||b||, in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Recorder:
    def __init__(self, out):
        self.out, self.rows = out, []
        self.meta = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "fla": FLA_VERSION,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "dtype": str(DTYPE),
        }

    def add(self, **row):
        self.rows.append(row)
        log(json.dumps(row))
        self.dump()

    def dump(self):
        if self.out:
            with open(os.path.join(self.out, "bench_hgrn2.json"), "w") as f:
                json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)


def find(rows, **kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r["ms"]
    return None


def markdown(rec):
    m = rec.meta
    lines = [
        f"HGRN2 recurrence, {m['dtype']}, K = V = head dim, scale 1. {m['gpu']}, torch {m['torch']}, "
        f"triton {m['triton']}, fla {m['fla']}, {m['date']}. "
        + ("Shape rows: GPU ms per call from CUDA-graph replays, L2 flushed before each call "
           "(bench/graph_timing.py; rows timed eagerly say so in the JSON); decoding rows: do_bench medians."
           if m.get("timing") == "graph" else "Median ms (triton.testing.do_bench)."),
        "",
        "| B, T, H, K | ours fwd | fla chunk_gla fwd | fla fused_recurrent fwd | SDPA causal fwd | ours fwd+bwd "
        "| fla chunk_gla fwd+bwd | fla fused_recurrent fwd+bwd | SDPA fwd+bwd | fwd+bwd speed-up vs chunk_gla "
        "(target >= 1.5) | SDPA fwd / ours fwd (target > 1 at T >= 4096) |",
        "|---" * 11 + "|",
    ]

    def fmt(x):
        return "-" if x is None else f"{x:.3f}"

    for shape in SHAPES:
        s = "x".join(map(str, shape))
        get = lambda impl, mode: find(rec.rows, shape=s, impl=impl, mode=mode)  # noqa: E731
        of, ob = get("ours", "fwd"), get("ours", "fwd+bwd")
        cf, cb = get("fla_chunk_gla", "fwd"), get("fla_chunk_gla", "fwd+bwd")
        rf, rb = get("fla_fused_recurrent_gla", "fwd"), get("fla_fused_recurrent_gla", "fwd+bwd")
        sf, sb = get("sdpa_causal", "fwd"), get("sdpa_causal", "fwd+bwd")
        speed = "-" if not (ob and cb) else f"{cb / ob:.2f}x"
        vs_sdpa = "-" if not (of and sf) else f"{sf / of:.2f}x"
        lines.append(
            f"| {', '.join(map(str, shape))} | {fmt(of)} | {fmt(cf)} | {fmt(rf)} | {fmt(sf)} | {fmt(ob)} | "
            f"{fmt(cb)} | {fmt(rb)} | {fmt(sb)} | {speed} | {vs_sdpa} |"
        )
    lines += ["", "Our chunk-state pass (the table above uses STATE_IMPL='auto'): split (chunk-parallel products, "
              "then a multiply-add scan), fused (one sequential kernel with the products inside its loop) and pre "
              "(the products' decay-dependent operands chunk-parallel, then a sequential kernel with the products), ms:",
              "", "| B, T, H, K | split fwd | fused fwd | pre fwd | split fwd+bwd | fused fwd+bwd | pre fwd+bwd |",
              "|---|---|---|---|---|---|---|"]
    for shape in SHAPES:
        s = "x".join(map(str, shape))
        get = lambda impl, mode: find(rec.rows, shape=s, impl=impl, mode=mode)  # noqa: E731
        lines.append(f"| {', '.join(map(str, shape))} | {fmt(get('ours_split_states', 'fwd'))} | "
                     f"{fmt(get('ours_fused_states', 'fwd'))} | {fmt(get('ours_pre_states', 'fwd'))} | "
                     f"{fmt(get('ours_split_states', 'fwd+bwd'))} | {fmt(get('ours_fused_states', 'fwd+bwd'))} | "
                     f"{fmt(get('ours_pre_states', 'fwd+bwd'))} |")
    lines += ["", "Operands of the intra-chunk products (A and the two dA products) and the storage of A and dA "
              "(INTRA_DOT; the first table uses 'input', i.e. bf16 here), ms:", "",
              "| B, T, H, K | bf16 fwd | fp32 (tf32) fwd | bf16 fwd+bwd | fp32 (tf32) fwd+bwd |", "|---|---|---|---|---|"]
    for shape in SHAPES:
        s = "x".join(map(str, shape))
        get = lambda impl, mode: find(rec.rows, shape=s, impl=impl, mode=mode)  # noqa: E731
        lines.append(f"| {', '.join(map(str, shape))} | {fmt(get('ours', 'fwd'))} | {fmt(get('ours_intra_fp32', 'fwd'))} | "
                     f"{fmt(get('ours', 'fwd+bwd'))} | {fmt(get('ours_intra_fp32', 'fwd+bwd'))} |")
    prof = [r for r in rec.rows if r.get("mode") == "profile fwd+bwd"]
    if prof:
        lines += ["", "GPU time per kernel, one fwd+bwd at " + prof[0]["shape"] + " (torch.profiler), ms:", ""]
        for r in prof:
            top = ", ".join(f"{k.split('(')[0][:48]} {v:.3f}" for k, v in list(r["kernels"].items())[:8])
            lines.append(f"* {r['impl']}: total {r['ms']:.3f}: {top}")
    acc = [r for r in rec.rows if r.get("mode") == "accuracy vs float64"]
    if acc:
        names = list(acc[0]["errors"])
        lines += ["", f"Accuracy against the float64 reference on the GPU ({acc[0]['shape']}, bf16 inputs, "
                  f"norm-relative errors; tolerance {ACCURACY_TOL:g} as in the tests), per chunk-state implementation:",
                  "", "| decay scale | impl | " + " | ".join(names) + " | over tolerance |",
                  "|---" * (len(names) + 3) + "|"]
        for r in acc:
            lines.append(f"| {r['decay_scale']:g} | {r['impl']} | " + " | ".join(f"{r['errors'][n]:.1e}" for n in names)
                         + f" | {', '.join(r['over_tolerance']) or 'none'} |")
    dec = [r for r in rec.rows if r.get("mode") == "decode"]
    if dec:
        lines += ["", "Decoding, one token (B 8, H 8, K = V = 128), ms per step:", "",
                  "| context | hgrn2_step | hgrn2_step, CUDA graph | SDPA over a KV cache |", "|---|---|---|---|"]
        for ctx in sorted({r["context"] for r in dec}):
            g = lambda impl: next((r["ms"] for r in dec if r["context"] == ctx and r["impl"] == impl), None)  # noqa: E731
            lines.append(f"| {ctx} | {fmt(g('hgrn2_step'))} | {fmt(g('hgrn2_step_graph'))} | {fmt(g('sdpa_decode'))} |")
    return "\n".join(lines) + "\n"


def warm_peers():
    for shape in SHAPES:
        q, v, g, do = inputs(*shape)
        for fn in (chunk_gla, fla_recurrent):
            for bwd in (False, True):
                t = time.time()
                fla_fn(fn, q, v, g, do, bwd)()
                torch.cuda.synchronize()
                log(f"warm {fn.__name__} {shape} bwd={bwd}: {time.time() - t:.1f}s")
        del q, v, g, do
        torch.cuda.empty_cache()


def bench_shapes(rec, peers):
    for shape in SHAPES:
        s = "x".join(map(str, shape))
        q, v, g, do = inputs(*shape)
        with torch.no_grad():
            o = hgrn2_fused(q, v, g)[0]
            if peers and chunk_gla is not None:
                ref = chunk_gla(q, -torch.expm1(g), v, g, scale=1.0)[0]
                log(f"{s}: ours vs fla chunk_gla output, relative difference {rel(o, ref):.2e}")
        candidates = [
            ("ours", lambda bwd: with_state_impl("auto", ours(q, v, g, do, bwd))),
            ("ours_split_states", lambda bwd: with_state_impl("split", ours(q, v, g, do, bwd))),
            ("ours_fused_states", lambda bwd: with_state_impl("fused", ours(q, v, g, do, bwd))),
            ("ours_intra_fp32", lambda bwd: with_settings(ours(q, v, g, do, bwd), STATE_IMPL="auto",
                                                          INTRA_DOT="fp32")),
            ("ours_pre_states", lambda bwd: with_state_impl("pre", ours(q, v, g, do, bwd))),
        ]
        if peers and chunk_gla is not None:
            candidates += [
                ("fla_chunk_gla", lambda bwd: fla_fn(chunk_gla, q, v, g, do, bwd)),
                ("fla_fused_recurrent_gla", lambda bwd: fla_fn(fla_recurrent, q, v, g, do, bwd)),
            ]
        candidates.append(("sdpa_causal", lambda bwd: sdpa(*shape, bwd)))
        for impl, make in candidates:
            for bwd in (False, True):
                fn = make(bwd)
                t = time.time()
                fn()  # compile / autotune outside the timing
                torch.cuda.synchronize()
                warm_s = time.time() - t
                ms, how = graph_timing.timeit(fn, None, 100 if impl != "fla_fused_recurrent_gla" else 50, TIMING, log)
                rec.add(shape=s, impl=impl, mode="fwd+bwd" if bwd else "fwd", ms=ms, timing=how,
                        warm_s=round(warm_s, 1))
        del q, v, g, do
        torch.cuda.empty_cache()


def bench_decode(rec):
    B, H, K = 8, 8, 128
    for ctx in (1024, 16384):
        q, v, g, _ = inputs(B, ctx, H, K, seed=ctx)
        with torch.no_grad():
            _, state = hgrn2_fused(q, v, g)
            q1, v1, g1 = q[:, -1].contiguous(), v[:, -1].contiguous(), g[:, -1].contiguous()
            step = lambda: hgrn2_step(q1, v1, g1, state)  # noqa: E731
            step()
            rec.add(impl="hgrn2_step", mode="decode", context=ctx, ms=timed(step))
            # 32 chained steps captured in a CUDA graph: launch overhead out, per-step time
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                st = state.clone()
                for _ in range(3):
                    hgrn2_step(q1, v1, g1, st)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                st2 = state.clone()
                for _ in range(32):
                    _, st2 = hgrn2_step(q1, v1, g1, st2)
            graph.replay()
            rec.add(impl="hgrn2_step_graph", mode="decode", context=ctx, ms=timed(graph.replay) / 32)
            kq = torch.randn(B, H, 1, K, device="cuda", dtype=DTYPE)
            kk = torch.randn(B, H, ctx, K, device="cuda", dtype=DTYPE)
            kv = torch.randn(B, H, ctx, K, device="cuda", dtype=DTYPE)
            attn = lambda: F.scaled_dot_product_attention(kq, kk, kv)  # noqa: E731
            attn()
            rec.add(impl="sdpa_decode", mode="decode", context=ctx, ms=timed(attn))
        del q, v, g
        torch.cuda.empty_cache()


def profile_breakdown(rec, shape=(8, 2048, 8, 128)):
    """Per-kernel CUDA time of one fwd+bwd (ours and fla), through torch.profiler."""
    q, v, g, do = inputs(*shape)
    runs = [("ours", ours(q, v, g, do, True)),
            ("ours_pre_states", with_state_impl("pre", ours(q, v, g, do, True)))]
    if chunk_gla is not None:
        runs.append(("fla_chunk_gla", fla_fn(chunk_gla, q, v, g, do, True)))
    for name, fn in runs:
        fn()
        torch.cuda.synchronize()
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            table = {}
            for evt in prof.key_averages():
                t = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
                if t > 0:
                    table[evt.key] = round(t / 10 / 1000, 4)  # ms per fwd+bwd
            top = dict(sorted(table.items(), key=lambda kv: -kv[1])[:14])
            rec.add(impl=name, mode="profile fwd+bwd", shape="x".join(map(str, shape)), ms=sum(table.values()),
                    kernels=top)
        except Exception as exc:  # noqa: BLE001
            log(f"profiler failed for {name}: {exc}")


ACCURACY_TOL = 2e-2  # the bf16 tolerance of tests/kernels/test_hgrn2_triton.py


def check_accuracy(rec, K=128, T=1000, H=2, device="cuda"):
    """The kernels the timed rows ran (bf16, K = V = 128, every chunk-state implementation) against the
    float64 reference of the equations (hgrn_fairseq.kernels.hgrn2_scan_reference, on the GPU): output,
    final state and the gradients of q, v and the log-decay under a loss that also reads the final
    state. T = 1000 ends in a partial chunk; decay scale 30 makes most chunks too steep for the one-
    reference path, so the second (redo) launches of the output and dq/dg kernels do real work. A
    check, not a test: it prints and records the errors and flags those over ACCURACY_TOL."""
    gen = torch.Generator(device=device).manual_seed(7)
    for scale in (1.0, 30.0):
        q = torch.randn(1, T, H, K, device=device, generator=gen).to(DTYPE)
        v = torch.randn(1, T, H, K, device=device, generator=gen).to(DTYPE)
        g = (F.logsigmoid(2 * torch.randn(1, T, H, K, device=device, generator=gen) + 1) * scale).to(DTYPE)
        wo = torch.randn(1, T, H, K, device=device, generator=gen, dtype=torch.float64)
        ws = torch.randn(1, H, K, K, device=device, generator=gen, dtype=torch.float64)
        ref = [x.double().requires_grad_() for x in (q, v, g)]  # (of the bf16 inputs the kernels see)
        ro, rs = hgrn2_scan_reference(*ref, None, False)
        ((ro * wo).sum() + (rs * ws).sum()).backward()
        for impl in ("auto", "split", "fused", "pre"):
            leaves = [x.detach().clone().requires_grad_() for x in (q, v, g)]
            o, st = with_state_impl(impl, lambda: hgrn2_fused(*leaves))()
            ((o.double() * wo).sum() + (st.double() * ws).sum()).backward()
            errs = {"o": rel(o, ro), "state": rel(st, rs)}
            errs.update({f"d{n}": rel(x.grad, r.grad) for n, x, r in zip(("q", "v", "log_decay"), leaves, ref)})
            bad = sorted(n for n, e in errs.items() if not e < ACCURACY_TOL)
            rec.add(impl=f"ours_{impl}", mode="accuracy vs float64", decay_scale=scale, shape=f"1x{T}x{H}x{K}",
                    errors={n: float(f"{e:.2e}") for n, e in errs.items()}, over_tolerance=bad)


def tuned_configs():
    out = {}
    for name in ("_chunk_outer", "_state_scan", "_fwd_states", "_fwd_output", "_bwd_dstates", "_bwd_dv", "_bwd_dqdg",
                 "_chunk_decay", "_state_pass"):
        tuner = getattr(hgrn2_triton, name)
        out[name] = {str(k): str(c) for k, c in getattr(tuner, "cache", {}).items()}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "results"), help="folder for the JSON and markdown")
    ap.add_argument("--warm-peers-only", action="store_true", help="only run the fla kernels once per shape")
    ap.add_argument("--no-peers", action="store_true", help="skip fla")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: shapes,accuracy,decode,profile")
    ap.add_argument("--timing", default="graph", choices=["graph", "eager"],
                    help="shape rows: graph = GPU time per call from CUDA-graph replays (default); eager = do_bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_hgrn2.py needs a CUDA GPU")
    if args.warm_peers_only:
        if chunk_gla is None:
            sys.exit(f"fla is {FLA_VERSION}")
        warm_peers()
        return
    os.makedirs(args.out, exist_ok=True)
    global TIMING
    TIMING = args.timing
    rec = Recorder(args.out)
    rec.meta["timing"] = TIMING
    log(json.dumps(rec.meta))
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.time()
    if "shapes" not in skip:
        bench_shapes(rec, peers=not args.no_peers)
    if "accuracy" not in skip:
        check_accuracy(rec)
    if "decode" not in skip:
        bench_decode(rec)
    if "profile" not in skip:
        profile_breakdown(rec)
    rec.meta["our_autotuned_configs"] = tuned_configs()
    rec.meta["bench_seconds"] = round(time.time() - t0, 1)
    rec.dump()
    md = markdown(rec)
    with open(os.path.join(args.out, "bench_hgrn2.md"), "w") as f:
        f.write(md)
    log(md)


if __name__ == "__main__":
    main()
