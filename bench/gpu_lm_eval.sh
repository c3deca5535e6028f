#!/usr/bin/env bash
# GPU evidence for the zero-shot evaluation (hgrn_fairseq/evaluation/lm_eval.py), run by
# bench/gpu_session.sh (stage lm_eval) with fairseq on the PYTHONPATH and lm_eval in .whl/lm_eval_site:
#   1. scripts/lm_evidence.sh trains hgrn_lm_base and the Transformer on its offline corpus (short budget);
#   2. a local multiple-choice task from the corpus's held-out split cut into 32-word windows: a window's first
#      24 words, and its true last 8 words against the last 8 words of 3 other windows (chance 25%);
#   3. python -m hgrn_fairseq.evaluation.lm_eval on that task, on CUDA, fp32 and bf16, per model.
# Environment: ZS_MAX_UPDATE [800] ZS_TRAIN_MINUTES [2] ZS_DOCS [400] ZS_MODELS [hgrn_lm_base,transformer_lm_wt103_small]
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
