"""Reading checkpoints safely: every checkpoint and state file the package or fairseq reads goes through here.

A ``torch.save`` file is a pickle, and unpickling can run any code the file names. ``load_checkpoint`` reads
with ``torch.load(weights_only=True)``, which builds nothing but tensors, containers and the types of
``allowed_types()``: what the checkpoints of this package and of stock fairseq 0.12 hold (omegaconf configs,
``argparse.Namespace``, numpy scalars, ...). A file naming anything else is refused before any of it runs,
as ``UnsafeCheckpointError`` naming the file and the type. Files you trust that hold other types (written
by other tools) load with ``--trust-checkpoint`` on the package's commands or ``HGRN_TRUST_CHECKPOINTS=1``
(the fairseq commands), with a warning. A damaged file (empty, truncated, not a torch file) is a
``CheckpointError`` with one line naming it. Importing this module changes nothing in torch.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import logging
import os
import pickle
import re
import sys
import zipfile
from typing import Any, Optional

from .data_checks import DataError

logger = logging.getLogger(__name__)

TRUST_ENV = "HGRN_TRUST_CHECKPOINTS"
TRUST_FLAG = "--trust-checkpoint"
TRUST_HELP = ("load checkpoints that hold Python types beyond weights and configs by unpickling them fully: "
              f"only for files you trust, since unpickling can run code (also: {TRUST_ENV}=1)")
OPT_IN = f"if you trust the file, pass {TRUST_FLAG} (fairseq commands: set {TRUST_ENV}=1)"
FIX = "pass a checkpoint_*.pt that fairseq-train wrote completely (copy it again if it was transferred)"


class CheckpointError(DataError):
    """A checkpoint that cannot be used (empty, truncated, not a torch file, not a fairseq checkpoint)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding a type outside ``allowed_types()``: refused, nothing in it ran."""


def _numpy_types() -> list:
    import numpy as np

    try:
        from numpy._core.multiarray import scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import scalar
    # np.float64(1.0) pickles as scalar(dtype, bytes); the dtype as its class (numpy.dtypes.*) since numpy 1.25
    dtype_classes = [type(np.dtype(c)) for c in "?bhilqBHILQefdgFDGUS"]
    return [scalar, np.dtype, *dict.fromkeys(dtype_classes)]


def allowed_types() -> tuple:
    """``checkpoint_types()``, and the placeholder fairseq's ``broadcast_object`` sends where the tensors were
    (sent alongside) once fairseq's distributed module is loaded."""
    placeholder = getattr(sys.modules.get("fairseq.distributed.utils"), "_TensorPlaceholder", None)
    return checkpoint_types() + ((placeholder,) if placeholder is not None else ())


@functools.lru_cache(maxsize=None)
def checkpoint_types() -> tuple:
    """The types (beyond torch's defaults: tensors, ``dict``/``list``/``OrderedDict``, numbers, strings) that
    checkpoints of this package and of stock fairseq 0.12 hold, and the state fairseq broadcasts between
    processes: fairseq-train (language models with and without CUDA graphs, LRA, MQAR), the image trainer,
    and fairseq's own argparse-era checkpoints."""
    import argparse
    import collections
    import typing

    from omegaconf import DictConfig, ListConfig
    from omegaconf import nodes as omegaconf_nodes
    from omegaconf.base import ContainerMetadata, Metadata

    types = [
        argparse.Namespace,  # fairseq's "args", and argparse-era values inside "cfg"
        collections.defaultdict,  # (omegaconf's container metadata)
        DictConfig, ListConfig, ContainerMetadata, Metadata,  # "cfg" as fairseq holds it after loading
        omegaconf_nodes.AnyNode, omegaconf_nodes.StringNode, omegaconf_nodes.IntegerNode,
        omegaconf_nodes.FloatNode, omegaconf_nodes.BooleanNode,
        typing.Any, dict, list, int, float, bool, str,  # omegaconf's key, element and reference types
        *_numpy_types(),  # meters and logged values that were numpy scalars
    ]
    return tuple(types)


_TRUSTED = contextvars.ContextVar("hgrn_trusted_checkpoints", default=False)


def trusted_by_environment() -> bool:
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def trusted_checkpoints(enabled: bool = True):
    """Within the block, ``load_checkpoint`` (and fairseq's loading through it) unpickles fully when ``enabled``:
    what a command's ``--trust-checkpoint`` does for the reads it makes through fairseq."""
    token = _TRUSTED.set(bool(enabled) or _TRUSTED.get())
    try:
        yield
    finally:
        _TRUSTED.reset(token)


_REFUSED_PATTERNS = (
    r"GLOBAL (\S+) was not an allowed global",
    r"unsupported GLOBAL (\S+) whose module",
    r"but got (<class '[^']+'>)",
    r"unrecognized function (.+?)(?: which belongs|$)",
)


def refused_type(message: str) -> Optional[str]:
    """The type or function that ``torch.load(weights_only=True)`` refused, from its error message, or None
    when the error is not a refusal (a damaged file)."""
    import _compat_pickle

    for pattern in _REFUSED_PATTERNS:
        m = re.search(pattern, message, flags=re.MULTILINE)
        if m:
            name = m.group(1).strip().removeprefix("<class '").removesuffix("'>")
            module, _, attr = name.rpartition(".")
            if not module:  # torch drops the "builtins." of builtins (exec, eval)
                return f"builtins.{attr}"
            # pickle writes some names as Python 2 had them (subprocess.call as commands.call)
            return f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{attr}"
    return None


def _describe(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return str(getattr(source, "name", None) or "<in-memory checkpoint state>")


def load_checkpoint(source, map_location: Any = "cpu", trust: Optional[bool] = None, mmap: bool = False,
                    name: Optional[str] = None) -> Any:
    """``torch.load`` of ``source`` (a path, or a binary file object) with ``weights_only=True`` under the
    allowlist ``allowed_types()``. ``trust`` (default: within ``trusted_checkpoints()``, or
    ``HGRN_TRUST_CHECKPOINTS`` set) unpickles fully, with a warning. ``mmap`` maps a zip-format file's tensors
    instead of reading them (when it can). Raises ``UnsafeCheckpointError`` for a type outside the allowlist, ``CheckpointError`` for a damaged file;
    ``name`` names the file in the messages (default: the path)."""
    import torch

    name = name or _describe(source)
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            raise CheckpointError(f"checkpoint {name} does not exist: give the path of a checkpoint file")
        if os.path.getsize(source) == 0:
            raise CheckpointError(f"checkpoint {name} is empty (0 bytes): {FIX}")
    if trust is None:
        trust = _TRUSTED.get() or trusted_by_environment()
    if trust:
        logger.warning("%s is unpickled fully (%s or %s=1): any code it carries runs; use this only for files you "
                       "trust", name, TRUST_FLAG, TRUST_ENV)
        return _load(torch, source, map_location, mmap, weights_only=False, name=name)
    with torch.serialization.safe_globals(list(allowed_types())):
        return _load(torch, source, map_location, mmap, weights_only=True, name=name)


def _load(torch, source, map_location, mmap, weights_only, name):
    try:
        if mmap and isinstance(source, (str, os.PathLike)) and zipfile.is_zipfile(source):
            return torch.load(source, map_location=map_location, weights_only=weights_only, mmap=True)
        return torch.load(source, map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as e:
        refused = refused_type(str(e)) if weights_only else None
        if refused is not None:
            raise UnsafeCheckpointError(
                f"checkpoint {name} holds {refused}, which is not among the types a checkpoint of this package or "
                f"fairseq holds: refused, nothing in it was run (unpickling a file can run code); {OPT_IN}"
            ) from None
        raise _damaged(name, e) from None
    except (EOFError, OSError, RuntimeError, ValueError, UnicodeDecodeError, ImportError, AttributeError,
            KeyError, IndexError, TypeError, zipfile.BadZipFile) as e:
        raise _damaged(name, e) from None


def _damaged(name: str, e: BaseException) -> CheckpointError:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    detail = next((line for line in lines if "WeightsUnpickler" not in line and "Weights only" not in line),
                  lines[0] if lines else "")
    return CheckpointError(f"checkpoint {name} cannot be read ({type(e).__name__}: {detail[:120]}): a truncated or "
                           f"damaged file? {FIX}")


class TorchWithSafeLoad:
    """Forwards every attribute to ``torch`` except ``load``, which is ``load_checkpoint``: given to fairseq's
    modules that read checkpoints and broadcast state (``fairseq_compat.load_checkpoints_safely``)."""

    def __getattr__(self, attr):
        import torch

        return getattr(torch, attr)

    @staticmethod
    def load(f, map_location=None, **_ignored):
        name = "<checkpoint state received from another process>" if isinstance(f, io.BytesIO) else None
        return load_checkpoint(f, map_location=map_location, name=name)


def read_fairseq_checkpoint(checkpoint: str) -> dict:
    """fairseq's ``load_checkpoint_to_cpu`` of ``checkpoint`` (through ``load_checkpoint``), with a damaged file
    (empty, truncated, not a torch file), a refused one, or a checkpoint of another kind (no ``model`` weights,
    no fairseq training state) raised as ``CheckpointError`` naming it."""
    from fairseq import checkpoint_utils

    from . import register

    register()  # fairseq reads through load_checkpoint (fairseq_compat.load_checkpoints_safely)

    if os.path.getsize(checkpoint) == 0:
        raise CheckpointError(f"checkpoint {checkpoint} is empty (0 bytes): {FIX}")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    except CheckpointError:
        raise
    except (KeyError, TypeError, AttributeError) as e:  # a torch file without fairseq's training state
        raise CheckpointError(
            f"checkpoint {checkpoint} is not a fairseq checkpoint (no {e} in it; a file of another kind, e.g. an "
            f"image model's?): {FIX}"
        ) from None
    except (EOFError, OSError, RuntimeError, ValueError, UnicodeDecodeError, ImportError, pickle.UnpicklingError,
            zipfile.BadZipFile) as e:
        raise _damaged(checkpoint, e) from None
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
