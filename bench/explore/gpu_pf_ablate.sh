#!/usr/bin/env bash
# One GPU call: generated Pathfinder data of one difficulty, then lra_pathfinder_ablate.py variants, all
# at once on the GPU (one process each, under CUDA MPS where it starts), each capped in time; everything
# they write is packed into $OUT/pf_ablate.tar.gz (one file to bring back).
#
#   PF_CONTOUR=6 PF_NUM=40000 PF_STEPS=1500 PF_MINUTES=6.5 OUT=... \
#       bash bench/explore/gpu_pf_ablate.sh "base" "model=cnn" "pool=last" ...
#
# PF_STATE_DIR (relative to the root, e.g. checkpoints/pf_ablate): variant i resumes from / writes
# PF_STATE_DIR/v<i>.pt (lra_pathfinder_ablate.py --state), copied back as $OUT/state_v<i>.pt.
# Run from the repository root with .whl/ carried (gpu_lra.sh installs fairseq for the data scripts' imports).
# With no variants (probes only, PF_PROBES) there is no data step and nothing to carry. On a machine with
# several GPUs the runs are dealt out over them in turn (variants first, then probes; CUDA_VISIBLE_DEVICES),
# one MPS daemon serving all; gpus.txt in the archive says which run had which GPU.
set -uo pipefail
R=$PWD
START=$(date +%s)
el() { echo $(( $(date +%s) - START )); }
: "${OUT:?set OUT}"
W=${PF_WORK:-/tmp/pf_ablate}  # (data, logs; PF_WORK for a trial run elsewhere)
mkdir -p "$W" "$OUT"
# the data (and, on a bare machine, fairseq for the data scripts' imports) as gpu_lra.sh makes them for its
# Pathfinder tasks: pathfinder (LRA's contour length 14), pathfinder6, pathfinder9; a warm machine's data
# are reused. Its logs go under $W/lra, into the archive.
C=${PF_CONTOUR:-6}
TASK=pathfinder$([ "$C" = 14 ] || echo "$C")
DATA=$W/data-bin/$TASK
if [ $# -gt 0 ]; then
    OUT="$W/lra" LRA_WORK="$W" LRA_PARTS="${TASK}_data" LRA_PF_NUM="${PF_NUM:-40000}" bash bench/gpu_lra.sh \
        > "$W/data.log" 2>&1
    echo "data rc=$? at $(el)s"; tail -4 "$W/data.log"
    [ -f "$DATA/meta.json" ] || { echo "gpu_pf_ablate.sh: no prepared data in $DATA (see $W/data.log)"; exit 2; }
fi
export PYTHONPATH=$R:/tmp/site:/tmp/site2
. scripts/gpu_count.sh
NUM_GPUS= count_gpus  # (NGPU: the GPUs of CUDA_VISIBLE_DEVICES, else nvidia-smi's)
[ "$NGPU" -ge 1 ] || NGPU=1
n=0  # runs started so far: run n goes to GPU n % NGPU
gpu_next() { GPU=$((n % NGPU)); n=$((n + 1)); }
: > "$W/gpus.txt"
. bench/gpu_mps.sh
start_mps
echo "$MPS_MODE" | tee "$W/mps.txt"
CAP=$(python3 -c "print(int(float('${PF_MINUTES:-6.5}') * 60 + 75))")  # a hung variant cannot hold the call
i=0
for v in "$@"; do
    i=$((i + 1))
    st=()
    [ -n "${PF_STATE_DIR:-}" ] && mkdir -p "$PF_STATE_DIR" && st=(--state "$PF_STATE_DIR/v$i.pt")
    gpu_next; echo "v$i GPU $GPU $v" >> "$W/gpus.txt"
    CUDA_VISIBLE_DEVICES=$GPU timeout -s INT "$CAP" python3 -m bench.explore.lra_pathfinder_ablate "$DATA" --out "$W/v$i.json" --variant "$v" "${st[@]}" \
        --steps "${PF_STEPS:-1500}" --minutes "${PF_MINUTES:-6.5}" --eval-every "${PF_EVAL:-500}" \
        > "$W/v$i.log" 2>&1 &
done
# PF_PROBES: lra_grid_toy_probe.py runs beside the variants, ';'-separated argument lists (each gets
# --device cuda, or PF_PROBE_DEVICE for a CPU trial, and --out $W/p<i>.json; give --backend triton or
# reference), capped like the variants
IFS=';' read -r -a probes <<< "${PF_PROBES:-}"
j=0
for a in "${probes[@]}"; do
    [ -n "${a// /}" ] || continue
    j=$((j + 1))
    # shellcheck disable=SC2086  # (the argument list is meant to split on spaces)
    gpu_next; echo "p$j GPU $GPU $a" >> "$W/gpus.txt"
    CUDA_VISIBLE_DEVICES=$GPU timeout -s INT "$CAP" python3 -m bench.explore.lra_grid_toy_probe --device "${PF_PROBE_DEVICE:-cuda}" --threads 1 $a \
        --out "$W/p$j.json" > "$W/p$j.log" 2>&1 &
done
wait
stop_mps
echo "variants done at $(el)s"
if [ -n "${PF_STATE_DIR:-}" ]; then
    for f in "$PF_STATE_DIR"/v*.pt; do [ -f "$f" ] && cp "$f" "$OUT/state_${f##*/}"; done
fi
for f in "$W"/v*.log; do echo "== $f"; grep -E "valid|stopped|Error|error" "$f" | tail -4; done
for f in "$W"/p*.log; do [ -f "$f" ] && { echo "== $f"; tail -4 "$f"; }; done
python3 - "$W" <<'EOF' > "$W/summary.txt"
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/v*.json"), key=lambda s: int(s.rsplit("v", 1)[1][:-5])):
    for e in json.load(open(f)):
        last = e["log"][-1] if e["log"] else {}
        ev = e["evals"][-1] if e["evals"] else {}
        print(f"{e['spec']:45s} steps {last.get('step')} loss {last.get('loss_bits')} bits train "
              f"{last.get('train_acc')} valid {ev.get('valid_acc')} (class-1 share {ev.get('pred1_share')}) "
              f"{last.get('seconds')} s")
EOF
cat "$W/summary.txt"
tar -czf "$OUT/pf_ablate.tar.gz" -C "$W" --exclude generated --exclude data-bin .
echo "packed at $(el)s"
