#!/usr/bin/env bash
# GPU evidence for the zero-shot evaluation (hgrn_fairseq/evaluation/lm_eval.py), run by
# bench/gpu_session.sh (stage lm_eval) with fairseq on the PYTHONPATH and lm_eval in .whl/lm_eval_site:
#   1. scripts/lm_evidence.sh trains hgrn_lm_base and the Transformer on its offline corpus (short budget);
#   2. a local multiple-choice task from the corpus's held-out split cut into 32-word windows: a window's first
#      24 words, and its true last 8 words against the last 8 words of 3 other windows (chance 25%);
#   3. python -m hgrn_fairseq.evaluation.lm_eval on that task, on CUDA, fp32 and bf16, per model;
#   4. per model, $OUT/state_<model>.json: loglikelihood_rolling of the first ZS_ROLL_TOKENS tokens of the held-out
#      split in 8 chunks with the recurrent state carried against one full forward (fp32), and ms per generated
#      token of the path generate_until takes, after a 16-token and a long prefix, fp32 and bf16 (O(1) per token
#      for the recurrent model; the Transformer re-reads up to its 512 positions).
# Expected: a few minutes on one GPU (training 2 x 2 minutes in parallel, the rest under a minute).
# Environment: ZS_MAX_UPDATE [800] ZS_TRAIN_MINUTES [2] ZS_DOCS [400] ZS_MODELS [hgrn_lm_base,transformer_lm_wt103_small]
#   ZS_ROLL_TOKENS [8192]
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}"
W=/tmp/zs_evidence
# lm-evaluation-harness and what it needs beyond the machine's packages (wheels and two sdists in
# .whl/lm_eval/; pyarrow, 55 MB, must already be on the machine)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site3 .whl/lm_eval/* > "$OUT/lm_eval_install.log" 2>&1
echo "lm_eval install rc=$?"
export PYTHONPATH=$PYTHONPATH:/tmp/site3
python3 -c "import pyarrow, lm_eval, datasets; print('pyarrow', pyarrow.__version__, 'lm_eval', lm_eval.__version__, 'datasets', datasets.__version__)" || exit 3
MODELS=${ZS_MODELS:-hgrn_lm_base,transformer_lm_wt103_small}
WORKDIR=$W OUT=$OUT/evidence MODELS=$MODELS MAX_UPDATE=${ZS_MAX_UPDATE:-800} TRAIN_MINUTES=${ZS_TRAIN_MINUTES:-2} \
  LENGTHS=512,2048 CORPUS_BYTES=30000000 bash scripts/lm_evidence.sh > "$OUT/lm_evidence.log" 2>&1
echo "lm_evidence rc=$?"; tail -15 "$OUT/lm_evidence.log"
python3 - "$W/corpus/test.txt" "$W/tasks" "${ZS_DOCS:-400}" <<'PY'
import json, os, random, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = open(src, encoding="utf-8", errors="replace").read().split()
docs = [words[i:i + 32] for i in range(0, len(words) - 32, 32)]  # consecutive 32-word windows of the split
rng = random.Random(0)
rng.shuffle(docs)
docs = docs[:n]
items = []
for i, d in enumerate(docs):
    others = rng.sample([j for j in range(len(docs)) if j != i], 3)
    choices = [" " + " ".join(d[24:32])] + [" " + " ".join(docs[j][24:32]) for j in others]
    label = rng.randrange(4)
    choices[0], choices[label] = choices[label], choices[0]
    items.append({"context": " ".join(d[:24]), "choices": choices, "label": label})
from hgrn_fairseq.evaluation.lm_eval import write_local_multiple_choice_task
write_local_multiple_choice_task(out, "heldout_continuation", items)
print(f"local task: {len(docs)} documents of the held-out split")
PY
for m in $(echo "$MODELS" | tr ',' ' '); do
  for dtype in fp32 bf16; do
    python3 -m hgrn_fairseq.evaluation.lm_eval --path "$W/checkpoints/$m/checkpoint_last.pt" --data "$W/data-bin" \
      --tasks heldout_continuation --include-path "$W/tasks" --device cuda --dtype "$dtype" --batch-size 32 \
      --output "$OUT/${m}_${dtype}.json" 2>&1 | grep -v Warning | tail -4
    echo "$m $dtype rc=${PIPESTATUS[0]}"
  done
done
cat > /tmp/zs_state_check.py <<'PY'
# argv: CKPT DATA TEXT OUT_JSON DEVICE TOKENS
# (1) rolling log-likelihood of a long held-out document in chunks with the state carried, against one
#     full forward of the whole document (fp32); (2) ms per generated token of the incremental path after
#     a short and a long prefix, fp32 and bf16 (O(1) per token for a recurrent model).
import json, sys, time
import torch
from hgrn_fairseq.evaluation.lm_eval import HgrnFairseqLM
ckpt, data, text_path, out, device, n_tokens = sys.argv[1:7]
n_tokens = int(n_tokens)
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
text = open(text_path, encoding="utf-8", errors="replace").read()
report = {"checkpoint": ckpt, "device": device}
m = HgrnFairseqLM(path=ckpt, data=data, device=device, rolling_chunk=max(1, n_tokens // 8))
ids = m.tok_encode(text)[:n_tokens]
report["recurrent"], report["max_length"], report["tokens"] = m.recurrent, m.max_length, len(ids)
if m.recurrent:
    rolled = m.rolling_log_likelihood(ids)
    with torch.no_grad():
        logits = m.model(torch.tensor([[m.eot_token_id] + ids[:-1]], device=device))[0][0]
    full = logits.float().log_softmax(-1).gather(-1, torch.tensor(ids, device=device)[:, None]).sum().item()
    report["rolling"] = {"chunk": m.rolling_chunk, "carried_state": rolled, "one_forward": full,
                         "rel_diff": abs(rolled - full) / abs(full), "ppl": float(torch.tensor(-full / len(ids)).exp())}
steps = 64
for dtype in (["fp32", "bf16"] if device.startswith("cuda") else ["fp32"]):
    mm = m if dtype == "fp32" else HgrnFairseqLM(path=ckpt, data=data, device=device, dtype="bf16")
    for prefix_len in (16, max(16, mm.max_length - steps - 1) if mm.max_length else len(ids)):
        prefix = [mm.eot_token_id] + ids[:prefix_len]
        state = {} if mm.recurrent else None
        logits = mm._logits(torch.tensor([prefix], device=device), incremental_state=state)
        nxt, seq = int(logits[0, -1].argmax()), list(prefix)
        sync(); t0 = time.perf_counter()
        for _ in range(steps):
            seq.append(nxt)
            if mm.recurrent:
                logits = mm._logits(torch.tensor([[nxt]], device=device), incremental_state=state, continue_stream=True)
            else:
                logits = mm._logits(torch.tensor([seq[-mm.max_length:]], device=device))
            nxt = int(logits[0, -1].argmax())
        sync()
        report[f"ms_per_token_{dtype}_after_{prefix_len}"] = 1000 * (time.perf_counter() - t0) / steps
json.dump(report, open(out, "w"), indent=1)
print(json.dumps(report))
PY
for m in $(echo "$MODELS" | tr ',' ' '); do
  python3 /tmp/zs_state_check.py "$W/checkpoints/$m/checkpoint_last.pt" "$W/data-bin" "$W/corpus/test.txt" \
    "$OUT/state_$m.json" cuda "${ZS_ROLL_TOKENS:-8192}" 2>&1 | grep -v Warning | tail -2
  echo "$m state check rc=${PIPESTATUS[0]}"
done
