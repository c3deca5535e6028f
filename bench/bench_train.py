#!/usr/bin/env python3
"""Training throughput and memory of the WikiText-103-sized language models, ours and peers, in one run.

    python3 -m bench.bench_train --out $OUT                          # the GPU run (about 5 minutes)
    python3 -m bench.bench_train --out /tmp/bt --quick               # smoke test: tiny shapes
    python3 -m bench.bench_train --out /tmp/bt --quick --device cpu  # CPU smoke test, tiny models

Models (6 layers, d 512, vocab 50264, tied embeddings):

* ``hgrn_lm_base``, ``hgrn2_lm_base``: ours, built through fairseq's registry exactly as
  ``fairseq-train --arch ...`` builds them; on CUDA they use our Triton kernels (``--kernel-backend``).
* ``transformer_lm``: fairseq's, at the papers' baseline size (FFN 2048, 8 heads, pre-norm, sinusoidal
  positions): the model of ``scripts/train_wt103.sh transformer_lm_wt103_small``.
* ``fla_hgrn``, ``fla_hgrn2``: flash-linear-attention's ``HGRNForCausalLM`` / ``HGRN2ForCausalLM`` as
  outside peers, sized to match (HGRN: expand ratio 1, SwiGLU 1536, 46.2M; HGRN2: expand ratio 128,
  SwiGLU 1365, 44.6M). They need ``transformers``; when fla cannot be imported or built the row says why.

One training step = zero_grad, forward and loss under ``torch.autocast(bfloat16)`` (fp32 weights),
backward, ``torch.optim.Adam`` step (fused on CUDA), the same for every model. The loss is what each
model trains with: fairseq's ``cross_entropy`` criterion (fp32 log-softmax over the vocabulary) for the
fairseq models, fla's fused cross entropy for fla's. ``--loss fused`` (or ``--loss fairseq,fused`` for
both, rows labelled ``MODEL (fused CE)``) trains the fairseq models with our ``linear_cross_entropy``
criterion instead (output projection + cross entropy in chunks, no fp32 logits); the speed targets
still compare against ``transformer_lm`` with fairseq's ``cross_entropy``, and the markdown adds the
comparison with ``transformer_lm (fused CE)``. Steps are timed with ``triton.testing.do_bench``
(median) on CUDA after two untimed steps (compilation, autotuning), ``time.perf_counter`` on CPU.
Peak memory is ``torch.cuda.max_memory_allocated`` over one step, Adam state included.

Also measured for ours and the Transformer: training memory at batch 1 against T (does it grow
linearly?) and evaluation at L = 14336, batch 1 (fp32 as ``fairseq-eval-lm`` runs by default, and bf16
autocast), as the extrapolation evaluation does it.

Every model runs in its own subprocess with a time limit (a crash, an out-of-memory or a slow cold
autotune of one model does not take the others down); the whole run keeps within ``--budget-s``.
Writes ``bench_train.json`` (every number, the GPU, versions, date) and ``bench_train.md`` to ``--out``.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from bench import provenance

VOCAB = 50264
MODELS = ("hgrn_lm_base", "hgrn2_lm_base", "transformer_lm", "fla_hgrn", "fla_hgrn2")
OURS = ("hgrn_lm_base", "hgrn2_lm_base")
# ours with an option, measured when asked for: +compile = --compile-blocks (torch.compile of each block
# around our kernels), +graphs = --cuda-graphs (each training step's forward and backward replayed as
# CUDA graphs)
VARIANT_FLAGS = {"+compile": "--compile-blocks", "+graphs": "--cuda-graphs"}
VARIANTS = tuple(f"{m}{suffix}" for suffix in VARIANT_FLAGS for m in OURS)
# +block_ops: ours with modules.block.use_block_ops (the image models' fused element-wise kernels, which
# the LMs leave off: they make them slower, docs/wikitext103.md)
VARIANTS += tuple(f"{m}+block_ops" for m in OURS)
# the baselines' archs of hgrn_lm (hgrn_fairseq/models/baseline_archs.py): measured when asked for
BASELINES = {"lru_lm_base": "lru_lm_tiny", "lru_mml_lm_base": "lru_lm_tiny", "mlgru_lm_base": "mlgru_lm_tiny",
             "mlgru_mml_lm_base": "mlgru_lm_tiny"}
# and each with --cuda-graphs, the HGRN recipes' setting (the baselines' recipes train eagerly)
VARIANTS += tuple(f"{m}+graphs" for m in BASELINES)
# loss of the fairseq models: fairseq's cross_entropy criterion, or our linear_cross_entropy criterion
LOSSES = ("fairseq", "fused")
SHAPES = ((16, 512), (4, 2048), (1, 8192))
MEMORY_T = (1024, 2048, 4096, 8192, 16384)
EVAL_L = 14336
QUICK = {
    "cuda": {"shapes": ((2, 256), (1, 512)), "memory_t": (256, 512, 1024), "eval_l": 2048, "tiny": False},
    "cpu": {"shapes": ((2, 16), (1, 32)), "memory_t": (), "eval_l": 48, "tiny": True},
}
# Speed targets: tokens/s ratio of one model over another at a shape.
TARGETS = (
    ("hgrn_lm_base", "transformer_lm", (16, 512), 1.5),
    ("hgrn_lm_base", "transformer_lm", (1, 8192), 2.0),
    ("hgrn_lm_base", "fla_hgrn", (16, 512), 1.0),
    ("hgrn_lm_base", "fla_hgrn", (4, 2048), 1.0),
    ("hgrn_lm_base", "fla_hgrn", (1, 8192), 1.0),
    ("hgrn2_lm_base", "fla_hgrn2", (16, 512), 1.3),
    ("hgrn2_lm_base", "fla_hgrn2", (4, 2048), 1.3),
    ("hgrn2_lm_base", "fla_hgrn2", (1, 8192), 1.3),
)
GIB = 2.0**30


# ================================================================================================
# Worker: one model, every measurement; one JSON object per line in --record (and on stdout)
# ================================================================================================
class Recorder:
    def __init__(self, path):
        self.path = path

    def __call__(self, **record):
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        print("  " + json.dumps(record), flush=True)


def environment(torch, device):
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except Exception:
            return None

    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "fairseq": version("fairseq-fixed") or version("fairseq"),
        "fla": version("flash-linear-attention"),
        "fla_core": version("fla-core"),
        "transformers": version("transformers"),
        "device": device,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(props.total_memory / GIB, 1),
                   cuda=torch.version.cuda)
    else:
        env.update(gpu=None, cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    env["git"] = provenance.git_version(REPO)
    return env


def gpt2_sized_dictionary(size):
    from fairseq.data import Dictionary

    dictionary = Dictionary()  # 4 specials
    for i in range(size - len(dictionary)):
        dictionary.add_symbol(f"tok{i}")
    return dictionary


def fairseq_model_flags(name, tiny, kernel_backend):
    """Command-line flags of the model, as scripts/train_wt103.sh passes them (tiny: CPU smoke sizes)."""
    if name == "transformer_lm":
        size = ["--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
                "--decoder-attention-heads", "4"] if tiny else \
               ["--decoder-layers", "6", "--decoder-embed-dim", "512", "--decoder-ffn-embed-dim", "2048",
                "--decoder-attention-heads", "8"]
        # positions for the longest evaluation (sinusoidal: no parameters)
        return ["--arch", "transformer_lm", *size, "--decoder-normalize-before",
                "--share-decoder-input-output-embed", "--tokens-per-sample", str(EVAL_L + 2048)]
    flags = []
    name = name[: -len("+block_ops")] if name.endswith("+block_ops") else name  # switched on after the build
    for suffix, flag in VARIANT_FLAGS.items():
        if name.endswith(suffix):
            name, flags = name[: -len(suffix)], [flag]
    arch = {"hgrn_lm_base": "hgrn_lm_tiny", "hgrn2_lm_base": "hgrn2_lm_tiny", **BASELINES}[name] if tiny else name
    if tiny and name.endswith("_mml_lm_base"):
        flags.append("--ternary")
    return ["--arch", arch, "--kernel-backend", kernel_backend, *flags]


def label(name, loss):
    """Row label of a model trained with ``loss`` (fla's models always use their own loss)."""
    return name if loss == "fairseq" or name.startswith("fla_") else f"{name} (fused CE)"


def parse_shapes(text):
    """"16x512,1x8192" -> ((16, 512), (1, 8192))."""
    return tuple(tuple(int(v) for v in s.split("x")) for s in text.split(","))


def random_tokens(torch, vocab, device, batch, length):
    """(inputs, targets), each [batch, length] and contiguous, targets = inputs shifted by one."""
    text = torch.randint(4, vocab, (batch, length + 1), device=device)
    return text[:, :-1].contiguous(), text[:, 1:].contiguous()


def build_fairseq(name, tiny, kernel_backend, vocab, device, torch, loss="fairseq"):
    """Parse the flags with fairseq's own parser (ARCH_CONFIG_REGISTRY fills the arch's defaults) and
    build through the model class of the arch, with a dictionary of ``vocab`` entries. ``loss``:
    ``"fairseq"`` (``--criterion cross_entropy``) or ``"fused"`` (``--criterion linear_cross_entropy``)."""
    import types

    import hgrn_fairseq
    hgrn_fairseq.register()  # hgrn_lm and its archs
    from fairseq import options
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.models import build_model

    from hgrn_fairseq.criterions.linear_cross_entropy import LinearCrossEntropyCriterion

    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not one of {LOSSES}")

    argv = ["/unused-data-dir", "--task", "language_modeling", "--optimizer", "adam",
            *fairseq_model_flags(name, tiny, kernel_backend)]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    dictionary = gpt2_sized_dictionary(vocab)
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    # what fairseq-train's task.build_model(cfg.model) does: the arch's defaults, then the model class
    model = build_model(cfg.model, task).to(device)
    if name.endswith("+block_ops"):
        from hgrn_fairseq.modules.block import use_block_ops

        use_block_ops(model)
    criterion = (CrossEntropyCriterion if loss == "fairseq" else LinearCrossEntropyCriterion)(task, sentence_avg=False)

    def loss_fn(tokens):
        inputs, target = tokens
        sample = {"net_input": {"src_tokens": inputs}, "target": target, "ntokens": target.numel()}
        loss, _, _ = criterion(model, sample)
        return loss

    def eval_fn(tokens):  # what fairseq-eval-lm computes per block: log-probabilities of the targets
        inputs, target = tokens
        net_output = model(inputs)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        return lprobs.gather(-1, target.unsqueeze(-1)).sum()

    return model, loss_fn, eval_fn, {"arch": args.arch, "criterion": criterion.__class__.__name__}


def build_fla(name, tiny, vocab, device, torch):
    import fla  # noqa: F401
    from fla.models import HGRN2Config, HGRN2ForCausalLM, HGRNConfig, HGRNForCausalLM

    d, layers = (64, 2) if tiny else (512, 6)
    common = dict(hidden_size=d, num_hidden_layers=layers, vocab_size=vocab, tie_word_embeddings=True,
                  fuse_cross_entropy=True, use_cache=False)
    if name == "fla_hgrn":
        config = HGRNConfig(attn_mode="chunk", expand_ratio=1, **common)  # SwiGLU 1536 at d 512
        model = HGRNForCausalLM(config)
    else:
        config = HGRN2Config(attn_mode="chunk", expand_ratio=16 if tiny else 128,
                             intermediate_size=int(8 / 3 * d), **common)
        model = HGRN2ForCausalLM(config)
    model = model.to(device)

    def loss_fn(tokens):
        inputs, target = tokens
        # fla shifts the labels itself: give it the inputs, it predicts inputs[t + 1] from inputs[:t + 1]
        return model(input_ids=inputs, labels=inputs, use_cache=False).loss

    def eval_fn(tokens):
        inputs, target = tokens
        logits = model(input_ids=inputs, use_cache=False).logits
        return torch.log_softmax(logits.float(), -1).gather(-1, target.unsqueeze(-1)).sum()

    return model, loss_fn, eval_fn, {"fla_config": {k: getattr(config, k) for k in
                                                     ("hidden_size", "num_hidden_layers", "expand_ratio",
                                                      "intermediate_size", "hidden_ratio", "attn_mode")}}


class Timer:
    def __init__(self, torch, device, quick):
        self.torch, self.device, self.quick = torch, device, quick
        self.method = "perf_counter"
        if device == "cuda":
            try:
                from triton.testing import do_bench

                self.do_bench = do_bench
                self.method = "triton.testing.do_bench (median)"
            except Exception:
                self.do_bench = None
                self.method = "cuda events (median)"

    def __call__(self, fn):
        """Median milliseconds of ``fn``."""
        torch = self.torch
        if self.device == "cuda" and self.do_bench is not None:
            warmup, rep = (50, 200) if self.quick else (150, 1000)
            return float(self.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
        reps = 2 if self.quick else 10
        times = []
        for _ in range(reps):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
        return sorted(times)[len(times) // 2]


def run_worker(args):
    import torch

    device = args.device
    plan = QUICK[device] if args.quick else {"shapes": SHAPES, "memory_t": MEMORY_T, "eval_l": EVAL_L,
                                             "tiny": False}
    if args.shapes:
        plan["shapes"] = parse_shapes(args.shapes)
    tiny = plan["tiny"]
    vocab = args.vocab or (1000 if tiny else VOCAB)
    record = Recorder(args.record)
    name = label(args.worker, args.loss)  # the row of this worker (records carry it as "model")
    cuda = device == "cuda"
    amp_dtype = {"bf16": torch.bfloat16, "fp32": None}[args.amp]
    record(kind="env", model=name, **environment(torch, device))

    torch.manual_seed(0)
    t0 = time.perf_counter()
    try:
        if name.startswith("fla_"):
            model, loss_fn, eval_fn, info = build_fla(name, tiny, vocab, device, torch)
        else:
            model, loss_fn, eval_fn, info = build_fairseq(args.worker, tiny, args.kernel_backend, vocab, device,
                                                          torch, loss=args.loss)
    except Exception as e:  # an unavailable peer is a result, not a crash
        record(kind="unavailable", model=name, error=f"{type(e).__name__}: {e}"[:2000],
               traceback=traceback.format_exc()[-3000:])
        return 0
    params = sum(p.numel() for p in model.parameters())
    record(kind="model", model=name, params=params, vocab=vocab, build_s=round(time.perf_counter() - t0, 2),
           amp=args.amp, kernel_backend=None if name.startswith("fla_") else args.kernel_backend,
           loss="fla" if name.startswith("fla_") else args.loss, **info)

    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-8,
                                 **({"fused": True} if cuda else {}))
    timer = Timer(torch, device, args.quick)

    def autocast():
        return torch.autocast(device_type=device, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)

    def make_step(tokens):
        def step():
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(tokens)
            loss.backward()
            optimizer.step()

        return step

    def tokens_of(batch, length):
        return random_tokens(torch, vocab, device, batch, length)

    def is_oom(e):
        return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()

    def measure_step(step):
        """Peak memory of one step (GiB) and the memory held before it (weights, Adam state)."""
        if not cuda:
            return None, None
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / GIB, held / GIB

    def free():
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.empty_cache()

    # ---- training throughput and memory at the three shapes ------------------------------------
    model.train()
    for batch, length in plan["shapes"]:
        tokens = tokens_of(batch, length)
        step = make_step(tokens)
        try:
            t_first = time.perf_counter()
            step()
            step()
            if cuda:
                torch.cuda.synchronize()
            first_s = time.perf_counter() - t_first
            ms = timer(step)
            peak, held = measure_step(step)
            record(kind="train", model=name, batch=batch, seq=length, ms=round(ms, 3),
                   tokens_per_s=round(batch * length / (ms / 1e3)), peak_gib=None if peak is None else round(peak, 3),
                   held_gib=None if held is None else round(held, 3), first_two_steps_s=round(first_s, 2),
                   timer=timer.method)
        except Exception as e:
            if not is_oom(e):
                record(kind="train", model=name, batch=batch, seq=length,
                       error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-3000:])
            else:
                record(kind="train", model=name, batch=batch, seq=length, error="out of memory")
        finally:
            del tokens, step
            free()

    if name.startswith("fla_") or any(suffix in name for suffix in VARIANT_FLAGS):
        # (a variant would recompile / capture a graph per T; the base model's rows have these)
        return 0

    # ---- training memory against T at batch 1 -------------------------------------------------
    for length in plan["memory_t"]:
        step = make_step(tokens_of(1, length))
        try:
            step()  # compile / allocate Adam state for this shape first
            peak, held = measure_step(step)
            record(kind="memory_vs_t", model=name, seq=length, peak_gib=round(peak, 4), held_gib=round(held, 4),
                   activation_gib=round(peak - held, 4))
        except Exception as e:
            record(kind="memory_vs_t", model=name, seq=length,
                   error="out of memory" if is_oom(e) else f"{type(e).__name__}: {e}"[:2000])
        finally:
            del step
            free()

    # ---- evaluation at L = 14336, batch 1 ------------------------------------------------------
    if args.loss != "fairseq":  # evaluation computes no loss: the model's fairseq row has it
        return 0
    model.eval()
    for precision in ("fp32", "bf16"):
        tokens = tokens_of(1, plan["eval_l"])
        try:
            if cuda:
                torch.cuda.synchronize()
                held = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            t_eval = time.perf_counter()
            with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16,
                                                 enabled=precision == "bf16"):
                total = eval_fn(tokens)
            nll = float(-total) / plan["eval_l"]
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t_eval
            peak = torch.cuda.max_memory_allocated() / GIB if cuda else None
            record(kind="eval", model=name, seq=plan["eval_l"], precision=precision, fits=True,
                   peak_gib=None if peak is None else round(peak, 3),
                   held_gib=None if not cuda else round(held / GIB, 3), seconds=round(seconds, 3),
                   mean_nll=round(nll, 4))
        except Exception as e:
            record(kind="eval", model=name, seq=plan["eval_l"], precision=precision, fits=False if is_oom(e) else None,
                   error="out of memory" if is_oom(e) else f"{type(e).__name__}: {e}"[:2000])
        finally:
            del tokens
            free()
    return 0


# ================================================================================================
# Driver: runs the workers, assembles JSON and markdown
# ================================================================================================
def worker_command(args, name, record_path, loss="fairseq"):
    cmd = [sys.executable, "-m", "bench.bench_train", "--worker", name, "--record", record_path,
           "--device", args.device, "--kernel-backend", args.kernel_backend, "--amp", args.amp, "--loss", loss]
    if args.quick:
        cmd.append("--quick")
    if args.shapes:
        cmd += ["--shapes", args.shapes]
    if args.vocab:
        cmd += ["--vocab", str(args.vocab)]
    return cmd


def read_records(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plan_jobs(models, losses):
    """(model, loss) of every worker: each fairseq model once per loss, each fla model once (its own
    loss), and ``transformer_lm`` always with fairseq's loss too (the peer of the speed targets)."""
    jobs = []
    for m in models:
        if m.startswith("fla_"):
            jobs.append((m, "fairseq"))  # ignored by fla's worker
        elif m == "transformer_lm":
            jobs += [(m, loss) for loss in LOSSES if loss == "fairseq" or loss in losses]
        else:
            jobs += [(m, loss) for loss in losses]
    return jobs


def run_all(args, jobs):
    """Run the workers of ``jobs`` ((model, loss) pairs); status by row label, and every record."""
    os.makedirs(args.out, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    status, records = {}, []
    for i, (model, loss) in enumerate(jobs):
        name = label(model, loss)
        record_path = os.path.join(args.out, f"records_{model}{'' if name == model else '_' + loss}.jsonl")
        if os.path.exists(record_path):
            os.remove(record_path)
        remaining = deadline - time.monotonic()
        reserve = 25 * (len(jobs) - i - 1)  # leave the models after this one a chance
        limit = remaining - reserve
        print(f"== {name} (time limit {max(limit, 0):.0f} s)", flush=True)
        if limit < 15:
            status[name] = f"skipped: the run's time budget (--budget-s {args.budget_s}) was spent"
            continue
        started = time.monotonic()
        if args.isolation == "process":
            # stdout (one line per measurement) passes through as progress; stderr (warnings, and
            # the traceback of a crash) is kept and shown only when the worker fails
            try:
                proc = subprocess.run(worker_command(args, model, record_path, loss), timeout=limit,
                                      env=provenance.child_env(),
                                      stderr=None if args.verbose else subprocess.PIPE, text=True)
                if proc.returncode == 0:
                    status[name] = "ok"
                else:
                    tail = (proc.stderr or "").strip().splitlines()[-15:]
                    status[name] = f"worker exited with {proc.returncode}: " + " | ".join(tail)[-1500:]
            except subprocess.TimeoutExpired:
                status[name] = f"timed out after {limit:.0f} s (results before that are kept)"
        else:
            worker_args = argparse.Namespace(**vars(args))
            worker_args.worker, worker_args.record, worker_args.loss = model, record_path, loss
            try:
                run_worker(worker_args)
                status[name] = "ok"
            except Exception as e:
                status[name] = f"{type(e).__name__}: {e}"[:1500]
        print(f"   {name}: {status[name]} ({time.monotonic() - started:.0f} s)", flush=True)
        records += read_records(record_path)
    return status, records


def fmt(value, digits=0):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def summarise(args, models, status, records, losses=("fairseq",)):
    """JSON summary and markdown of the run; ``models`` are the row labels (see ``label``)."""
    env = next((r for r in records if r["kind"] == "env"), {})
    env = {k: v for k, v in env.items() if k not in ("kind", "model")}
    by_model = {m: [r for r in records if r.get("model") == m] for m in models}
    params = {m: next((r["params"] for r in rs if r["kind"] == "model"), None) for m, rs in by_model.items()}
    unavailable = {m: next((r["error"] for r in rs if r["kind"] == "unavailable"), None) for m, rs in by_model.items()}
    train = {(r["model"], r["batch"], r["seq"]): r for r in records if r["kind"] == "train"}
    shapes = []
    for r in records:
        if r["kind"] == "train" and (r["batch"], r["seq"]) not in shapes:
            shapes.append((r["batch"], r["seq"]))

    def tps(model, shape):
        r = train.get((model, *shape))
        return None if r is None else r.get("tokens_per_s")

    def ratio_row(ours, peer, shape, target):
        a, b = tps(ours, shape), tps(peer, shape)
        ratio = None if not a or not b else a / b
        return {"model": ours, "peer": peer, "batch": shape[0], "seq": shape[1], "ratio": ratio, "target": target,
                "met": None if ratio is None or target is None else ratio >= target}

    # the targets name the peers as they train: transformer_lm with fairseq's cross_entropy, fla with its
    # own fused loss; ours with each loss measured. "Same loss" rows (target None) are for comparison.
    ratios = []
    for ours, peer, shape, target in TARGETS:
        for variant in (ours, *(ours + suffix for suffix in VARIANT_FLAGS)):
            for loss in losses:
                if variant == ours or label(variant, loss) in models:
                    ratios.append(ratio_row(label(variant, loss), peer, shape, target))
        if peer == "transformer_lm" and "fused" in losses:
            ratios.append(ratio_row(label(ours, "fused"), label(peer, "fused"), shape, None))
    summary = {"environment": env, "status": status, "params": params, "unavailable": unavailable,
               "settings": {"quick": args.quick, "device": args.device, "amp": args.amp,
                            "kernel_backend": args.kernel_backend, "budget_s": args.budget_s,
                            "optimizer": "torch.optim.Adam(betas=(0.9, 0.98), fused on CUDA)",
                            "loss": "fairseq cross_entropy criterion (fp32 log-softmax) for fairseq models; "
                                    "rows '(fused CE)': our linear_cross_entropy criterion; "
                                    "fla's fused cross entropy for fla models",
                            "losses": list(losses)},
               "ratios": ratios, "records": records}

    run = "quick" if args.quick else "full"
    vocab = next((r["vocab"] for r in records if r["kind"] == "model"), VOCAB)
    lines = [f"# bench_train: training step of the WikiText-103-sized LMs ({run} run)", ""]
    lines.append(f"{env.get('gpu') or env.get('cpu')}, torch {env.get('torch')}, triton {env.get('triton')}, "
                 f"fairseq {env.get('fairseq')}, fla {env.get('fla')}, transformers {env.get('transformers')}, "
                 f"{env.get('date_utc')}, commit {env.get('git')}. Step = forward + loss + backward + Adam, "
                 f"autocast {args.amp}, vocab {vocab}.")
    if "fused" in losses:
        lines += ["", "Loss: fairseq's `cross_entropy` criterion (fp32 log-softmax) for the fairseq models; rows "
                  "`(fused CE)`: our `--criterion linear_cross_entropy` (projection + cross entropy in chunks, no "
                  "fp32 logits); fla: its fused cross entropy. The speed targets compare against "
                  "`transformer_lm` with fairseq's `cross_entropy`; evaluation rows come from the fairseq-loss "
                  "workers (evaluation computes no loss)."]
    lines += ["", "## Training tokens/s (peak memory GiB)", ""]
    header = "| model | params | " + " | ".join(f"{b}x{t}" for b, t in shapes) + " |"
    lines += [header, "|" + " --- |" * (2 + len(shapes))]
    for m in models:
        cells = []
        for shape in shapes:
            r = train.get((m, *shape))
            if r is None:
                cells.append("-")
            elif "error" in r:
                cells.append(r["error"][:60].replace("|", "/"))
            else:
                mem = "" if r.get("peak_gib") is None else f" ({r['peak_gib']:.2f})"
                cells.append(f"{r['tokens_per_s']:,}{mem}")
        note = ""
        if unavailable.get(m):
            note = f" (unavailable: {unavailable[m][:120].replace('|', '/')})"
        elif status.get(m) not in (None, "ok"):
            note = f" ({status[m][:120].replace('|', '/')})"
        lines.append(f"| {m}{note} | {fmt(params.get(m))} | " + " | ".join(cells) + " |")

    lines += ["", "## Speed targets: tokens/s ratio, same run", "",
              "| model / peer | shape | ratio | target | met |", "| --- | --- | --- | --- | --- |"]
    for r in ratios:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "no")
        target = "(same loss, for comparison)" if r["target"] is None else f">= {r['target']}"
        lines.append(f"| {r['model']} / {r['peer']} | {r['batch']}x{r['seq']} | {ratio} | {target} | {met} |")

    mem = [r for r in records if r["kind"] == "memory_vs_t"]
    if mem:
        lines += ["", "## Training memory against T (batch 1): activation GiB = peak - held before the step", "",
                  "| model | " + " | ".join(f"T={t}" for t in sorted({r['seq'] for r in mem})) +
                  " | activation per 1K tokens, MiB (first -> last) | linear? |",
                  "|" + " --- |" * (3 + len({r['seq'] for r in mem}))]
        summary["memory_linearity"] = {}
        for m in models:
            rows = sorted((r for r in mem if r["model"] == m), key=lambda r: r["seq"])
            if not rows:
                continue
            ok = [r for r in rows if "error" not in r]
            per_k = [1024 * r["activation_gib"] / (r["seq"] / 1024) for r in ok]  # GiB -> MiB, per 1K tokens
            # linear (or less): from the 2nd length on, the activation memory per token never grows past
            # 1.25x its value there (the fused loss's logits buffer stops growing at its chunk size, so its
            # memory per token falls with T)
            linear = None
            if len(per_k) >= 3:
                tail = per_k[1:]
                linear = max(tail) <= 1.25 * tail[0]
            summary["memory_linearity"][m] = {"activation_mib_per_1k_tokens": per_k, "linear": linear}
            cells = [("-" if "error" in r else f"{r['activation_gib']:.3f}") for r in rows]
            trend = "-" if not per_k else f"{per_k[0]:.1f} -> {per_k[-1]:.1f}"
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {trend} | "
                         f"{'-' if linear is None else ('yes' if linear else 'no')} |")

    evals = [r for r in records if r["kind"] == "eval"]
    if evals:
        lines += ["", f"## Evaluation at L = {evals[0]['seq']}, batch 1 (forward + log-probabilities of every token)",
                  "",
                  "| model | precision | fits | peak GiB | seconds |", "| --- | --- | --- | --- | --- |"]
        for r in evals:
            fits = {True: "yes", False: "no (OOM)", None: r.get("error", "-")[:60]}[r.get("fits")]
            lines.append(f"| {r['model']} | {r['precision']} | {fits} | {fmt(r.get('peak_gib'), 2)} | "
                         f"{fmt(r.get('seconds'), 3)} |")

    problems = {m: s for m, s in status.items() if s != "ok"}
    if problems or any(unavailable.values()):
        lines += ["", "## Not measured", ""]
        for m in models:
            if unavailable.get(m):
                lines.append(f"- {m}: unavailable: {unavailable[m][:500]}")
            elif m in problems:
                lines.append(f"- {m}: {problems[m][:500]}")
    lines += ["", "Timer: " + next((r.get("timer") for r in records if r.get("timer")), "-") +
              "; peak memory: torch.cuda.max_memory_allocated over one step (Adam state included)."]
    return summary, "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output folder for bench_train.json / bench_train.md")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (and tiny models on CPU): a smoke test")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS + VARIANTS)} (+compile: ours with --compile-blocks, "
                        "+graphs: ours with --cuda-graphs)")
    parser.add_argument("--shapes", default=None, help="override the BxT shapes, e.g. 16x512,1x8192")
    parser.add_argument("--vocab", type=int, default=None,
                        help=f"vocabulary size (default {VOCAB}; 1000 for tiny models)")
    parser.add_argument("--amp", choices=("bf16", "fp32"), default=None,
                        help="autocast dtype (default bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--kernel-backend", default="auto", choices=("auto", "triton", "reference"),
                        help="our models' --kernel-backend")
    parser.add_argument("--loss", default="fairseq",
                        help=f"loss of the fairseq models, comma-separated subset of {','.join(LOSSES)}: fairseq "
                             "(--criterion cross_entropy) and/or fused (--criterion linear_cross_entropy, rows "
                             "'MODEL (fused CE)'); transformer_lm always also runs with fairseq's (the speed targets' peer)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget for all models")
    parser.add_argument("--isolation", choices=("process", "none"), default="process",
                        help="process: one subprocess per model (default); none: all in this process")
    parser.add_argument("--verbose", action="store_true", help="show the workers' stderr (warnings) as it comes")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.amp is None:
        args.amp = "bf16" if args.device == "cuda" else "fp32"
    losses = [loss for loss in args.loss.split(",") if loss]
    bad = [loss for loss in losses if loss not in LOSSES]
    if bad or not losses or (args.worker and len(losses) != 1):
        parser.error(f"--loss {args.loss!r}: choose {'one' if args.worker else 'a comma-separated subset'} of "
                     f"{','.join(LOSSES)}")
    if args.worker:
        return run_worker(args)
    if not args.out:
        parser.error("--out FOLDER is required")
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS + VARIANTS + tuple(BASELINES)]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {','.join(MODELS)}")

    started = time.monotonic()
    jobs = plan_jobs(models, losses)
    status, records = run_all(args, jobs)
    summary, markdown = summarise(args, [label(m, loss) for m, loss in jobs], status, records, losses)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    with open(os.path.join(args.out, "bench_train.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.out, "bench_train.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    print(f"wrote {os.path.join(args.out, 'bench_train.json')} and bench_train.md ({summary['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
