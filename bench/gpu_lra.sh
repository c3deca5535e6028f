#!/usr/bin/env bash
# GPU evidence for Long Range Arena (issue 20, deliverable 6). Run on the GPU machine through
# bench/gpu_session.sh (stage lra), which installs fairseq and puts it and the repository on the
# PYTHONPATH, one part per call (each fits a ~10-minute call on a 16-core, 1-GPU machine):
#
#   LRA_PARTS=listops    OUT=/some/dir bash bench/gpu_session.sh lra:520
#   LRA_PARTS=pathfinder OUT=/some/dir bash bench/gpu_session.sh lra:520
#   LRA_PARTS=tests,bench OUT=/some/dir bash bench/gpu_session.sh lra:520
#
# (Standalone, with fairseq importable: OUT=/some/dir LRA_PARTS=... bash bench/gpu_lra.sh.)
# Parts:
# A call has ~600 s in all: gpu_session.sh's set-up (~1 min), data (~1.5 min for ListOps), and per model
# LRA_TRAIN_MINUTES plus ~1 min (start-up, Triton autotuning, validation, test). LRA_MODELS="hgrn1" (or
# "hgrn2") trains one model per call, e.g. LRA_MODELS=hgrn1 LRA_TRAIN_MINUTES=5 for a longer run.
#   listops     ListOps from the offline generator at LRA's full size (96k/2k/2k, data_prep/lra_listops.py),
#               data_prep/prepare_lra.py, then `scripts/train_lra.sh listops hgrn1` and `... hgrn2` with
#               the papers' recipes shortened to LRA_LISTOPS_UPDATES updates (default 2500; warm-up scaled,
#               cosine to 0 there) and at most LRA_TRAIN_MINUTES minutes each (default 2.2; the log's "ups"
#               says how many updates fit: set LRA_LISTOPS_UPDATES to that x 60 x minutes for the next call); test accuracy
#               of the best checkpoint (JSON) and the results table beside the papers' 59.95 / 60.52.
#   pathfinder  LRA_PF_NUM pathfinder32 images from the generator (default 40000, ~1 min on 16 cores;
#               LRA has 200k), prepared with LRA's 80/10/10 split, then both models as above
#               (LRA_PF_UPDATES, default 2000; LRA_TRAIN_MINUTES each).
#   tests       the LRA tests that need a GPU (Triton scans under the encoder vs the reference, padding).
#   bench       bench/bench_lra.py: training sequences/s of every LRA model and of a Transformer encoder
#               of the same width, depth and precision (LRA_BENCH_S seconds, default 300; LRA_BENCH_ARGS
#               more options, e.g. "--tasks image,pathfinder --models hgrn2,transformer@hgrn2").
# Smoke test on CPU (tiny): LRA_LISTOPS_ARGS="--train 300 --valid 50 --test 50" LRA_PF_NUM=200 LRA_NUM_GPUS=0
#   LRA_LISTOPS_UPDATES=20 LRA_PF_UPDATES=10 LRA_TRAIN_EXTRA="--encoder-embed-dim 8 --encoder-layers 1"
# Everything lands in $OUT: logs, test_result.json files, results.md / results.csv, tensorboard
# events, bench_lra.json / .md, env.txt (gpu_session.sh). Checkpoints stay on the machine.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}"
mkdir -p "$OUT"
R=$PWD
START=$(date +%s)
el() { echo $(( $(date +%s) - START )); }
if ! python3 -c "import fairseq" >/dev/null 2>&1; then  # standalone: set up as gpu_session.sh does
    . bench/gpu_fairseq.sh
    gpu_env
    [ -d /tmp/site2/fairseq ] || install_fairseq > "$OUT/fairseq_install.log" 2>&1
    export PYTHONPATH=$R:/tmp/site:/tmp/site2 PATH=/tmp/site2/bin:$PATH
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
WORK=${LRA_WORK:-/tmp/lra_evidence}
NPROC_CPU=$(env -u OMP_NUM_THREADS nproc)  # (nproc honours OMP_NUM_THREADS, which gpu_session.sh sets to 4)
PARTS=${LRA_PARTS:-listops}
MINUTES=${LRA_TRAIN_MINUTES:-2.2}
mkdir -p "$WORK" "$OUT/runs"

train_both() {  # TASK UPDATES: both models, shortened recipe, test evaluation, results table
    local task=$1 updates=$2 model
    for model in ${LRA_MODELS:-hgrn1 hgrn2}; do
        echo "== train $task $model: MAX_UPDATE=$updates, at most $MINUTES min (at $(el)s)"
        SAVE_DIR=$WORK/runs/${task}_$model LOG_DIR=$OUT/runs/${task}_$model RESULTS_DIR=$WORK/runs \
            MAX_UPDATE=$updates TRAIN_MINUTES=$MINUTES NUM_GPUS=${LRA_NUM_GPUS:-1} SAVE_INTERVAL_UPDATES=500 \
            bash scripts/train_lra.sh "$task" "$model" "$WORK/data-bin/$task" ${LRA_TRAIN_EXTRA:-} \
            > "$OUT/runs/train_${task}_$model.log" 2>&1
        echo "   rc=$? at $(el)s"
        grep "valid on 'valid'" "$OUT/runs/train_${task}_$model.log" | tail -3
        grep "lra_eval:" "$OUT/runs/train_${task}_$model.log"
        grep -o "num_updates [0-9]*\|ups [0-9.]*" "$OUT/runs/train_${task}_$model.log" | tail -2 | tr '\n' ' '; echo
        cp "$WORK/runs/${task}_$model/test_result.json" "$OUT/runs/${task}_$model.test_result.json" 2>/dev/null
    done
    cp "$WORK/runs/results.md" "$WORK/runs/results.csv" "$OUT/" 2>/dev/null
    cat "$OUT/results.md" 2>/dev/null
}

if [[ ",$PARTS," == *",listops,"* ]]; then
    echo "== listops data (generator, 96k/2k/2k, $NPROC_CPU workers) at $(el)s"
    python3 data_prep/lra_listops.py --dest "$WORK/generated" --workers "$NPROC_CPU" --no-progress ${LRA_LISTOPS_ARGS:-} \
        > "$OUT/listops_generate.log" 2>&1
    echo "   generate rc=$? at $(el)s"; tail -2 "$OUT/listops_generate.log"
    python3 data_prep/prepare_lra.py listops --source "$WORK/generated" --dest "$WORK/data-bin/listops" > "$OUT/listops_prepare.log" 2>&1
    echo "   prepare rc=$? at $(el)s"; tail -3 "$OUT/listops_prepare.log"
    cp "$WORK/data-bin/listops/meta.json" "$OUT/listops_meta.json" 2>/dev/null
    train_both listops "${LRA_LISTOPS_UPDATES:-2500}"
fi

if [[ ",$PARTS," == *",pathfinder,"* ]]; then
    echo "== pathfinder data (generator, ${LRA_PF_NUM:-40000} images of 32x32, $NPROC_CPU workers) at $(el)s"
    python3 data_prep/lra_pathfinder.py --dest "$WORK/generated" --num "${LRA_PF_NUM:-40000}" --size 32 \
        --workers "$NPROC_CPU" --no-progress > "$OUT/pathfinder_generate.log" 2>&1
    echo "   generate rc=$? at $(el)s"; tail -2 "$OUT/pathfinder_generate.log"
    python3 data_prep/prepare_lra.py pathfinder --source "$WORK/generated" --dest "$WORK/data-bin/pathfinder" \
        --workers "$NPROC_CPU" > "$OUT/pathfinder_prepare.log" 2>&1
    echo "   prepare rc=$? at $(el)s"; tail -3 "$OUT/pathfinder_prepare.log"
    cp "$WORK/data-bin/pathfinder/meta.json" "$OUT/pathfinder_meta.json" 2>/dev/null
    train_both pathfinder "${LRA_PF_UPDATES:-2000}"
fi

if [[ ",$PARTS," == *",tests,"* ]]; then
    echo "== GPU tests at $(el)s"
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/modules/test_lra_encoder.py -k "gpu or triton" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "   tests rc=$? at $(el)s"; tail -3 "$OUT/gpu_tests.log"
fi

if [[ ",$PARTS," == *",bench,"* ]]; then
    echo "== bench_lra at $(el)s"
    timeout $(( ${LRA_BENCH_S:-300} + 120 )) python3 bench/bench_lra.py --out "$OUT/bench" --budget-s "${LRA_BENCH_S:-300}" ${LRA_BENCH_ARGS:-} \
        > "$OUT/bench_lra.log" 2>&1
    echo "   bench rc=$? at $(el)s"; cat "$OUT/bench/bench_lra.md" 2>/dev/null
fi
echo "gpu_lra.sh done at $(el)s"
