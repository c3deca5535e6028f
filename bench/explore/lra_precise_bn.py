#!/usr/bin/env python3
"""Does an LRA checkpoint score more with its batch norms' statistics re-estimated on its final weights (precise BN)?

    python -m bench.explore.lra_precise_bn CHECKPOINT [--data DATA_DIR] [--batches 50 200] [--seeds 1 2]
        [--batch-size 128] [--eval-batch-size 64] [--splits valid test] [--batch-stats] [--recorded TEST.json]
        [--stored-only] [--fp32] [--cpu] [--kernel-backend reference] [--out RESULT.json]

Settings, each scored on every example of each split in eval mode (``scripts/lra_eval.py``'s loader, with its
data check, and its scorer: the same batches, precision and order as the run's test):
  (a) ``as stored``: the running statistics the run kept (momentum-0.1 averages, updated in the run's precision);
  (b) ``re-estimated``: every ``MaskedBatchNorm``'s running mean / variance set to the exact pooled statistics
      of the valid positions of the first N batches of a seeded shuffle of the training split (the task's own
      batching, ``--batch-size``, default the run's; ``--data``, default the data the checkpoint trained on), the weights fixed, no gradients, the norms in training
      mode in those passes and everything else in eval mode (``hgrn_fairseq.modules.norms.
      pooled_norm_statistics``). The N of ``--batches`` are prefixes of one draw per ``--seed`` (one pass);
  (c) with ``--batch-stats``, for information: the norms use each batch's own statistics, on random batches of
      ``--batch-size`` examples of the split (a prediction then depends on its batch).
``--stored-only`` scores (a) alone; ``--fp32`` runs a bf16 checkpoint in float32 (how much the arithmetic moves
the predictions). Prints a line per setting and split; the JSON holds the settings, the checkpoint's update and
recorded numbers (its best validation accuracy; the run's test JSON with ``--recorded``), the data's sizes and
hashes, each row's accuracy with its counts and loss (bits, as fairseq logs it), the predictions (one digit per
example, by id) and, as stored, each example's top-1 minus top-2 logit, for comparisons between machines. Every
other row also holds its margins over the as-stored row of its split: ``delta_correct``, ``delta_accuracy``,
``delta_loss_bits``, ``changed_predictions`` (examples whose prediction differs), ``wrong_to_right`` /
``right_to_wrong`` (the paired counts behind ``delta_correct``) and ``mcnemar_z`` ((wrong_to_right - right_to_wrong)
/ sqrt(their sum): |z| < 2 is a change the same examples scored twice can give by chance), beside ``std_error``
(sqrt(p (1 - p) / n) of its accuracy, in points), so that a change can be read against the noise.
With ``--cpu`` (or no GPU) the model runs the PyTorch reference path.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import sys
import time


from hgrn_fairseq.preprocessing.sentencepiece_bpe import sha256_file as sha256  # a file's SHA-256, read in blocks


def train_batches(task, batch_size: int, count: int, seed: int, use_cuda: bool, bf16: bool):
    """``count`` batches of the training split in a seeded shuffle (the task's own batching), ready for the model."""
    from scripts.lra_eval import prepare_sample

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


def data_record(task, data_dir: str, splits) -> dict:
    """What identifies the data: meta.json's generator options, each file's SHA-256 and each split's examples
    and tokens (the appended ``<eos>`` counted, as the run's logged ``wpb`` counts them)."""
    files = {name: sha256(os.path.join(data_dir, name)) for name in sorted(os.listdir(data_dir))
             if name != "meta.json" and os.path.isfile(os.path.join(data_dir, name))}
    sizes = {}
    for split in splits:
        task.load_dataset(split)
        ds = task.dataset(split)
        sizes[split] = {"examples": len(ds), "tokens": int(ds.sizes.sum())}
    return {"dir": os.path.abspath(data_dir), "generator_options": task.meta.get("generator_options"),
            "source": task.meta.get("source"), "sha256": files, "splits": sizes}


def predictions(logits: dict, n: int) -> str:
    """One digit per example (ids 0..n-1): the predicted class (10 classes at most)."""
    if sorted(logits) != list(range(n)):
        raise ValueError(f"logits for {len(logits)} ids, not ids 0..{n - 1}")
    return "".join(str(int(logits[i].argmax())) for i in range(n))


def loss_and_margins(logits: dict, labels) -> tuple:
    """(mean cross-entropy in bits, as fairseq's log prints the loss; each example's top-1 minus top-2 logit,
    by id)."""
    import torch

    z = torch.stack([logits[i] for i in range(len(logits))]).double()
    y = torch.as_tensor([int(v) for v in labels[: len(z)]])
    loss = float(torch.nn.functional.cross_entropy(z, y)) / math.log(2)
    top = z.topk(2, dim=-1).values
    return loss, (top[:, 0] - top[:, 1]).tolist()


def stat_shift(stored: dict, new: dict) -> dict:
    """How far the stored running statistics are from the re-estimated ones, over all norms and channels: the
    mean's shift in re-estimated standard deviations (largest, root mean square) and the variance ratio."""
    import torch

    shifts, ratios = [], []
    for name, (mean, var) in new.items():
        sm, sv = stored[name + ".running_mean"].double(), stored[name + ".running_var"].double()
        shifts.append(((sm - mean) / var.clamp_min(1e-12).sqrt()).abs())
        ratios.append(sv / var.clamp_min(1e-12))
    s, r = torch.cat(shifts), torch.cat(ratios)
    return {"norms": len(new), "channels": int(s.numel()), "mean_shift_sd_max": round(float(s.max()), 4),
            "mean_shift_sd_rms": round(float(s.pow(2).mean().sqrt()), 4),
            "var_ratio_min": round(float(r.min()), 4), "var_ratio_max": round(float(r.max()), 4)}


def reestimated(model, task, counts, seed: int, batch_size: int, use_cuda: bool, bf16: bool):
    """The pooled statistics after the first k training batches of the seeded shuffle, for each k of ``counts``
    (one pass over max(counts) batches): -> ({k: stats}, {k: (sequences, valid positions)})."""
    from hgrn_fairseq.modules.norms import pooled_norm_statistics

    seen = [0, 0]
    tally = {}

    def forward(m, sample):
        seen[0] += int(sample["target"].numel())
        seen[1] += int(sample["net_input"]["src_tokens"].ne(task.source_dictionary.pad()).sum())
        m(**sample["net_input"])
        tally[len(tally) + 1] = tuple(seen)

    _, stats = pooled_norm_statistics(model, train_batches(task, batch_size, max(counts), seed, use_cuda, bf16),
                                      forward, at=counts)
    return stats, {k: tally[k] for k in counts}


def score_with_batch_stats(model, task, split: str, batch_size: int, seed: int, use_cuda: bool, bf16: bool,
                           logits_out: dict) -> int:
    """(c): the split in random batches of ``batch_size``, each normalised by its own masked statistics (the batch
    norms in training mode, the rest in eval mode; running statistics restored after). -> correct."""
    import numpy as np
    import torch

    from scripts.lra_eval import prepare_sample

    from hgrn_fairseq.modules.norms import MaskedBatchNorm

    task.load_dataset(split)
    ds = task.dataset(split)
    order = np.random.default_rng(seed).permutation(len(ds))
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm)]
    kept = [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()) for m in norms]
    correct = 0
    try:
        model.eval()
        for m in norms:
            m.train()
        with torch.no_grad():
            for start in range(0, len(ds), batch_size):
                sample = prepare_sample(ds.collater([ds[int(i)] for i in order[start:start + batch_size]]),
                                        use_cuda, bf16)
                logits = model(**sample["net_input"])
                correct += int(logits.argmax(-1).eq(sample["target"]).sum())
                logits_out.update(zip(sample["id"].tolist(), logits.float().cpu().unbind(0)))
    finally:
        model.eval()
        with torch.no_grad():
            for m, (mean, var, n) in zip(norms, kept):
                m.running_mean.copy_(mean), m.running_var.copy_(var), m.num_batches_tracked.copy_(n)
    return correct


def recorded_numbers(state: dict, recorded_json: str | None) -> dict:
    extra = state.get("extra_state", {}) or {}
    out = {"best_valid_accuracy": extra.get("best")}
    if recorded_json:
        with open(recorded_json) as f:
            rec = json.load(f)
        out.update(test_json=os.path.abspath(recorded_json), test_accuracy=rec.get("accuracy"),
                   test_correct=rec.get("correct"), test_examples=rec.get("examples"),
                   test_device=rec.get("device"), test_precision=rec.get("precision"),
                   test_best_checkpoint_updates=rec.get("best_checkpoint_updates"))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", default=None, help="the data directory (default: the one the checkpoint trained on); "
                   "the checkpoint's data check applies")
    p.add_argument("--batches", type=int, nargs="+", default=[50, 200],
                   help="training batches per re-estimate (prefixes of one draw per seed)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="shuffles (draws) of the training split")
    p.add_argument("--batch-size", type=int, default=None, help="training batches' size (default: the run's)")
    p.add_argument("--eval-batch-size", type=int, default=64, help="scoring batches (default: lra_eval.py's)")
    p.add_argument("--splits", nargs="+", default=["valid", "test"])
    p.add_argument("--batch-stats", action="store_true", help="also (c): each batch's own statistics")
    p.add_argument("--recorded", default=None, help="the run's test JSON (lra_eval.py), for the recorded number")
    p.add_argument("--stored-only", action="store_true", help="only (a), the checkpoint as stored")
    p.add_argument("--fp32", action="store_true", help="run a bf16 checkpoint in float32 (an arithmetic check)")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--kernel-backend", choices=["auto", "triton", "reference"], default=None,
                   help="the model's kernels (default: the checkpoint's, auto: Triton on a GPU, PyTorch on the CPU)")
    p.add_argument("--out", default=None, help="write the results here (JSON)")
    args = p.parse_args(argv)
    if min(args.batches) < 1:
        p.error("--batches must be >= 1")

    import torch

    from scripts.lra_eval import git_commit, load, score

    from hgrn_fairseq.modules.norms import set_running_stats

    t_all = time.time()
    model, cfg, task, use_cuda, bf16 = load(args.checkpoint, args.data, args.cpu, kernel_backend=args.kernel_backend)
    if args.fp32 and bf16:
        model, bf16 = model.float(), False
    batch_size = args.batch_size or int(cfg.dataset.batch_size)
    stored = {k: v.clone() for k, v in model.state_dict().items()}
    from hgrn_fairseq.checkpoint_io import load_checkpoint

    state = load_checkpoint(args.checkpoint)
    recorded = recorded_numbers(state, args.recorded)
    result = {
        "checkpoint": os.path.abspath(args.checkpoint),
        "checkpoint_sha256": sha256(args.checkpoint),
        "arch": cfg.model._name,
        "checkpoint_updates": int((state.get("optimizer_history") or [{}])[-1].get("num_updates", 0)),
        "recorded": recorded,
        "data": data_record(task, args.data or cfg.task.data, ["train", *args.splits]),
        "settings": {"stored_only": args.stored_only, "batches": sorted(set(args.batches)), "seeds": args.seeds,
                     "batch_size": batch_size,
                     "eval_batch_size": args.eval_batch_size, "splits": args.splits,
                     "batch_stats": args.batch_stats, "append_eos": bool(getattr(cfg.task, "append_eos", False))},
        "precision": "bf16" if bf16 else "fp32",
        "device": torch.cuda.get_device_name() if use_cuda else "cpu",
        "kernel_path": "triton" if use_cuda and cfg.model.kernel_backend != "reference" else "PyTorch reference",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "rows": [],
    }
    rows = result["rows"]

    def write():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out + ".tmp", "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
            os.replace(args.out + ".tmp", args.out)

    def add(setting: str, split: str, correct: int, logits: dict, seconds: float, **info):
        n = task.meta["splits"][split]
        acc = round(100.0 * correct / n, 3)
        se = round(100.0 * math.sqrt(acc / 100 * (1 - acc / 100) / n), 2)
        labels = task.dataset(split).labels
        loss, margins = loss_and_margins(logits, labels)
        row = dict(setting=setting, split=split, correct=correct, examples=n, accuracy=acc, std_error=se,
                   loss_bits=round(loss, 5), seconds=round(seconds, 1), **info, predictions=predictions(logits, n))
        base = next((r for r in rows if r["setting"] == "as stored" and r["split"] == split), None)
        if setting == "as stored":  # (how near a tie each prediction is: for comparisons between machines)
            row["margins"] = [round(v, 4) for v in margins]
        elif base is not None:  # the margins over the checkpoint as stored, and the paired counts behind them
            pairs = [(a, b, str(int(t))) for a, b, t in zip(row["predictions"], base["predictions"], labels[:n])]
            up = sum(a == t != b for a, b, t in pairs)
            down = sum(b == t != a for a, b, t in pairs)
            row.update(delta_correct=correct - base["correct"], delta_accuracy=round(acc - base["accuracy"], 3),
                       delta_loss_bits=round(loss - base["loss_bits"], 5),
                       changed_predictions=sum(a != b for a, b, _ in pairs), wrong_to_right=up, right_to_wrong=down,
                       mcnemar_z=round((up - down) / math.sqrt(up + down), 2) if up + down else 0.0)
        rows.append(row)
        note = ""
        if setting == "as stored" and split == "test" and recorded.get("test_correct") is not None:
            d = correct - recorded["test_correct"]
            note = "  (recorded: the same)" if d == 0 else f"  (recorded {recorded['test_accuracy']}: {d:+d} examples)"
        if setting == "as stored" and split == "valid" and recorded.get("best_valid_accuracy") is not None:
            d = acc - recorded["best_valid_accuracy"]
            note = ("  (recorded: the same)" if abs(d) < 1e-9
                    else f"  (recorded {recorded['best_valid_accuracy']}: {d:+.2f})")
        if "delta_correct" in row:
            note = (f"  (as stored {row['delta_accuracy']:+.2f} points, {row['delta_loss_bits']:+.4f} bits, "
                    f"{row['changed_predictions']} predictions changed, "
                    f"{row['wrong_to_right']} to right / {row['right_to_wrong']} to wrong: z {row['mcnemar_z']:+.2f})")
        print(f"[{setting}] {split}: {acc:.2f}% ({correct}/{n}), loss {loss:.4f} bits, {seconds:.0f} s{note}",
              flush=True)
        write()

    def run_splits(setting: str, **info):
        for split in args.splits:
            t, logits = time.time(), {}
            correct, _ = score(model, task, split, args.eval_batch_size, use_cuda, bf16, logits_out=logits)
            add(setting, split, correct, logits, time.time() - t, **info)

    print(f"{result['arch']}: update {result['checkpoint_updates']}, {result['precision']} on {result['device']} "
          f"({result['kernel_path']}); recorded {recorded}", flush=True)
    run_splits("as stored")
    for seed in [] if args.stored_only else args.seeds:
        model.load_state_dict(stored)
        t = time.time()
        stats, seen = reestimated(model, task, sorted(set(args.batches)), seed, batch_size, use_cuda, bf16)
        passes = time.time() - t
        print(f"re-estimation, seed {seed}: {max(args.batches)} batches of {batch_size} in {passes:.0f} s", flush=True)
        for n in sorted(stats):
            model.load_state_dict(stored)
            set_running_stats(model, stats[n])
            run_splits(f"re-estimated on {n} x {batch_size}, seed {seed}", batches=n, batch_size=batch_size,
                       seed=seed, sequences=seen[n][0], valid_positions=seen[n][1],
                       passes_seconds=round(passes, 1), shift_from_stored=stat_shift(stored, stats[n]))
    if args.batch_stats and not args.stored_only:
        model.load_state_dict(stored)
        for split in args.splits:
            t, logits = time.time(), {}
            correct = score_with_batch_stats(model, task, split, batch_size, args.seeds[0], use_cuda, bf16, logits)
            add(f"batch statistics, random batches of {batch_size}", split, correct, logits, time.time() - t,
                batch_size=batch_size, seed=args.seeds[0])
    result["total_seconds"] = round(time.time() - t_all, 1)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
