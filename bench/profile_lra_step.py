#!/usr/bin/env python3
"""Where an LRA training step of the real entry point spends its time (GPU machine, fairseq installed).

    python -m bench.profile_lra_step TASK MODEL DATA_DIR [--steps 60] [--out DIR]

Builds what ``scripts/train_lra.sh TASK MODEL DATA_DIR`` trains (the recipe's fairseq arguments,
fairseq's Trainer, the task's data) and times, one after the other:

1. ``data``: drawing batches from the epoch iterator (the recipe's loader, 2 workers), no GPU;
2. ``step``: ``Trainer.train_step`` on batches drawn beforehand (the whole update: forward, backward,
   clipping, optimizer, logging), milliseconds per update;
3. ``fwd+bwd``: the criterion's forward and backward alone on the same batches;
4. a torch.profiler trace of ``profile_steps`` updates: GPU busy time against wall time, the operators
   with the most host time and the kernels with the most GPU time.

bench/bench_lra.py times the model alone on unpadded random batches; the gap between its numbers and
the updates/s of a training log is what this script takes apart. Output: stdout and
``DIR/profile_lra_step_TASK_MODEL.md``.
"""
from __future__ import annotations

import argparse
import os
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(task_name, model_name, data, workers):
    import torch
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer
    from hgrn_fairseq.cli.fairseq_train import _bf16_without_tpu  # --bf16 on a GPU, not a TPU
    from hgrn_fairseq.recipes.lra import fairseq_args

    argv = [data] + fairseq_args(task_name, model_name) + [
        "--user-dir", os.path.join(REPO, "hgrn_fairseq"), "--num-workers", str(workers),
        "--distributed-world-size", "1", "--log-format", "none"] + ([] if torch.cuda.is_available() else ["--cpu"])
    args = _bf16_without_tpu(options.parse_args_and_arch)(options.get_training_parser(), input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    def batches():  # epoch after epoch (a small data set runs out)
        epoch = 1
        while True:
            yield from task.get_batch_iterator(
                dataset=task.dataset("train"), max_sentences=cfg.dataset.batch_size, seed=cfg.common.seed,
                num_workers=workers, epoch=epoch).next_epoch_itr(shuffle=True)
            epoch += 1

    return cfg, trainer, batches()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task")
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch
    from fairseq import utils
    from torch.profiler import ProfilerActivity, profile

    cfg, trainer, itr = build(a.task, a.model, os.path.abspath(a.data), a.workers)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    lines = [f"# LRA training step: {a.task} / {a.model} ({torch.cuda.get_device_name() if cuda else 'CPU'})", ""]

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    n = a.steps + 10 + a.profile_steps
    t = time.perf_counter()
    batches = [next(itr) for _ in range(n)]
    say(f"- data: {n} batches in {time.perf_counter() - t:.2f} s "
        f"({1e3 * (time.perf_counter() - t) / n:.1f} ms a batch, {a.workers} workers, including their start)")
    lengths = [b["net_input"]["src_tokens"].shape[1] if "src_tokens" in b["net_input"] else 0 for b in batches]
    say(f"- padded lengths: min {min(lengths)}, mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)}; "
        f"padded batches {sum(bool(b['net_input'].get('padded')) for b in batches)} of {n}")

    def timed(fn, items):
        sync()
        t0 = time.perf_counter()
        for s in items:
            fn(s)
        sync()
        return 1e3 * (time.perf_counter() - t0) / len(items)

    def step(s):
        trainer.train_step([s])

    model, criterion = trainer.model, trainer.criterion

    def fwd_bwd(s):
        s = trainer._prepare_sample(s)[0]
        loss, _, _ = criterion(model, s)
        loss.backward()

    timed(step, batches[:10])  # warm-up: Triton autotuning and compiling
    say(f"- step (Trainer.train_step, whole update): {timed(step, batches[10:10 + a.steps]):.1f} ms")
    model.train()
    say(f"- fwd+bwd only (same batches): {timed(fwd_bwd, batches[10:10 + a.steps]):.1f} ms")
    trainer.zero_grad()
    pre = [utils.move_to_cuda(b) if cuda else b for b in batches[10:10 + a.steps]]
    say(f"- fwd+bwd only, batches already on the GPU: {timed(lambda s: criterion(model, s)[0].backward(), pre):.1f} ms")

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for s in batches[-a.profile_steps:]:
            step(s)
        sync()
        wall = 1e3 * (time.perf_counter() - t0) / a.profile_steps
    events = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    say(f"- profiled: {wall:.1f} ms wall a step, GPU busy {gpu / a.profile_steps:.1f} ms a step, "
        f"{kernels / a.profile_steps:.0f} GPU kernels/copies a step")
    say("")
    say("## Operators by host time (self CPU, per step)")
    say("```")
    say(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    say("```")
    say("## By GPU time")
    say("```")
    say(events.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))
    say("```")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"profile_lra_step_{a.task}_{a.model}.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
