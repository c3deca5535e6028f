#!/usr/bin/env bash
# Evidence run on an offline corpus: the whole WikiText-103 pipeline (corpus -> BPE -> binarise ->
# train with the paper recipes -> length extrapolation) for hgrn_lm_base, hgrn2_lm_base and the
# Transformer baseline, the same number of updates each, then one comparison table and plot.
#
#   bash scripts/lm_evidence.sh                    # on a GPU machine (minutes on one GPU)
#   MAX_UPDATE=200 LENGTHS=512,1024 bash scripts/lm_evidence.sh    # a quicker look
#
# The corpus is text already on the machine (this Python's standard library, all of it; see
# data_prep/build_text_corpus.py) with an 8000-piece sentencepiece BPE: the perplexities are NOT
# comparable with the papers' WikiText-103 numbers. What it shows is the shape of PPL against L.
#
# Environment (defaults in brackets):
#   WORKDIR [lm_evidence]   everything; prepared data is reused by the next run
#   OUT [WORKDIR/report]    comparison.{md,csv,json,png} and logs.tgz
#   MODELS [hgrn_lm_base,hgrn2_lm_base,transformer_lm_wt103_small]   recipes of scripts/train_wt103.sh
#   MAX_UPDATE [2000]  BATCH [32]  WARMUP [400]   updates, sequences of 512 tokens per update, warm-up
#   LENGTHS [512,1024,2048,3072,4096,6144,8192,10240,12288,14336]   evaluation lengths
#   PARALLEL [1]            train (and evaluate) the models at the same time on one GPU (0: one by one)
#   TRAIN_MINUTES [5]       each training stops after this long even if MAX_UPDATE is not reached (the
#                           table then says how many updates each model got)
#   SPM_VOCAB [8000]  TEST_FRACTION [0.05]  CORPUS_BYTES [none: all of it]  MAX_DOC_BYTES [50000]
#   CORPUS_SOURCES [this Python's stdlib]   comma-separated directories of text to read instead
#   PREP_ONLY [0]           1: stop after the corpus and the BPE (they need no fairseq)
#
# Deviations from the recipes, all models alike: fairseq --bf16 (the hgrn2 recipe's precision) instead
# of fp32 for hgrn_lm_base and the Transformer; BATCH x 512 tokens per update instead of 128 x 512;
# WARMUP warm-up steps instead of 8000/4000; MAX_UPDATE updates.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
START=$(date +%s)
step() { printf '\n== [%ds] %s\n' $(( $(date +%s) - START )) "$*"; }
die() { echo "lm_evidence.sh: error: $*" >&2; exit 1; }
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
WORKDIR=$(mkdir -p "${WORKDIR:-lm_evidence}" && cd "${WORKDIR:-lm_evidence}" && pwd)
OUT=${OUT:-$WORKDIR/report}
MODELS=${MODELS:-hgrn_lm_base,hgrn2_lm_base,transformer_lm_wt103_small}
MAX_UPDATE=${MAX_UPDATE:-2000}
BATCH=${BATCH:-32}
WARMUP=${WARMUP:-400}
LENGTHS=${LENGTHS:-512,1024,2048,3072,4096,6144,8192,10240,12288,14336}
PARALLEL=${PARALLEL:-1}
TRAIN_MINUTES=${TRAIN_MINUTES:-5}
SPM_VOCAB=${SPM_VOCAB:-8000}
TEST_FRACTION=${TEST_FRACTION:-0.05}
CORPUS_BYTES=${CORPUS_BYTES:-none}
MAX_DOC_BYTES=${MAX_DOC_BYTES:-50000}
SOURCE_ARGS=()
if [[ -n "${CORPUS_SOURCES:-}" ]]; then
  IFS=, read -r -a _sources <<< "$CORPUS_SOURCES"
  for d in "${_sources[@]}"; do
    [[ -d "$d" ]] || die "CORPUS_SOURCES: $d is not a directory"
    SOURCE_ARGS+=(--source "$d")
  done
fi
for v in MAX_UPDATE BATCH WARMUP SPM_VOCAB; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v=${!v}: expected a positive integer"
done
IFS=, read -r -a MODEL_LIST <<< "$MODELS"
mkdir -p "$OUT"
NPROC=$("$PYTHON" -c "import os; print(os.cpu_count() or 1)")

step "1/5 corpus: ${CORPUS_SOURCES:-the Python standard library} (no download)"
"$PYTHON" "$REPO/data_prep/build_text_corpus.py" --out-dir "$WORKDIR/corpus" --max-bytes "$CORPUS_BYTES" \
  --max-doc-bytes "$MAX_DOC_BYTES" --valid-fraction 0.02 --test-fraction "$TEST_FRACTION" ${SOURCE_ARGS[@]+"${SOURCE_ARGS[@]}"}

step "2/5 sentencepiece BPE ($SPM_VOCAB pieces), trained on the train split"
"$PYTHON" "$REPO/data_prep/sentencepiece_bpe.py" --text-dir "$WORKDIR/corpus" --out-dir "$WORKDIR/spm" \
  --vocab-size "$SPM_VOCAB" --workers "$NPROC"

if [[ "${PREP_ONLY:-0}" == 1 ]]; then step "corpus and BPE ready (PREP_ONLY=1)"; exit 0; fi

step "3/5 fairseq-preprocess"
DATA=$WORKDIR/data-bin
if [[ -f "$DATA/test.idx" ]] && cmp -s "$DATA/TOKENIZER_INFO.json" "$WORKDIR/spm/TOKENIZER_INFO.json"; then
  echo "$DATA is up to date"
else
  rm -rf "$DATA"
  fairseq-preprocess --only-source --srcdict "$WORKDIR/spm/dict.txt" --trainpref "$WORKDIR/spm/train.bpe" \
    --validpref "$WORKDIR/spm/valid.bpe" --testpref "$WORKDIR/spm/test.bpe" --destdir "$DATA" \
    --workers "$NPROC" 2>&1 | grep -E "tokens|Wrote" || true
  [[ -f "$DATA/test.idx" ]] || die "fairseq-preprocess did not write $DATA/test.idx"
  cp "$WORKDIR/spm/TOKENIZER_INFO.json" "$WORKDIR/spm/spm.model" "$DATA/"  # (spm.model: for text in, e.g. zero-shot)
fi

train() {  # $1: recipe
  local m=$1 dir=$WORKDIR/checkpoints/$1
  mkdir -p "$dir"
  SAVE_DIR=$dir LOG_DIR=$dir NUM_GPUS=${NUM_GPUS:-1} BATCH_PER_GPU=$BATCH PRECISION=bf16 bash "$REPO/scripts/train_wt103.sh" "$m" "$DATA" \
    --update-freq 1 --max-update "$MAX_UPDATE" --warmup-updates "$WARMUP" \
    --stop-time-hours "$("$PYTHON" -c "print($TRAIN_MINUTES / 60)")" --save-interval-updates 0 \
    --save-interval 1000 --validate-interval-updates 500 --log-interval 100 --seed 1 --num-workers 2 \
    > "$dir/stdout.log" 2>&1
  echo "$m: training exit $?, $(grep -o 'num_updates [0-9]*' "$dir/train.log" | tail -1)"
}
evaluate() {  # $1: recipe
  local m=$1
  "$PYTHON" -m hgrn_fairseq.evaluation.extrapolation "$WORKDIR/checkpoints/$m/checkpoint_last.pt" "$DATA" \
    --lengths "$LENGTHS" --mode auto --dtype fp32 --no-progress --out-dir "$WORKDIR/extrapolation/$m" \
    > "$WORKDIR/checkpoints/$m/eval.log" 2>&1
  echo "$m: evaluation exit $?"
}

step "4/5 training ${MODEL_LIST[*]}: $MAX_UPDATE updates of $BATCH x 512 tokens (parallel=$PARALLEL)"
pids=()
for m in "${MODEL_LIST[@]}"; do
  if [[ $PARALLEL == 1 ]]; then train "$m" & pids+=($!); else train "$m"; fi
done
for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || die "a training run failed (see $WORKDIR/checkpoints/*/stdout.log)"; done
for m in "${MODEL_LIST[@]}"; do
  [[ -f "$WORKDIR/checkpoints/$m/checkpoint_last.pt" ]] || die "$m wrote no checkpoint: see $WORKDIR/checkpoints/$m/stdout.log"
done

step "5/5 test perplexity at L = $LENGTHS"
pids=()
for m in "${MODEL_LIST[@]}"; do
  if [[ $PARALLEL == 1 ]]; then evaluate "$m" & pids+=($!); else evaluate "$m"; fi
done
rc=0
for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || rc=1; done
runs=()
for m in "${MODEL_LIST[@]}"; do
  [[ -f "$WORKDIR/extrapolation/$m/extrapolation.json" ]] && runs+=("$m=$WORKDIR/extrapolation/$m")
done
"$PYTHON" -m hgrn_fairseq.evaluation.compare --out-dir "$OUT" \
  --title "Length extrapolation after $MAX_UPDATE updates (${CORPUS_LABEL:-offline corpus}, spm $SPM_VOCAB; not WikiText-103)" \
  ${runs[@]+"${runs[@]}"} || rc=1
(cd "$WORKDIR" && tar czf "$OUT/logs.tgz" corpus/manifest.json checkpoints/*/*.log checkpoints/*/command.txt \
  extrapolation 2>/dev/null) || true
step "done (exit $rc): $OUT"
exit $rc
