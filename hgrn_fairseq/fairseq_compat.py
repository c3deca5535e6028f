"""Make fairseq 0.12 (fairseq-fixed) work on the current stack: torch >= 2.6 and numpy >= 2.

Both fixes are narrow and idempotent; ``install()`` runs when the plugin is imported.

1. torch 2.6 changed ``torch.load``'s default to ``weights_only=True``, which refuses the Python
   objects fairseq stores next to the weights (configs, optimizer history, meters). fairseq calls
   ``torch.load`` without the argument, so ``fairseq-train`` resume, ``fairseq-eval-lm`` and
   ``fairseq-generate`` fail. We give fairseq's checkpoint module a ``torch`` whose ``load``
   defaults to ``weights_only=False``, the behaviour fairseq was written for; nothing outside
   ``fairseq.checkpoint_utils`` is affected. As with any fairseq checkpoint, load only files you
   trust: a checkpoint is a pickle.
2. numpy 2 removed ``numpy.compat``; fairseq's ``TokenBlockDataset`` still reads
   ``np.compat.long`` (the inference datasets of ``fairseq-interactive`` / ``-generate`` for LMs).
   We restore that one alias (``int``, its value in numpy 1.x) when it is missing.
"""
import types

import numpy as np
import torch


class _TorchForFairseqCheckpoints:
    """Forwards every attribute to ``torch``; ``load`` unpickles whole fairseq checkpoints."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(*args, **kwargs):
        kwargs.setdefault("weights_only", False)
        return torch.load(*args, **kwargs)


def install() -> None:
    from fairseq import checkpoint_utils

    if not isinstance(checkpoint_utils.torch, _TorchForFairseqCheckpoints):
        checkpoint_utils.torch = _TorchForFairseqCheckpoints()
    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=int)
