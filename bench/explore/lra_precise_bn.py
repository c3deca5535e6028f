#!/usr/bin/env python3
"""Does an LRA checkpoint score more with its batch norms' statistics re-estimated on its final weights?

    python bench/explore/lra_precise_bn.py CHECKPOINT [--data DATA_DIR] [--batches 50 200] [--seeds 1 2]
        [--batch-size 32] [--splits valid test] [--cpu] [--out RESULT.json]

Scores the splits (a) with the checkpoint as stored, in eval mode (the running statistics the run kept: a
momentum-0.1 average over its last updates), then (b) for each number of training batches N and seed, with
every ``MaskedBatchNorm``'s running mean and variance set to the pooled statistics of N shuffled training
batches through the fixed weights (``hgrn_fairseq.modules.norms.reestimate_running_stats``; the norms in
training mode during those passes, as in training). Same examples, precision and batching as
``scripts/lra_eval.py`` (whose loader and scorer it uses), so (a) is the run's recorded test number up to
the device's arithmetic. Prints a line per setting and writes the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, REPO)


def train_batches(task, batch_size: int, count: int, seed: int, use_cuda: bool, bf16: bool):
    """``count`` batches of the training split in a seeded shuffle (the task's own batching), ready for the model."""
    from lra_eval import prepare_sample

    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_sentences=batch_size, required_batch_size_multiple=1,
                                  seed=seed, num_workers=0).next_epoch_itr(shuffle=True)
    got = 0
    for sample in itertools.islice(itr, count):
        if sample:
            got += 1
            yield prepare_sample(sample, use_cuda, bf16)
    if got < count:
        raise ValueError(f"the training split gave {got} batches of {batch_size}, fewer than --batches {count}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", default=None, help="data directory (default: the one the checkpoint trained on)")
    p.add_argument("--batches", type=int, nargs="+", default=[50, 200], help="training batches per re-estimation")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="shuffles of the training split")
    p.add_argument("--batch-size", type=int, default=None, help="training batches' size (default: the run's)")
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--splits", nargs="+", default=["valid", "test"])
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--out", default=None, help="write the results here (JSON)")
    args = p.parse_args(argv)

    import torch

    from lra_eval import git_commit, load, score

    from hgrn_fairseq.modules.norms import reestimate_running_stats

    model, cfg, task, use_cuda, bf16 = load(args.checkpoint, args.data, args.cpu)
    batch_size = args.batch_size or int(cfg.dataset.batch_size)
    stored = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    extra = state.get("extra_state", {}) or {}
    rows = []

    def run(setting: str, **info):
        for split in args.splits:
            t = time.time()
            correct, seen = score(model, task, split, args.eval_batch_size, use_cuda, bf16)
            acc = round(100.0 * correct / len(seen), 3)
            rows.append(dict(setting=setting, split=split, correct=correct, examples=len(seen), accuracy=acc,
                             seconds=round(time.time() - t, 1), **info))
            print(f"[{setting}] {split}: {acc:.2f}% ({correct}/{len(seen)})", flush=True)

    run("as stored")
    for n, seed in itertools.product(args.batches, args.seeds):
        model.load_state_dict(stored)
        t = time.time()
        reestimate_running_stats(model, train_batches(task, batch_size, n, seed, use_cuda, bf16),
                                 lambda m, s: m(**s["net_input"]))
        run(f"re-estimated on {n} x {batch_size}, seed {seed}", batches=n, batch_size=batch_size, seed=seed,
            reestimate_seconds=round(time.time() - t, 1))
    result = {
        "checkpoint": os.path.abspath(args.checkpoint),
        "arch": cfg.model._name,
        "data": os.path.abspath(cfg.task.data),
        "checkpoint_updates": int((state.get("optimizer_history") or [{}])[-1].get("num_updates", 0)),
        "best_valid_accuracy_recorded": extra.get("best"),
        "precision": "bf16" if bf16 else "fp32",
        "device": torch.cuda.get_device_name() if use_cuda else "cpu",
        "torch": torch.__version__,
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "rows": rows,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
