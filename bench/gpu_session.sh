#!/usr/bin/env bash
# One GPU-machine call that runs several evidence/benchmark stages with fairseq installed (see
# ../shared/DEVICE.md). Run from the repository root with the wheels of DEVICE.md in .whl/:
#
#   OUT=/some/dir bash bench/gpu_session.sh STAGE[:SECONDS] ...
#
# Each STAGE is a command name below, run under its own time limit (default 300 s), its output in
# $OUT/STAGE.log (and on stdout, tail only). Stages:
#   precision   bench/bench_precision.py: train_wt103.sh tokens/s at fp32 / tf32 / bf16
#   lra         bench/gpu_lra.sh           image       bench/gpu_image.sh
#   lm_speed    bench/bench_train.py (LM_SPEED_ARGS): the LMs' training tokens/s against transformer_lm
#   profile_image  bench/profile_image.py (PROFILE_IMAGE_ARGS): where an image training step spends GPU time
#   baselines   bench/gpu_baselines.sh     lm_eval     bench/gpu_lm_eval.sh
#   tests:PATHS... is not a stage: use TEST_PATHS with bench/gpu_checks.sh for kernel tests.
# SAVE_FAIRSEQ_WHEEL=1 returns the fairseq wheel built here in $OUT (two parts; see gpu_fairseq.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/split_pytest.sh  # OUT checked and created; el = seconds since the start
R=$PWD
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 OMP_NUM_THREADS=4

. bench/gpu_fairseq.sh  # gpu_env, install_fairseq
gpu_env
if [ ! -d /tmp/site2/fairseq ]; then
  install_fairseq > "$OUT/fairseq_install.log" 2>&1
  echo "fairseq install rc=$? at $(el)s"
fi
export PYTHONPATH=$R:/tmp/site:/tmp/site2 PATH=/tmp/site2/bin:$PATH
export TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc

for spec in "$@"; do
  stage=${spec%%:*}
  limit=300
  [ "$spec" != "$stage" ] && limit=${spec#*:}
  case $stage in
    precision) cmd=(python3 bench/bench_precision.py --out "$OUT/precision") ;;
    lra) cmd=(bash bench/gpu_lra.sh) ;;
    image) cmd=(bash bench/gpu_image.sh) ;;
    lm_speed) cmd=(python3 bench/bench_train.py --out "$OUT/lm_speed" ${LM_SPEED_ARGS:-}) ;;
    profile_image) cmd=(python3 bench/profile_image.py --out "$OUT/profile_image" ${PROFILE_IMAGE_ARGS:-}) ;;
    baselines) cmd=(bash bench/gpu_baselines.sh) ;;
    lm_eval) cmd=(bash bench/gpu_lm_eval.sh) ;;
    *) echo "gpu_session.sh: unknown stage '$stage'"; continue ;;
  esac
  echo "== $stage (limit ${limit}s) at $(el)s"
  mkdir -p "$OUT/$stage"
  OUT=$OUT/$stage timeout "$limit" "${cmd[@]}" > "$OUT/$stage.log" 2>&1
  echo "== $stage rc=$? at $(el)s"
  tail -25 "$OUT/$stage.log"
done
echo "all done at $(el)s"
# $OUT brings back at most 8 files of 16 MiB: everything but the wheel parts travels as one archive
# (split when larger).
# (Split parts a stage left in its own folder, e.g. gpu_lra.sh's checkpoint state, move up to travel alone.)
cd "$OUT" && find . -mindepth 2 -name '*.part[0-9]*' -exec mv -t . {} + ; \
  tar czf /tmp/session.tgz --exclude='*.part*' --exclude='*.pt' . && \
  find . -mindepth 1 -maxdepth 1 ! -name '*.part*' -exec rm -rf {} + && \
  split -b 15M -d /tmp/session.tgz session.tgz.part && ls -la "$OUT"
