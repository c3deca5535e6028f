# Sourced by bench/gpu_checks.sh (mqar stage), bench/gpu_mqar.sh, bench/gpu_lra.sh and bench/gpu_session.sh,
# from the repository root. CUDA MPS: sets MPS_MODE to what was used (MPS on, or off and why).
# MPS_SHARED=1 (exported by gpu_session.sh when its stages run at once, SESSION_PARALLEL=1, with the daemon
# it started): start_mps and stop_mps leave that daemon alone (a start would quit it under the other stage).
start_mps() {
  if [ "${MPS_SHARED:-0}" = 1 ]; then
    MPS_MODE="${MPS_SHARED_MODE:-CUDA MPS as gpu_session.sh set it up} (shared by the session's stages)"
    return
  fi
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
  [ "${MPS_SHARED:-0}" = 1 ] && return
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | timeout 30 nvidia-cuda-mps-control > /dev/null 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
