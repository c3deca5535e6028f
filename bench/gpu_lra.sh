#!/usr/bin/env bash
# LRA on the GPU machine: generated data, shortened training runs through scripts/train_lra.sh, the GPU
# tests and the benchmarks. Run through bench/gpu_session.sh (stage lra), which installs fairseq and puts
# it and the repository on the PYTHONPATH; standalone it installs fairseq itself (bench/gpu_fairseq.sh):
#
#   LRA_PARTS=listops     OUT=/some/dir bash bench/gpu_session.sh lra:520
#   LRA_PARTS=tests,bench OUT=/some/dir bash bench/gpu_session.sh lra:520
#
# Parts (LRA_PARTS, comma-separated):
#   listops       ListOps from data_prep/lra_listops.py at LRA's size (96k/2k/2k), prepare_lra.py, then each
#                 model of LRA_MODELS (default "hgrn1 hgrn2") through scripts/train_lra.sh with the recipe
#                 shortened to LRA_LISTOPS_UPDATES (default 2500; warm-up and cosine compressed to it) and at
#                 most LRA_TRAIN_MINUTES (default 2.2) each; test JSONs and the results table.
#   pathfinder    LRA_PF_NUM generated pathfinder32 images (default 40000; LRA has 200k), 80/10/10, then the
#                 models as above (LRA_PF_UPDATES, default 2000).
#   listops_data, pathfinder_data, pathfinder6_data, pathfinder9_data   only the data (pathfinderN: the
#                 release's easier difficulties, contour length N).
#   pf_cnn        bench/explore/lra_pathfinder_cnn_control.py on every prepared Pathfinder data-bin, in the
#                 background beside the training (LRA_PF_CNN_ARGS).
#   tests         the LRA encoder's GPU tests.   small_heads   the HGRN2 kernel tests and bench/bench_hgrn2_small_heads.py.
#   bench         bench/bench_lra.py (LRA_BENCH_S seconds, default 300; LRA_BENCH_ARGS).
#   speed         bench/lra_train_speed.sh on the ListOps data (LRA_SPEED_TREES "LABEL=TREE[@ARGS] ...",
#                 LRA_SPEED_UPDATES 600, LRA_SPEED_MODELS "hgrn1 hgrn2").
#   profile       bench/profile_lra_step.py on the ListOps data for each model of LRA_MODELS.
# LRA_MODELS entries: MODEL, MODEL:SEED, or MODEL:SEED:FLAGS (flags joined by '+'), each its own run
# TASK_MODEL[_sSEED][_FLAGS]. Flags: unmasked (--unmasked-padding), eos (--append-eos), noeos (NO_EOS=1),
# truncate (SCHEDULE=truncate: the paper's own warm-up and cosine, cut), scratchK (--scratch-positions K),
# fixedN (--pad-to-length N), scanpads (--scan-padding), layernorm (--norm layer), scan1d (--scan-2d none),
# nolb, maxpool, layersN, lrXe-Y (peak rate), dropX, wdX, repocfg (ListOps HGRN1: the public OpenNLPLab/lra
# repository's config, d 128, GLU 2x, layer norms, lr 1e-3, batch 50, 50,000 updates). E.g.
# LRA_MODELS="hgrn1:2222:unmasked+eos" is the official harness's padding and end token (docs/lra.md).
# LRA_JOBS="TASK/RUN ..." (TASK listops, pathfinder, pathfinder6, pathfinder9) trains runs of several tasks in
# one go; LRA_CONCURRENT=1 trains the runs at once (CUDA MPS unless LRA_MPS=0; over several GPUs, run k on
# GPU k mod N). LRA_TRAIN_EXTRA: more fairseq-train arguments for every run. LRA_CALL_S (gpu_session.sh sets
# it): training stops early enough for the test evaluations (LRA_END_S, default 120 s) to finish in the call.
# A run is one GPU call: on a warm machine a rerun resumes the runs in LRA_WORK (default /tmp/lra_evidence),
# nothing is carried between machines. Everything lands in $OUT: logs, test JSONs, results.md / .csv.
# Smoke test on CPU (tiny): LRA_LISTOPS_ARGS="--train 300 --valid 50 --test 50" LRA_PF_NUM=200 LRA_NUM_GPUS=0
#   LRA_LISTOPS_UPDATES=20 LRA_PF_UPDATES=10 LRA_TRAIN_EXTRA="--encoder-embed-dim 8 --encoder-layers 1"
set -uo pipefail
cd "$(dirname "$0")/.."
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
mkdir -p "$WORK" "$OUT/runs"

trained_minutes() {  # the training time (minutes) a run's checkpoint_last.pt holds, 0 without one
    python3 - "$1/checkpoint_last.pt" <<'PY'
import os, sys, torch
p = sys.argv[1]
print(0 if not os.path.exists(p) else
      torch.load(p, map_location="cpu", weights_only=True)["extra_state"].get("previous_training_time", 0) / 60)
PY
}

data_ready() {  # TASK: a warm machine keeps the prepared data of an earlier call
    [ -f "$WORK/data-bin/$1/meta.json" ] && [ -z "${LRA_REGENERATE:-}" ] && echo "== $1 data: reusing $WORK/data-bin/$1"
}

run_id() {  # TASK RUN: the run's folder name. RUN: MODEL (the recipe's seed) -> TASK_MODEL, MODEL:SEED ->
    # TASK_MODEL_sSEED, MODEL:SEED:unmasked (the unmasked-padding ablation) -> TASK_MODEL_sSEED_unmasked,
    # MODEL:SEED:eos (--append-eos) -> TASK_MODEL_sSEED_eos, MODEL:SEED:noeos (NO_EOS=1) -> TASK_MODEL_sSEED_noeos;
    # flags joined by '+' (MODEL:SEED:unmasked+eos, the official harness's setting) -> TASK_MODEL_sSEED_unmasked_eos
    local model seed flag
    IFS=: read -r model seed flag <<< "$2"
    echo "$1_${model}${seed:+_s$seed}${flag:+_${flag//+/_}}"
}

spec_args() {  # RUN: the fairseq-train arguments it adds (--seed N, --unmasked-padding, --append-eos)
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
            # regularisers for the masked recipe: residual dropout, e.g. drop0.1, and weight decay, e.g. wd0.05
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

train_one() {  # TASK UPDATES RUN: one model (RUN: see run_id), shortened recipe, test evaluation
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

train_jobs() {  # JOB...: TASK/RUN runs (RUN: see run_id), one after the other or at once (LRA_CONCURRENT=1)
    local job task spec log id
    if [ "${LRA_CONCURRENT:-0}" = 1 ]; then
        # The LRA models are small (ListOps HGRN1: 66k parameters) and leave the GPU partly idle (host
        # time, small kernels): they train at once, each with its own time cap, under CUDA MPS where the
        # machine has it (kernels of every process run concurrently), else time-sliced.
        # On a machine with several GPUs the runs are dealt out
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
        wait "${pids[@]}"  # (these jobs only, not the pf_cnn control in the background)
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
        log=$OUT/runs/train_$id.log
        echo "-- $id"
        grep "valid on 'valid'" "$log" | tail -3
        grep "lra_eval:" "$log"
        grep -o "num_updates [0-9]*\|ups [0-9.]*" "$log" | tail -2 | tr '\n' ' '; echo
        cp "$WORK/runs/$id/test_result.json" "$OUT/runs/$id.test_result.json" 2>/dev/null
    done
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
    echo "gpu_lra.sh: LRA_JOBS entry '$job' is not TASK/RUN with TASK listops, pathfinder, pathfinder6 or pathfinder9 (e.g. pathfinder/hgrn2)" >&2
    exit 2
done

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
        python3 -m bench.explore.lra_pathfinder_cnn_control "${dirs[@]}" --out "$OUT/pf_cnn_control.json" \
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
        timeout 300 python3 -m bench.profile_lra_step listops "$model" "$WORK/data-bin/listops" --out "$OUT" \
            > "$OUT/profile_listops_$model.log" 2>&1
        echo "   profile rc=$? at $(el)s"; grep "^- " "$OUT/profile_listops_$model.log"
    done
fi

if [[ ",$PARTS," == *",tests,"* ]]; then
    echo "== GPU tests at $(el)s"
    timeout 300 python3 -m pytest -q -p no:cacheprovider -m "" tests/modules/test_lra_encoder.py -k "gpu or triton" \
        > "$OUT/gpu_tests.log" 2>&1
    echo "   tests rc=$? at $(el)s"; tail -3 "$OUT/gpu_tests.log"
fi

if [[ ",$PARTS," == *",small_heads,"* ]]; then
    echo "== HGRN2 kernel tests on the GPU at $(el)s"
    # the packed kernels' cases only (the whole file pins every autotune config in turn: too long for one
    # call); -k would deselect the encoder's test too, hence two runs
    timeout 240 python3 -m pytest -q -p no:cacheprovider -m "" tests/kernels/test_hgrn2_triton.py -k "packed or auto_choice" \
        > "$OUT/gpu_tests_hgrn2.log" 2>&1
    echo "   kernel tests rc=$? at $(el)s"; tail -3 "$OUT/gpu_tests_hgrn2.log"
    timeout 120 python3 -m pytest -q -p no:cacheprovider -m "" \
        "tests/modules/test_lra_encoder.py::test_small_heads_2d_matches_reference" >> "$OUT/gpu_tests_hgrn2.log" 2>&1
    echo "   encoder test rc=$? at $(el)s"; tail -3 "$OUT/gpu_tests_hgrn2.log"
    echo "== bench_hgrn2_small_heads at $(el)s"
    timeout 300 python3 -m bench.bench_hgrn2_small_heads --out "$OUT/bench" > "$OUT/bench_hgrn2_small_heads.log" 2>&1
    echo "   bench rc=$? at $(el)s"; cat "$OUT/bench/bench_hgrn2_small_heads.md" 2>/dev/null || tail -5 "$OUT/bench_hgrn2_small_heads.log"
fi

if [[ ",$PARTS," == *",bench,"* ]]; then
    echo "== bench_lra at $(el)s"
    timeout $(( ${LRA_BENCH_S:-300} + 120 )) python3 -m bench.bench_lra --out "$OUT/bench" --budget-s "${LRA_BENCH_S:-300}" ${LRA_BENCH_ARGS:-} \
        > "$OUT/bench_lra.log" 2>&1
    echo "   bench rc=$? at $(el)s"; cat "$OUT/bench/bench_lra.md" 2>/dev/null
fi
echo "gpu_lra.sh done at $(el)s"
