#!/usr/bin/env bash
# Train an image classifier on ImageNet-1k (or any ImageFolder) with the DeiT recipe of its paper.
#
#   bash scripts/train_imagenet.sh MODEL DATA_DIR [KEY=VALUE ...] [--dry-run]
#
# MODEL picks the recipe (configs/image/*.yaml):
#   hgrn1d_vit_tiny, hgrn1d_vit_small, hgrn1_2d_vit_*   hgrn1: batch 2048, lr 5e-4 x 2048/512, warm-up 10, clip 5
#   hgrn2_vit_tiny, hgrn2_2d_vit_tiny                   hgrn2_tiny: batch 1024, lr 7.5e-4 x 1024/512, warm-up 20
#   hgrn2_vit_small, hgrn2_2d_vit_small                 hgrn2_small: batch 2048, lr 7.5e-4 x 2048/512, wd 0.1
#   any other timm model (deit_tiny_patch16_224, ...)    deit: batch 1024, lr 5e-4 x 1024/512, warm-up 5
# All: AdamW, cosine to 1e-5, 300 epochs, RandAugment rand-m9-mstd0.5-inc1, Mixup 0.8 / CutMix 1.0, label
# smoothing 0.1, random erasing 0.25, repeated augmentation x3, EMA 0.99996, drop-path 0.1, bf16 autocast,
# evaluation at resize 256 / centre crop 224 (top-1 / top-5).
# DATA_DIR holds train/<class>/<image> and val/<class>/<image>.
# KEY=VALUE overrides any recipe key (e.g. optim.epochs=100 model.img_size=448 data.workers=16).
# --dry-run prints the command (on stdout) and trains nothing; when DATA_DIR exists it also checks the data
# and prints the resolved recipe and plan (processes, per-GPU batch, accumulation, lr, resume).
#
# Environment:
#   NUM_GPUS         GPUs (default: all visible; CUDA_VISIBLE_DEVICES respected; 0 = one CPU process)
#   OUTPUT_DIR       checkpoints and logs (default runs/MODEL); rerunning the same command resumes there
#   PYTHON           interpreter (default python3)
#   OMP_NUM_THREADS  set to 1 for a CPU run unless given (more threads make CPU training several times slower)
# One process per GPU through torchrun; the total batch stays the recipe's whatever the GPU count (the
# per-GPU batch is capped by optim.max_batch_per_gpu, gradient accumulation makes up the rest).
set -euo pipefail

die() { echo "train_imagenet.sh: $*" >&2; exit 1; }
. "$(dirname "$0")/gpu_count.sh"  # count_gpus
usage="usage: bash scripts/train_imagenet.sh MODEL DATA_DIR [KEY=VALUE ...] [--dry-run]"
DRY_RUN=0
ARGS=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) ARGS+=("$arg") ;;
    esac
done
set -- ${ARGS[@]+"${ARGS[@]}"}
[ $# -ge 2 ] || die "$usage"
MODEL=$1 DATA=$2
shift 2
case "$MODEL" in -*|*=*) die "MODEL '$MODEL' looks like an option: $usage" ;; esac
[ -d "$DATA" ] || [ "$DRY_RUN" = 1 ] || die "DATA_DIR '$DATA' is not a folder: pass the folder that holds train/ and val/"

case "$MODEL" in
    hgrn1d_vit_*|hgrn1_2d_vit_*) RECIPE=hgrn1 ;;
    hgrn2_vit_tiny|hgrn2_2d_vit_tiny) RECIPE=hgrn2_tiny ;;
    hgrn2_vit_small|hgrn2_2d_vit_small) RECIPE=hgrn2_small ;;
    *) RECIPE=deit ;;
esac

count_gpus

PY=${PYTHON:-python3}
ARGS=(--config-name "$RECIPE" "model.name=$MODEL" "data.path=$DATA" "train.output_dir=${OUTPUT_DIR:-runs/$MODEL}")
PREFIX=""
if [ "$NGPU" -eq 0 ]; then
    echo "train_imagenet.sh: no GPU: one CPU process (for smoke runs)" >&2
    cpu_threads  # (scripts/gpu_count.sh)
    PREFIX="OMP_NUM_THREADS=$OMP_NUM_THREADS "
    CMD=("$PY" -m hgrn_fairseq.image.train "${ARGS[@]}" train.device=cpu "$@")
elif [ "$NGPU" -eq 1 ]; then
    CMD=("$PY" -m hgrn_fairseq.image.train "${ARGS[@]}" "$@")
else
    CMD=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$NGPU" -m hgrn_fairseq.image.train
         "${ARGS[@]}" "$@")
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # the package, installed or not
echo "recipe $RECIPE, $NGPU GPU(s): $PREFIX${CMD[*]}" >&2
if [ "$DRY_RUN" = 1 ]; then
    printf '%s' "$PREFIX"; printf '%q ' "${CMD[@]}" | sed 's/ $//'; echo
    if [ -d "$DATA" ]; then
        exec "${CMD[@]}" --dry-run  # the data check, the resolved recipe and the plan
    fi
    echo "train_imagenet.sh: dry run: DATA_DIR '$DATA' does not exist, so the data check and the plan were skipped" >&2
    exit 0
fi
exec "${CMD[@]}"
