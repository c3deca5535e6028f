#!/usr/bin/env bash
# Train an image classifier on ImageNet-1k (or any ImageFolder) with the DeiT recipe of its paper (SPEC 8).
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
# KEY=VALUE overrides any recipe key (e.g. optim.epochs=100 model.img_size=448 data.workers=16); --dry-run
# checks the data and prints the resolved recipe and plan without training.
#
# Environment:
#   NUM_GPUS     GPUs (default: all visible; CUDA_VISIBLE_DEVICES respected; 0 = one CPU process)
#   OUTPUT_DIR   checkpoints and logs (default runs/MODEL); rerunning the same command resumes there
#   PYTHON       interpreter (default python3)
# One process per GPU through torchrun; the total batch stays the recipe's whatever the GPU count (the
# per-GPU batch is capped by optim.max_batch_per_gpu, gradient accumulation makes up the rest).
set -euo pipefail

die() { echo "train_imagenet.sh: $*" >&2; exit 1; }
. "$(dirname "$0")/gpu_count.sh"  # count_gpus
usage="usage: bash scripts/train_imagenet.sh MODEL DATA_DIR [KEY=VALUE ...] [--dry-run]"
[ $# -ge 2 ] || die "$usage"
MODEL=$1 DATA=$2
shift 2
case "$MODEL" in -*|*=*) die "MODEL '$MODEL' looks like an option: $usage" ;; esac
[ -d "$DATA" ] || die "DATA_DIR '$DATA' is not a folder: pass the folder that holds train/ and val/"

case "$MODEL" in
    hgrn1d_vit_*|hgrn1_2d_vit_*) RECIPE=hgrn1 ;;
    hgrn2_vit_tiny|hgrn2_2d_vit_tiny) RECIPE=hgrn2_tiny ;;
    hgrn2_vit_small|hgrn2_2d_vit_small) RECIPE=hgrn2_small ;;
    *) RECIPE=deit ;;
esac

count_gpus

PY=${PYTHON:-python3}
ARGS=(--config-name "$RECIPE" "model.name=$MODEL" "data.path=$DATA" "train.output_dir=${OUTPUT_DIR:-runs/$MODEL}")
if [ "$NGPU" -eq 0 ]; then
    echo "train_imagenet.sh: no GPU: one CPU process (for smoke runs)" >&2
    CMD=("$PY" -m hgrn_fairseq.image.train "${ARGS[@]}" train.device=cpu "$@")
elif [ "$NGPU" -eq 1 ]; then
    CMD=("$PY" -m hgrn_fairseq.image.train "${ARGS[@]}" "$@")
else
    CMD=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$NGPU" -m hgrn_fairseq.image.train
         "${ARGS[@]}" "$@")
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # the package, installed or not
echo "recipe $RECIPE, $NGPU GPU(s): ${CMD[*]}" >&2
exec "${CMD[@]}"
