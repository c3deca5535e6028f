#!/usr/bin/env bash
# One GPU-machine call that runs several evidence/benchmark stages with fairseq installed. Run from the
# repository root with the wheels in .whl/ (bench/README.md, "On a GPU machine"):
#
#   OUT=/some/dir bash bench/gpu_session.sh STAGE[:SECONDS] ...
#
# Each STAGE is a command name below, run under its own time limit (default 300 s), its output in
# $OUT/STAGE.log (and on stdout, tail only). Stages:
#   precision   bench/bench_precision.py: train_wt103.sh tokens/s at fp32 / tf32 / bf16
#   lra         bench/gpu_lra.sh           image       bench/gpu_image.sh
#   lm_speed    bench/bench_train.py (LM_SPEED_ARGS): the LMs' training tokens/s against transformer_lm
#   profile_image  bench/profile_image.py (PROFILE_IMAGE_ARGS): where an image training step spends GPU time
#   scan_configs   bench/explore/hgrn2_image_scan_configs.py (SCAN_CONFIGS_ARGS, e.g. "--kernels dqdg"): the HGRN2
#               chunk kernels' candidate configs timed at the image models' scans
#   ln_rows     bench/explore/block_ops_ln_rows.py (LN_ROWS_ARGS): the image models' LayerNorm forward + backward
#               by rows per program of its backward, against PyTorch's, at the image models' widths
#   dqdg_sanitize  bench/explore/hgrn2_head64_configs.py --sanitize (DQDG_SANITIZE_ARGS, default "--batch 16"): every
#               dq/dg config at head 64 under compute-sanitizer memcheck (rows in dqdg_sanitize.log)
#   baselines   bench/gpu_baselines.sh     lm_eval     bench/gpu_lm_eval.sh
#   mqar        bench/gpu_mqar.sh: one slice of the MQAR sweep (its MQAR_* knobs; MQAR_CALL_S defaults to the
#               stage's limit - 5). Its files come back inside session.tgz (mqar/mqar_results.tgz, ...) except
#               the checkpoint parts mqar_ckpt.tar.partNN, which travel alone.
#   tests:PATHS... is not a stage: use TEST_PATHS with bench/gpu_checks.sh for kernel tests.
# SESSION_PARALLEL=1 runs the stages at the same time, under one CUDA MPS daemon they share. Only for stages
#   that leave a GPU idle: LRA ListOps beside the MQAR sweep gained nothing, so run those one after the other.
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

run_stage() {  # STAGE[:SECONDS]: the stage under its time limit, its output in $OUT/STAGE.log
  local spec=$1 stage=${1%%:*} limit=300 cmd
  [ "$spec" != "$stage" ] && limit=${spec#*:}
  case $stage in
    precision) cmd=(python3 -m bench.bench_precision --out "$OUT/precision") ;;
    # the LRA slices end so that their test evaluations and the state packing fit the stage's limit
    lra) cmd=(env LRA_CALL_S="${LRA_CALL_S:-$(( limit - 5 ))}" bash bench/gpu_lra.sh) ;;
    image) cmd=(bash bench/gpu_image.sh) ;;
    lm_speed) cmd=(python3 -m bench.bench_train --out "$OUT/lm_speed" ${LM_SPEED_ARGS:-}) ;;
    profile_image) cmd=(python3 -m bench.profile_image --out "$OUT/profile_image" ${PROFILE_IMAGE_ARGS:-}) ;;
    scan_configs) cmd=(python3 -m bench.explore.hgrn2_image_scan_configs --out "$OUT/scan_configs" ${SCAN_CONFIGS_ARGS:-}) ;;
    ln_rows) cmd=(python3 -m bench.explore.block_ops_ln_rows --out "$OUT/ln_rows" ${LN_ROWS_ARGS:-}) ;;
    dqdg_sanitize) cmd=(python3 -m bench.explore.hgrn2_head64_configs --sanitize ${DQDG_SANITIZE_ARGS:---batch 16}) ;;
    baselines) cmd=(bash bench/gpu_baselines.sh) ;;
    lm_eval) cmd=(bash bench/gpu_lm_eval.sh) ;;
    # the sweep's slice ends so that it has packed before the stage's limit
    mqar) cmd=(env MQAR_CALL_S="${MQAR_CALL_S:-$(( limit - 5 ))}" bash bench/gpu_mqar.sh) ;;
    *) echo "gpu_session.sh: unknown stage '$stage'"; return ;;
  esac
  echo "== $stage (limit ${limit}s) at $(el)s"
  mkdir -p "$OUT/$stage"
  OUT=$OUT/$stage timeout "$limit" "${cmd[@]}" > "$OUT/$stage.log" 2>&1
  echo "== $stage rc=$? at $(el)s"
}

if [ "${SESSION_PARALLEL:-0}" = 1 ]; then
  # All stages at once on the machine's GPU(s), under one CUDA MPS daemon that the stages share (their own
  # start_mps/stop_mps leave it alone: MPS_SHARED); small models (LRA ListOps, MQAR) leave a GPU partly idle.
  . bench/gpu_mps.sh
  start_mps
  export MPS_SHARED=1 MPS_SHARED_MODE="$MPS_MODE"
  echo "== stages at once: $*; $MPS_MODE"
  for spec in "$@"; do
    run_stage "$spec" &
  done
  wait
  unset MPS_SHARED
  stop_mps
  for spec in "$@"; do
    echo "-- ${spec%%:*}"
    tail -25 "$OUT/${spec%%:*}.log"
  done
else
  for spec in "$@"; do
    run_stage "$spec"
    tail -25 "$OUT/${spec%%:*}.log"
  done
fi
echo "all done at $(el)s"
# $OUT brings back at most 8 files of 16 MiB: everything but the wheel parts travels as one archive
# (split when larger).
# (Split parts a stage left in its own folder, e.g. gpu_lra.sh's checkpoint state, move up to travel alone.)
cd "$OUT" && find . -mindepth 2 -name '*.part[0-9]*' -exec mv -t . {} + ; \
  tar czf /tmp/session.tgz --exclude='*.part*' --exclude='*.pt' . && \
  find . -mindepth 1 -maxdepth 1 ! -name '*.part*' -exec rm -rf {} + && \
  split -b 15M -d /tmp/session.tgz session.tgz.part && ls -la "$OUT"
