"""Which code a bench result came from (shared by the bench scripts)."""
from __future__ import annotations

import os
import subprocess
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_version(repo: str = REPO) -> Optional[str]:
    """The short commit of ``repo``'s HEAD, with "+dirty" when tracked files differ from it (the GPU
    machine's copy of the working tree can carry a stale HEAD and the current files), or None.
    ``$HGRN_GIT_COMMIT`` (set by whoever copied the tree there: the commit it was copied from) wins."""
    if os.environ.get("HGRN_GIT_COMMIT"):
        return os.environ["HGRN_GIT_COMMIT"]
    try:
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (commit + ("+dirty" if dirty else "")) or None
    except Exception:  # noqa: BLE001 - no git, no repository: the result just says so
        return None


def child_env() -> dict:
    """The environment for a worker started as ``python -m bench.NAME``: the repository root importable
    wherever the caller's working directory is."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env
