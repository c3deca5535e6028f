"""Shared test set-up.

Without a GPU, Triton kernels run through the interpreter on CPU tensors: set TRITON_INTERPRET=1
before any kernel is compiled. (With ``backend='auto'`` CPU tensors take the PyTorch reference
anyway; only tests that force ``backend='triton'`` reach the interpreter.)

Two sets (pytest.ini): the default run is the fast set; a test that starts a Python interpreter, a shell
script or torchrun (command-line tools end to end, several processes), or that takes more than about ten
seconds on one CPU core, is marked ``integration`` and runs with ``pytest -m integration``. A test outside
it that starts such a process fails and says to mark it.
"""
import contextlib
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# HGRN_TEST_TIMES=FILE appends a line when each test starts and one with its time and outcome when it
# ends: the GPU scripts run tests under a time limit, and a killed pytest prints no --durations table.
_TIMES = os.environ.get("HGRN_TEST_TIMES")


def _log_time(line):
    import time

    with open(_TIMES, "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} {line}\n")


def pytest_runtest_logstart(nodeid, location):
    if _TIMES:
        _log_time(f"   start {nodeid}")


def pytest_runtest_logreport(report):
    if _TIMES and (report.when == "call" or report.outcome != "passed"):
        _log_time(f"{report.duration:8.1f} {report.when}:{report.outcome} {report.nodeid}")


# programs whose start-up alone (torch, fairseq and triton imports for Python) costs the fast set seconds
def _slow_program(args, executable):
    first = executable or (args if isinstance(args, (str, bytes)) else args[0])
    name = os.path.basename(os.fsdecode(first).split(" ")[0])
    slow = name.startswith(("python", "torchrun")) or name in ("bash", "sh") or first == sys.executable
    return name if slow else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_slow_programs(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_slow_programs(item):
        yield


@contextlib.contextmanager
def _no_slow_programs(item):
    """Outside ``integration`` (its fixtures included), starting an interpreter, a shell or torchrun is an
    error that names the marker."""
    if item.get_closest_marker("integration") is not None:
        yield
        return
    spawn = subprocess.Popen._execute_child

    def refuse(self, args, executable, *rest, **kw):
        program = _slow_program(args, executable)
        if program is not None:
            raise RuntimeError(f"{item.nodeid} starts `{program}`: mark it @pytest.mark.integration "
                               "(the fast set starts no interpreter, shell or torchrun)")
        return spawn(self, args, executable, *rest, **kw)

    subprocess.Popen._execute_child = refuse
    try:
        yield
    finally:
        subprocess.Popen._execute_child = spawn
