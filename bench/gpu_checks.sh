#!/usr/bin/env bash
# One call on a GPU machine: kernel/module tests on the real GPU, then what needs fairseq there. Run
# from the repository root with the wheels it installs in .whl/ (fla, accelerated-scan, fairseq's
# sources; see bench/README.md):
#
#   OUT=/some/dir bash bench/gpu_checks.sh [tests] [train] [mqar]
#
#   tests   pytest tests/kernels tests/modules on CUDA (no TRITON_INTERPRET), split over processes
#           so Triton compiles in parallel; log in $OUT/gpu_tests.log
#   train   bench/bench_train.py (needs fairseq, built from .whl in the background meanwhile)
#   mqar    scripts/run_mqar.sh with a reduced grid (needs fairseq); MQAR_* below
#   evidence  scripts/lm_evidence.sh (corpus, BPE, 3 models trained, extrapolation table);
#           its corpus and BPE steps run while fairseq builds
#   profile bench/profile_train.py (where a training step's time goes; PROFILE_ARGS passed on)
#   autotune  the HGRN2 test that pins every autotune config (tests/kernels/test_hgrn2_triton.py)
#   flawarm fla's HGRN2 model trained in the background from the start with Triton's autotune cache
#           on (its cold autotuning takes minutes); the cache comes back as $OUT/fla_autotune.tgz, to
#           be put in .whl/ so that later calls start warm
#
# Triton's cache lives in /tmp/tc with autotuning results kept (TRITON_CACHE_AUTOTUNING=1), seeded
# from .whl/fla_autotune.tgz when that exists.
#
# fairseq-fixed: installed from .whl/prebuilt/fairseq_fixed-*.whl when that exists (seconds), else
# built from .whl/fairseq_fixed-*.tar.gz as a wheel (85-110 s); SAVE_FAIRSEQ_WHEEL=1 returns that wheel
# in $OUT as two parts (NAME.whl.part00, .part01: a file of $OUT may have 16 MiB; they count 2 of its 8
# files): `cat NAME.whl.part* > .whl/prebuilt/NAME.whl`, and later calls skip the build.
#
# Time limits per stage come from TESTS_S, TRAIN_S, MQAR_S (seconds). TEST_PATHS narrows the tests
# stage; BENCH_TRAIN_ARGS goes to bench_train.py; SAVE_AUTOTUNE=1 returns Triton's autotune cache.
# The tests stage runs each pytest process with torch single-threaded (bench/split_pytest.sh): with the
# default thread count, 12 processes of 16 spinning threads each starve Triton's compiler (a fifth of
# the HGRN2 kernel tests finish in the time all of them take single-threaded).
#
# mqar stage (scripts/run_mqar.sh documents each; defaults in brackets): MQAR_SETTINGS [256:16,512:64]
# MQAR_DIMS [64,128,256,512] MQAR_LRS [1e-3,3e-3] MQAR_TRAIN_SIZE [20000] MQAR_EPOCHS [4]
# MQAR_MAX_UPDATE [none] MQAR_VALIDATE_EVERY [0] MQAR_JOBS [4] MQAR_GPUS [all] MQAR_S [420: no run
# starts after] MQAR_RUN_TIMEOUT [none]. MQAR_MPS=1 runs the sweep under CUDA MPS (several processes'
# kernels on one GPU at once), falling back to plain time-slicing when MPS does not start or fails its
# check; mqar.log says which. Outputs: mqar.log, mqar/{runs.csv,table.md,plot.png} and mqar_logs.tgz
# (per-run fairseq logs and runs/*.json with the validation curves).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/split_pytest.sh  # (also: OUT checked and created, el = seconds since the start)
STAGES=${*:-tests train}
R=$PWD
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 OMP_NUM_THREADS=4

. bench/gpu_fairseq.sh  # gpu_env, install_fairseq
gpu_env

export TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1
mkdir -p /tmp/tc
[ -f .whl/fla_autotune.tgz ] && tar xzf .whl/fla_autotune.tgz -C /tmp/tc
save_autotune() { (cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/fla_autotune.tgz" -T -); }

need_fairseq=0
case " $STAGES " in *" train "*|*" mqar "*|*" evidence "*|*" profile "*|*" flawarm "*) need_fairseq=1 ;; esac
if [ $need_fairseq = 1 ] && [ ! -d /tmp/site2/fairseq ]; then
  (install_fairseq > /tmp/fairseq_build.log 2>&1; echo "fairseq install rc=$? at $(el)s" >> /tmp/fairseq_build.log) &
  BUILD_PID=$!
fi

# fla's model needs no fairseq: it starts at once (its cold autotuning is the long pole)
if [[ " $STAGES " == *" flawarm "* ]]; then
  (timeout "${FLAWARM_S:-450}" python3 -m bench.bench_train --out "$OUT/flawarm" --models fla_hgrn2 \
      --budget-s $(( ${FLAWARM_S:-450} - 10 )) > /tmp/flawarm.log 2>&1; echo "flawarm rc=$? at $(el)s" >> /tmp/flawarm.log
   save_autotune) &
  FLAWARM_PID=$!
fi

EVID=${EVIDENCE_WORKDIR:-/tmp/lm_evidence}
if [[ " $STAGES " == *" evidence "* ]]; then  # the steps that need no fairseq, while it builds
  WORKDIR=$EVID PREP_ONLY=1 bash scripts/lm_evidence.sh > /tmp/evidence_prep.log 2>&1
  echo "evidence prep rc=$? at $(el)s"; tail -4 /tmp/evidence_prep.log
fi

if [[ " $STAGES " == *" autotune "* ]]; then
  echo "autotune tests done at $(el)s: $(split_pytest aids "${AUTOTUNE_PROCS:-8}" "${AUTOTUNE_S:-200}" \
    "$OUT/autotune_tests.log" tests/kernels/test_hgrn2_triton.py -k every_autotune)"
  grep -h "passed\|failed\|error\|== " "$OUT/autotune_tests.log" | tail -20
fi

if [[ " $STAGES " == *" tests "* ]]; then
  # shellcheck disable=SC2086  # TEST_PATHS is a list of paths
  echo "tests done at $(el)s: $(HGRN2_AUTOTUNE=0 split_pytest ids "${TEST_PROCS:-12}" "${TESTS_S:-240}" \
    "$OUT/gpu_tests.log" ${TEST_PATHS:-tests/kernels tests/modules})"
  grep -h "passed\|failed\|error\|== " "$OUT/gpu_tests.log" | tail -40
fi

if [ $need_fairseq = 1 ]; then
  [ -n "${BUILD_PID:-}" ] && wait "$BUILD_PID" 2>/dev/null
  grep -v "^ *$" /tmp/fairseq_build.log 2>/dev/null | tail -4
  export PYTHONPATH=$R:/tmp/site:/tmp/site2 PATH=/tmp/site2/bin:$PATH
fi


if [[ " $STAGES " == *" profile "* ]]; then
  timeout "${PROFILE_S:-300}" python3 -m bench.profile_train --out "$OUT/profile" ${PROFILE_ARGS:-} 2>&1 \
    | tee "$OUT/profile.log" | tail -80
  echo "profile done at $(el)s"
fi

if [[ " $STAGES " == *" train "* ]]; then
  timeout "${TRAIN_S:-330}" python3 -m bench.bench_train --out "$OUT" --budget-s $(( ${TRAIN_S:-330} - 20 )) \
    ${BENCH_TRAIN_ARGS:-} 2>&1 | tee "$OUT/bench_train.log" | tail -40
  rm -f "$OUT"/records_*.jsonl  # all of it is in bench_train.json (and $OUT brings back 8 files at most)
  echo "bench_train done at $(el)s"
fi

. bench/gpu_mps.sh  # start_mps / stop_mps (CUDA MPS) for the mqar stage

if [[ " $STAGES " == *" mqar "* ]]; then
  MPS_MODE="MPS off (MQAR_MPS is not 1): the runs sharing a GPU time-slice it"
  [ "${MQAR_MPS:-0}" = 1 ] && start_mps
  echo "mqar: $MPS_MODE" | tee "$OUT/mqar.log"
  SETTINGS=${MQAR_SETTINGS:-256:16,512:64} DIMS=${MQAR_DIMS:-64,128,256,512} LRS=${MQAR_LRS:-1e-3,3e-3} \
    TRAIN_SIZE=${MQAR_TRAIN_SIZE:-20000} EPOCHS=${MQAR_EPOCHS:-4} MAX_UPDATE=${MQAR_MAX_UPDATE:-} \
    VALIDATE_EVERY=${MQAR_VALIDATE_EVERY:-0} JOBS=${MQAR_JOBS:-4} GPUS=${MQAR_GPUS:-} TIME_BUDGET=${MQAR_S:-420} \
    OUT=$OUT/mqar bash scripts/run_mqar.sh --yes ${MQAR_RUN_TIMEOUT:+--run-timeout $MQAR_RUN_TIMEOUT} 2>&1 \
    | tee -a "$OUT/mqar.log" | tail -30
  [ "${MQAR_MPS:-0}" = 1 ] && stop_mps
  # $OUT brings back at most 8 files: the per-run logs and JSONs travel as one archive
  (cd "$OUT/mqar" && rm -rf checkpoints && tar czf ../mqar_logs.tgz $(ls -d logs runs 2>/dev/null) && rm -rf logs runs)
  echo "mqar done at $(el)s"
fi
if [[ " $STAGES " == *" evidence "* ]]; then
  WORKDIR=$EVID OUT=$OUT/evidence timeout "${EVIDENCE_S:-480}" bash scripts/lm_evidence.sh 2>&1 | tee "$OUT/evidence.log" | tail -60
  echo "evidence done at $(el)s"
fi
if [ -n "${FLAWARM_PID:-}" ]; then
  wait "$FLAWARM_PID"; tail -12 /tmp/flawarm.log; cp /tmp/flawarm.log "$OUT/flawarm.log"
fi
if [ -n "${SAVE_AUTOTUNE:-}" ]; then  # Triton's autotune results, for .whl/fla_autotune.tgz
  save_autotune
fi
echo "all done at $(el)s"
