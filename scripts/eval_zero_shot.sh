#!/usr/bin/env bash
# Zero-shot evaluation of a trained checkpoint on the HGRN paper's task lists (Tables 4 and 5) with
# lm-evaluation-harness (the [eval] extra), through hgrn_fairseq/evaluation/lm_eval.py.
#
#   bash scripts/eval_zero_shot.sh CKPT DATA_DIR [extra arguments of python -m hgrn_fairseq.evaluation.lm_eval]
#
# Runs the commonsense list (boolq, piqa, hellaswag, winogrande, arc_easy, arc_challenge, openbookqa: Table 4)
# and the SuperGLUE list (wsc, wic, rte, cb, multirc, boolq, copa: Table 5; BoolQ is in both tables, so it is
# scored twice); prints a table per list in the papers' layout (a column per task and AVG; rows: acc and
# acc_norm as the harness reports them, then the papers' rows: hgrn_fairseq/evaluation/lm_eval.py, PAPER_HGRN)
# and writes OUT_DIR/{commonsense,superglue}.json (results, the table, the model's info and token counts).
# Offline by default: the tasks' data must be in the local Hugging Face cache (the error names a task whose
# data are not); --online lets the datasets library download.
# Environment: OUT_DIR [zero_shot_results]  PYTHON [python3]  TASK_LISTS [commonsense,superglue]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
die() { echo "eval_zero_shot.sh: error: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: bash scripts/eval_zero_shot.sh CKPT DATA_DIR [extra arguments]"
CKPT=$1 DATA=$2
shift 2
[ -f "$CKPT" ] || die "checkpoint $CKPT not found: pass the .pt file fairseq-train wrote"
[ -f "$DATA/dict.txt" ] || die "$DATA/dict.txt not found: pass the data directory the model was trained on"
OUT_DIR=${OUT_DIR:-zero_shot_results}
mkdir -p "$OUT_DIR"
for list in $(echo "${TASK_LISTS:-commonsense,superglue}" | tr ',' ' '); do
    case $list in
        commonsense) TASKS=boolq,piqa,hellaswag,winogrande,arc_easy,arc_challenge,openbookqa ;;
        superglue) TASKS=wsc,wic,rte,cb,multirc,boolq,copa ;;
        *) die "TASK_LISTS: '$list' is not commonsense or superglue" ;;
    esac
    echo "== $list: $TASKS"
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m hgrn_fairseq.evaluation.lm_eval --path "$CKPT" \
        --data "$DATA" --tasks "$TASKS" --output "$OUT_DIR/$list.json" "$@"
done
