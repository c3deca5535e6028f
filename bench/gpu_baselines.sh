#!/usr/bin/env bash
# GPU evidence for the baselines (docs/baselines.md), run by bench/gpu_session.sh (stage baselines) with fairseq
# on the PYTHONPATH:
#   1. tests/modules/test_baseline_mixers.py and tests/models/test_baseline_archs.py on CUDA (the Triton
#      scans of LRU / MLGRU against the reference, gradients included);
#   2. bench/bench_train.py rows (tokens/s, peak memory; bf16 autocast, fused CE) for hgrn_lm_base and the
#      four baseline archs at 16 x 512 and 1 x 8192, eager and with --cuda-graphs (the HGRN recipes'
#      setting; the baselines' recipes stay eager until these rows show graphs work and help);
#   3. scripts/lm_evidence.sh with every model, the same updates each: validation PPL and the
#      extrapolation table / plot.
# Environment: BL_STAGES [tests,bench,evidence]  BL_MAX_UPDATE [600]  BL_TRAIN_MINUTES [3]  BL_BENCH_S [210]
#   BL_MODELS [hgrn_lm_base,hgrn2_lm_base,transformer_lm_wt103_small,lru_lm_base,lru_mml_lm_base,mlgru_lm_base,mlgru_mml_lm_base]
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}"
STAGES=${BL_STAGES:-tests,bench,evidence}
if [[ ",$STAGES," == *",tests,"* ]]; then
  OMP_NUM_THREADS=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -m "" tests/modules/test_baseline_mixers.py \
    tests/models/test_baseline_archs.py -k "not fairseq_train and not flattened_bf16" > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/gpu_tests.log"
fi
if [[ ",$STAGES," == *",bench,"* ]]; then
  timeout $(( ${BL_BENCH_S:-210} + 30 )) python3 -m bench.bench_train --out "$OUT/bench_train" --loss fused \
    --models hgrn_lm_base,lru_lm_base,lru_mml_lm_base,mlgru_lm_base,mlgru_mml_lm_base,hgrn_lm_base+graphs,lru_lm_base+graphs,lru_mml_lm_base+graphs,mlgru_lm_base+graphs,mlgru_mml_lm_base+graphs --shapes 16x512,1x8192 \
    --budget-s "${BL_BENCH_S:-210}" > "$OUT/bench_train.log" 2>&1
  echo "bench_train rc=$?"; grep -A16 "^| model" "$OUT/bench_train/bench_train.md" | head -20
  rm -f "$OUT"/bench_train/records_*.jsonl
fi
if [[ ",$STAGES," == *",evidence,"* ]]; then
  WORKDIR=/tmp/bl_evidence OUT=$OUT/evidence \
    MODELS=${BL_MODELS:-hgrn_lm_base,hgrn2_lm_base,transformer_lm_wt103_small,lru_lm_base,lru_mml_lm_base,mlgru_lm_base,mlgru_mml_lm_base} \
    MAX_UPDATE=${BL_MAX_UPDATE:-600} TRAIN_MINUTES=${BL_TRAIN_MINUTES:-3} LENGTHS=512,2048,4096 CORPUS_BYTES=30000000 \
    bash scripts/lm_evidence.sh > "$OUT/lm_evidence.log" 2>&1
  echo "lm_evidence rc=$?"; tail -25 "$OUT/lm_evidence.log"
fi
