# Sourced by the training entry points (train_wt103.sh, train_lra.sh, train_imagenet.sh), which define
# die(). count_gpus sets NGPU: $NUM_GPUS when set (0 for CPU), else the devices of CUDA_VISIBLE_DEVICES,
# else the GPUs nvidia-smi lists, else 0.
count_gpus() {
    if [ -n "${NUM_GPUS:-}" ]; then
        case "$NUM_GPUS" in '' | *[!0-9]*) die "NUM_GPUS='$NUM_GPUS' is not a number: set it to the number of GPUs to use (0 for CPU)" ;; esac
        NGPU=$NUM_GPUS
    elif [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
        NGPU=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c '[0-9]' || true)
    elif command -v nvidia-smi >/dev/null 2>&1; then
        NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    else
        NGPU=0
    fi
}
