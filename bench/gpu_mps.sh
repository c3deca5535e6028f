# Sourced by bench/gpu_checks.sh (mqar stage) and bench/gpu_mqar.sh, from the repository root.
# CUDA MPS for the mqar stage: sets MPS_MODE to what was used (MPS on, or off and why).
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  local why="" check rc
  if ! command -v nvidia-cuda-mps-control > /dev/null; then
    why="nvidia-cuda-mps-control is not on the PATH"
  else
    # a daemon left by an earlier call that was cut (daemons outlive their call on a warm machine)
    echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1
    if ! nvidia-cuda-mps-control -d; then
      why="nvidia-cuda-mps-control -d failed"
    else
      check=$(timeout 60 python3 -c 'import torch; print(torch.ones(1, device="cuda").sum().item())' 2>&1)
      rc=$?
      if [ $rc != 0 ] || [ "$(echo "$check" | tail -1)" != "1.0" ]; then
        why="health check failed (rc $rc; 124: timed out): $(echo "$check" | tail -2 | tr '\n' ' ')"
        [ -s /tmp/mps_log/control.log ] && why+=" control.log: $(tail -2 /tmp/mps_log/control.log | tr '\n' ' ')"
      fi
    fi
  fi
  if [ -z "$why" ]; then
    MPS_MODE="CUDA MPS on (pipe $CUDA_MPS_PIPE_DIRECTORY): the runs sharing a GPU run their kernels concurrently"
    return
  fi
  stop_mps
  MPS_MODE="MPS off: $why; the runs sharing a GPU time-slice it"
}
stop_mps() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | timeout 30 nvidia-cuda-mps-control > /dev/null 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
