# Sourced by the GPU-machine scripts (bench/gpu_checks.sh, bench/gpu_session.sh) from the repository root,
# with R set to it and OUT to the results folder. gpu_env installs the wheels of .whl/ into /tmp/site,
# puts the repository and them on the PYTHONPATH and records the GPU and versions (gpu_versions) in $OUT/env.txt;
# install_fairseq installs fairseq-fixed into /tmp/site2.
gpu_env() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$R"/.whl/*.whl 2>/dev/null
  export PYTHONPATH=$R:/tmp/site
  gpu_versions | tee "$OUT/env.txt"
}
gpu_versions() {  # the GPU, its driver, torch and triton (what $OUT/env.txt records)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
}
# fairseq-fixed into /tmp/site2 (console scripts in /tmp/site2/bin): the prebuilt wheel, else a wheel
# built from the sdist. The other sdists of .whl/ (antlr4) are pure Python and install from source.
# (The globs do not recurse: .whl/*.whl and .whl/*.tar.gz never match files in .whl/prebuilt/.)
install_fairseq() {
  local wheel sdist="" others=() f
  wheel=$(ls "$R"/.whl/prebuilt/fairseq_fixed-*.whl 2>/dev/null | tail -1)
  for f in "$R"/.whl/*.tar.gz; do
    case ${f##*/} in fairseq_fixed-*) sdist=$f ;; *) others+=("$f") ;; esac
  done
  if [ -n "$wheel" ]; then
    echo "fairseq: prebuilt ${wheel##*/}"
  else
    [ -n "$sdist" ] || { echo "fairseq: neither .whl/prebuilt/fairseq_fixed-*.whl nor .whl/fairseq_fixed-*.tar.gz"; return 1; }
    rm -rf /tmp/fairseq_wheel
    (cd /tmp && env -u CUDA_HOME MAX_JOBS=$(( $(nproc) < 32 ? $(nproc) : 32 )) python3 -m pip wheel -q --no-index \
       --no-deps --no-build-isolation -w /tmp/fairseq_wheel "$sdist") || return
    wheel=$(ls /tmp/fairseq_wheel/fairseq_fixed-*.whl) || return
    echo "fairseq: built ${wheel##*/} at $(el)s"
    if [ "${SAVE_FAIRSEQ_WHEEL:-0}" = 1 ]; then  # ~22 MB, over the 16 MiB a file of $OUT may have: in parts
      split -b 15M -d "$wheel" "$OUT/${wheel##*/}.part" \
        && echo "fairseq: wheel saved as \$OUT/${wheel##*/}.part*; cat them into .whl/prebuilt/${wheel##*/}"
    fi
  fi
  (cd /tmp && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site2 \
     "$wheel" "${others[@]}")
}
