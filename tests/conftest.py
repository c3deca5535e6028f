"""Shared test set-up.

Without a GPU, Triton kernels run through the interpreter on CPU tensors: set TRITON_INTERPRET=1
before any kernel is compiled. (With ``backend='auto'`` CPU tensors take the PyTorch reference
anyway; only tests that force ``backend='triton'`` reach the interpreter.)
"""
import os

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


# The files that take longest on 2 CPU cores run first.
# scripts/test.sh hands files to its worker processes in collection order (--dist loadfile
# --no-loadscope-reorder): pytest-xdist's own order, most tests first, had left the one-test sm90 file
# (224 s) to run last on one worker while the other sat idle.
SLOW_FILES_FIRST = (
    "tests/kernels/test_sm90_compile.py",
    "tests/tasks/test_mqar.py",
    "tests/kernels/test_hgru_triton.py",
    "tests/kernels/test_hgrn2_triton.py",
    "tests/kernels/test_hgru_triton_lookback.py",
    "tests/scripts/test_train_lra.py",
    "tests/tasks/test_lra.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
    root = str(config.rootpath)

    def file_rank(item):
        path = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        return rank.get(path, len(SLOW_FILES_FIRST))

    items.sort(key=file_rank)  # (stable: each file's tests keep their order, the other files theirs)
