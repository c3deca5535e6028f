"""Compile the Triton kernels for sm_90 (Hopper) without a GPU, one specialisation per line.

The CPU tests run the kernels through the Triton interpreter, which executes the Python code and does
not type-check it the way the compiler does: a loop-carried variable whose shape changes inside the
loop, for one, runs in the interpreter and only fails to compile on the GPU (see
test_sm90_compile.py). This script compiles a list of constexpr combinations of every kernel through
Triton's real compiler (front end to PTX and ptxas) for an sm_90 target, which needs no GPU.

Run it without TRITON_INTERPRET (the interpreter replaces ``triton.jit`` functions):
``python -m tests.kernels.sm90_compile`` prints ``OK name`` or ``FAIL name: error`` per line and exits 1
if any failed.

``--match TEXT`` keeps the specialisations whose label contains TEXT; ``--resources`` adds, per kernel,
what decides its occupancy and size on sm_90: registers per thread, local memory (spills), shared
memory and the static SASS instruction count (from the cubin, with cuobjdump and nvdisasm of Triton's
own CUDA tools). A quick check of a kernel change without a GPU (the figures match the GPU build: same
compiler, same target). The pointer arguments carry the ``tt.divisibility`` 16 attribute the JIT gives
them; without it loads stay scalar and the pipeliner does nothing, so the figures would be wrong.
"""
from __future__ import annotations

import itertools
import os
import sys

# runtime scalars of the kernels (int32) per module (names differ: H is a pointer in the HGRU kernels
# and the head count in the HGRN2 ones), float scalars, and the pointers that are not bf16
_INTS = {
    "hgru_triton": {"sxb", "sxt", "sab", "sat", "s0b", "s0d", "s0c", "sgb", "sgt", "stb", "std", "stc", "B", "T", "D",
                    "NC", "CL", "bd_rt"},
    "hgrn2": {"T", "H", "NT", "BH", "CAP"},
}
_FLOATS = {"gamma_val"}
_PTR_TYPES = {"LBUF": "*i64", "STATE": "*i32", "redo": "*i32"}
_FP32_PTRS = {"AGG_M", "AGG_S", "THETA", "GAMMA", "DTHETA_P", "DGAMMA_P", "ht", "h0", "dht", "dh0", "D", "LB",
              "s0", "sT"}  # (xt of the "pre" state kernels is in the dot dtype: bf16 here)


def _grid(**axes):
    """Every combination of the given constexpr values, as dicts."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def specialisations():
    """(label, kernel, constexprs, num_warps) for every kernel (A and dA are bf16 pointers with LOWP, else fp32): its flags both ways, in a few
    combinations each (not the full product), at block sizes the GPU configurations use."""
    from hgrn_fairseq.kernels import hgrn2_chunk_kernels as c2
    from hgrn_fairseq.kernels import hgrn2_packed_kernels as p2
    from hgrn_fairseq.kernels import hgrn2_recurrent_kernels as r2
    from hgrn_fairseq.kernels import hgrn2_state_kernels as s2
    from hgrn_fairseq.kernels import hgru_triton as h1

    out = []
    common = dict(sxt=1024, sat=1024, sgt=1024, DW=1024, GAMMA_MODE=2, PRECISE=True, BT=16, BD=32, NCP=8, LBW=1,
                  VEC=1, STAGES=2)
    # (complex, fused, reverse, flags): each value of each with each of the others at least once
    combos = [(False, False, False, False), (False, False, True, True), (False, True, False, True),
              (False, True, True, False), (True, False, False, True), (True, True, False, False),
              (True, True, True, True)]
    for cplx, fused, rev, flags in combos:
        base = dict(common, COMPLEX=cplx, FUSED=fused, REVERSE=rev, HAS_H0=flags, HAS_DH=flags, HAS_DHT=flags,
                    NEED_DGAMMA=fused and flags, NEED_DTHETA=cplx and flags, NEED_DH0=flags,
                    NEED_A_T=fused or cplx, PREFETCH=flags, FOLD=not flags, AGG_REV=flags, PUBLISH_INC=flags,
                    GAMMA_MODE=2 if flags else 0)
        tag = f"complex={cplx} fused={fused} reverse={rev} flags={flags}"
        for mode in (1, 2):
            out.append((f"hgru fwd mode {mode} {tag}", h1._hgru_fwd_kernel, dict(base, MODE=mode), 1))
            out.append((f"hgru bwd mode {mode} {tag}", h1._hgru_bwd_kernel, dict(base, MODE=mode), 1))
        out.append((f"hgru fwd look-back {tag}", h1._hgru_fwd_lb_kernel, base, 1))
        out.append((f"hgru bwd look-back {tag}", h1._hgru_bwd_lb_kernel, base, 1))
        out.append((f"hgru fwd chunklb {tag}", h1._hgru_fwd_lbc_kernel, dict(base, BD=64, VEC=2 if flags else 1), 2))
        if not cplx:
            out.append((f"hgru block fwd {tag}", h1._hgru_block_fwd_kernel,
                        dict(base, R=8, NW=16, BD=64, STAGES=3, VEC=8 if flags else 1), 4))
            out.append((f"hgru stream fwd {tag}", h1._hgru_stream_fwd_kernel, dict(base, BD=64), 4))
            out.append((f"hgru stream bwd {tag}", h1._hgru_stream_bwd_kernel, dict(base, BD=64), 4))

    h2 = dict(K=128, V=128, BT=64, BC=16, BV=128, SAFE=60.0, CSAFE=60.0, EMU=False)
    for rev, flags in ((False, True), (True, False)):
        tag = f"reverse={rev} flags={flags}"
        for bk, warps in ((64, 4), (32, 4)):
            st = dict(h2, BK=bk, REVERSE=rev, PREFETCH=flags, HAS_H0=flags, STORE_HT=flags, HAS_DHT=flags,
                      STORE_DH0=flags)
            out.append((f"hgrn2 fwd_states BK={bk} {tag}", c2.hgrn2_fwd_states_kernel, dict(st, BV=64), warps))
            out.append((f"hgrn2 bwd_dstates BK={bk} {tag}", c2.hgrn2_bwd_dstates_kernel, dict(st, BV=64), warps))
        for lowp, (fast, redo) in itertools.product((False, True), ((False, False), (True, False), (False, True))):
            t = f"{tag} LOWP={lowp} FAST_ONLY={fast} REDO={redo}"
            out.append((f"hgrn2 fwd_output {t}", c2.hgrn2_fwd_output_kernel,
                        dict(h2, BK=32, REVERSE=rev, STORE_A=flags, PREFETCH=flags and not redo, LOWP=lowp,
                             FAST_ONLY=fast, REDO=redo), 8))
            out.append((f"hgrn2 bwd_dqdg {t}", c2.hgrn2_bwd_dqdg_kernel,
                        dict(h2, BK=32, REVERSE=rev, LOWP=lowp, FAST_ONLY=fast, REDO=redo), 8))
        out.append((f"hgrn2 bwd_dv {tag}", c2.hgrn2_bwd_dv_kernel, dict(h2, BK=128, REVERSE=rev, LOWP=flags), 8))
        # the image models' head 64 with its BK 64 / 4-warp configs, ACCUM (the reverse direction adding into
        # the forward one's tensors) with flags. `--match "K=64" --resources [--maxnreg N]`: their registers
        h64 = dict(h2, K=64, V=64, BV=64, REVERSE=rev, LOWP=True, FAST_ONLY=False, REDO=False, ACCUM=flags)
        t64 = f"K=64 ACCUM={flags} reverse={rev}"
        out.append((f"hgrn2 fwd_output {t64}", c2.hgrn2_fwd_output_kernel,
                    dict(h64, BK=64, STORE_A=True, PREFETCH=False), 4))
        out.append((f"hgrn2 bwd_dqdg {t64}", c2.hgrn2_bwd_dqdg_kernel, dict(h64, BK=64), 4))
        out.append((f"hgrn2 bwd_dv {t64}", c2.hgrn2_bwd_dv_kernel, dict(h64, BK=64), 8))
        if not rev:  # the same with chunks of 32 steps (hgrn2_triton.chunk_size's choice at head 64 on short scans)
            h32, t32 = dict(h64, BT=32, BC=8), f"K=64 BT=32 ACCUM={flags} reverse={rev}"
            out.append((f"hgrn2 fwd_output {t32}", c2.hgrn2_fwd_output_kernel,
                        dict(h32, BK=64, STORE_A=True, PREFETCH=False), 4))
            out.append((f"hgrn2 bwd_dqdg {t32}", c2.hgrn2_bwd_dqdg_kernel, dict(h32, BK=64), 4))
            out.append((f"hgrn2 bwd_dv {t32}", c2.hgrn2_bwd_dv_kernel, dict(h32, BK=64), 8))
        out.append((f"hgrn2 chunk_outer {tag}", s2.hgrn2_chunk_outer_kernel,
                    dict(h2, BK=64, BV=64, REVERSE=rev, KEYS=flags, DOT_BF16=flags), 4))
        out.append((f"hgrn2 chunk_decay {tag}", s2.hgrn2_chunk_decay_kernel, dict(h2, BK=64, REVERSE=rev, KEYS=flags), 4))
        out.append((f"hgrn2 state_pass {tag}", s2.hgrn2_state_pass_kernel,
                    dict(h2, BK=64, BV=64, REVERSE=rev, BACKWARD=flags, HAS_S0=flags, STORE_ST=not flags,
                         PREFETCH=flags), 4))
        out.append((f"hgrn2 state_scan {tag}", s2.hgrn2_state_scan_kernel,
                    dict(h2, BK=64, BV=64, BACKWARD=flags, HAS_S0=flags, STORE_ST=flags), 4))
        rec = dict(K=128, V=128, BK=128, BV=32, REVERSE=rev, HAS_H0=flags, HAS_DHT=flags, STORE_DH0=flags)
        out.append((f"hgrn2 rec_fwd {tag}", r2.hgrn2_rec_fwd_kernel, rec, 4))
        out.append((f"hgrn2 rec_dq {tag}", r2.hgrn2_rec_dq_kernel, dict(rec, BK=32, BV=128), 4))
        out.append((f"hgrn2 rec_bwd {tag}", r2.hgrn2_rec_bwd_kernel, dict(rec, BV=128), 8))
        # packed: heads of 2 x 2 (the LRA 2-D models, 64 per program) and of 3 x 5 (masked, 16 per program)
        for K, V, BH, BK, BV, warps in ((2, 2, 64, 2, 2, 2), (3, 5, 16, 4, 8, 4)):
            pk = dict(K=K, V=V, BH=BH, BK=BK, BV=BV, REVERSE=rev, HAS_H0=flags, HAS_DHT=flags, STORE_DH0=flags)
            t = f"{tag} K={K} V={V}"
            out.append((f"hgrn2 packed_fwd {t}", p2.hgrn2_packed_fwd_kernel, pk, warps))
            out.append((f"hgrn2 packed_dq {t}", p2.hgrn2_packed_dq_kernel, pk, warps))
            out.append((f"hgrn2 packed_bwd {t}", p2.hgrn2_packed_bwd_kernel, pk, warps))
    return out


def compile_sm90(fn, constexprs, num_warps, maxnreg=None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = fn.fn.__module__.rsplit(".", 2)[-2]  # (the HGRU kernels live in kernels/hgru/)
    ints = _INTS["hgru_triton" if module == "hgru" else "hgrn2"]
    fp32 = _FP32_PTRS | ({"A", "dA"} if not constexprs.get("LOWP", True) else set())
    signature, constants = {}, {}
    for p in fn.params:
        name = p.name
        if p.is_constexpr:
            signature[name] = "constexpr"
            # (a constexpr with a default, e.g. ACCUM, takes it unless the specialisation names it)
            constants[(fn.arg_names.index(name),)] = constexprs[name] if name in constexprs or not p.has_default \
                else p.default
        elif name in ints:
            signature[name] = "i32"
        elif name in _FLOATS:
            signature[name] = "fp32"
        else:
            signature[name] = _PTR_TYPES.get(name, "*fp32" if name in fp32 else "*bf16")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items() if t.startswith("*")}
    return triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, **({"maxnreg": maxnreg} if maxnreg else {})))


def resources(kernel) -> str:
    """Registers, local memory (spills), shared memory and SASS instruction count of a compiled kernel."""
    import re
    import subprocess
    import tempfile

    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True).stdout
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
    reg = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    instrs = sum(1 for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]+\*/\s+\S", line))
    return (f"registers {reg.group(1) if reg else '?'}, local {local.group(1) if local else '?'} B, "
            f"shared {kernel.metadata.shared} B, {instrs} instructions")


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--match", default="", help="only specialisations whose label contains this text")
    ap.add_argument("--resources", action="store_true", help="print registers, spills, shared memory, SASS size")
    ap.add_argument("--warps", type=int, default=0, help="compile with this many warps instead of each's own")
    ap.add_argument("--maxnreg", type=int, default=0, help="cap the registers a thread (ptxas maxnreg)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("FAIL setup: TRITON_INTERPRET=1 is set; run without it")
        return 1
    failed = 0
    specs = [spec for spec in specialisations() if args.match in spec[0]]
    for label, fn, constexprs, warps in specs:
        try:
            kernel = compile_sm90(fn, constexprs, args.warps or warps, args.maxnreg or None)
            print(f"OK {label}" + (f": {resources(kernel)}" if args.resources else ""), flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, with its message
            failed += 1
            root = e
            while root.__cause__ is not None:  # the innermost error says what is wrong
                root = root.__cause__
            where = " | ".join(str(e).strip().splitlines()[-3:])[-300:]
            print(f"FAIL {label}: {type(root).__name__}: {str(root).strip()[-400:]} (at: {where})".replace("\n", " | "),
                  flush=True)
    print(f"compiled {len(specs) - failed} of {len(specs)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
