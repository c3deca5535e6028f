#!/usr/bin/env bash
# The MQAR sweep of the HGRN2 paper's Fig. 3 (HGRN1 vs HGRN2 over width and learning rate) through
# scripts/mqar_sweep.py, configured by environment variables. `bash scripts/run_mqar.sh --help` lists them.
# Without --yes it prints the sweep's size and starts nothing (the default grid is 88 paper-scale runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# Defaults of the variables (the usage below prints them; mqar_sweep.py has the same ones)
D_OUT=results/mqar D_SETTINGS=256:16,512:64 D_MODELS=hgrn1,hgrn2 D_DIMS=64,128,256,512
D_LRS=1e-4,5e-4,1e-3,5e-3 D_EXPAND=64,128 D_SEEDS=1 D_VOCAB_SIZE=8192 D_TRAIN_SIZE=100000 D_TEST_SIZE=3000
D_EPOCHS=32 D_BATCH_SIZE=64 D_JOBS=1 D_VALIDATE_EVERY=0 D_CKPT_EVERY=1000

sweep_args() {  # the sweep's arguments from the environment (or, with "defaults", from the defaults alone)
  if [[ "${1:-}" == defaults ]]; then
    local OUT= SETTINGS= MODELS= DIMS= LRS= SEEDS= VOCAB_SIZE= TRAIN_SIZE= TEST_SIZE= EPOCHS= BATCH_SIZE= JOBS= \
      VALIDATE_EVERY= CKPT_EVERY= SLICE_S= REVEAL_ANSWERS= MAX_UPDATE= GPUS= TIME_BUDGET= FAIRSEQ_ARGS= EXPAND
    unset EXPAND  # (unset, not empty: empty means no expand ratio)
  fi
  args=(
    --out "${OUT:-$D_OUT}"
    --settings "${SETTINGS:-$D_SETTINGS}"
    --models "${MODELS:-$D_MODELS}"
    --dims "${DIMS:-$D_DIMS}"
    --lrs "${LRS:-$D_LRS}"
    --seeds "${SEEDS:-$D_SEEDS}"
    --hgrn2-expand "${EXPAND-$D_EXPAND}"
    --vocab-size "${VOCAB_SIZE:-$D_VOCAB_SIZE}"
    --train-size "${TRAIN_SIZE:-$D_TRAIN_SIZE}"
    --test-size "${TEST_SIZE:-$D_TEST_SIZE}"
    --epochs "${EPOCHS:-$D_EPOCHS}"
    --batch-size "${BATCH_SIZE:-$D_BATCH_SIZE}"
    --jobs "${JOBS:-$D_JOBS}"
    --validate-interval-updates "${VALIDATE_EVERY:-$D_VALIDATE_EVERY}"
    --checkpoint-every "${CKPT_EVERY:-$D_CKPT_EVERY}"
  )
  if [[ -n "${SLICE_S:-}" ]]; then args+=(--slice-s "$SLICE_S"); fi
  if [[ "${REVEAL_ANSWERS:-0}" == 1 ]]; then args+=(--reveal-answers); fi
  if [[ -n "${MAX_UPDATE:-}" ]]; then args+=(--max-update "$MAX_UPDATE"); fi
  if [[ -n "${GPUS:-}" ]]; then args+=(--gpus "$GPUS"); fi
  if [[ -n "${TIME_BUDGET:-}" ]]; then args+=(--time-budget "$TIME_BUDGET"); fi
  if [[ -n "${FAIRSEQ_ARGS:-}" ]]; then args+=("--fairseq-args=$FAIRSEQ_ARGS"); fi  # (= form: the value starts with --)
  return 0
}

usage() {
  cat <<EOF
usage: [VARIABLE=value ...] bash scripts/run_mqar.sh [--yes] [--plan | --dry-run | --report-only] [mqar_sweep.py options]

The MQAR sweep of the HGRN2 paper's Fig. 3: HGRN1 and HGRN2 (2 layers, no MLP, no positions) trained with
fairseq-train --task mqar for every setting x model x width d x learning rate (x HGRN2 expand ratio x seed);
each cell of OUT/table.md, OUT/runs.csv and OUT/plot.png is the best run of that (setting, model, d).

  --yes          start training. Without it the script prints the sweep's size (--plan) and starts nothing.
  --plan         print the number of runs and updates, then exit (trains nothing, writes nothing)
  --dry-run      print every run's fairseq-train command
  --report-only  rewrite table.md, runs.csv and plot.png from OUT/runs/*.json (same grid variables as the sweep)
  -h, --help     this text
Other arguments go to scripts/mqar_sweep.py (python scripts/mqar_sweep.py --help), e.g. --cpu, --force,
--run-timeout S, --keep-checkpoints, --no-plot.

Environment variables [default]:
  OUT [$D_OUT]: the sweep's folder (runs/*.json, logs/, checkpoints/, table.md, runs.csv, plot.png)
  SETTINGS [$D_SETTINGS]: SEQ_LEN:KV_PAIRS list
  MODELS [$D_MODELS]: subset of hgrn1,hgrn2
  DIMS [$D_DIMS]: model widths d
  LRS [$D_LRS]: learning rates
  EXPAND [$D_EXPAND]: HGRN2 expand ratios, each run where <= d (empty: min(d, 128) only)
  SEEDS [$D_SEEDS]: model seeds; each cell shows its best run over them (seed 1's runs have no suffix)
  VOCAB_SIZE [$D_VOCAB_SIZE], TRAIN_SIZE [$D_TRAIN_SIZE], TEST_SIZE [$D_TEST_SIZE]: the generated task
  EPOCHS [$D_EPOCHS]: epochs per run, one value or one per setting (e.g. 16,8)
  MAX_UPDATE [none]: updates per run, one value or one per setting; overrides EPOCHS
  BATCH_SIZE [$D_BATCH_SIZE]: one value or one per setting (the paper: 256,64)
  VALIDATE_EVERY [$D_VALIDATE_EVERY]: also validate every N updates (0: at each epoch's end only)
  CKPT_EVERY [$D_CKPT_EVERY]: save each run's checkpoint_last.pt every N updates (0: no checkpoints)
  SLICE_S [none]: this call's seconds; runs still going then stop with a checkpoint ('paused') and the
      same command later continues them
  REVEAL_ANSWERS [0]: 1 = answers shown after the queries (a leaking layout, docs/mqar.md)
  JOBS [$D_JOBS]: runs at the same time; GPU runs then get OMP_NUM_THREADS = CPU cores / JOBS
  GPUS [every visible GPU]: how many GPUs the runs are spread over
  TIME_BUDGET [none]: seconds after which no new run starts
  FAIRSEQ_ARGS [none]: extra fairseq-train arguments, e.g. --cuda-graphs
  PYTHON [python3]: the interpreter
On CPU every run (and the sweep's one-step check) gets OMP_NUM_THREADS=1 unless OMP_NUM_THREADS is set:
more threads per process only contend on a shared CPU.

The default sweep (no variable set), paper-scale, several GPU-hours (docs/mqar.md gives measured costs):
EOF
  sweep_args defaults
  "$PYTHON" scripts/mqar_sweep.py "${args[@]}" --plan || true
  cat <<EOF

A small sweep that runs on a CPU in minutes:
  SETTINGS=32:4 VOCAB_SIZE=64 DIMS=32,64 LRS=3e-3 TRAIN_SIZE=2000 TEST_SIZE=300 EPOCHS=2 \\
    OUT=/tmp/mqar bash scripts/run_mqar.sh --yes --cpu
The table of a finished sweep from its records alone:
  OUT=<sweep folder> [grid variables] bash scripts/run_mqar.sh --report-only
EOF
}

yes=0
passthrough=()
for a in "$@"; do
  case $a in
    -h|--help) usage; exit 0 ;;
    --yes) yes=1 ;;
    *) passthrough+=("$a") ;;
  esac
done
sweep_args
trains=1
for a in "${passthrough[@]}"; do
  case $a in --plan|--dry-run|--report-only) trains=0 ;; esac
done
if (( trains && ! yes )); then
  "$PYTHON" scripts/mqar_sweep.py "${args[@]}" "${passthrough[@]}" --plan
  echo "run_mqar.sh: nothing started. Add --yes to train these runs, or set a smaller grid (bash scripts/run_mqar.sh --help)." >&2
  exit 2
fi
exec "$PYTHON" scripts/mqar_sweep.py "${args[@]}" "${passthrough[@]}"
