#!/usr/bin/env bash
# Train a WikiText-103 language model with one of the papers' recipes.
#
#   bash scripts/train_wt103.sh RECIPE [DATA_DIR] [extra fairseq-train args...]
#   bash scripts/train_wt103.sh RECIPE [DATA_DIR] --dry-run   # print the exact command, run nothing
#
# RECIPE (also the --arch, except for the Transformer):
#   hgrn_lm_base                HGRN1, 46.25M: adam (0.9, 0.98), lr 5e-4, inverse_sqrt, warmup 8000 from
#                               1e-7, weight decay 0.2, no clipping, fp32, 100k updates
#   hgrn2_lm_base               HGRN2, 44.66M: as above but warmup 4000, weight decay 0.1, clip 1.0,
#                               bf16, 50k updates
#   transformer_lm_wt103_small  fairseq's transformer_lm at the papers' size: 6 layers, d 512, FFN 2048,
#                               8 heads, pre-norm, sinusoidal positions, tied embeddings (44.65M),
#                               with the settings of the HGRN authors' LM script (train_alm.sh in
#                               OpenNLPLab/HGRN): weight decay 0.01, no clipping, warmup 8000, fp32,
#                               100k updates
#   lru_lm_base, lru_mml_lm_base, mlgru_lm_base, mlgru_mml_lm_base
#                               the recurrent baselines (hgrn_fairseq/models/baseline_archs.py) with
#                               hgrn_lm_base's recipe (fp32, eager: no --cuda-graphs)
# All: dropout 0.1, 512 tokens per sample (sample-break-mode none), 128 sequences (65,536 tokens) per
# update whatever the number of GPUs, task hgrn_language_modeling, cross-entropy loss through
# --criterion linear_cross_entropy: the same loss, logs and gradients as fairseq's cross_entropy, with
# the output projection fused into the loss (no fp32 [tokens, vocab] logits). For fairseq's own
# criterion add --criterion cross_entropy (extra arguments win, see below), e.g.
#   bash scripts/train_wt103.sh hgrn_lm_base --criterion cross_entropy
# (needed for a decoder without one bias-free output matrix, e.g. with an adaptive softmax).
# The two HGRN recipes add --cuda-graphs: on CUDA each training forward and backward of the decoder is
# replayed as a CUDA graph, so the host issues 2 launches a step instead of ~550; the numbers are the
# eager model's. CUDA_GRAPHS=0 leaves it out. CPU runs ignore it. (docs/wikitext103.md: speed.)
#
# DATA_DIR defaults to data-bin/wikitext-103 (what data_prep/prepare_wikitext103.py writes), relative to
# the repository. Extra arguments go to fairseq-train after the recipe's, so they override it (e.g.
# --max-update 1000, --criterion cross_entropy): fairseq's argparse keeps the last occurrence of a flag.
# --dry-run prints the command also when DATA_DIR does not exist yet; an existing DATA_DIR is checked.
#
# Environment:
#   NUM_GPUS        GPUs to use (default: all visible, CUDA_VISIBLE_DEVICES respected; 0 = CPU)
#   BATCH_PER_GPU   sequences per GPU per forward/backward (default 16); --update-freq is
#                   128 / (BATCH_PER_GPU x processes) and must be a whole number
#   SAVE_DIR        checkpoints (default checkpoints/wt103/RECIPE in the repository)
#   LOG_DIR         train.log, command.txt and tensorboard/ (default SAVE_DIR/logs)
#   PYTHON          interpreter (default python3)
#   CUDA_GRAPHS     1 (default): the HGRN recipes train with --cuda-graphs; 0: eagerly
#   PRECISION       fp32 | tf32 | bf16 (default: the paper's: fp32 for hgrn_lm_base and the
#                   Transformer, bf16 for hgrn2_lm_base). tf32: fp32 weights and activations with
#                   TensorFloat-32 matrix products on CUDA; bf16: fairseq's --bf16. The precision is
#                   printed and written at the top of train.log.
#   OMP_NUM_THREADS on the CPU, 1 unless set (small models train several times faster so)
#
# Multi-GPU: one process per GPU through torchrun (python -m torch.distributed.run --standalone), which
# fairseq's distributed training picks up from the environment (env:// rendezvous, no fairseq spawn).
# --cpu among the extra arguments, or no GPU: one CPU process (tests and smoke runs).
# Resume: rerun the same command; fairseq continues from SAVE_DIR/checkpoint_last.pt.
# Before anything runs, scripts/check_lm_data.py checks DATA_DIR (dict.txt, train and valid splits, no
# token id beyond the dictionary). The same runs for fairseq-hydra-train: configs/wt103/RECIPE.yaml.
# bf16: fairseq's command line turns --bf16 into --tpu; scripts/fairseq_train.py undoes that so the
# bf16 recipes train in bfloat16 on CUDA.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
SEQS_PER_UPDATE=128
TOKENS_PER_SAMPLE=512
GPT2_DICT_SIZE=50264
RECIPES="hgrn_lm_base hgrn2_lm_base transformer_lm_wt103_small lru_lm_base lru_mml_lm_base mlgru_lm_base mlgru_mml_lm_base"

die() {
    echo "train_wt103.sh: error: $*" >&2
    exit 2
}
. "$REPO/scripts/gpu_count.sh"  # count_gpus, cpu_threads
note() { echo "train_wt103.sh: $*" >&2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

# ---- arguments -------------------------------------------------------------------------------
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

[ $# -ge 1 ] || die "no RECIPE given: use one of: $RECIPES (bash scripts/train_wt103.sh --help)"
RECIPE=$1
shift
case " $RECIPES " in
    *" $RECIPE "*) ;;
    *) die "unknown RECIPE '$RECIPE': use one of: $RECIPES" ;;
esac

if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
    DATA_DIR=$(absolute "$1")
    shift
else
    DATA_DIR="$REPO/data-bin/wikitext-103"
fi
EXTRA=("$@")

has_extra() {
    local flag
    for flag in ${EXTRA[@]+"${EXTRA[@]}"}; do [ "$flag" = "$1" ] && return 0; done
    return 1
}

# ---- data ------------------------------------------------------------------------------------
MAKE_DATA="python data_prep/prepare_wikitext103.py --source wikitext-103-raw-v1.zip --gpt2-dir GPT2_DIR --dest $DATA_DIR (data_prep/README.md)"
if [ ! -d "$DATA_DIR" ]; then
    [ "$DRY_RUN" -eq 1 ] || die "DATA_DIR $DATA_DIR does not exist: make it with $MAKE_DATA, or pass the binarised data directory as the second argument"
    note "note: DATA_DIR $DATA_DIR does not exist yet (a dry run prints the command anyway): make it with $MAKE_DATA"
else
    [ -f "$DATA_DIR/dict.txt" ] || die "$DATA_DIR/dict.txt is missing: pass the directory fairseq-preprocess wrote (it holds dict.txt, train.bin/.idx, valid.bin/.idx)"
    CHECK=$("$PYTHON" "$REPO/scripts/check_lm_data.py" "$DATA_DIR" --splits train,valid 2>&1) ||
        die "${CHECK#error: }"
    DICT_SIZE=$(echo "$CHECK" | sed -n 's/^dictionary_size=//p')
    if [ "$DICT_SIZE" != "$GPT2_DICT_SIZE" ]; then
        note "note: dict.txt gives $DICT_SIZE entries, not GPT-2 BPE's $GPT2_DICT_SIZE: parameter counts and perplexities are not comparable with the papers'"
    fi
    if [ -f "$DATA_DIR/TOKENIZER_INFO.json" ]; then
        note "note: $DATA_DIR/TOKENIZER_INFO.json: $(tr -d '\n' <"$DATA_DIR/TOKENIZER_INFO.json" | cut -c1-200)"
    fi
fi

# ---- processes and batch ---------------------------------------------------------------------
if has_extra --cpu; then
    NPROC=1
    DEVICE=cpu
else
    count_gpus
    if [ "$NGPU" -eq 0 ]; then
        note "note: no GPU found: training on CPU (slow; for tests and smoke runs)"
        NPROC=1
        DEVICE=cpu
        EXTRA+=(--cpu)
    else
        NPROC=$NGPU
        DEVICE=cuda
    fi
fi
ENV_SET=()  # variables this script sets for the command (printed with it)
if [ "$DEVICE" = cpu ]; then
    cpu_threads
    if [ "$CPU_THREADS_SET" -eq 1 ]; then
        ENV_SET+=(OMP_NUM_THREADS=1)
        note "note: OMP_NUM_THREADS=1 for the CPU run (set OMP_NUM_THREADS to choose another number of threads)"
    fi
fi
BATCH_PER_GPU=${BATCH_PER_GPU:-16}
case "$BATCH_PER_GPU" in '' | 0 | *[!0-9]*) die "BATCH_PER_GPU='$BATCH_PER_GPU' must be a positive whole number" ;; esac
PER_STEP=$((BATCH_PER_GPU * NPROC))
if [ $((SEQS_PER_UPDATE % NPROC)) -ne 0 ]; then
    die "$SEQS_PER_UPDATE sequences per update cannot be split evenly over $NPROC processes: use a GPU count that divides $SEQS_PER_UPDATE (NUM_GPUS=1, 2, 4 or 8)"
fi
if [ $((SEQS_PER_UPDATE % PER_STEP)) -ne 0 ]; then
    die "$SEQS_PER_UPDATE sequences per update is not divisible by BATCH_PER_GPU=$BATCH_PER_GPU x $NPROC process(es) = $PER_STEP: set BATCH_PER_GPU to a divisor of $((SEQS_PER_UPDATE / NPROC)) (e.g. 16, 8 or 4)"
fi
UPDATE_FREQ=$((SEQS_PER_UPDATE / PER_STEP))
for flag in --batch-size --update-freq --max-sentences --max-tokens --tokens-per-sample; do
    if has_extra "$flag"; then
        note "note: extra argument $flag overrides the recipe: the effective batch is no longer $SEQS_PER_UPDATE x $TOKENS_PER_SAMPLE tokens"
    fi
done

# ---- the recipes -----------------------------------------------------------------------------
COMMON=(
    --task hgrn_language_modeling --user-dir "$REPO/hgrn_fairseq"
    --tokens-per-sample "$TOKENS_PER_SAMPLE" --sample-break-mode none
    --criterion linear_cross_entropy
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-08
    --lr 0.0005 --lr-scheduler inverse_sqrt --warmup-init-lr 1e-07
    --dropout 0.1
)
case "${CUDA_GRAPHS:-1}" in
    1) GRAPHS=(--cuda-graphs) ;;
    0) GRAPHS=() ;;
    *) die "CUDA_GRAPHS='$CUDA_GRAPHS' is not 0 or 1 (1: the HGRN recipes train with --cuda-graphs)" ;;
esac
case "$RECIPE" in
    hgrn_lm_base)
        RECIPE_ARGS=(--arch hgrn_lm_base --warmup-updates 8000 --weight-decay 0.2 --clip-norm 0.0 --max-update 100000
            "${GRAPHS[@]}")
        ;;
    hgrn2_lm_base)
        RECIPE_ARGS=(--arch hgrn2_lm_base --warmup-updates 4000 --weight-decay 0.1 --clip-norm 1.0 --max-update 50000
            "${GRAPHS[@]}")
        ;;
    lru_lm_base | lru_mml_lm_base | mlgru_lm_base | mlgru_mml_lm_base)
        # the baselines with HGRN1's recipe; eager (CUDA graphs are not tested with their mixers)
        RECIPE_ARGS=(--arch "$RECIPE" --warmup-updates 8000 --weight-decay 0.2 --clip-norm 0.0 --max-update 100000)
        ;;
    transformer_lm_wt103_small)
        RECIPE_ARGS=(--arch transformer_lm --decoder-layers 6 --decoder-embed-dim 512 --decoder-ffn-embed-dim 2048
            --decoder-attention-heads 8 --decoder-normalize-before --share-decoder-input-output-embed
            --warmup-updates 8000 --weight-decay 0.01 --clip-norm 0.0 --max-update 100000)
        ;;
esac
case "$RECIPE" in
    hgrn2_lm_base) PAPER_PRECISION=bf16 ;;
    *) PAPER_PRECISION=fp32 ;;
esac
PRECISION=${PRECISION:-$PAPER_PRECISION}
case "$PRECISION" in
    fp32) PRECISION_ARGS=() ;;
    tf32) PRECISION_ARGS=(); export HGRN_MATMUL_PRECISION=tf32; ENV_SET+=(HGRN_MATMUL_PRECISION=tf32) ;;
    bf16) PRECISION_ARGS=(--bf16) ;;
    *) die "PRECISION='$PRECISION' is not one of fp32, tf32, bf16 (default for $RECIPE: $PAPER_PRECISION, the paper's)" ;;
esac
if has_extra --bf16 || has_extra --fp16 || has_extra --memory-efficient-bf16 || has_extra --memory-efficient-fp16; then
    die "pass the precision as PRECISION=fp32|tf32|bf16, not as an extra fairseq flag (--bf16/--fp16)"
fi
if [ "$PRECISION" = "$PAPER_PRECISION" ]; then
    PRECISION_NOTE="$PRECISION (the paper's)"
else
    PRECISION_NOTE="$PRECISION (the paper trained $RECIPE in $PAPER_PRECISION)"
fi
RECIPE_ARGS+=(${PRECISION_ARGS[@]+"${PRECISION_ARGS[@]}"})

SAVE_DIR=$(absolute "${SAVE_DIR:-$REPO/checkpoints/wt103/$RECIPE}")
LOG_DIR=$(absolute "${LOG_DIR:-$SAVE_DIR/logs}")
RUN_ARGS=(
    --batch-size "$BATCH_PER_GPU" --update-freq "$UPDATE_FREQ" --required-batch-size-multiple 1
    --distributed-world-size "$NPROC"
    --save-dir "$SAVE_DIR" --save-interval-updates 2000 --keep-interval-updates 2 --no-epoch-checkpoints
    --log-format simple --log-interval 100 --log-file "$LOG_DIR/train.log"
    --tensorboard-logdir "$LOG_DIR/tensorboard"
)

if [ "$NPROC" -gt 1 ]; then
    LAUNCH=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$REPO/scripts/fairseq_train.py")
else
    LAUNCH=("$PYTHON" "$REPO/scripts/fairseq_train.py")
fi
CMD=("${LAUNCH[@]}" "$DATA_DIR" "${COMMON[@]}" "${RECIPE_ARGS[@]}" "${RUN_ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"})

note "recipe $RECIPE on $NPROC $DEVICE process(es): $BATCH_PER_GPU sequences x $TOKENS_PER_SAMPLE tokens per process, update-freq $UPDATE_FREQ ($SEQS_PER_UPDATE sequences per update)"
note "precision: $PRECISION_NOTE"
note "checkpoints: $SAVE_DIR (rerun to resume from checkpoint_last.pt); logs: $LOG_DIR"
if [ "$DRY_RUN" -eq 1 ]; then
    [ ${#ENV_SET[@]} -eq 0 ] || printf '%s ' "${ENV_SET[@]}"
    printf '%q ' "${CMD[@]}"
    echo
    exit 0
fi

if ! "$PYTHON" -c "import tensorboard" >/dev/null 2>&1 && ! "$PYTHON" -c "import tensorboardX" >/dev/null 2>&1; then
    note "note: neither tensorboard nor tensorboardX is installed: no tensorboard logs (pip install tensorboard); training continues, text logs go to $LOG_DIR/train.log"
fi
mkdir -p "$SAVE_DIR" "$LOG_DIR"
{
    printf '# %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    [ ${#ENV_SET[@]} -eq 0 ] || printf '%s ' "${ENV_SET[@]}"
    printf '%q ' "${CMD[@]}"
    echo
} >>"$LOG_DIR/command.txt"
echo "train_wt103.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): recipe $RECIPE, precision: $PRECISION_NOTE" >>"$LOG_DIR/train.log"
exec "${CMD[@]}"
