#!/usr/bin/env bash
# Train and test an HGRN / HGRN2 classifier on one Long Range Arena task with the paper's recipe.
#
#   bash scripts/train_lra.sh TASK MODEL [DATA_DIR] [extra fairseq-train args...]
#   bash scripts/train_lra.sh --dry-run TASK MODEL ...     # print the commands, run nothing
#
# TASK: listops | text | retrieval | image | pathfinder | pathx.  MODEL: hgrn1 | hgrn2.
# DATA_DIR defaults to data-bin/lra/TASK (what data_prep/prepare_lra.py writes).
# The recipe (scripts/lra_recipes.py; also configs/lra/TASK_MODEL.yaml for fairseq-hydra-train): arch
# MODEL_lra_TASK, AdamW, linear warm-up then cosine to 0, the paper's lr / weight decay / warm-up /
# total updates / epochs / total batch / clipping, seed 2222; HGRN1 fp32, HGRN2 bf16.
# Best checkpoint by validation accuracy; at the end the best checkpoint is scored on the test split
# (scripts/lra_eval.py: every example, printed, SAVE_DIR/test_result.json) and the results table beside
# the papers' numbers is rewritten (scripts/lra_results.py: RESULTS_DIR/results.md and results.csv).
# Extra arguments go to fairseq-train after the recipe's, so they override it.
#
# Environment:
#   NUM_GPUS        GPUs (default: all visible; 0 = CPU). One process per GPU through torchrun; the
#                   recipe's total batch is split over them (it must divide).
#   BATCH_PER_GPU   sequences per forward/backward per GPU (default: the whole per-GPU share; smaller
#                   values accumulate gradients with --update-freq)
#   MAX_UPDATE      a shorter run than the paper's: warm-up scaled by
#                   MAX_UPDATE / total, cosine to 0 at MAX_UPDATE, no epoch cap. The test JSON and the
#                   results table say how many updates ran.
#   SCHEDULE        with MAX_UPDATE: compress (default, as above) or truncate: the paper's own warm-up and
#                   cosine, stopped at MAX_UPDATE (every update at the paper's learning rate: the run is the
#                   paper's first MAX_UPDATE updates; rerun with a larger MAX_UPDATE, it goes on at the
#                   paper's rates). Pathfinder needs truncate (docs/lra.md, "The learning rate").
#   TRAIN_MINUTES   stop training after this many minutes (fairseq --stop-time-hours; the schedule is
#                   not shortened: set MAX_UPDATE to what fits). The JSON says how many updates ran.
#   SAVE_INTERVAL_UPDATES  checkpoint (and validate) every N updates as well as every epoch (default 1000)
#   SAVE_DIR        checkpoints (default checkpoints/lra/TASK_MODEL); LOG_DIR (default SAVE_DIR/logs):
#                   train.log, command.txt, tensorboard/
#   RESULTS_DIR     where results.md / results.csv are written (default: the parent of SAVE_DIR)
#   NUM_WORKERS     data-loading workers per process (default 2; 0 on CPU)
#   OMP_NUM_THREADS on CPU 1 unless set (PyTorch's default thread pool makes these small models several
#                   times slower)
#   NO_EOS=1        token tasks: no <eos> after each sequence (the recipe appends one, as the official data
#                   do; docs/lra.md). An ablation: its checkpoints record it, evaluation follows them.
#   SKIP_TEST=1     train only.  PYTHON: interpreter (default python3).
# Resume: rerun the same command; fairseq continues from SAVE_DIR/checkpoint_last.pt. A run that reached
# its --max-update leaves SAVE_DIR/finished_max_update_N, and a rerun only redoes the test evaluation.
# A run stopped by TRAIN_MINUTES stops again at once when rerun (fairseq counts the training time in the
# checkpoint): raise TRAIN_MINUTES to continue it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
TASKS="listops text retrieval image pathfinder pathx"
MODELS="hgrn1 hgrn2"

die() {
    echo "train_lra.sh: error: $*" >&2
    exit 2
}
. "$REPO/scripts/gpu_count.sh"  # count_gpus
note() { echo "train_lra.sh: $*" >&2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
positive() { case "$2" in '' | 0 | *[!0-9]*) die "$1='$2' must be a positive whole number" ;; esac; }

DRY_RUN=0
ARGS=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) usage; exit 0 ;;
        *) ARGS+=("$arg") ;;
    esac
done
set -- ${ARGS[@]+"${ARGS[@]}"}

[ $# -ge 2 ] || die "usage: bash scripts/train_lra.sh TASK MODEL [DATA_DIR] [fairseq args] (TASK: $TASKS; MODEL: $MODELS)"
TASK=$1
MODEL=$2
shift 2
case " $TASKS " in *" $TASK "*) ;; *) die "unknown TASK '$TASK': use one of: $TASKS" ;; esac
case " $MODELS " in *" $MODEL "*) ;; *) die "unknown MODEL '$MODEL': use hgrn1 or hgrn2" ;; esac
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
    DATA_DIR=$(absolute "$1")
    shift
else
    DATA_DIR="$REPO/data-bin/lra/$TASK"
fi
EXTRA=("$@")
has_extra() {
    local flag
    for flag in ${EXTRA[@]+"${EXTRA[@]}"}; do [ "$flag" = "$1" ] && return 0; done
    return 1
}

# ---- processes -------------------------------------------------------------------------------
if has_extra --cpu; then
    NPROC=1
    DEVICE=cpu
else
    count_gpus
    if [ "$NGPU" -eq 0 ]; then
        note "note: no GPU: training on CPU (slow; for tests and smoke runs)"
        NPROC=1
        DEVICE=cpu
        EXTRA+=(--cpu)
    else
        NPROC=$NGPU
        DEVICE=cuda
    fi
fi
CPU_ENV=()  # what the CPU processes run with, printed with the commands
if [ "$DEVICE" = cpu ]; then
    cpu_threads  # (scripts/gpu_count.sh)
    CPU_ENV=(env "OMP_NUM_THREADS=$OMP_NUM_THREADS")
fi

RECIPE_OPTS=(--nproc "$NPROC")
if [ -n "${MAX_UPDATE:-}" ]; then positive MAX_UPDATE "$MAX_UPDATE"; RECIPE_OPTS+=(--max-update "$MAX_UPDATE"); fi
if [ -n "${BATCH_PER_GPU:-}" ]; then positive BATCH_PER_GPU "$BATCH_PER_GPU"; RECIPE_OPTS+=(--batch-per-gpu "$BATCH_PER_GPU"); fi
case "${NO_EOS:-0}" in 0) ;; 1) RECIPE_OPTS+=(--no-eos) ;; *) die "NO_EOS='$NO_EOS' must be 0 or 1" ;; esac
case "${SCHEDULE:-compress}" in
    compress) ;;
    truncate) [ -n "${MAX_UPDATE:-}" ] || die "SCHEDULE=truncate needs MAX_UPDATE (a run of the full recipe has nothing to truncate)"
              RECIPE_OPTS+=(--truncate) ;;
    *) die "SCHEDULE='$SCHEDULE' must be compress or truncate" ;;
esac
RECIPE_LINE=$(PYTHONPATH="$REPO/scripts" "$PYTHON" "$REPO/scripts/lra_recipes.py" args "$TASK" "$MODEL" "${RECIPE_OPTS[@]}" 2>&1) ||
    die "${RECIPE_LINE#lra_recipes.py: error: }"
eval "RECIPE_ARGS=($RECIPE_LINE)"

SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-1000}
positive SAVE_INTERVAL_UPDATES "$SAVE_INTERVAL_UPDATES"
if [ "$DEVICE" = cpu ]; then NUM_WORKERS=${NUM_WORKERS:-0}; else NUM_WORKERS=${NUM_WORKERS:-2}; fi
SAVE_DIR=$(absolute "${SAVE_DIR:-$REPO/checkpoints/lra/${TASK}_${MODEL}}")
LOG_DIR=$(absolute "${LOG_DIR:-$SAVE_DIR/logs}")
RESULTS_DIR=$(absolute "${RESULTS_DIR:-$(dirname "$SAVE_DIR")}")
STOP_ARGS=()
if [ -n "${TRAIN_MINUTES:-}" ]; then
    case "$TRAIN_MINUTES" in '' | *[!0-9.]* | *.*.*) die "TRAIN_MINUTES='$TRAIN_MINUTES' must be a number of minutes" ;; esac
    STOP_ARGS=(--stop-time-hours "$(awk "BEGIN { printf \"%.6f\", $TRAIN_MINUTES / 60 }")")
fi
RUN_ARGS=(
    ${STOP_ARGS[@]+"${STOP_ARGS[@]}"}
    --user-dir "$REPO/hgrn_fairseq" --distributed-world-size "$NPROC" --num-workers "$NUM_WORKERS"
    --save-dir "$SAVE_DIR" --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates 1
    --no-epoch-checkpoints
    --log-format simple --log-interval 100 --log-file "$LOG_DIR/train.log" --tensorboard-logdir "$LOG_DIR/tensorboard"
)
if [ "$NPROC" -gt 1 ]; then
    LAUNCH=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$REPO/scripts/fairseq_train.py")
else
    LAUNCH=("$PYTHON" "$REPO/scripts/fairseq_train.py")
fi
TRAIN=("${LAUNCH[@]}" "$DATA_DIR" "${RECIPE_ARGS[@]}" "${RUN_ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"})
EVAL=("$PYTHON" "$REPO/scripts/lra_eval.py" "$SAVE_DIR/checkpoint_best.pt" --data "$DATA_DIR" --split test
    --json "$SAVE_DIR/test_result.json")
if [ "$DEVICE" = cpu ]; then EVAL+=(--cpu); fi
RESULTS=("$PYTHON" "$REPO/scripts/lra_results.py" "$RESULTS_DIR")

note "$TASK / $MODEL ($MODEL""_lra_$TASK) on $NPROC $DEVICE process(es); data $DATA_DIR"
note "recipe: ${RECIPE_ARGS[*]}"
note "checkpoints: $SAVE_DIR (rerun to resume); logs: $LOG_DIR"
if [ "$DRY_RUN" -eq 1 ]; then
    printf '%q ' ${CPU_ENV[@]+"${CPU_ENV[@]}"} "${TRAIN[@]}"; echo
    printf '%q ' ${CPU_ENV[@]+"${CPU_ENV[@]}"} "${EVAL[@]}"; echo
    printf '%q ' "${RESULTS[@]}"; echo
    exit 0
fi

prepare_hint() {  # commands that make DATA_DIR: from the task's archive, or (ListOps, Pathfinder) from a generator
    local here dest src hint
    here=$(printf '%q' "$REPO/"); [ "$PWD" = "$REPO" ] && here=
    dest=$(printf '%q' "$DATA_DIR")
    case $TASK in text) src=aclImdb_v1.tar.gz ;; image) src=cifar-10-python.tar.gz ;; *) src=lra_release.gz ;; esac
    hint="python ${here}data_prep/prepare_lra.py $TASK --source ~/data/$src --dest $dest"
    case $TASK in
        listops) hint+="; offline: python ${here}data_prep/lra_listops.py --dest data/lra_generated && python ${here}data_prep/prepare_lra.py listops --source data/lra_generated --dest $dest" ;;
        pathfinder) hint+="; offline: python ${here}data_prep/lra_pathfinder.py --dest data/lra_generated --num 200000 && python ${here}data_prep/prepare_lra.py pathfinder --source data/lra_generated --dest $dest" ;;
    esac
    echo "$hint"
}
[ -d "$DATA_DIR" ] || die "DATA_DIR $DATA_DIR does not exist: prepare it with: $(prepare_hint) (docs/lra.md; or pass the prepared folder as the third argument)"
# fairseq-train restarted after a run that reached --max-update makes one more update before it notices:
# a finished run leaves a mark, and a rerun goes straight to the test evaluation.
PLANNED=""
for ((i = 0; i < ${#TRAIN[@]} - 1; i++)); do [ "${TRAIN[$i]}" = --max-update ] && PLANNED=${TRAIN[$((i + 1))]}; done
DONE_MARK="$SAVE_DIR/finished_max_update_$PLANNED"
if [ -f "$DONE_MARK" ]; then
    note "training already reached --max-update $PLANNED ($DONE_MARK): going to the test evaluation (delete the mark to train on)"
else
    CHECK=$("$PYTHON" -m hgrn_fairseq.tasks.lra_format validate "$DATA_DIR" 2>&1) ||
        die "$(echo "$CHECK" | grep -v -i 'warn\|INFO' | tail -5)"
    note "data: $(echo "$CHECK" | tail -1)"
    mkdir -p "$SAVE_DIR" "$LOG_DIR"
    {
        printf '# %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        printf '%q ' ${CPU_ENV[@]+"${CPU_ENV[@]}"} "${TRAIN[@]}"; echo
    } >>"$LOG_DIR/command.txt"
    "${TRAIN[@]}"
    if grep -q "Stopping training due to num_updates: [0-9]* >= max_update: $PLANNED\$" "$LOG_DIR/train.log" 2>/dev/null; then
        date -u +%Y-%m-%dT%H:%M:%SZ >"$DONE_MARK"
    fi
fi
if [ "${SKIP_TEST:-0}" = 1 ]; then
    note "SKIP_TEST=1: no test evaluation"
    exit 0
fi
"${EVAL[@]}"
"${RESULTS[@]}"
