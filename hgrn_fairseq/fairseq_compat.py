"""Make fairseq 0.12 (fairseq-fixed) work on the current stack: torch >= 2.6 and numpy >= 2.

The fixes are narrow and idempotent; ``install()`` runs when the plugin is imported.

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
3. fairseq's argparse entry points turn ``--bf16`` into ``--tpu`` (``options.parse_args_and_arch``:
   "if args.bf16: args.tpu = True"), so ``fairseq-train --bf16`` on a GPU (or CPU) asks torch_xla
   for a TPU and fails. ``--user-dir`` imports this plugin *during* that parse, after the command
   line modules (``fairseq_cli.train`` & co.) are loaded, so we wrap the
   ``convert_namespace_to_omegaconf`` those modules call right after parsing: it resets ``tpu`` to
   False when ``--bf16`` was given without ``--tpu`` (whose meaning is unchanged). bf16 then trains
   in bfloat16 on the device fairseq would otherwise use, as ``fairseq-hydra-train`` already does
   with ``common.bf16: true``. ``scripts/fairseq_train.py`` does the same at parse time for runs that
   do not load the plugin first.
"""
import functools
import sys
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
    install_bf16_fix()


_CLI_MODULES = ("fairseq_cli.train", "fairseq_cli.eval_lm", "fairseq_cli.generate", "fairseq_cli.interactive",
                "fairseq_cli.validate")


def _bf16_means_bf16(convert):
    @functools.wraps(convert)
    def wrapped(args, *rest, **kwargs):
        if getattr(args, "bf16", False) and getattr(args, "tpu", False) and "--tpu" not in sys.argv[1:]:
            args.tpu = False
        return convert(args, *rest, **kwargs)

    wrapped._hgrn_bf16_fix = True
    return wrapped


def install_bf16_fix() -> None:
    """Fix 3 for every fairseq command-line module already imported (see the module docstring)."""
    modules = [sys.modules.get(name) for name in _CLI_MODULES]
    main = sys.modules.get("__main__")  # ``python -m fairseq_cli.train`` runs the module as __main__
    if getattr(getattr(main, "__spec__", None), "name", None) in _CLI_MODULES:
        modules.append(main)
    for module in modules:
        convert = getattr(module, "convert_namespace_to_omegaconf", None)
        if convert is not None and not getattr(convert, "_hgrn_bf16_fix", False):
            module.convert_namespace_to_omegaconf = _bf16_means_bf16(convert)
