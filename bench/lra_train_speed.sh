#!/usr/bin/env bash
# Training speed of the real LRA entry point (scripts/train_lra.sh: fairseq-train, the paper's recipe,
# real prepared data) for one or more source trees, one after the other on the same GPU: an A/B of a
# change in the training step (bench/bench_lra.py times the model alone on unpadded random batches).
#
#   OUT=DIR bash bench/lra_train_speed.sh TASK DATA_DIR UPDATES "MODELS" LABEL=TREE[@ARGS] [LABEL=TREE[@ARGS] ...]
#
# e.g. OUT=/tmp/ab bash bench/lra_train_speed.sh listops /tmp/lra_evidence/data-bin/listops 600 \
#          "hgrn1 hgrn2" old=/tmp/old_tree new=$PWD
#      OUT=/tmp/ab bash bench/lra_train_speed.sh listops DATA 600 "hgrn1 hgrn2" \
#          eager=$PWD graphs=$PWD@--cuda-graphs,--pad-to-length,2001
# @ARGS: more train_lra.sh options for that side, separated by commas (the same tree twice: an A/B of options).
# Each (tree, model) trains UPDATES updates from scratch (MAX_UPDATE, no test evaluation, no checkpoint
# but the last) with that tree alone on the PYTHONPATH. Reported: fairseq's logged updates/s (the
# median of its every-100-updates lines after the first, which holds the start-up), the wall time of
# the whole command, and the last logged loss; $OUT/lra_train_speed.md, and each run's log.
set -uo pipefail
[ $# -ge 5 ] || { sed -n '2,13p' "$0"; exit 2; }
: "${OUT:?set OUT}"
TASK=$1 DATA=$2 UPDATES=$3 MODELS=$4
shift 4
mkdir -p "$OUT"
SITE=${LRA_SPEED_SITE:-/tmp/site:/tmp/site2}  # where gpu_session.sh installed fairseq
TABLE=$OUT/lra_train_speed.md
{
    echo "| tree | model | updates | updates/s (median of fairseq's log) | wall s | last loss |"
    echo "| --- | --- | ---: | ---: | ---: | ---: |"
} > "$TABLE"
for model in $MODELS; do
    for spec in "$@"; do
        label=${spec%%=*} tree=${spec#*=} extra=()
        if [[ $tree == *@* ]]; then
            IFS=, read -r -a extra <<< "${tree#*@}"
            tree=${tree%%@*}
        fi
        [ -f "$tree/scripts/train_lra.sh" ] || { echo "lra_train_speed.sh: $tree has no scripts/train_lra.sh"; exit 2; }
        run=/tmp/lra_speed/${label}_$model log=$OUT/${label}_$model.log
        rm -rf "$run"
        start=$(date +%s.%N)
        PYTHONPATH=$tree:$SITE SAVE_DIR=$run LOG_DIR=$run/logs MAX_UPDATE=$UPDATES SKIP_TEST=1 NUM_GPUS=1 \
            SAVE_INTERVAL_UPDATES=1000000 bash "$tree/scripts/train_lra.sh" "$TASK" "$model" "$DATA" "${extra[@]}" > "$log" 2>&1
        rc=$?
        wall=$(awk "BEGIN { printf \"%.0f\", $(date +%s.%N) - $start }")
        ups=$(grep -o " ups=[0-9.]*" "$run/logs/train.log" 2>/dev/null | grep -v "^$" | sed 's/ ups=//' | tail -n +2 | sort -g |
              awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "-" }')
        loss=$(grep -o " loss=[0-9.]*" "$run/logs/train.log" 2>/dev/null | tail -1 | sed 's/ loss=//')
        echo "| $label${extra[*]:+ (${extra[*]})} | $model | $UPDATES | $ups | $wall | ${loss:--} |" >> "$TABLE"
        echo "$label $model: rc=$rc, $ups updates/s, ${wall}s"
        [ $rc -eq 0 ] || tail -5 "$log"
    done
done
cat "$TABLE"
