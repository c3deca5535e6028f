#!/usr/bin/env bash
# End-to-end demo, no download: stdlib text corpus -> sentencepiece BPE -> fairseq-preprocess ->
# fairseq-train a tiny HGRN LM at 128 tokens -> test perplexity at 128, 256, 512, 1024 tokens.
#
#   bash scripts/demo.sh [--workdir DIR] [--max-update N] [--cpu] [--fresh] [--dry-run]
#
#   --workdir DIR    where everything goes (default ./demo_workdir); prepared data and a finished
#                    training run in it are reused by the next run
#   --max-update N   training updates (default 800, about two passes over the train split)
#   --cpu            stay on the CPU even when a GPU is present
#   --fresh          delete the work dir first
#   --dry-run        print the training and evaluation commands and what the table shows; run nothing
#
# Budget: a few minutes on a 2-core CPU, everything included. Training stops at --max-update or after
# DEMO_TRAIN_MINUTES (default 5) minutes, whichever comes first, so a slow machine still finishes (with
# fewer updates; the log says how many). On the CPU it runs with OMP_NUM_THREADS=1 unless that is set.
#
# The corpus is this Python's standard library, so the numbers depend on the Python version; they
# are NOT comparable with anything in the papers (different text, tokenizer and model size).
set -euo pipefail

START=$(date +%s)
elapsed() { local s=$(( $(date +%s) - START )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
step() { printf '\n== [%s] %s\n' "$(elapsed)" "$*"; }
die() { echo "demo.sh: error: $*" >&2; exit 1; }
trap 'echo "demo.sh: FAILED (line $LINENO, exit $?) after $(elapsed)" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORKDIR=./demo_workdir
MAX_UPDATE=800
FORCE_CPU=0
FRESH=0
DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --workdir) WORKDIR=${2:?--workdir needs a directory}; shift 2 ;;
    --max-update) MAX_UPDATE=${2:?--max-update needs a number}; shift 2 ;;
    --cpu) FORCE_CPU=1; shift ;;
    --fresh) FRESH=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown option $1 (see bash scripts/demo.sh --help)" ;;
  esac
done
[[ "$MAX_UPDATE" =~ ^[1-9][0-9]*$ ]] || die "--max-update $MAX_UPDATE: expected a positive integer"
TRAIN_MINUTES=${DEMO_TRAIN_MINUTES:-5}
[[ "$TRAIN_MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "DEMO_TRAIN_MINUTES=$TRAIN_MINUTES: expected a number of minutes"

PYTHON=${PYTHON:-python3}
# The plugin runs from this checkout whether or not it was pip-installed.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
. "$REPO/scripts/gpu_count.sh"  # cpu_threads

case "$WORKDIR" in /*) ;; *) WORKDIR="$PWD/${WORKDIR#./}" ;; esac
DATA="$WORKDIR/data-bin"
CKPT_DIR="$WORKDIR/checkpoints"
TRAIN_LENGTH=128
EVAL_LENGTHS=128,256,512,1024
# What step 5's table shows, printed with it.
EXPLAIN="The table: test perplexity of the model trained on blocks of L = $TRAIN_LENGTH tokens, scored on blocks of 1x, 2x, 4x and 8x L ($EVAL_LENGTHS tokens). In the stateless column (every block starts from an empty state, the papers' protocol) a flat or falling perplexity as the blocks grow means the model extrapolates to lengths it never trained on; a Transformer's rises. The stateful column carries the recurrent state across blocks, so there L is only a chunk size."

if [[ $DRY_RUN == 0 ]] && ! "$PYTHON" -c "import fairseq, sentencepiece, torch" 2>/dev/null; then
  # A fresh machine: install the package and its dependencies (fairseq-fixed, torch, ...) first.
  echo "demo.sh: installing hgrn_fairseq and its dependencies (pip install -e $REPO) ..."
  "$PYTHON" -m pip install --quiet --progress-bar off -e "$REPO" \
    || die "pip install -e $REPO failed; install it by hand and rerun"
fi
if [[ $DRY_RUN == 0 ]]; then
  for tool in fairseq-preprocess fairseq-train; do
    command -v "$tool" >/dev/null || die "$tool not found on PATH: pip install fairseq-fixed==0.12.3.1"
  done
fi

if [[ $FORCE_CPU == 0 ]] && "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  DEVICE_FLAGS=()
  DEVICE="GPU"
else
  DEVICE_FLAGS=(--cpu)
  DEVICE="CPU"
  cpu_threads  # OMP_NUM_THREADS=1 unless set: the tiny model's CPU steps are small ops that threads slow down
fi

# Why these flags:
#   --task hgrn_language_modeling --sample-break-mode none   the paper's LM setup: a token stream cut
#                                 into blocks, ignoring line boundaries; the task is fairseq's
#                                 language_modeling with its silent failure modes turned into errors
#   --tokens-per-sample 128       the training length; step 5 evaluates up to 8x beyond it
#   --batch-size 16               16 x 128 = 2048 tokens per update: big enough for stable Adam
#                                 steps, small enough for ~1-3 s per update on 2 CPU cores
#   --optimizer adam --adam-betas (0.9, 0.98) --weight-decay 0.01   the paper's optimizer, lighter decay
#   --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 20 --warmup-init-lr 1e-7
#                                 a tiny model and a few hundred updates tolerate (and need) a
#                                 larger learning rate than the paper's 5e-4 with 8000 warm-up steps
#   --clip-norm 1.0               guards the high learning rate
#   --dropout 0.0                 less than one epoch of data: nothing to regularise yet
#   --max-update / --stop-time-hours   bounded wall time (see the header)
#   --num-workers 0               no data-loader processes competing for 2 cores
#   --no-epoch-checkpoints        only checkpoint_last.pt / checkpoint_best.pt
#   --log-format simple --log-interval 50   progress lines that survive a non-terminal stdout
#   --cpu (when there is no GPU)
TRAIN_FLAGS=(
  "$DATA" --user-dir "$REPO/hgrn_fairseq"
  --task hgrn_language_modeling --arch hgrn_lm_tiny
  --tokens-per-sample "$TRAIN_LENGTH" --sample-break-mode none --batch-size 16
  --optimizer adam --adam-betas "(0.9, 0.98)" --weight-decay 0.01
  --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 20 --warmup-init-lr 1e-7
  --clip-norm 1.0 --dropout 0.0
  --max-update "$MAX_UPDATE"
  --stop-time-hours "$("$PYTHON" -c "print($TRAIN_MINUTES / 60)")"
  --num-workers 0 --seed 1
  --save-dir "$CKPT_DIR" --no-epoch-checkpoints
  --log-format simple --log-interval 50
  ${DEVICE_FLAGS[@]+"${DEVICE_FLAGS[@]}"}
)
EVAL_CMD=("$PYTHON" -m hgrn_fairseq.evaluation.extrapolation "$CKPT_DIR/checkpoint_last.pt" "$DATA"
  --lengths "$EVAL_LENGTHS" --mode auto --out-dir "$WORKDIR/extrapolation" ${DEVICE_FLAGS[@]+"${DEVICE_FLAGS[@]}"})

if [[ $DRY_RUN == 1 ]]; then
  echo "demo.sh: dry run on the $DEVICE, work dir $WORKDIR (steps 1-3 build the corpus, tokenizer and $DATA)"
  [[ "$DEVICE" == CPU && "${CPU_THREADS_SET:-0}" == 1 ]] && printf 'OMP_NUM_THREADS=1 '
  printf 'fairseq-train'; printf ' %q' "${TRAIN_FLAGS[@]}"; echo
  printf '%q ' "${EVAL_CMD[@]}"; echo
  echo "$EXPLAIN"
  exit 0
fi

[[ $FRESH == 1 ]] && rm -rf "$WORKDIR"
mkdir -p "$WORKDIR"
NPROC=$("$PYTHON" -c "import os; print(os.cpu_count() or 1)")
if [[ $DEVICE == GPU ]]; then
  DEVICE="GPU ($("$PYTHON" -c "import torch; print(torch.cuda.get_device_name(0))"))"
else
  DEVICE="CPU ($NPROC cores, OMP_NUM_THREADS=$OMP_NUM_THREADS)"
fi
echo "demo.sh: work dir $WORKDIR, $DEVICE, up to $MAX_UPDATE updates / $TRAIN_MINUTES min of training"

step "1/5 corpus from the Python standard library (~3 MB, documents never split across splits)"
"$PYTHON" "$REPO/data_prep/build_text_corpus.py" --out-dir "$WORKDIR/corpus" \
  --max-bytes 3000000 --valid-fraction 0.02 --test-fraction 0.03

step "2/5 sentencepiece BPE (4000 pieces) trained on the train split; encoding all splits"
"$PYTHON" "$REPO/data_prep/sentencepiece_bpe.py" --text-dir "$WORKDIR/corpus" \
  --out-dir "$WORKDIR/spm" --vocab-size 4000 --workers "$NPROC"

step "3/5 fairseq-preprocess (dictionary fixed to the sentencepiece vocabulary)"
if [[ -f "$DATA/test.idx" ]] && cmp -s "$DATA/TOKENIZER_INFO.json" "$WORKDIR/spm/TOKENIZER_INFO.json"; then
  echo "$DATA is up to date; nothing to do"
else
  rm -rf "$DATA"
  fairseq-preprocess --only-source --srcdict "$WORKDIR/spm/dict.txt" \
    --trainpref "$WORKDIR/spm/train.bpe" --validpref "$WORKDIR/spm/valid.bpe" \
    --testpref "$WORKDIR/spm/test.bpe" --destdir "$DATA" --workers "$NPROC" 2>&1 \
    | grep -E "sents|Wrote" || true
  [[ -f "$DATA/test.idx" ]] || die "fairseq-preprocess did not write $DATA/test.idx"
  cp "$WORKDIR/spm/TOKENIZER_INFO.json" "$DATA/"
fi

step "4/5 fairseq-train --task hgrn_language_modeling --arch hgrn_lm_tiny at $TRAIN_LENGTH tokens per sample"
STAMP="$CKPT_DIR/demo_train_done.txt"
if [[ -f "$CKPT_DIR/checkpoint_last.pt" && -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "${TRAIN_FLAGS[*]}" ]]; then
  echo "$CKPT_DIR/checkpoint_last.pt was trained with the same flags; reusing it"
else
  rm -rf "$CKPT_DIR"
  mkdir -p "$CKPT_DIR"
  echo "fairseq-train ${TRAIN_FLAGS[*]}"
  # Full log in train.log, progress lines on the terminal. The exit status goes through a file
  # because the filter (grep) ends the pipeline.
  { fairseq-train "${TRAIN_FLAGS[@]}" 2>&1; echo $? > "$CKPT_DIR/train.rc"; } | tee "$CKPT_DIR/train.log" \
    | { grep --line-buffered -E "\| (train_inner|train|valid) \||Stopping|done training|Error" || true; }
  [[ "$(cat "$CKPT_DIR/train.rc")" == 0 ]] || die "fairseq-train failed; see $CKPT_DIR/train.log"
  [[ -f "$CKPT_DIR/checkpoint_last.pt" ]] || die "fairseq-train wrote no checkpoint; see $CKPT_DIR/train.log"
  printf '%s' "${TRAIN_FLAGS[*]}" > "$STAMP"
fi

step "5/5 test perplexity at $EVAL_LENGTHS tokens per block (1x to 8x the training length)"
"${EVAL_CMD[@]}"
printf '\n%s\n' "$EXPLAIN"

printf '\ndemo.sh: done in %s (%s). Results: %s/extrapolation/ (csv, md, json, png)\n' \
  "$(elapsed)" "$DEVICE" "$WORKDIR"
