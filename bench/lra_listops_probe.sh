#!/usr/bin/env bash
# Does the paper's ListOps model learn the operators, or only token statistics? A CPU probe on short
# generated ListOps (docs/lra.md, Findings, "ListOps: seed spread"), two data sets from data_prep/lra_listops.py
# with LRA's distribution but short examples:
#   short   lengths 20-150 (depth up to 10), 20k/1k/1k
#   shallow lengths 5-80, depth <= 3, 20k/1k/1k
#   full    LRA's lengths (500-2000), 20k/1k/2k: the n-gram baselines only (no training on CPU)
# For each: the majority class and n-gram logistic regressions (bench/listops_ngram_baseline.py), then
# `scripts/train_lra.sh listops hgrn1` (hgrn1_lra_listops, the paper's recipe compressed to MAX_UPDATE
# updates) on one CPU thread; on "shallow" also transformer_lra of the same width and depth.
#
#   OUT=/tmp/listops_probe bash bench/lra_listops_probe.sh      (~2 h on one core of a laptop-class CPU)
#
# PROBE_PARTS (default "short shallow shallow_tf full") picks the runs; OUT/<part>.log and the test JSONs land in OUT.
# More parts: short_unmasked, shallow_unmasked (the same runs with --unmasked-padding, the official code's
# padding: docs/lra.md). PROBE_SEED=N trains with --seed N instead of the recipe's 2222 (parts then
# named <part>_sN).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}"
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PARTS=${PROBE_PARTS:-short shallow shallow_tf full}

data() {  # NAME GENERATOR_ARGS...
    local name=$1; shift
    if [ ! -f "$OUT/$name/bin/meta.json" ]; then
        "$PYTHON" data_prep/lra_listops.py --dest "$OUT/$name/gen" --train 20000 --valid 1000 --test 1000 \
            --no-progress "$@"
        "$PYTHON" data_prep/prepare_lra.py listops --source "$OUT/$name/gen" --dest "$OUT/$name/bin"
        "$PYTHON" bench/listops_ngram_baseline.py "$OUT/$name/gen" | tee "$OUT/${name}_ngram_baseline.txt"
    fi
}

shallow_data() { data shallow --min-length 5 --max-length 80 --max-depth 3; }

train() {  # PART DATA MAX_UPDATE [extra fairseq args]
    local part=$1 name=$2 updates=$3; shift 3
    if [ -n "${PROBE_SEED:-}" ]; then part=${part}_s$PROBE_SEED; set -- "$@" --seed "$PROBE_SEED"; fi
    NUM_GPUS=0 MAX_UPDATE=$updates SAVE_DIR="$OUT/$part/ck" RESULTS_DIR="$OUT/$part" SAVE_INTERVAL_UPDATES=250 \
        bash scripts/train_lra.sh listops hgrn1 "$OUT/$name/bin" --log-interval 50 --num-workers 0 "$@" \
        > "$OUT/$part.log" 2>&1
    grep "lra_eval:" "$OUT/$part.log"
    cp "$OUT/$part/ck/test_result.json" "$OUT/$part.test_result.json"
}

for part in $PARTS; do
    case $part in
        short) data short --min-length 20 --max-length 150; train short short 3000 ;;
        short_unmasked) data short --min-length 20 --max-length 150; train short_unmasked short 3000 --unmasked-padding ;;
        shallow) shallow_data; train shallow shallow 2500 ;;
        shallow_unmasked) shallow_data; train shallow_unmasked shallow 2500 --unmasked-padding ;;
        shallow_tf) shallow_data
            train shallow_tf shallow 2500 --arch transformer_lra --encoder-embed-dim 32 --encoder-layers 6 \
                --norm syncbatch --positions sin ;;
        full) data full --test 2000 ;;
        *) echo "lra_listops_probe.sh: unknown part '$part' (short, short_unmasked, shallow, shallow_unmasked, shallow_tf, full)" >&2; exit 2 ;;
    esac
done
