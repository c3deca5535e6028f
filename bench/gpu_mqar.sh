#!/usr/bin/env bash
# The MQAR sweep (scripts/run_mqar.sh) on the GPU machine, one time-boxed slice per call (docs/mqar.md):
#
#   OUT=/some/dir bash bench/gpu_mqar.sh
#
# run tool: carry [".whl"] (fairseq), plus "results/mqar_carry" when continuing a sweep on a fresh machine.
#
# Where the sweep lives: results/mqar_gpu (MQAR_STATE) on the GPU machine, an ignored folder that a warm
# machine keeps between calls. A call continues it there if it exists (paused runs first, from their
# checkpoints, then new runs); otherwise it restores it from results/mqar_carry (MQAR_CARRY: the files
# an earlier call returned, copied there on the CPU machine), otherwise it starts a new sweep. The carried
# files restore only into a folder of the name they were packed from (scripts/mqar_state.py): a warm machine
# keeps results/mqar_carry from an earlier call, so start a new sweep there with MQAR_CARRY=/nonexistent.
# Runs still going at the end of the slice stop with a checkpoint (fairseq --stop-time-hours) and are
# 'paused'; a run killed anyway loses only the updates since its last checkpoint.
#
# What comes back in $OUT (at most 8 files of <= 16 MiB: that is all $OUT returns):
#   gpu_mqar.log       this call's log (the sweep's lines, the state restored, what was packed)
#   mqar_table.md      the table so far; env.txt the GPU and versions
#   mqar_results.tgz   the whole sweep minus checkpoints: runs/*.json (every validation), logs/, runs.csv,
#                      table.md, plot.png. Unpacked into bench/results/<name>/, it is what
#                      `OUT=bench/results/<name> bash scripts/run_mqar.sh --report-only` reads.
#   mqar_ckpt.tar.partNN  checkpoint_last.pt of paused runs, smallest first, at most MQAR_CKPT_MB MiB in
#                      all (default 26: the run tool carries at most 64 MiB into a call, .whl/ takes 33),
#                      in 15 MiB parts. Checkpoints that did not fit are listed in the log; on a fresh
#                      machine those runs start over (the sweep records it as a restart).
# To continue on a fresh machine: rm -rf results/mqar_carry && mkdir -p results/mqar_carry &&
#   cp FILES_AT/mqar_results.tgz FILES_AT/mqar_ckpt.tar.part* results/mqar_carry/   (then carry it)
#
# Knobs (defaults in brackets; scripts/run_mqar.sh documents the sweep's):
#   MQAR_CALL_S [570]: the call's length; the slice ends MQAR_PACK_S [75] s before it (final saves,
#       packing). MQAR_SLICE_S overrides the slice.
#   MQAR_SETTINGS [256:16,512:64]  MQAR_DIMS [64,128,256,512]  MQAR_MODELS [hgrn1,hgrn2]
#   MQAR_LRS [1e-4,5e-4,1e-3,5e-3]  MQAR_EXPAND [64,128]  MQAR_BATCH [256,64: the paper's]  MQAR_SEEDS [1]
#   MQAR_EPOCHS [16]  MQAR_MAX_UPDATE [none: overrides epochs]  MQAR_TRAIN_SIZE [100000]
#   MQAR_VALIDATE_EVERY [500]  MQAR_CKPT_EVERY [500]  MQAR_JOBS [8]  MQAR_MPS [1]
#   MQAR_FAIRSEQ_ARGS [--cuda-graphs]  MQAR_REVEAL_ANSWERS [0]
# The grid must stay the same from call to call of one sweep (the run names and schedules come from it).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/split_pytest.sh  # (OUT checked and created, el = seconds since the start)
R=$PWD
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
LOG=$OUT/gpu_mqar.log
STATE=${MQAR_STATE:-results/mqar_gpu}
CARRY=${MQAR_CARRY:-results/mqar_carry}
say() { echo "$*" | tee -a "$LOG"; }

. bench/gpu_fairseq.sh  # gpu_env, gpu_versions, install_fairseq
if python3 -c "import fairseq" > /dev/null 2>&1; then  # under gpu_session.sh (stage mqar): set up already
  gpu_versions > "$OUT/env.txt" 2>&1
else
  gpu_env
  if [ ! -d /tmp/site2/fairseq ]; then
    install_fairseq > /tmp/fairseq_build.log 2>&1 || { cat /tmp/fairseq_build.log | tee -a "$LOG"; exit 1; }
  fi
  export PYTHONPATH=$R:/tmp/site:/tmp/site2 PATH=/tmp/site2/bin:$PATH
fi
say "fairseq ready at $(el)s"

if ls "$STATE"/runs/*.json > /dev/null 2>&1; then
  say "state: continuing $STATE on this warm machine ($(ls "$STATE"/runs | wc -l) run records, $(ls -d "$STATE"/checkpoints/*/ 2>/dev/null | wc -l) checkpoint folders)"
elif [ -f "$CARRY/mqar_results.tgz" ]; then
  python3 scripts/mqar_state.py restore "$CARRY" "$STATE" 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
else
  say "state: new sweep in $STATE"
fi

SLICE=${MQAR_SLICE_S:-$(( ${MQAR_CALL_S:-570} - ${MQAR_PACK_S:-75} - $(el) ))}
MPS_MODE="MPS off (MQAR_MPS is not 1): the runs sharing the GPU time-slice it"
. bench/gpu_mps.sh
[ "${MQAR_MPS:-1}" = 1 ] && start_mps
say "mqar: $MPS_MODE; slice ${SLICE}s from $(el)s"
SETTINGS=${MQAR_SETTINGS:-256:16,512:64} DIMS=${MQAR_DIMS:-64,128,256,512} MODELS=${MQAR_MODELS:-hgrn1,hgrn2} \
  LRS=${MQAR_LRS:-1e-4,5e-4,1e-3,5e-3} SEEDS=${MQAR_SEEDS:-1} EXPAND=${MQAR_EXPAND-64,128} BATCH_SIZE=${MQAR_BATCH:-256,64} \
  EPOCHS=${MQAR_EPOCHS:-16} MAX_UPDATE=${MQAR_MAX_UPDATE:-} TRAIN_SIZE=${MQAR_TRAIN_SIZE:-100000} \
  VALIDATE_EVERY=${MQAR_VALIDATE_EVERY:-500} CKPT_EVERY=${MQAR_CKPT_EVERY:-500} JOBS=${MQAR_JOBS:-8} \
  FAIRSEQ_ARGS=${MQAR_FAIRSEQ_ARGS---cuda-graphs} REVEAL_ANSWERS=${MQAR_REVEAL_ANSWERS:-0} SLICE_S=$SLICE \
  OUT=$STATE PYTHON=python3 bash scripts/run_mqar.sh --yes --slice-grace-s 30 2>&1 | tee -a "$LOG" | grep -v "^|" | tail -40
[ "${MQAR_MPS:-1}" = 1 ] && stop_mps
say "sweep slice done at $(el)s"

# Pack: the records (small) always; checkpoints of paused runs while they fit
cp "$STATE/table.md" "$OUT/mqar_table.md" 2>/dev/null
python3 scripts/mqar_state.py pack "$STATE" "$OUT" --ckpt-mb "${MQAR_CKPT_MB:-26}" 2>&1 | tee -a "$LOG"
ls -la "$OUT" | tee -a "$LOG"
say "all done at $(el)s"
