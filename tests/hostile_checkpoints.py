"""Checkpoint files for the safe-loading tests: hostile ones whose unpickling creates a marker file (through
``os.system``, ``builtins.exec`` or ``subprocess``), and damaged ones (truncated, random bytes)."""
import builtins
import os
import subprocess

import torch

WAYS = ("os.system", "exec", "subprocess")


class RunsCode:
    """Pickles as a call that creates ``marker`` when unpickled."""

    def __init__(self, marker: str, way: str = "os.system"):
        self.marker, self.way = str(marker), way

    def __reduce__(self):
        if self.way == "os.system":
            return os.system, (f"touch '{self.marker}'",)
        if self.way == "exec":
            return builtins.exec, (f"open({self.marker!r}, 'w').close()",)
        if self.way == "subprocess":
            return subprocess.call, (["touch", self.marker],)
        raise ValueError(f"way={self.way!r} is not one of {WAYS}")


def write_hostile(path, marker, way: str = "os.system", base: dict = None) -> str:
    """``base`` (default: a minimal fairseq-like state) with a payload in its ``extra_state``, saved at ``path``."""
    state = dict(base) if base is not None else {"model": {"w": torch.zeros(2)}, "cfg": None, "args": None}
    extra = dict(state.get("extra_state") or {})
    extra["payload"] = RunsCode(marker, way)
    state["extra_state"] = extra
    torch.save(state, str(path))
    return str(path)


def write_truncated(path, source) -> str:
    """The first half of the file ``source`` at ``path``."""
    with open(source, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return str(path)


def write_random_bytes(path, size: int = 4096, seed: int = 0) -> str:
    import random

    with open(path, "wb") as f:
        f.write(random.Random(seed).randbytes(size))
    return str(path)
