#!/usr/bin/env bash
# GPU evidence for Long Range Arena (issue 20, deliverable 6). Run on the GPU machine through
# bench/gpu_session.sh (stage lra), which installs fairseq and puts it and the repository on the
# PYTHONPATH, one part per call (each fits a ~10-minute call on a 16-core, 1-GPU machine):
#
#   LRA_PARTS=listops    OUT=/some/dir bash bench/gpu_session.sh lra:520
#   LRA_PARTS=pathfinder OUT=/some/dir bash bench/gpu_session.sh lra:520
#   LRA_PARTS=tests,bench OUT=/some/dir bash bench/gpu_session.sh lra:520
#
# (Standalone, with fairseq importable: OUT=/some/dir LRA_PARTS=... bash bench/gpu_lra.sh.)
# Parts:
# A call has ~600 s in all: gpu_session.sh's set-up (~1 min), data (~1.5 min for ListOps), and per model
# LRA_TRAIN_MINUTES plus ~1 min (start-up, Triton autotuning, validation, test). LRA_MODELS="hgrn1" (or
# "hgrn2") trains one model per call, e.g. LRA_MODELS=hgrn1 LRA_TRAIN_MINUTES=5 for a longer run. An entry
# MODEL:SEED trains that model with another seed than the recipe's 2222 in its own run, TASK_MODEL_sSEED
# (e.g. LRA_MODELS="hgrn2 hgrn1:2" LRA_CONCURRENT=1: HGRN2 continues while a second HGRN1 seed starts);
# MODEL:SEED:unmasked is the unmasked-padding ablation (--unmasked-padding, docs/lra.md) in TASK_MODEL_sSEED_unmasked;
# MODEL:SEED:eos ends every sequence with <eos> (--append-eos, token tasks; --max-positions 2048, LRA's own cap)
# in TASK_MODEL_sSEED_eos: the runs of 2026-11-26 that made it the recipe (since then plain MODEL appends it
# too, the same run under another name); MODEL:SEED:noeos is the recipe without it (NO_EOS=1), TASK_MODEL_sSEED_noeos.
# Flags combine with '+': MODEL:SEED:unmasked+eos (the official harness's padding and token) in
# TASK_MODEL_sSEED_unmasked_eos. MODEL:SEED:scratchK appends K scratch positions after the <eos>
# (--scratch-positions K, masked padding: docs/lra.md) in TASK_MODEL_sSEED_scratchK. MODEL:SEED:fixedN pads
# every batch to N positions (--pad-to-length N; with unmasked: the official setting, batch-independent),
# e.g. MODEL:SEED:unmasked+eos+fixed2001 in TASK_MODEL_sSEED_unmasked_eos_fixed2001; MODEL:SEED:scanpads
# (--scan-padding: the scans see the pads, the batch norms and pooling do not; with fixedN) e.g.
# MODEL:SEED:scanpads+eos+fixed2001. MODEL:SEED:layernorm: layer norms instead of the arch's batch norms
# (--norm layer; no batch statistics at all), e.g. MODEL:SEED:layernorm+eos. hgrn1:SEED:repocfg (ListOps only):
# the public OpenNLPLab/lra repository's configs/experiment/hgrn-lra-listops.yaml instead of the paper's table:
# d 128, GLU 2x, layer norms, lr 1e-3, weight decay 0.01, warm-up 1,000, batch 50, cosine over 50,000
# updates (its own --max-update: LRA_LISTOPS_UPDATES does not apply), e.g. hgrn1:2222:repocfg+eos.
# MODEL:SEED:truncate runs the paper's own schedule cut at the task's updates (SCHEDULE=truncate: warm-up and
# cosine not compressed, so every update has the paper's learning rate), e.g. LRA_JOBS="pathfinder/hgrn2:2222:truncate".
# MODEL:SEED:eos+dropX / +wdX: residual dropout X / weight decay X on the recipe (regularisers within the issue's
# rules), e.g. hgrn2:2222:eos+drop0.1 in listops_hgrn2_s2222_eos_drop0.1.
# (Since the recipe appends <eos>, a new MODEL:SEED:unmasked run has it too, but
# its name is that of the finished no-<eos> ablation: restored from LRA_CARRY, that run's checkpoint is refused
# by the data fingerprint, which records append_eos. Name such runs with the flags they have.)
#   listops     ListOps from the offline generator at LRA's full size (96k/2k/2k, data_prep/lra_listops.py),
#               data_prep/prepare_lra.py, then `scripts/train_lra.sh listops hgrn1` and `... hgrn2` with
#               the papers' recipes shortened to LRA_LISTOPS_UPDATES updates (default 2500; warm-up scaled,
#               cosine to 0 there) and at most LRA_TRAIN_MINUTES minutes each (default 2.2; the log's "ups"
#               says how many updates fit: set LRA_LISTOPS_UPDATES to that x 60 x minutes for the next call); test accuracy
#               of the best checkpoint (JSON) and the results table beside the papers' 59.95 / 60.52.
#   pathfinder  LRA_PF_NUM pathfinder32 images from the generator (default 40000, ~1 min on 16 cores;
#               LRA has 200k), prepared with LRA's 80/10/10 split, then both models as above
#               (LRA_PF_UPDATES, default 2000; LRA_TRAIN_MINUTES each).
#   LRA_CONCURRENT=1  (listops, pathfinder) trains the models of LRA_MODELS at the same time on the one GPU
#               (on a machine with several, run k on GPU k mod N), under CUDA MPS unless LRA_MPS=0, each with the LRA_TRAIN_MINUTES cap (not measured yet
#               against one at a time: compare the logs' "ups" with the solo rates of docs/lra.md).
#   listops_data  only the ListOps data of the listops part (kept in /tmp/lra_evidence for later calls).
#   speed       bench/lra_train_speed.sh on the ListOps data (listops_data first): LRA_SPEED_TREES
#               ("old=DIR new=$PWD", or one tree with options: "eager=$PWD graphs=$PWD@--cuda-graphs,--pad-to-length,2001"),
#               LRA_SPEED_UPDATES (600), LRA_SPEED_MODELS ("hgrn1 hgrn2").
#   profile     bench/profile_lra_step.py on the ListOps data for each of LRA_MODELS: data, whole update,
#               forward+backward, torch.profiler tables ($OUT/profile_lra_step_listops_MODEL.md).
#   LRA_JOBS="TASK/SPEC ..." (TASK listops or pathfinder, SPEC as in LRA_MODELS) trains runs of both tasks
#               in one go, at once with LRA_CONCURRENT=1 (e.g. a ListOps run finishing beside Pathfinder
#               runs); their data are generated and prepared first (parts listops_data / pathfinder_data).
#               TASK pathfinder6 / pathfinder9: Pathfinder at the release's easier difficulties (contour length
#               6 = curv_baseline, 9), generated and prepared as such (data-bin/pathfinderN), same archs.
#   pathfinder_data  only the Pathfinder data of the pathfinder part (pathfinder6_data, pathfinder9_data: theirs).
#   pf_cnn      bench/explore/lra_pathfinder_cnn_control.py on every Pathfinder data-bin prepared in this call
#               or kept from an earlier one (a plain CNN: are the data learnable at this size?), in the
#               background beside the training (LRA_PF_CNN_ARGS, e.g. "--minutes 3"); $OUT/pf_cnn_control.json.
#   tests       the LRA tests that need a GPU (Triton scans under the encoder vs the reference, padding).
#   bench       bench/bench_lra.py: training sequences/s of every LRA model and of a Transformer encoder
#               of the same width, depth and precision (LRA_BENCH_S seconds, default 300; LRA_BENCH_ARGS
#               more options, e.g. "--tasks image,pathfinder --models hgrn2,transformer@hgrn2").
#   small_heads the HGRN2 kernel tests on the GPU (test_hgrn2_triton.py: the packed kernels of small heads
#               among them; the HGRN2 2-D encoder with heads of 2 x 2 against the reference) and bench/bench_hgrn2_small_heads.py (packed / recurrent / chunk / HGRU-scan
#               paths at the LRA 2-D shapes), before bench when both are given.
# Smoke test on CPU (tiny): LRA_LISTOPS_ARGS="--train 300 --valid 50 --test 50" LRA_PF_NUM=200 LRA_NUM_GPUS=0
#   LRA_LISTOPS_UPDATES=20 LRA_PF_UPDATES=10 LRA_TRAIN_EXTRA="--encoder-embed-dim 8 --encoder-layers 1"
# Everything lands in $OUT: logs, test_result.json files, results.md / results.csv, tensorboard
# events, bench_lra.json / .md, env.txt (gpu_session.sh). Checkpoints stay on the machine, unless:
#
# Runs longer than one call (the full recipes): LRA_TRAIN_MINUTES is then the length of *this* call's
# slice (the run's cumulative --stop-time-hours is what its checkpoint has trained plus that), and
#   LRA_SAVE_STATE=trained  as 1 (below), but only the runs this call trained: what a call that goes on
#                      with some runs should hand on when the older ones are finished (the tree limit);
#                      either way a finished run keeps only checkpoint_best.pt and its finished mark;
#   LRA_SAVE_STATE=1   after training, packs every run's checkpoint_last.pt / checkpoint_best.pt (and the
#                      mark of a finished run) on this machine, restored ones included, into
#                      $OUT/lra_state.tar.part* (gzip-compressed tar since 2026-11-27; gpu_session.sh returns them;
#                      they replace the old parts);
#   LRA_CARRY=DIR      a folder with such parts from an earlier call (the run tool's carry, e.g.
#                      results/lra_carry): runs with no checkpoint on this machine continue from them. On a
#                      machine with no runs yet, bench/lra_state_check.py first checks that each would resume
#                      where its slices filed in LRA_RESULTS_ROOT (bench/results) end, and the call stops
#                      (exit 2) before training when not; LRA_STATE_CHECK=0 skips the check.
# On a warm machine /tmp/lra_evidence still holds the runs and the data (a part finds its data-bin
# there and skips the generator); a fresh machine regenerates the data (seeded: the same examples, the
# same dictionary, so the checkpoints' data fingerprints match).
set -uo pipefail
cd "$(dirname "$0")/.."
case ${LRA_SAVE_STATE:-0} in  # checked before the set-up, data and training, not after the GPU time is spent
    0|1|trained) ;;
    *) echo "gpu_lra.sh: LRA_SAVE_STATE='$LRA_SAVE_STATE' is not 0, 1 or trained" >&2; exit 2 ;;
esac

: "${OUT:?set OUT}"
mkdir -p "$OUT"
R=$PWD
START=$(date +%s)
el() { echo $(( $(date +%s) - START )); }
# (find_spec, not an import: importing fairseq takes 8-12 s on a small CPU machine, where the tests run this)
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec(\"fairseq\") is None)" >/dev/null 2>&1; then  # standalone: set up as gpu_session.sh does
    . bench/gpu_fairseq.sh
    gpu_env
    [ -d /tmp/site2/fairseq ] || install_fairseq > "$OUT/fairseq_install.log" 2>&1
    export PYTHONPATH=$R:/tmp/site:/tmp/site2 PATH=/tmp/site2/bin:$PATH
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
WORK=${LRA_WORK:-/tmp/lra_evidence}
NPROC_CPU=$(env -u OMP_NUM_THREADS nproc)  # (nproc honours OMP_NUM_THREADS, which gpu_session.sh sets to 4)
PARTS=${LRA_PARTS:-listops}
MINUTES=${LRA_TRAIN_MINUTES:-2.2}
# LRA_CALL_S (gpu_session.sh sets it to the stage's limit - 5): the training slices are cut so that each
# run's validation, test evaluation and the state packing (LRA_END_S, default 120 s: 74-95 s were seen with
# three runs at once) end before it; without it, a slice that overran the stage's limit lost its state.
mkdir -p "$WORK" "$OUT/runs"
# what the disk and the GPU do during the call, every 5 s (bench/io_watch.sh: the slow checkpoint saves)
# (its output away from ours: a caller reading our pipes must see them close when we end; and it ends
# with us, on any exit)
bash bench/io_watch.sh "$OUT/io_watch.log" $$ > /dev/null 2>&1 &
IO_WATCH=$!
trap 'kill "$IO_WATCH" 2>/dev/null' EXIT

if [ -n "${LRA_CARRY:-}" ]; then  # checkpoints of earlier calls; a run this machine already has wins
    mkdir -p "$WORK/runs"
    if ls "$LRA_CARRY"/lra_state.tar.part* > /dev/null 2>&1; then
        # A fresh machine resumes every run from the carried state: first check (bench/lra_state_check.py, the
        # resume code itself) that each would resume where its filed slices in LRA_RESULTS_ROOT end, and stop
        # before any GPU time is spent when not (2026-11-27: two calls resumed from a stripped best at update 0).
        # A warm machine's runs win over the state, so there the check would be beside the point.
        if [ -z "$(ls -A "$WORK/runs")" ] && [ "${LRA_STATE_CHECK:-1}" != 0 ]; then
            if ! python3 bench/lra_state_check.py --state "$LRA_CARRY" --dest-root "${LRA_RESULTS_ROOT:-bench/results}" \
                    > "$OUT/lra_state_check.log" 2>&1; then
                cat "$OUT/lra_state_check.log"
                echo "== gpu_lra.sh: the carried state would not resume where the filed slices end (above): stopped" \
                     "before training; file the last call (bench/lra_collect.py) or pass LRA_STATE_CHECK=0"
                exit 2
            fi
            grep "^|" "$OUT/lra_state_check.log"
        fi
        # gzip-compressed since 2026-11-27 (GNU tar does not detect it on a pipe); plain tar before
        z=; [ "$(od -An -N2 -tx1 "$(ls "$LRA_CARRY"/lra_state.tar.part* | head -1)" | tr -d ' \n')" = 1f8b ] && z=z
        cat "$LRA_CARRY"/lra_state.tar.part* | tar -x$z -C "$WORK/runs" --skip-old-files \
            && echo "== state restored from $LRA_CARRY: $(cd "$WORK/runs" && ls -d */ | tr '\n' ' ')"
    else
        echo "== LRA_CARRY=$LRA_CARRY has no lra_state.tar.part* files (copy them from an earlier call's files)"
        exit 2
    fi
fi

trained_minutes() {  # the training time (minutes) a run's checkpoint_last.pt holds, 0 without one
    python3 - "$1/checkpoint_last.pt" <<'PY'
import os, sys, torch
p = sys.argv[1]
print(0 if not os.path.exists(p) else
      torch.load(p, map_location="cpu", weights_only=False)["extra_state"].get("previous_training_time", 0) / 60)
PY
}

data_ready() {  # TASK: a warm machine keeps the prepared data of an earlier call
    [ -f "$WORK/data-bin/$1/meta.json" ] && [ -z "${LRA_REGENERATE:-}" ] && echo "== $1 data: reusing $WORK/data-bin/$1"
}

run_id() {  # TASK SPEC: the run's folder name. SPEC: MODEL (the recipe's seed) -> TASK_MODEL, MODEL:SEED ->
    # TASK_MODEL_sSEED, MODEL:SEED:unmasked (the unmasked-padding ablation) -> TASK_MODEL_sSEED_unmasked,
    # MODEL:SEED:eos (--append-eos) -> TASK_MODEL_sSEED_eos, MODEL:SEED:noeos (NO_EOS=1) -> TASK_MODEL_sSEED_noeos;
    # flags joined by '+' (MODEL:SEED:unmasked+eos, the official harness's setting) -> TASK_MODEL_sSEED_unmasked_eos
    local model seed flag
    IFS=: read -r model seed flag <<< "$2"
    echo "$1_${model}${seed:+_s$seed}${flag:+_${flag//+/_}}"
}

spec_args() {  # SPEC: the fairseq-train arguments it adds (--seed N, --unmasked-padding, --append-eos)
    local model seed flags flag
    IFS=: read -r model seed flags <<< "$1"
    if [[ "+$flags+" == *"+eos+"* && "+$flags+" == *"+noeos+"* ]]; then
        echo "gpu_lra.sh: '$1' in LRA_MODELS asks for both 'eos' and 'noeos'; keep one" >&2; return 1
    fi
    for flag in ${flags//+/ }; do
        case $flag in
            unmasked) echo "--unmasked-padding" ;;
            eos) echo "--append-eos --max-positions 2048" ;;
            noeos) ;;  # (train_one sets NO_EOS=1: the recipe's --append-eos cannot be undone by a later flag)
            truncate) ;;  # (train_one sets SCHEDULE=truncate: the paper's warm-up and cosine, cut at MAX_UPDATE)
            scratch[1-9]|scratch[1-9][0-9]) echo "--scratch-positions ${flag#scratch}" ;;
            scanpads) echo "--scan-padding" ;;
            layernorm) echo "--norm layer" ;;
            scan1d) echo "--scan-2d none" ;;  # a 2-D task's raster as one bidirectional 1-D sequence
            nolb) echo "--no-lower-bound" ;;  # no layer-wise lower bounds on the forget gates
            maxpool) echo "--pool max" ;;  # the channel-wise maximum over the positions instead of the mean
            layers[1-9]) echo "--encoder-layers ${flag#layers}" ;;
            lr[1-9]e-[1-9]|lr[1-9].[0-9]e-[1-9]) echo "--lr ${flag#lr}" ;;  # another peak rate, e.g. lr2e-4
            # regularisers within the issue's rules (ListOps' masked recipe overfits: docs/lra.md): residual
            # dropout, e.g. drop0.1, and weight decay, e.g. wd0.05
            drop0.[0-9]|drop0.[0-9][0-9]) echo "--dropout ${flag#drop}" ;;
            wd0.[0-9]|wd0.[0-9][0-9]|wd0.[0-9][0-9][0-9]) echo "--weight-decay ${flag#wd}" ;;
            repocfg)  # the public OpenNLPLab/lra repository's configs/experiment/hgrn-lra-listops.yaml (HGRN1)
                if [ "$model" != hgrn1 ]; then
                    echo "gpu_lra.sh: '$1' in LRA_MODELS: 'repocfg' is the public repository's HGRN1 ListOps config (model hgrn1)" >&2
                    return 1
                fi
                echo "--encoder-embed-dim 128 --glu-multiple 2 --norm layer --lr 0.001 --weight-decay 0.01" \
                     "--warmup-updates 1000 --batch-size 50 --batch-size-valid 50 --max-update 50000" ;;
            fixed[1-9][0-9]|fixed[1-9][0-9][0-9]|fixed[1-9][0-9][0-9][0-9]) echo "--pad-to-length ${flag#fixed}" ;;
            *) echo "gpu_lra.sh: '$1' in LRA_MODELS: the third field can only be 'unmasked', 'eos', 'noeos', 'truncate', 'scratchK' (K 1-99), 'fixedN' (N 10-9999), 'scanpads', 'layernorm', 'scan1d', 'nolb', 'maxpool', 'layersN' (N 1-9), 'lrXe-Y' (e.g. lr2e-4), 'dropX' (e.g. drop0.1), 'wdX' (e.g. wd0.05) or 'repocfg' (several joined by '+')" >&2; return 1 ;;
        esac
    done
    [ -n "$seed" ] && echo "--seed $seed"
    return 0
}

slice_plan() {  # -> "MINUTES KILL_S": this slice's training minutes and the run's hard time limit (seconds)
    local now; now=$(el)
    awk -v m="$MINUTES" -v call="${LRA_CALL_S:-}" -v end="${LRA_END_S:-120}" -v now="$now" 'BEGIN {
        kill = m * 60 + 150
        if (call != "") {
            left = call - now - end  # seconds this slice may train
            if (left < 60) { print "none"; exit }
            if (left < m * 60) m = left / 60
            if (call - now - 15 < kill) kill = call - now - 15
        }
        printf "%.3f %.0f\n", m, kill }'
}

train_one() {  # TASK UPDATES SPEC: one model (SPEC: see run_id), shortened recipe, test evaluation
    local task=$1 updates=$2 model=${3%%:*} id run cap seed plan minutes kill
    id=$(run_id "$task" "$3")
    seed=$(spec_args "$3") || return 1
    if [[ "+${3##*:}+" == *"+repocfg+"* && "$task" != listops ]]; then
        echo "gpu_lra.sh: '$3': 'repocfg' is a ListOps config; task $task" >&2
        return 1
    fi
    run=$WORK/runs/$id
    plan=$(slice_plan)
    if [ "$plan" = none ]; then
        echo "== train $id: skipped, under a minute of LRA_CALL_S=$LRA_CALL_S left for a slice (at $(el)s)"
        return 0
    fi
    read -r minutes kill <<< "$plan"
    cap=$(awk "BEGIN { printf \"%.3f\", $(trained_minutes "$run") + $minutes }")
    echo "== train $id: MAX_UPDATE=$updates, this slice at most $minutes min (cumulative cap $cap min; killed after ${kill}s) (at $(el)s)"
    SAVE_DIR=$run LOG_DIR=$OUT/runs/$id RESULTS_DIR=$WORK/runs \
        MAX_UPDATE=$updates TRAIN_MINUTES=$cap NUM_GPUS=${LRA_NUM_GPUS:-1} SAVE_INTERVAL_UPDATES=500 \
        NO_EOS=$(case "+${3##*:}+" in *+noeos+*) echo 1 ;; *) echo 0 ;; esac) \
        SCHEDULE=$(case "+${3##*:}+" in *+truncate+*) echo truncate ;; *) echo compress ;; esac) \
        timeout "$kill" \
        bash scripts/train_lra.sh "${task%%[0-9]*}" "$model" "$WORK/data-bin/$task" ${LRA_TRAIN_EXTRA:-} $seed \
        > "$OUT/runs/train_$id.log" 2>&1
    echo "   $id rc=$? at $(el)s"
}

task_updates() {  # TASK: the MAX_UPDATE of its runs
    case $1 in
        listops) echo "${LRA_LISTOPS_UPDATES:-2500}" ;;
        pathfinder*) echo "${LRA_PF_UPDATES:-2000}" ;;
    esac
}

train_jobs() {  # JOB...: TASK/SPEC runs (SPEC: see run_id), one after the other or at once (LRA_CONCURRENT=1)
    local job task spec log id
    if [ "${LRA_CONCURRENT:-0}" = 1 ]; then
        # The LRA models are small (ListOps HGRN1: 66k parameters) and leave the GPU partly idle (host
        # time, small kernels): they train at once, each with its own time cap, under CUDA MPS where the
        # machine has it (kernels of every process run concurrently), else time-sliced.
        # On a machine with several GPUs (nvidia-h200-x4: the same device time as one) the runs are dealt out
        # over them in turn (CUDA_VISIBLE_DEVICES), unless LRA_NUM_GPUS > 1 gives each run all of them (DDP).
        MPS_MODE="MPS off (LRA_MPS=0)"
        [ "${LRA_MPS:-1}" = 1 ] && { . bench/gpu_mps.sh; start_mps; }
        local pids=() ngpu k=0
        local NUM_GPUS=  # (count_gpus, scripts/gpu_count.sh: the GPUs of CUDA_VISIBLE_DEVICES, else nvidia-smi's)
        . scripts/gpu_count.sh; count_gpus; ngpu=$NGPU
        [ "$ngpu" -ge 1 ] && [ "${LRA_NUM_GPUS:-1}" = 1 ] || ngpu=1
        echo "== $* at once on $ngpu GPU(s); $MPS_MODE"
        for job in "$@"; do
            if [ "$ngpu" -gt 1 ]; then
                echo "   $job on GPU $((k % ngpu))"
                (export CUDA_VISIBLE_DEVICES=$((k % ngpu)); train_one "${job%%/*}" "$(task_updates "${job%%/*}")" "${job#*/}") &
            else
                train_one "${job%%/*}" "$(task_updates "${job%%/*}")" "${job#*/}" &
            fi
            pids+=($!)
            k=$((k + 1))
        done
        wait "${pids[@]}"  # (these jobs only: a bare wait would also wait for the io_watch sampler, forever)
        [ "${LRA_MPS:-1}" = 1 ] && stop_mps
        # the table again, now that every run has its test result (each rewrote it as it ended)
        python3 scripts/lra_results.py "$WORK/runs" > /dev/null 2>&1
    else
        for job in "$@"; do
            train_one "${job%%/*}" "$(task_updates "${job%%/*}")" "${job#*/}"
        done
    fi
    for job in "$@"; do
        task=${job%%/*} spec=${job#*/}
        id=$(run_id "$task" "$spec")
        TRAINED_RUNS+=("$id")
        log=$OUT/runs/train_$id.log
        echo "-- $id"
        grep "valid on 'valid'" "$log" | tail -3
        grep "lra_eval:" "$log"
        grep -o "num_updates [0-9]*\|ups [0-9.]*" "$log" | tail -2 | tr '\n' ' '; echo
        cp "$WORK/runs/$id/test_result.json" "$OUT/runs/$id.test_result.json" 2>/dev/null
    done
    TRAINED=1
    cp "$WORK/runs/results.md" "$WORK/runs/results.csv" "$OUT/" 2>/dev/null
    cat "$OUT/results.md" 2>/dev/null
}

train_both() {  # TASK: the models of LRA_MODELS on TASK
    local model jobs=()
    for model in ${LRA_MODELS:-hgrn1 hgrn2}; do
        jobs+=("$1/$model")
    done
    train_jobs "${jobs[@]}"
}

# LRA_JOBS="listops/hgrn2:2222:eos pathfinder/hgrn2 ...": runs of several tasks in one go (at once with
# LRA_CONCURRENT=1) instead of the listops / pathfinder parts' LRA_MODELS; their data are prepared first.
PF_TASKS="pathfinder pathfinder6 pathfinder9"  # LRA's Pathfinder, then the release's easier difficulties
for job in ${LRA_JOBS:-}; do
    if [[ $job == */* && " listops $PF_TASKS " == *" ${job%%/*} "* ]]; then
        PARTS="$PARTS,${job%%/*}_data"
        continue
    fi
    echo "gpu_lra.sh: LRA_JOBS entry '$job' is not TASK/SPEC with TASK listops, pathfinder, pathfinder6 or pathfinder9 (e.g. pathfinder/hgrn2)" >&2
    exit 2
done

TRAINED=0  # set by train_jobs: LRA_SAVE_STATE packs only after a call that trained
TRAINED_RUNS=()  # the runs train_jobs trained (LRA_SAVE_STATE=trained packs only these)

state_files() {  # RUNS_DIR RUN...: the files of each run that its state needs, relative to RUNS_DIR.
    # A finished run (train_lra.sh's finished_max_update_N mark: a rerun only redoes the test of the best
    # checkpoint) needs checkpoint_best.pt and the mark, not checkpoint_last.pt; a run in progress both
    # checkpoints. (The run tool copies at most 64 MiB of tree to the GPU machine, state included.)
    local dir=$1 r f want
    shift
    for r in "$@"; do
        if compgen -G "$dir/$r/finished_max_update_*" > /dev/null; then
            want=("$dir/$r"/checkpoint_best.pt "$dir/$r"/finished_max_update_*)
        else
            want=("$dir/$r"/checkpoint_last.pt "$dir/$r"/checkpoint_best.pt)
        fi
        for f in "${want[@]}"; do
            if [ -f "$f" ]; then echo "${f#"$dir/"}"; fi
        done
    done
}
if [[ ",$PARTS," == *",listops,"* || ",$PARTS," == *",listops_data,"* ]] && ! data_ready listops; then
    echo "== listops data (generator, 96k/2k/2k, $NPROC_CPU workers) at $(el)s"
    python3 data_prep/lra_listops.py --dest "$WORK/generated" --workers "$NPROC_CPU" --no-progress ${LRA_LISTOPS_ARGS:-} \
        > "$OUT/listops_generate.log" 2>&1
    echo "   generate rc=$? at $(el)s"; tail -2 "$OUT/listops_generate.log"
    python3 data_prep/prepare_lra.py listops --source "$WORK/generated" --dest "$WORK/data-bin/listops" > "$OUT/listops_prepare.log" 2>&1
    echo "   prepare rc=$? at $(el)s"; tail -3 "$OUT/listops_prepare.log"
    cp "$WORK/data-bin/listops/meta.json" "$OUT/listops_meta.json" 2>/dev/null
fi
if [[ ",$PARTS," == *",listops,"* ]]; then
    train_both listops
fi

# pathfinder: LRA's curv_contour_length_14; pathfinder6 / pathfinder9 (LRA_JOBS only): the release's easier
# curv_baseline / curv_contour_length_9 from the same generator (data-bin/pathfinderN, runs pathfinderN_MODEL...;
# the fairseq task and the archs are pathfinder's)
contour_of() {  # pathfinder -> 14 (LRA's), pathfinderN -> N
    local c=${1#pathfinder}
    echo "${c:-14}"
}
for pf in $PF_TASKS; do
    if [[ ",$PARTS," == *",$pf,"* || ",$PARTS," == *",${pf}_data,"* ]] && ! data_ready $pf; then
        contour=$(contour_of $pf)
        echo "== $pf data (generator, ${LRA_PF_NUM:-40000} images of 32x32, contour length $contour, $NPROC_CPU workers) at $(el)s"
        python3 data_prep/lra_pathfinder.py --dest "$WORK/generated" --num "${LRA_PF_NUM:-40000}" --size 32 \
            --contour-length "$contour" --workers "$NPROC_CPU" --no-progress > "$OUT/${pf}_generate.log" 2>&1
        echo "   generate rc=$? at $(el)s"; tail -2 "$OUT/${pf}_generate.log"
        python3 data_prep/prepare_lra.py pathfinder --source "$WORK/generated" --dest "$WORK/data-bin/$pf" \
            --contour-length "$contour" --workers "$NPROC_CPU" > "$OUT/${pf}_prepare.log" 2>&1
        echo "   prepare rc=$? at $(el)s"; tail -3 "$OUT/${pf}_prepare.log"
        cp "$WORK/data-bin/$pf/meta.json" "$OUT/${pf}_meta.json" 2>/dev/null
    fi
done
PF_CNN=
if [[ ",$PARTS," == *",pf_cnn,"* ]]; then
    dirs=()
    for pf in $PF_TASKS; do
        [ -f "$WORK/data-bin/$pf/meta.json" ] && dirs+=("$WORK/data-bin/$pf")
    done
    if [ ${#dirs[@]} = 0 ]; then
        echo "== pf_cnn: no Pathfinder data-bin in $WORK/data-bin (add pathfinder_data or pathfinder6_data to LRA_PARTS)"
    else
        echo "== pf_cnn: the CNN control on ${dirs[*]}, in the background (at $(el)s)"
        # shellcheck disable=SC2086
        python3 bench/explore/lra_pathfinder_cnn_control.py "${dirs[@]}" --out "$OUT/pf_cnn_control.json" \
            ${LRA_PF_CNN_ARGS:-} > "$OUT/pf_cnn_control.log" 2>&1 &
        PF_CNN=$!
    fi
fi
if [[ ",$PARTS," == *",pathfinder,"* ]]; then
    train_both pathfinder
fi
if [ -n "${LRA_JOBS:-}" ]; then
    # shellcheck disable=SC2086
    train_jobs $LRA_JOBS
fi
if [ -n "$PF_CNN" ]; then
    wait "$PF_CNN"
    echo "== pf_cnn rc=$? at $(el)s"; tail -6 "$OUT/pf_cnn_control.log"
fi

if [ "${LRA_SAVE_STATE:-0}" != 0 ] && [ "$TRAINED" = 1 ]; then
    case $LRA_SAVE_STATE in
        1) runs=(); for d in "$WORK"/runs/*/; do runs+=("$(basename "$d")"); done ;;  # restored ones too
        trained) runs=("${TRAINED_RUNS[@]}") ;;
    esac
    mapfile -t files < <(state_files "$WORK/runs" "${runs[@]}")
    # a best checkpoint is only evaluated: its optimizer state (two more copies of the weights) stays here
    bests=()
    for f in "${files[@]}"; do [[ $f == */checkpoint_best.pt ]] && bests+=("$WORK/runs/$f"); done
    if [ ${#bests[@]} -gt 0 ]; then
        python3 bench/lra_strip_best.py "${bests[@]}" > "$OUT/lra_strip_best.log" 2>&1 ||
            echo "== lra_strip_best.py failed (rc $?): the bests go as they are; see lra_strip_best.log"
    fi
    # gzip: fp32 weights and Adam moments shrink ~10% (23.5 -> 21.0 MB for the repocfg + HGRN2 state), which keeps
    # the tracked tree, the state and the prebuilt fairseq wheel inside the run tool's 64 MiB
    tar -czf - -C "$WORK/runs" "${files[@]}" | split -b 15M -d - "$OUT/lra_state.tar.part"
    echo "== state saved: ${files[*]} -> $(ls "$OUT"/lra_state.tar.part* | wc -l) part(s) of lra_state.tar (they replace bench/results/lra_state/*: commit them)"
fi

if [[ ",$PARTS," == *",speed,"* ]]; then  # A/B of the training step through the real entry point
    echo "== training speed on listops: ${LRA_SPEED_TREES:?set LRA_SPEED_TREES=\"old=DIR new=DIR\"} at $(el)s"
    bash bench/lra_train_speed.sh listops "$WORK/data-bin/listops" "${LRA_SPEED_UPDATES:-600}" \
        "${LRA_SPEED_MODELS:-hgrn1 hgrn2}" $LRA_SPEED_TREES > "$OUT/lra_train_speed.log" 2>&1
    echo "   speed rc=$? at $(el)s"; tail -8 "$OUT/lra_train_speed.log"
fi

if [[ ",$PARTS," == *",profile,"* ]]; then  # where a training step of the entry point spends its time
    for model in ${LRA_MODELS:-hgrn1 hgrn2}; do
        model=${model%%:*}
        echo "== profile listops $model at $(el)s"
        timeout 300 python3 bench/profile_lra_step.py listops "$model" "$WORK/data-bin/listops" --out "$OUT" \
            > "$OUT/profile_listops_$model.log" 2>&1
        echo "   profile rc=$? at $(el)s"; grep "^- " "$OUT/profile_listops_$model.log"
    done
fi

if [[ ",$PARTS," == *",tests,"* ]]; then
    echo "== GPU tests at $(el)s"
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/modules/test_lra_encoder.py -k "gpu or triton" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "   tests rc=$? at $(el)s"; tail -3 "$OUT/gpu_tests.log"
fi

if [[ ",$PARTS," == *",small_heads,"* ]]; then
    echo "== HGRN2 kernel tests on the GPU at $(el)s"
    # the packed kernels' cases only: the whole file pins every autotune config in turn (110 tests, more
    # than 400 s on an H200 on 2026-11-26); the tests part runs it all
    # (-k would deselect the encoder's test too: two runs)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_hgrn2_triton.py -k "packed or auto_choice" \
        > "$OUT/gpu_tests_hgrn2.log" 2>&1
    echo "   kernel tests rc=$? at $(el)s"; tail -3 "$OUT/gpu_tests_hgrn2.log"
    timeout 120 python3 -m pytest -q -p no:cacheprovider \
        "tests/modules/test_lra_encoder.py::test_small_heads_2d_matches_reference" >> "$OUT/gpu_tests_hgrn2.log" 2>&1
    echo "   encoder test rc=$? at $(el)s"; tail -3 "$OUT/gpu_tests_hgrn2.log"
    echo "== bench_hgrn2_small_heads at $(el)s"
    timeout 300 python3 bench/bench_hgrn2_small_heads.py --out "$OUT/bench" > "$OUT/bench_hgrn2_small_heads.log" 2>&1
    echo "   bench rc=$? at $(el)s"; cat "$OUT/bench/bench_hgrn2_small_heads.md" 2>/dev/null || tail -5 "$OUT/bench_hgrn2_small_heads.log"
fi

if [[ ",$PARTS," == *",bench,"* ]]; then
    echo "== bench_lra at $(el)s"
    timeout $(( ${LRA_BENCH_S:-300} + 120 )) python3 bench/bench_lra.py --out "$OUT/bench" --budget-s "${LRA_BENCH_S:-300}" ${LRA_BENCH_ARGS:-} \
        > "$OUT/bench_lra.log" 2>&1
    echo "   bench rc=$? at $(el)s"; cat "$OUT/bench/bench_lra.md" 2>/dev/null
fi
kill "$IO_WATCH" 2>/dev/null
bash bench/io_watch.sh --summary "$OUT/io_watch.log"
echo "gpu_lra.sh done at $(el)s"
