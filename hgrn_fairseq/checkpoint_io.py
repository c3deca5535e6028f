"""Reading fairseq checkpoints for the package's commands: a damaged file or a checkpoint of another kind
is refused as ``CheckpointError``, one line naming the file, instead of a pickle/zip/KeyError traceback."""
from __future__ import annotations

import os

from .data_checks import DataError

FIX = "pass a checkpoint_*.pt that fairseq-train wrote completely (copy it again if it was transferred)"


class CheckpointError(DataError):
    """A checkpoint that cannot be used (empty, truncated, not a torch file, not a fairseq checkpoint)."""


def read_fairseq_checkpoint(checkpoint: str) -> dict:
    """fairseq's ``load_checkpoint_to_cpu`` of ``checkpoint``, with a damaged file (empty, truncated,
    not a torch file) or a checkpoint of another kind (no ``model`` weights, no fairseq training
    state) refused as ``CheckpointError`` naming the file."""
    import pickle
    import zipfile

    from fairseq import checkpoint_utils

    if os.path.getsize(checkpoint) == 0:
        raise CheckpointError(f"checkpoint {checkpoint} is empty (0 bytes): {FIX}")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    except (KeyError, TypeError, AttributeError) as e:  # a torch file without fairseq's training state
        raise CheckpointError(
            f"checkpoint {checkpoint} is not a fairseq checkpoint (no {e} in it; a file of another kind, e.g. an "
            f"image model's?): {FIX}"
        ) from None
    except (EOFError, OSError, RuntimeError, ValueError, UnicodeDecodeError, ImportError, pickle.UnpicklingError,
            zipfile.BadZipFile) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), "")[:120]
        raise CheckpointError(
            f"checkpoint {checkpoint} cannot be read ({type(e).__name__}: {first}): a truncated or damaged "
            f"file? {FIX}"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(
            f"checkpoint {checkpoint} is not a fairseq checkpoint (no 'model' weights in it; a file of another "
            f"kind?): {FIX}"
        )
    return state


def checkpoint_task(state: dict):
    """The name of the fairseq task a checkpoint state (``read_fairseq_checkpoint``) trained with, or None."""
    cfg = state.get("cfg")
    task = None
    if cfg is not None:
        task = cfg.get("task") if hasattr(cfg, "get") else getattr(cfg, "task", None)
    if task is not None:
        return task.get("_name") if hasattr(task, "get") else getattr(task, "_name", None)
    args = state.get("args")
    return getattr(args, "task", None) if args is not None else None
