#!/usr/bin/env bash
# MQAR sweep of the HGRN2 paper's Fig. 3 (SPEC 9): HGRN1 vs HGRN2, 2 layers, no MLP, no positions,
# d in DIMS x learning rates in LRS, for each SEQ_LEN:KV_PAIRS in SETTINGS. Writes OUT/runs.csv,
# OUT/table.md and OUT/plot.png (rewritten after every run), plus per-run logs under OUT/logs.
#
# Every knob is an environment variable (defaults in brackets); extra arguments go to
# scripts/mqar_sweep.py (e.g. --dry-run, --force, --report-only, --run-timeout 120):
#   OUT [results/mqar]  SETTINGS [256:16,512:64]  MODELS [hgrn1,hgrn2]  DIMS [64,128,256,512]
#   LRS [1e-4,3e-4,1e-3,3e-3]  VOCAB_SIZE [8192]  TRAIN_SIZE [100000]  TEST_SIZE [3000]  BATCH_SIZE [64]
#   EPOCHS [32]: epochs per run, one value or one per setting (EPOCHS=6,3 with SETTINGS=256:16,512:64)
#   MAX_UPDATE [none]: updates per run, one value or one per setting; overrides EPOCHS (the cosine
#       schedule and its warm-up span it)
#   VALIDATE_EVERY [0: end of each epoch only]: also validate every N updates, so that a run cut by
#       --run-timeout still has accuracies on record (its cell shows the best one, marked *)
#   JOBS [1]: runs at the same time; on GPU each gets OMP_NUM_THREADS = CPU cores / JOBS
#   GPUS [every visible GPU]: GPUs the runs are spread over, each run on the least-loaded one
#   TIME_BUDGET [none: seconds before no new run starts]  FAIRSEQ_ARGS [none: extra fairseq-train arguments]
#
# The defaults are the paper-scale sweep (100k examples, 32 epochs, 4 learning rates): hours on one GPU.
#
# Reduced sweep for 4 H200s in one 10-minute call (the two settings issue 4 requires, 32 runs at once,
# 8 per GPU, 2 CPU threads each on 64 cores):
#   OUT=$OUT/mqar TRAIN_SIZE=100000 MAX_UPDATE=4000,3000 LRS=1e-3,3e-3 GPUS=4 JOBS=32 VALIDATE_EVERY=500 \
#     bash scripts/run_mqar.sh --run-timeout 370
# (bench/gpu_checks.sh mqar runs it with MQAR_* variables, optionally under CUDA MPS.) The budget is a
# guess: the last sweep (16 runs sharing one H200, 4 threads each on 16 cores) did ~8-9 updates/s per
# run; 4000 updates need ~12/s in the ~330 s a run has after its start-up. Runs that do not finish
# are cut at --run-timeout and shown with the best accuracy seen (*); every run records its updates/s
# (runs.csv, updates_per_s) to size the next sweep. Either way this is far less training than the
# paper's (Zoology: 64 epochs of 100k examples): a first look, not the reproduction.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
args=(
  --out "${OUT:-results/mqar}"
  --settings "${SETTINGS:-256:16,512:64}"
  --models "${MODELS:-hgrn1,hgrn2}"
  --dims "${DIMS:-64,128,256,512}"
  --lrs "${LRS:-1e-4,3e-4,1e-3,3e-3}"
  --vocab-size "${VOCAB_SIZE:-8192}"
  --train-size "${TRAIN_SIZE:-100000}"
  --test-size "${TEST_SIZE:-3000}"
  --epochs "${EPOCHS:-32}"
  --batch-size "${BATCH_SIZE:-64}"
  --jobs "${JOBS:-1}"
  --validate-interval-updates "${VALIDATE_EVERY:-0}"
)
if [[ -n "${MAX_UPDATE:-}" ]]; then args+=(--max-update "$MAX_UPDATE"); fi
if [[ -n "${GPUS:-}" ]]; then args+=(--gpus "$GPUS"); fi
if [[ -n "${TIME_BUDGET:-}" ]]; then args+=(--time-budget "$TIME_BUDGET"); fi
if [[ -n "${FAIRSEQ_ARGS:-}" ]]; then args+=("--fairseq-args=$FAIRSEQ_ARGS"); fi  # (= form: the value starts with --)
exec "$PYTHON" scripts/mqar_sweep.py "${args[@]}" "$@"
