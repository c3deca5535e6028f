#!/usr/bin/env python3
"""MQAR diagnostics: which queries a trained model answers, and what a shortcut would score.

From a fairseq checkpoint of ``--task mqar`` (``--checkpoint``), or with no model at all (the
baselines only), on the task's held-out set (regenerated from the options stored in the checkpoint,
or given on the command line), prints and writes as JSON (``--json``):

* accuracy by **query rank** (the j-th query of an example, in order of position), by the **pair
  index** of the queried key in the context (0 = the first pair), and by the **key-query distance**
  in tokens (binned);
* what each wrong answer was: another value of the same example that has **not yet been shown** in
  the query region, one that **was already shown** there (as the answer of an earlier query), a value
  that is not in the example, or not a value at all;
* two baselines computed from the token sequences alone (never from the model):
  ``elimination``: guess uniformly among the example's context values that have not appeared after
  the context before the query position -- the best a model can do that only knows *which* values
  the example holds and *which have been shown*, not which key they belong to; ``bag``: guess
  uniformly among the example's N values (expected 1/N).

With ``--reveal-answers`` layout data (each query's value follows it in the input), the elimination
baseline is ``mean_j 1/(N - j)``: 21.1% at 16 pairs, 34.0% at 8, 7.4% at 64 (docs/mqar.md, Findings).
In Zoology's layout (the default) no answer is shown and it equals the bag baseline, 1/N.

Example::

    python scripts/mqar_diagnose.py --checkpoint ckpt/checkpoint_last.pt --json diag.json
    python scripts/mqar_diagnose.py --seq-len 256 --num-kv-pairs 16 --reveal-answers   # baselines only
"""
import argparse
import json
import os
from typing import Dict, List, Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DISTANCE_BINS = (0, 8, 16, 32, 64, 128, 256, 512, 1024, 1 << 30)
ANSWER_KINDS = ("right", "unshown_value", "shown_value", "foreign_value", "not_a_value")


def query_facts(inputs: np.ndarray, query_positions: np.ndarray, vocab_size: int) -> Dict[str, np.ndarray]:
    """Per query ``[n, N]``: its rank, the pair index of its key in the context, the key-query
    distance in tokens, and how many of the example's context values appear in the input between the
    context and the query (shown before it). Read from the tokens: the context is the first 2N
    positions, keys at even and values at odd positions."""
    from hgrn_fairseq.tasks.mqar import value_range

    inputs = inputs.astype(np.int64)
    n, pairs = query_positions.shape
    context = 2 * pairs
    keys, values = inputs[:, 0:context:2], inputs[:, 1:context:2]
    asked = np.take_along_axis(inputs, query_positions, axis=1)  # the queried keys
    match = asked[:, :, None] == keys[:, None, :]  # [n, N(query), N(pair)]
    if not (match.sum(-1) == 1).all():
        raise ValueError("mqar_diagnose: a query token is not exactly one of its example's context keys; "
                         "is this MQAR data with these --num-kv-pairs?")
    pair_index = match.argmax(-1)
    vlo, vhi = value_range(vocab_size)
    shown = np.zeros((n, pairs), dtype=np.int64)
    for i in range(n):
        seen = set()
        row = inputs[i]
        qpos = query_positions[i]
        ctx_values = set(values[i].tolist())
        prev = context
        for j in range(pairs):
            for t in row[prev : qpos[j]].tolist():
                if vlo <= t < vhi and t in ctx_values:
                    seen.add(t)
            shown[i, j] = len(seen)
            prev = qpos[j]
    return {
        "rank": np.broadcast_to(np.arange(pairs), (n, pairs)).copy(),
        "pair_index": pair_index,
        "distance": query_positions - 2 * pair_index,
        "shown_before": shown,
        "values": values,
    }


def baselines(inputs: np.ndarray, query_positions: np.ndarray, vocab_size: int) -> Dict[str, float]:
    """Expected accuracy (%) of the two shortcut strategies of the module docstring."""
    facts = query_facts(inputs, query_positions, vocab_size)
    pairs = query_positions.shape[1]
    remaining = pairs - facts["shown_before"]  # the unshown context values; the right one is among them
    return {"elimination": float(100.0 * np.mean(1.0 / remaining)), "bag": 100.0 / pairs}


def classify(predictions: np.ndarray, answers: np.ndarray, inputs: np.ndarray, query_positions: np.ndarray,
             vocab_size: int) -> np.ndarray:
    """``[n, N]`` index into ANSWER_KINDS of each prediction (task tokens)."""
    from hgrn_fairseq.tasks.mqar import value_range

    facts = query_facts(inputs, query_positions, vocab_size)
    inputs = inputs.astype(np.int64)
    vlo, vhi = value_range(vocab_size)
    n, pairs = answers.shape
    kinds = np.empty((n, pairs), dtype=np.int64)
    context = 2 * pairs
    for i in range(n):
        ctx_values = set(facts["values"][i].tolist())
        for j in range(pairs):
            p = int(predictions[i, j])
            if p == answers[i, j]:
                kinds[i, j] = 0
            elif not vlo <= p < vhi:
                kinds[i, j] = 4
            elif p not in ctx_values:
                kinds[i, j] = 3
            elif p in set(inputs[i, context : query_positions[i, j]].tolist()):
                kinds[i, j] = 2
            else:
                kinds[i, j] = 1
    return kinds


def _grouped(labels: np.ndarray, right: np.ndarray, names=None) -> List[Dict]:
    out = []
    for value in np.unique(labels):
        sel = labels == value
        out.append({"group": names[value] if names else int(value), "count": int(sel.sum()),
                    "accuracy": float(100.0 * right[sel].mean())})
    return out


def report(predictions: Optional[np.ndarray], examples, vocab_size: int) -> Dict:
    """Everything the module docstring lists, as a JSON-able dict (model parts absent without one)."""
    inputs, qpos, answers = examples.inputs, examples.query_positions, examples.answers
    facts = query_facts(inputs, qpos, vocab_size)
    pairs = qpos.shape[1]
    remaining = pairs - facts["shown_before"]
    out = {"examples": int(inputs.shape[0]), "num_kv_pairs": pairs, "seq_len": int(inputs.shape[1]),
           "baselines": baselines(inputs, qpos, vocab_size),
           "elimination_by_rank": [float(100.0 * np.mean(1.0 / remaining[:, j])) for j in range(pairs)]}
    if predictions is None:
        return out
    right = predictions == answers
    bins = np.digitize(facts["distance"], DISTANCE_BINS) - 1
    bin_names = {b: f"{DISTANCE_BINS[b]}-{DISTANCE_BINS[b + 1] - 1}" for b in range(len(DISTANCE_BINS) - 1)}
    kinds = classify(predictions, answers, inputs, qpos, vocab_size)
    out.update({
        "accuracy": float(100.0 * right.mean()),
        "by_rank": _grouped(facts["rank"], right),
        "by_pair_index": _grouped(facts["pair_index"], right),
        "by_distance": _grouped(bins, right, bin_names),
        "answer_kinds": {k: float(100.0 * (kinds == i).mean()) for i, k in enumerate(ANSWER_KINDS)},
        # of the guesses among unshown values (right or not): the share that was right, vs 1/remaining
        "right_among_unshown_guesses": float(100.0 * right.sum() / max(1, ((kinds == 0) | (kinds == 1)).sum())),
    })
    return out


def predict(model, examples, offset: int, batch_size: int = 64, device: str = "cpu") -> np.ndarray:
    """Arg-max over the whole vocabulary at every query position, in task tokens ``[n, N]``."""
    import torch

    model.eval()
    preds = []
    with torch.no_grad():
        for s in range(0, examples.inputs.shape[0], batch_size):
            src = torch.from_numpy(examples.inputs[s : s + batch_size].astype(np.int64) + offset).to(device)
            pos = torch.from_numpy(examples.query_positions[s : s + batch_size]).to(device)
            logits, _ = model(src)
            at = torch.gather(logits, 1, pos[:, :, None].expand(-1, -1, logits.size(-1)))
            preds.append((at.argmax(-1) - offset).cpu().numpy())
    return np.concatenate(preds)


def load_checkpoint(path: str, device: str = "cpu"):
    """(model, task config) of a fairseq ``--task mqar`` checkpoint."""
    import hgrn_fairseq
    hgrn_fairseq.register()  # the task, model and criterion
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"user_dir": os.path.join(REPO, "hgrn_fairseq")})
    if cfg.task._name != "mqar":
        raise SystemExit(f"{path}: a checkpoint of task {cfg.task._name!r}, expected mqar")
    return models[0].to(device), cfg.task


def format_report(rep: Dict) -> str:
    lines = [f"{rep['examples']} held-out examples, seq {rep['seq_len']}, {rep['num_kv_pairs']} pairs"]
    b = rep["baselines"]
    lines.append(f"baselines: elimination {b['elimination']:.2f}%  bag {b['bag']:.2f}%")
    if "accuracy" in rep:
        lines.append(f"model accuracy {rep['accuracy']:.2f}%; answers: "
                     + ", ".join(f"{k} {v:.1f}%" for k, v in rep["answer_kinds"].items()))
        lines.append(f"right among guesses of unshown values: {rep['right_among_unshown_guesses']:.1f}%")
        lines.append("by query rank (model / elimination): " + ", ".join(
            f"{g['group']}: {g['accuracy']:.0f}/{e:.0f}" for g, e in zip(rep["by_rank"], rep["elimination_by_rank"])))
        lines.append("by pair index of the key: " + ", ".join(f"{g['group']}: {g['accuracy']:.0f}" for g in rep["by_pair_index"]))
        lines.append("by key-query distance: " + ", ".join(
            f"{g['group']}: {g['accuracy']:.0f} (n {g['count']})" for g in rep["by_distance"]))
    else:
        lines.append("elimination by query rank: " + ", ".join(f"{e:.0f}" for e in rep["elimination_by_rank"]))
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="", help="fairseq checkpoint of --task mqar (default: baselines only)")
    p.add_argument("--examples", type=int, default=0, help="held-out examples to use (default: the task's test size)")
    p.add_argument("--json", default="", help="also write the report here")
    p.add_argument("--device", default="cpu")
    # the data, when there is no checkpoint to read them from
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--num-kv-pairs", type=int, default=16)
    p.add_argument("--test-size", type=int, default=3000)
    p.add_argument("--data-seed", type=int, default=1)
    p.add_argument("--power-a", type=float, default=0.01)
    p.add_argument("--reveal-answers", action="store_true", help="the leaking layout (value after each query)")
    args = p.parse_args(argv)

    from hgrn_fairseq.tasks.mqar import generate_mqar

    model = None
    if args.checkpoint:
        model, tcfg = load_checkpoint(args.checkpoint, args.device)
        opts = dict(vocab_size=tcfg.vocab_size, seq_len=tcfg.seq_len, num_kv_pairs=tcfg.num_kv_pairs,
                    seed=tcfg.data_seed, power_a=tcfg.power_a,
                    reveal_answers=bool(tcfg.reveal_answers))
        n = args.examples or tcfg.test_size
    else:
        opts = dict(vocab_size=args.vocab_size, seq_len=args.seq_len, num_kv_pairs=args.num_kv_pairs,
                    seed=args.data_seed, power_a=args.power_a, reveal_answers=args.reveal_answers)
        n = args.examples or args.test_size
    examples = generate_mqar(n, split="test", **opts)
    preds = None
    if model is not None:
        from hgrn_fairseq.tasks.mqar import build_mqar_dictionary

        preds = predict(model, examples, build_mqar_dictionary(opts["vocab_size"]).nspecial, device=args.device)
    rep = report(preds, examples, opts["vocab_size"])
    rep["options"] = opts
    if args.checkpoint:
        rep["checkpoint"] = args.checkpoint
    print(format_report(rep))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
