# Sourced by the entry points (train_wt103.sh, train_lra.sh, train_imagenet.sh, demo.sh,
# eval_extrapolation.sh), which define die().
#
# count_gpus sets NGPU: $NUM_GPUS when set (0 for CPU), else the devices of CUDA_VISIBLE_DEVICES,
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

# cpu_threads: call it when the run goes to the CPU. Unless the caller set OMP_NUM_THREADS, it exports
# OMP_NUM_THREADS=1: the small models' CPU steps are many small ops, which one OpenMP thread per process
# runs several times faster than one thread per core. Sets CPU_THREADS_SET=1 when it set the variable
# (so that a dry run can print it), 0 otherwise.
cpu_threads() {
    if [ -z "${OMP_NUM_THREADS:-}" ]; then
        export OMP_NUM_THREADS=1
        CPU_THREADS_SET=1
    else
        CPU_THREADS_SET=0
    fi
}
