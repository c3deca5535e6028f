"""Every kernel compiles for sm_90 (Hopper) through Triton's real compiler, on a machine without a
GPU (tests/kernels/sm90_compile.py has the list and says why the interpreter cannot check this).

Regression: a loop-carried variable whose shape changed inside the loop (in the fused stream backward
of the HGRU scan) passed every CPU test and failed to compile on the GPU; this test fails on that code."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

triton = pytest.importorskip("triton")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _has_nvidia_backend():
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.mark.skipif(not _has_nvidia_backend(), reason="this Triton build has no NVIDIA backend (ptxas)")
def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.sm90_compile"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200)
    lines = proc.stdout.splitlines()
    failures = [line for line in lines if line.startswith("FAIL")]
    assert not failures, "\n".join(failures)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = lines[-1].split()
    assert summary[0] == "compiled" and summary[1] == summary[3] and int(summary[1]) >= 50, lines[-1]
