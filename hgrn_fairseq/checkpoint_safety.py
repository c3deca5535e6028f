"""fairseq-train checkpoints that survive a kill, and a save directory one run at a time.

Installed by ``fairseq_compat.install()`` (so by ``--user-dir hgrn_fairseq``); it changes fairseq 0.12's
``checkpoint_utils`` as follows, and nothing else:

* **Complete or absent.** fairseq writes the first checkpoint of a save aside and renames it into place,
  but then *copies* it to the others (``checkpoint_last.pt``, ``checkpoint_best.pt``): a kill during a
  copy left a truncated ``checkpoint_last.pt``, on which every rerun of the same command died. The copies
  are now written aside and renamed into place too.
* **Resume from the newest intact checkpoint.** A kill between fairseq's first write of a save and its
  copy to ``checkpoint_last.pt`` leaves that file missing or older than the save; a damaged one (written
  by something else, a full disk) cannot be loaded. In each case the run resumes from the newest intact
  ``checkpoint*.pt`` of the save directory that holds optimizer state, and says so (a damaged file is kept
  as ``checkpoint_last.pt.damaged``). A checkpoint without optimizer state (a best stripped for
  evaluation) is never resumed from: fairseq would restart the run at update 0.
* **One run per save directory.** The master process holds an exclusive lock on
  ``SAVE_DIR/.hgrn_train.lock`` for its lifetime (released by the system when it ends, however it ends); a
  second run on the same directory stops with a message naming the first one's process id.
* **A ``--restore-file`` that does not exist is an error** (fairseq trained from scratch with exit 0).
"""
from __future__ import annotations

import functools
import glob
import logging
import os
import re
import shutil
import zipfile
from typing import Dict, Optional

from .checkpoint_io import CheckpointError, load_checkpoint

logger = logging.getLogger(__name__)
LOCK_NAME = ".hgrn_train.lock"
_HELD_LOCKS: Dict[str, object] = {}  # save_dir -> open lock file, kept for the life of the process


def _atomic_copy(src: str, dst: str) -> None:
    tmp = dst + ".tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


class _PathManagerWithAtomicCopy:
    """fairseq's ``PathManager`` with ``copy`` of local files done aside then renamed."""

    def __init__(self, path_manager):
        self._pm = path_manager

    def __getattr__(self, name):
        return getattr(self._pm, name)

    def copy(self, src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if "://" in src_path or "://" in dst_path:
            return self._pm.copy(src_path, dst_path, overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        _atomic_copy(src_path, dst_path)
        return True


def is_intact(path: str) -> bool:
    """True when ``path`` is a complete ``torch.save`` zip archive (a truncated one has no central
    directory at its end) whose members all pass their CRC check."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def _updates_of(path: str) -> int:
    m = re.search(r"_(\d+)\.pt$", os.path.basename(path))
    return int(m.group(1)) if m else -1


def has_optimizer_state(path: str) -> bool:
    """True when the checkpoint at ``path`` holds the optimizer state a run resumes with. A checkpoint
    saved without it (``--no-save-optimizer-state``, or a best stripped for evaluation) loads, but fairseq then restarts at update 0: the learning-rate schedule
    and the optimizer's moments from scratch. Read memory-mapped: the tensors' bytes are not loaded."""
    state = load_checkpoint(path, mmap=True)  # (a refused file is an error: nothing is resumed from it)
    return isinstance(state, dict) and state.get("last_optimizer_state") is not None


def newest_intact_checkpoint(save_dir: str, resumable: bool = False) -> Optional[str]:
    """The most recently written intact ``checkpoint*.pt`` of ``save_dir`` (None when there is none);
    with ``resumable``, the most recent one that also holds optimizer state (``has_optimizer_state``)."""
    candidates = glob.glob(os.path.join(save_dir, "checkpoint*.pt"))
    # newest first; at equal times checkpoint_last.pt, then the most updates
    candidates.sort(key=lambda p: (os.path.getmtime(p), "checkpoint_last" in os.path.basename(p), _updates_of(p)),
                    reverse=True)
    for path in candidates:
        if not is_intact(path):
            logger.warning("%s is damaged (not a complete checkpoint): skipped", path)
        elif resumable and not has_optimizer_state(path):
            logger.warning("%s holds no optimizer state (resuming from it would restart the learning-rate "
                           "schedule at update 0): not resumed from", path)
        else:
            return path
    return None


def resume_choice(save_dir: str, last: str, master: bool) -> Optional[str]:
    """The checkpoint to resume from when it is not ``last`` (None: fairseq's own choice, ``last`` or a
    fresh start). A kill can leave ``last`` missing, damaged, or older than a checkpoint written in the
    same save (fairseq writes one file, then copies it to the others, ``last`` at the end)."""
    if not os.path.isdir(save_dir):
        return None
    if os.path.exists(last) and is_intact(last) and not any(
            os.path.getmtime(p) > os.path.getmtime(last) for p in glob.glob(os.path.join(save_dir, "checkpoint*.pt"))):
        return None  # the usual case, decided without reading any checkpoint
    # A checkpoint without optimizer state is never resumed from (has_optimizer_state): a best stripped for
    # evaluation after the last was written is newer than it, and resuming from it restarted a run at
    # update 0 with the best's weights.
    newest = newest_intact_checkpoint(save_dir, resumable=True)
    if os.path.exists(last) and not is_intact(last):
        if master:
            os.replace(last, last + ".damaged")
        if newest is None:
            logger.warning("%s is damaged (kept as %s.damaged) and the save directory holds no intact checkpoint "
                           "with optimizer state: training starts from scratch", last, last)
        else:
            logger.warning("%s is damaged (kept as %s.damaged): resuming from %s, the newest intact checkpoint",
                           last, last, newest)
        return newest
    if newest is None or os.path.abspath(newest) == os.path.abspath(last):
        return None
    if not os.path.exists(last):
        logger.warning("%s is missing (a run stopped while saving): resuming from %s, the newest intact checkpoint",
                       last, newest)
        return newest
    if os.path.getmtime(newest) > os.path.getmtime(last):
        logger.warning("%s is older than %s (a run stopped while saving): resuming from the newer one", last, newest)
        return newest
    return None


class LockHeld(Exception):
    """Another process holds the lock; ``holder`` is what it wrote in the lock file."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def hold_lock(path: str, holder: str):
    """Take an exclusive lock on the file ``path`` (created if absent) for as long as the returned file
    stays open (the system drops it when the process ends, however it ends: no stale locks), and write
    ``holder`` in it; raise ``LockHeld`` with the current holder's line when another process has it."""
    import fcntl

    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        current = f.read().strip()
        f.close()
        raise LockHeld(current) from None
    f.seek(0)
    f.truncate()
    f.write(holder + "\n")
    f.flush()
    return f


def lock_save_dir(save_dir: str) -> None:
    """Hold ``save_dir``'s lock for the life of this process, or stop when another process holds it."""
    key = os.path.realpath(save_dir)
    if key in _HELD_LOCKS:
        return
    os.makedirs(save_dir, exist_ok=True)
    try:
        _HELD_LOCKS[key] = hold_lock(os.path.join(save_dir, LOCK_NAME), str(os.getpid()))
    except LockHeld as e:
        raise CheckpointError(
            f"save directory {save_dir} is in use by another fairseq-train (process {e.holder or 'unknown'}): wait "
            f"for it to finish, stop it, or pass another --save-dir"
        ) from None


def _restore_path(cfg, suffix: str) -> str:
    if suffix:
        return cfg.restore_file.replace(".pt", suffix + ".pt")
    return cfg.restore_file


def _safe_load_checkpoint(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def wrapped(cfg, trainer, **passthrough_args):
        from omegaconf import open_dict

        suffix = trainer.checkpoint_suffix or ""
        if trainer.is_data_parallel_master and not cfg.no_save:
            lock_save_dir(cfg.save_dir)
        if cfg.restore_file != "checkpoint_last.pt":
            path = _restore_path(cfg, suffix)
            if not os.path.isfile(path):
                raise CheckpointError(
                    f"--restore-file {cfg.restore_file} does not exist (looked for {os.path.abspath(path)}): "
                    f"give the path of a checkpoint, or leave the option out to resume from "
                    f"{os.path.join(cfg.save_dir, 'checkpoint_last.pt')}"
                )
        else:
            last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
            choice = resume_choice(cfg.save_dir, last, trainer.is_data_parallel_master)
            if choice is not None:
                with open_dict(cfg):
                    cfg.restore_file = os.path.abspath(choice)
        return load_checkpoint(cfg, trainer, **passthrough_args)

    wrapped._hgrn_safe = True
    return wrapped


def install() -> None:
    from fairseq import checkpoint_utils

    if not isinstance(checkpoint_utils.PathManager, _PathManagerWithAtomicCopy):
        checkpoint_utils.PathManager = _PathManagerWithAtomicCopy(checkpoint_utils.PathManager)
    if not getattr(checkpoint_utils.load_checkpoint, "_hgrn_safe", False):
        checkpoint_utils.load_checkpoint = _safe_load_checkpoint(checkpoint_utils.load_checkpoint)
