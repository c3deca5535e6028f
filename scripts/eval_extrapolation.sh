#!/usr/bin/env bash
# Length extrapolation of a trained LM: test perplexity at L = 512, 768, ..., 14336.
#
#   bash scripts/eval_extrapolation.sh CHECKPOINT [DATA] [options]
#
#   CHECKPOINT  a fairseq checkpoint of hgrn_lm*, hgrn2 or fairseq's transformer_lm
#   DATA        the binarised data directory (default: the one recorded in the checkpoint)
#   options     passed to python -m hgrn_fairseq.evaluation.extrapolation, e.g.
#                 --lengths 512,1024,2048   or   --lengths 512:14336:256 (the default)
#                 --mode stateless|stateful|both|auto   --out-dir DIR   --dtype bf16   --cpu
#
# Non-overlapping blocks of L tokens, one block per batch. The run fails (exit 3) if at any L the
# number of scored tokens differs from the test split's token count; the Transformer's
# max_target_positions is lifted to max(L) so that fairseq does not skip long blocks. An L longer
# than the test split is refused (exit 2, the split's token count named).
# Writes extrapolation.{csv,md,json,png} to --out-dir (default: next to the checkpoint).
# On the CPU (--cpu, or no GPU) it runs with OMP_NUM_THREADS=1 unless that is set.
set -euo pipefail

usage() { sed -n '2,17p' "$0"; }
die() { echo "eval_extrapolation.sh: error: $*" >&2; exit 2; }
if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  usage
  [[ $# -ge 1 ]] && exit 0 || exit 2
fi
CHECKPOINT=$1
shift
[[ -f "$CHECKPOINT" ]] || die "checkpoint $CHECKPOINT not found"
ARGS=("$CHECKPOINT")
if [[ $# -ge 1 && "$1" != -* ]]; then
  [[ -d "$1" ]] || die "data directory $1 not found"
  ARGS+=("$1")
  shift
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$REPO/scripts/gpu_count.sh"  # count_gpus, cpu_threads
ON_CPU=0
for arg in "$@"; do [[ "$arg" == --cpu ]] && ON_CPU=1; done
if [[ $ON_CPU == 0 ]]; then
  count_gpus
  [[ "$NGPU" -gt 0 ]] || ON_CPU=1
fi
[[ $ON_CPU == 0 ]] || cpu_threads
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m hgrn_fairseq.evaluation.extrapolation "${ARGS[@]}" "$@"
