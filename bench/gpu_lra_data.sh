#!/usr/bin/env bash
# Offline LRA data on the GPU host (issue 20): generate ListOps (96k/2k/2k) and Pathfinder32 with the
# generators, binarise both with prepare_lra.py, and record wall times, counts and label histograms.
# Needs python3 with numpy, Pillow, tqdm (generators) and fairseq + torch (prepare_lra.py) importable,
# e.g. run from bench/gpu_session.sh after gpu_env / install_fairseq. Reruns reuse finished outputs.
# Environment: LRA_GEN [/tmp/lra_generated]  LRA_BIN [data-bin/lra]  PF_NUM [200000]  PF_SIZE [32]
#   LRA_WORKERS [nproc]  LRA_STAGES [listops,pathfinder]  LO_SIZES [96000,2000,2000] (train,valid,test)
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}"
GEN=${LRA_GEN:-/tmp/lra_generated}
BIN=${LRA_BIN:-data-bin/lra}
W=${LRA_WORKERS:-$(nproc)}
STAGES=${LRA_STAGES:-listops,pathfinder}
mkdir -p "$OUT" "$GEN" "$BIN"
timed() {  # name cmd...: run, log to $OUT/name.log, append "name seconds rc" to $OUT/lra_data_times.txt
  local name=$1 t0 rc; shift
  t0=$(date +%s.%N)
  "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "$name $(python3 -c "import time; print(round(time.time() - $t0, 1))") rc=$rc workers=$W" | tee -a "$OUT/lra_data_times.txt"
  return $rc
}
if [[ ",$STAGES," == *",listops,"* ]]; then
  IFS=, read -r LO_TRAIN LO_VALID LO_TEST <<< "${LO_SIZES:-96000,2000,2000}"
  timed listops_generate python3 data_prep/lra_listops.py --dest "$GEN" --workers "$W" --no-progress \
    --train "$LO_TRAIN" --valid "$LO_VALID" --test "$LO_TEST"
  timed listops_prepare python3 data_prep/prepare_lra.py listops --source "$GEN" --dest "$BIN/listops" --workers "$W"
  cp "$GEN/listops-1000/GENERATOR.json" "$OUT/listops_GENERATOR.json" 2>/dev/null
  cp "$BIN/listops/meta.json" "$OUT/listops_meta.json" 2>/dev/null
fi
if [[ ",$STAGES," == *",pathfinder,"* ]]; then
  task=pathfinder; [ "${PF_SIZE:-32}" = 128 ] && task=pathx
  timed ${task}_generate python3 data_prep/lra_pathfinder.py --dest "$GEN" --num "${PF_NUM:-200000}" \
    --size "${PF_SIZE:-32}" --workers "$W" --no-progress
  timed ${task}_prepare python3 data_prep/prepare_lra.py $task --source "$GEN" --dest "$BIN/$task" --workers "$W"
  cp "$GEN/pathfinder${PF_SIZE:-32}/curv_contour_length_14/GENERATOR.json" "$OUT/${task}_GENERATOR.json" 2>/dev/null
  cp "$BIN/$task/meta.json" "$OUT/${task}_meta.json" 2>/dev/null
  python3 - "$GEN/pathfinder${PF_SIZE:-32}/curv_contour_length_14" "$OUT/${task}_samples.png" <<'PY'
import os, sys
import numpy as np
from PIL import Image
root, out = sys.argv[1:]
tiles = [np.asarray(Image.open(os.path.join(root, "imgs", "0", f"sample_{i}.png"))) for i in range(32)]
rows = [np.concatenate(tiles[r * 8:(r + 1) * 8], 1) for r in range(4)]
Image.fromarray(np.concatenate(rows, 0)).save(out)
PY
fi
cat "$OUT/lra_data_times.txt"
