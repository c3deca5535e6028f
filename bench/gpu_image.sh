#!/usr/bin/env bash
# GPU evidence for the image models, run by bench/gpu_session.sh (stage image) or alone:
#
#   OUT=/some/dir bash bench/gpu_image.sh                      # everything (~8-9 min)
#   OUT=/some/dir IMG_STAGES=tests,bench bash bench/gpu_image.sh    # ~4 min
#   OUT=/some/dir IMG_STAGES=evidence bash bench/gpu_image.sh       # ~5 min
# (alone it needs hydra-core / omegaconf wheels in .whl/ (bench/gpu_fairseq.sh), not fairseq; or run it as
# stage image of gpu_session.sh)
#
# Stages (IMG_STAGES, default tests,evidence,bench):
#   tests     tests/image/test_models.py on CUDA: the models' Triton path against float64 (forward,
#             gradients, bf16) plus the CPU tests of the file
#   evidence  scikit-learn's digits (1797 images, 10 classes; 8 x 8 upscaled to 32 x 32, written as an
#             ImageFolder by scripts/make_image_folder.py), then hgrn1d_vit_tiny, hgrn2_vit_tiny and timm's
#             deit_tiny_patch16_224 trained by python -m hgrn_fairseq.image.train with one recipe and
#             budget (the hgrn1 preset: DeiT augmentation, Mixup/CutMix, repeated augmentation, EMA,
#             clip 5, bf16; IMG_EPOCHS epochs at IMG_RES px, batch 128, base lr 2e-3, i.e. lr 5e-4).
#             Table: $OUT/evidence.md / .json (top-1/top-5 of the model and of its EMA, time)
#   bench     bench/bench_image.py: training / inference images/s and peak memory, tiny and small, 224 and
#             448 px, against DeiT, eager and with CUDA graphs for both ($OUT/bench/bench_image.md / .json)
# Environment: IMG_STAGES  IMG_EPOCHS [60]  IMG_RES [112]  IMG_MODELS [hgrn1d_vit_tiny,hgrn2_vit_tiny,
#   deit_tiny_patch16_224]  IMG_WORKERS [12]  IMG_DATA [digits]  IMG_TRAIN_S [150: limit per model]
#   IMG_EXTRA (more KEY=VALUE overrides for every evidence run, word-split)
#   IMG_TEST_PATHS [tests/image/test_models.py tests/kernels/test_block_ops.py]  IMG_TESTS_S [240: their limit;
#   with tests/models/test_cuda_graphs.py give ~420: its fairseq-train tests take longer]
#   HGRN_GIT_COMMIT: the commit the tree was copied from, for env.txt (the copy's git metadata can be stale)
#   IMG_TEST_PROCS [1]: above 1, the tests run in that many pytest processes at once (bench/split_pytest.sh),
#   each under IMG_TESTS_S, so that Triton compiles in parallel
#   IMG_BENCH_ARGS [--modes eager,graphs] (compile: + torch.compile rows, minutes of compiling)  IMG_BENCH_S [300]
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/split_pytest.sh  # OUT checked and created; el = seconds since the start; split_pytest
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
STAGES=${IMG_STAGES:-tests,evidence,bench}
EPOCHS=${IMG_EPOCHS:-60}
RES=${IMG_RES:-112}
MODELS=${IMG_MODELS:-hgrn1d_vit_tiny,hgrn2_vit_tiny,deit_tiny_patch16_224}
# Alone (not under gpu_session.sh): hydra-core / omegaconf from the wheels of .whl/ and their
# antlr4 runtime from its source archive; fairseq is not needed (hgrn_fairseq skips it when absent).
if ! python3 -c "import hydra" 2>/dev/null; then
  R=$PWD
  . bench/gpu_fairseq.sh
  gpu_env > /dev/null
  (cd /tmp && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
     "$R"/.whl/antlr4*.tar.gz) || echo "antlr4 runtime: install failed (hydra will not import)"
  export PYTHONPATH=$R:/tmp/site
fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__)"
  # HGRN_GIT_COMMIT wins over the copy's git metadata, which can be stale (bench/provenance.py)
  python3 -c "from bench.provenance import git_version; print('commit', git_version())"; } \
  > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [[ ",$STAGES," == *",tests,"* ]]; then
  IMG_TESTS=${IMG_TEST_PATHS:-tests/image/test_models.py tests/kernels/test_block_ops.py}
  if [ "${IMG_TEST_PROCS:-1}" -gt 1 ]; then
    # several pytest processes at once so that Triton compiles (and autotunes) in parallel; each process's
    # summary line ends its part of the log (bench/split_pytest.sh)
    # shellcheck disable=SC2086  # IMG_TESTS is a list of paths
    echo "tests: $(split_pytest imgids "$IMG_TEST_PROCS" "${IMG_TESTS_S:-240}" "$OUT/gpu_tests.log" $IMG_TESTS) at $(el)s"
    grep -h " passed\| failed\| error\|^FAILED\|^ERROR\|== " "$OUT/gpu_tests.log" | tail -40
  else
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=4 timeout "${IMG_TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -rfEs $IMG_TESTS \
      > "$OUT/gpu_tests.log" 2>&1
    echo "tests rc=$? at $(el)s"; tail -4 "$OUT/gpu_tests.log"
  fi
fi

if [[ ",$STAGES," == *",evidence,"* ]]; then
  DATA=/tmp/img_evidence/${IMG_DATA:-digits}
  python3 scripts/make_image_folder.py --source "${IMG_DATA:-digits}" --dest "$DATA" --size 32 2>&1 | tee "$OUT/data.log"
  IFS=, read -ra MODEL_LIST <<< "$MODELS"
  for m in "${MODEL_LIST[@]}"; do
    run_dir=/tmp/img_evidence/runs/$m
    rm -rf "$run_dir"
    echo "== $m at $(el)s"
    timeout "${IMG_TRAIN_S:-150}" python3 -m hgrn_fairseq.image.train --config-name hgrn1 "model.name=$m" \
      "data.path=$DATA" "train.output_dir=$run_dir" "model.img_size=$RES" "optim.epochs=$EPOCHS" \
      optim.warmup_epochs=5 optim.batch_size=128 optim.base_lr=2e-3 ema.warmup=true train.eval_every=10 \
      "data.workers=${IMG_WORKERS:-12}" train.no_progress=true train.log_every=100 ${IMG_EXTRA:-} \
      > "$OUT/train_$m.log" 2>&1
    echo "$m rc=$? at $(el)s"; grep '"event": "eval"' "$OUT/train_$m.log" | tail -1
    mkdir -p "$OUT/runs/$m" && cp "$run_dir/log.jsonl" "$OUT/runs/$m/"
  done
  python3 - "$OUT" "$DATA" "$RES" "$EPOCHS" "${MODEL_LIST[@]}" <<'EOF'
import json, os, sys
out, data, res, epochs, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
info = json.load(open(os.path.join(data, "dataset.json")))
rows = []
for m in models:
    path = os.path.join(out, "runs", m, "log.jsonl")
    if not os.path.isfile(path):
        rows.append({"model": m, "status": "no log"}); continue
    log = [json.loads(line) for line in open(path)]
    start = next(e for e in log if e["event"] == "start")
    evals = [e for e in log if e["event"] == "eval"]
    trains = [e for e in log if e["event"] == "train"]
    done = any(e["event"] == "done" for e in log)
    last = evals[-1] if evals else {}
    rows.append({"model": m, "params": start["parameters"], "epochs": last.get("epoch"), "updates": last.get("update"),
                 "top1": last.get("top1"), "top5": last.get("top5"), "ema_top1": last.get("ema_top1"),
                 "best_top1": last.get("best_top1"), "images_per_s": trains[-1]["images_per_s"] if trains else None,
                 "finished": done})
json.dump({"data": info, "res": res, "epochs": epochs, "rows": rows}, open(os.path.join(out, "evidence.json"), "w"), indent=1)
f = lambda v, p=2: "-" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))
lines = [f"{info['source']} ({len(info['classes'])} classes, {info['images']['train']} train / {info['images']['val']} val "
         f"images of {info['size']} px), trained at {res} px for {epochs} epochs, the hgrn1 recipe for every model", "",
         "| model | params | epochs done | top-1 | top-5 | EMA top-1 | best top-1 | train img/s | finished |", "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['model']} | {f(r.get('params'))} | {f(r.get('epochs'))} | {f(r.get('top1'))} | {f(r.get('top5'))} | "
                 f"{f(r.get('ema_top1'))} | {f(r.get('best_top1'))} | {f(r.get('images_per_s'), 0)} | {r.get('finished', r.get('status'))} |")
open(os.path.join(out, "evidence.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
fi

if [[ ",$STAGES," == *",bench,"* ]]; then
  timeout "${IMG_BENCH_S:-300}" python3 -m bench.bench_image --out "$OUT/bench" ${IMG_BENCH_ARGS:---modes eager,graphs} \
    > "$OUT/bench.log" 2>&1
  echo "bench rc=$? at $(el)s"; tail -14 "$OUT/bench.log"
fi
echo "gpu_image.sh done at $(el)s"
