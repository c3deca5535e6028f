#!/usr/bin/env bash
# MQAR sweep of the HGRN2 paper's Fig. 3 (SPEC 9): HGRN1 vs HGRN2, 2 layers, no MLP, no positions,
# d in DIMS x learning rates in LRS, for each SEQ_LEN:KV_PAIRS in SETTINGS. Writes OUT/runs.csv,
# OUT/table.md and OUT/plot.png (rewritten after every run), plus per-run logs under OUT/logs.
#
# Every knob is an environment variable (defaults in brackets); extra arguments go to
# scripts/mqar_sweep.py (e.g. --dry-run, --force, --report-only, --run-timeout 120):
#   OUT [results/mqar]  SETTINGS [256:16,512:64]  MODELS [hgrn1,hgrn2]  DIMS [64,128,256,512]
#   LRS [1e-4,5e-4,1e-3,5e-3]  EXPAND [64,128: HGRN2 expand ratios, each where <= d]
#   SEEDS [1]: model seeds; the grid runs once per seed, each cell shows its best run over them (runs of
#       seed 1 keep their names, others end in _sN, so SEEDS=1,2 adds seed 2 to a finished seed-1 sweep)
#   VOCAB_SIZE [8192]  TRAIN_SIZE [100000]  TEST_SIZE [3000]
#   BATCH_SIZE [64]: one value or one per setting (the paper: 256,64)
#   EPOCHS [32]: epochs per run, one value or one per setting (EPOCHS=6,3 with SETTINGS=256:16,512:64)
#   MAX_UPDATE [none]: updates per run, one value or one per setting; overrides EPOCHS (the cosine
#       schedule and its warm-up span it)
#   VALIDATE_EVERY [0: end of each epoch only]: also validate every N updates, so that a run cut by
#       --run-timeout still has accuracies on record (its cell shows the best one, marked *)
#   CKPT_EVERY [1000]: each run saves OUT/checkpoints/<run>/checkpoint_last.pt every N updates; 0: none
#   SLICE_S [none]: this call's seconds; runs still going then stop with a checkpoint ('paused') and the
#       same command later continues them (docs/mqar.md)
#   REVEAL_ANSWERS [0]: 1 = the task's pre-issue-25 layout (answers shown after the queries; leaks)
#   JOBS [1]: runs at the same time; on GPU each gets OMP_NUM_THREADS = CPU cores / JOBS
#   GPUS [every visible GPU]: GPUs the runs are spread over, each run on the least-loaded one
#   TIME_BUDGET [none: seconds before no new run starts]  FAIRSEQ_ARGS [none: extra fairseq-train arguments]
#
# The table and plot of a finished (or partial) sweep come back from its results files alone:
#   OUT=bench/results/<sweep folder> bash scripts/run_mqar.sh --report-only
# (with the grid variables of the sweep; the folder's runs/*.json are the results).
#
# The defaults are the paper-scale sweep (100k examples, 32 epochs, 4 learning rates): hours on one GPU.
# bench/gpu_mqar.sh runs it in slices of one GPU call each (docs/mqar.md gives the commands).
#
# Reduced sweep of 2026-11-21 (4 H200s in one 10-minute call; the pre-issue-25 task layout):
#   OUT=$OUT/mqar TRAIN_SIZE=100000 MAX_UPDATE=4000,3000 LRS=1e-3,3e-3 EXPAND= REVEAL_ANSWERS=1 GPUS=4 \
#     JOBS=32 VALIDATE_EVERY=500 CKPT_EVERY=0 bash scripts/run_mqar.sh --run-timeout 370
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
args=(
  --out "${OUT:-results/mqar}"
  --settings "${SETTINGS:-256:16,512:64}"
  --models "${MODELS:-hgrn1,hgrn2}"
  --dims "${DIMS:-64,128,256,512}"
  --lrs "${LRS:-1e-4,5e-4,1e-3,5e-3}"
  --seeds "${SEEDS:-1}"
  --hgrn2-expand "${EXPAND-64,128}"
  --vocab-size "${VOCAB_SIZE:-8192}"
  --train-size "${TRAIN_SIZE:-100000}"
  --test-size "${TEST_SIZE:-3000}"
  --epochs "${EPOCHS:-32}"
  --batch-size "${BATCH_SIZE:-64}"
  --jobs "${JOBS:-1}"
  --validate-interval-updates "${VALIDATE_EVERY:-0}"
  --checkpoint-every "${CKPT_EVERY:-1000}"
)
if [[ -n "${SLICE_S:-}" ]]; then args+=(--slice-s "$SLICE_S"); fi
if [[ "${REVEAL_ANSWERS:-0}" == 1 ]]; then args+=(--reveal-answers); fi
if [[ -n "${MAX_UPDATE:-}" ]]; then args+=(--max-update "$MAX_UPDATE"); fi
if [[ -n "${GPUS:-}" ]]; then args+=(--gpus "$GPUS"); fi
if [[ -n "${TIME_BUDGET:-}" ]]; then args+=(--time-budget "$TIME_BUDGET"); fi
if [[ -n "${FAIRSEQ_ARGS:-}" ]]; then args+=("--fairseq-args=$FAIRSEQ_ARGS"); fi  # (= form: the value starts with --)
exec "$PYTHON" scripts/mqar_sweep.py "${args[@]}" "$@"
