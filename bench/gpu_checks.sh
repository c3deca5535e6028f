#!/usr/bin/env bash
# One GPU-machine session (see ../shared/DEVICE.md): kernel/module tests on the real GPU, then what
# needs fairseq there. Run from the repository root with the wheels of DEVICE.md in .whl/:
#
#   OUT=/some/dir bash bench/gpu_checks.sh [tests] [train] [mqar]
#
#   tests   pytest tests/kernels tests/modules on CUDA (no TRITON_INTERPRET), split over processes
#           so Triton compiles in parallel; log in $OUT/gpu_tests.log
#   train   bench/bench_train.py (needs fairseq, built from .whl in the background meanwhile)
#   mqar    scripts/run_mqar.sh with a reduced grid (needs fairseq)
#   evidence  scripts/lm_evidence.sh (issue 5: corpus, BPE, 3 models trained, extrapolation table);
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
# Time limits per stage come from TESTS_S, TRAIN_S, MQAR_S (seconds). TEST_PATHS narrows the tests
# stage; BENCH_TRAIN_ARGS goes to bench_train.py; SAVE_AUTOTUNE=1 returns Triton's autotune cache.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/split_pytest.sh
: "${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
STAGES=${*:-tests train}
R=$PWD
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 OMP_NUM_THREADS=4

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$R:/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.txt"

export TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1
mkdir -p /tmp/tc
[ -f .whl/fla_autotune.tgz ] && tar xzf .whl/fla_autotune.tgz -C /tmp/tc
save_autotune() { (cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/fla_autotune.tgz" -T -); }

need_fairseq=0
case " $STAGES " in *" train "*|*" mqar "*|*" evidence "*|*" profile "*|*" flawarm "*) need_fairseq=1 ;; esac
if [ $need_fairseq = 1 ] && [ ! -d /tmp/site2/fairseq ]; then
  (cd /tmp && env -u CUDA_HOME MAX_JOBS=8 python3 -m pip install -q --no-index --no-deps --no-build-isolation \
     --target /tmp/site2 "$R"/.whl/*.tar.gz > /tmp/fairseq_build.log 2>&1; echo "build rc=$? at $(el)s" >> /tmp/fairseq_build.log) &
  BUILD_PID=$!
fi

# fla's model needs no fairseq: it starts at once (its cold autotuning is the long pole)
if [[ " $STAGES " == *" flawarm "* ]]; then
  (timeout "${FLAWARM_S:-450}" python3 bench/bench_train.py --out "$OUT/flawarm" --models fla_hgrn2 \
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
  cat /tmp/fairseq_build.log 2>/dev/null | tail -3
  export PYTHONPATH=$R:/tmp/site:/tmp/site2 PATH=/tmp/site2/bin:$PATH
fi


if [[ " $STAGES " == *" profile "* ]]; then
  timeout "${PROFILE_S:-300}" python3 bench/profile_train.py --out "$OUT/profile" ${PROFILE_ARGS:-} 2>&1 \
    | tee "$OUT/profile.log" | tail -80
  echo "profile done at $(el)s"
fi

if [[ " $STAGES " == *" train "* ]]; then
  timeout "${TRAIN_S:-330}" python3 bench/bench_train.py --out "$OUT" --budget-s $(( ${TRAIN_S:-330} - 20 )) \
    ${BENCH_TRAIN_ARGS:-} 2>&1 | tee "$OUT/bench_train.log" | tail -40
  rm -f "$OUT"/records_*.jsonl  # all of it is in bench_train.json (and $OUT brings back 8 files at most)
  echo "bench_train done at $(el)s"
fi

if [[ " $STAGES " == *" mqar "* ]]; then
  TRAIN_SIZE=${MQAR_TRAIN_SIZE:-20000} EPOCHS=${MQAR_EPOCHS:-4} LRS=${MQAR_LRS:-1e-3,3e-3} \
    JOBS=${MQAR_JOBS:-4} TIME_BUDGET=${MQAR_S:-420} OUT=$OUT/mqar bash scripts/run_mqar.sh ${MQAR_RUN_TIMEOUT:+--run-timeout $MQAR_RUN_TIMEOUT} 2>&1 \
    | tee "$OUT/mqar.log" | tail -30
  # $OUT brings back at most 8 files: the per-run logs travel as one archive
  (cd "$OUT/mqar" && tar czf ../mqar_logs.tgz logs && rm -rf logs)
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
