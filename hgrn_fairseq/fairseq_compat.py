"""Make fairseq 0.12 (fairseq-fixed) work on the current stack: torch >= 2.6 and numpy >= 2.

The fixes are narrow and idempotent; ``install()`` runs when the plugin is imported.

1. torch 2.6 changed ``torch.load``'s default to ``weights_only=True``, which refuses the Python
   objects fairseq stores next to the weights (configs, optimizer history, meters). fairseq calls
   ``torch.load`` without the argument, so ``fairseq-train`` resume, ``fairseq-eval-lm`` and
   ``fairseq-generate`` fail. We give fairseq's checkpoint module a ``torch`` whose ``load``
   defaults to ``weights_only=False``, the behaviour fairseq was written for, and the same to
   ``fairseq.distributed.utils``: on several GPUs only rank 0 reads the checkpoint and sends it to
   the others as a pickle (``broadcast_object``), which they unpickled with the new default and
   refused (every multi-GPU resume failed with "Unsupported global: omegaconf.dictconfig.DictConfig").
   Nothing outside those two modules is affected. As with any
   fairseq checkpoint, load only files you trust: a checkpoint is a pickle.
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
4. fairseq adds a model's, task's and criterion's options to the parser only after a first parse, and
   that first parse handles ``--help``: ``fairseq-train --arch hgrn_lm --help`` printed no model option.
   We wrap ``fairseq.options.parse_args_and_arch`` (looked up at call time by every fairseq command,
   after ``--user-dir`` imported this plugin): with ``-h``/``--help`` it builds the whole parser first,
   then prints the help with each option's default as the chosen arch sets it, and exits.
5. Checkpoints of ``hgrn_lm`` written before its boolean options were renamed (no option may default to
   True: see ``models/hgrn_lm.py``) are translated when fairseq loads them, so they build the same model.
6. Per-parameter optimiser groups (the LRU paper's slow parameters): a parameter that carries an
   ``optim_group`` dict (``modules/lru.py``) gets a group of its own with those settings when fairseq builds
   the optimizer, and ``FairseqOptimizer.set_lr`` gives each group ``lr * group["lr_scale"]`` (1 when
   absent; fairseq sets one rate for all). fairseq's ``--fp16`` / ``--bf16`` optimizers train flattened
   copies of the parameters, which lose the marks: the trainer refuses that combination instead of
   dropping the groups in silence.
7. Checkpoints survive a kill, one run per save directory, a missing ``--restore-file`` is an error:
   ``checkpoint_safety.py``.
"""
import argparse
import functools
import logging
import sys
import types

import numpy as np
import torch

from .modules.lru import OPTIM_GROUP_ATTR  # the optimiser-group mark (6), defined where it is set

logger = logging.getLogger(__name__)


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
    from fairseq.distributed import utils as distributed_utils

    for module in (checkpoint_utils, distributed_utils):
        if not isinstance(module.torch, _TorchForFairseqCheckpoints):
            module.torch = _TorchForFairseqCheckpoints()
    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=int)
    install_bf16_fix()
    install_help_fix()
    install_legacy_config_upgrade()
    install_optimizer_groups()
    from . import checkpoint_safety

    checkpoint_safety.install()


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


# -- 4. --help lists every option of the chosen arch, task and criterion -----------------------------
_HELP_FLAGS = ("-h", "--help")


def _help_after_full_parse(parse_args_and_arch):
    @functools.wraps(parse_args_and_arch)
    def wrapped(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        argv = list(sys.argv[1:] if input_args is None else input_args)
        if not any(a in _HELP_FLAGS for a in argv):
            return parse_args_and_arch(parser, input_args, parse_known, suppress_defaults, modify_parser)
        stripped = [a for a in argv if a not in _HELP_FLAGS]
        # Required arguments (e.g. the task's data directory, added during the parse) must not stop a
        # parse that only builds the help: every parse of this parser runs with them relaxed.
        relaxed = []
        parse_known_args = parser.parse_known_args

        def parse_relaxed(*a, **k):
            for action in parser._actions:
                if action.required:
                    relaxed.append(action)
                    action.required = False
            return parse_known_args(*a, **k)

        parser.parse_known_args = parse_relaxed
        try:
            args, _ = parse_args_and_arch(parser, stripped, True, False, modify_parser)
        finally:
            del parser.parse_known_args
            for action in relaxed:
                action.required = True
        show_defaults(parser, args)
        parser.print_help()
        sys.exit(0)

    wrapped._hgrn_help_fix = True
    return wrapped


def show_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Append ``(default: X)`` to each option's help, X as ``args`` holds it after the arch function
    ran (so ``--arch hgrn2_lm_base --help`` shows ``--token-mixer``'s default as hgru2)."""
    for action in parser._actions:
        if action.help in (None, argparse.SUPPRESS) or not action.option_strings or action.dest == "help":
            continue
        if "(default:" in action.help:
            continue
        value = getattr(args, action.dest, action.default)
        if value is argparse.SUPPRESS:
            continue
        action.help = f"{action.help} (default: {value})".replace("%", "%%")


def install_help_fix() -> None:
    from fairseq import options

    if not getattr(options.parse_args_and_arch, "_hgrn_help_fix", False):
        options.parse_args_and_arch = _help_after_full_parse(options.parse_args_and_arch)


# -- 5. old hgrn_lm checkpoints ------------------------------------------------------------------------
def _is_hgrn_lm(model_cfg) -> bool:
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    from .models.hgrn_lm import HgrnLanguageModel

    for key in ("_name", "arch"):
        name = model_cfg.get(key) if hasattr(model_cfg, "get") else getattr(model_cfg, key, None)
        if name is not None and (ARCH_MODEL_REGISTRY.get(name) or MODEL_REGISTRY.get(name)) is HgrnLanguageModel:
            return True
    return False


def upgrade_legacy_model_config(state: dict) -> dict:
    """Translate the model config of an ``hgrn_lm`` checkpoint from before the boolean renames."""
    from omegaconf import DictConfig, open_dict

    from .models.hgrn_lm import upgrade_legacy_config

    cfg = state.get("cfg")
    model = cfg.get("model") if cfg is not None else None
    if model is None or not _is_hgrn_lm(model):
        return state
    if isinstance(model, DictConfig):
        with open_dict(model):
            upgraded = upgrade_legacy_config(model)
    else:  # an argparse Namespace (checkpoints of argparse-era configs)
        upgraded = upgrade_legacy_config(vars(model))
    if upgraded:
        new = ("no_lower_bound", "gate_before_norm", "no_glu_bias", "untie_embeddings")
        get = model.get if isinstance(model, DictConfig) else vars(model).get
        logger.info("hgrn_lm checkpoint from before the boolean option renames, read as: %s",
                    ", ".join(f"{name}={get(name)}" for name in new))
    return state


def _upgrade_then_translate(upgrade):
    @functools.wraps(upgrade)
    def wrapped(state):
        return upgrade_legacy_model_config(upgrade(state))

    wrapped._hgrn_legacy_upgrade = True
    return wrapped


def install_legacy_config_upgrade() -> None:
    from fairseq import checkpoint_utils

    if not getattr(checkpoint_utils._upgrade_state_dict, "_hgrn_legacy_upgrade", False):
        checkpoint_utils._upgrade_state_dict = _upgrade_then_translate(checkpoint_utils._upgrade_state_dict)


# -- 6. per-parameter optimiser groups -------------------------------------------------------------------


def group_parameters(params):
    """``params`` as torch parameter groups when any carries an ``optim_group`` mark (the unmarked ones
    first, so ``get_lr`` reads the base rate), else unchanged."""
    params = list(params)
    if not params or isinstance(params[0], dict) or not any(getattr(p, OPTIM_GROUP_ATTR, None) for p in params):
        return params
    groups = {}
    for p in params:
        key = tuple(sorted((getattr(p, OPTIM_GROUP_ATTR, None) or {}).items()))
        groups.setdefault(key, []).append(p)
    return [dict(key, params=ps) for key, ps in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))]


def _grouped_build(build):
    @functools.wraps(build)
    def wrapped(cfg, params, *args, **kwargs):
        return build(cfg, group_parameters(params), *args, **kwargs)

    wrapped._hgrn_groups = True
    return wrapped


def _scaled_set_lr(self, lr):
    for group in self.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


_scaled_set_lr._hgrn_groups = True


def _refuse_flattened(build_optimizer):
    @functools.wraps(build_optimizer)
    def wrapped(self):
        common = self.cfg.common
        flattened = (common.fp16 or common.bf16) and not (
            common.memory_efficient_fp16 or common.memory_efficient_bf16 or common.amp)
        if flattened and any(getattr(p, OPTIM_GROUP_ATTR, None) for p in self.model.parameters()):
            raise ValueError(
                "the model asks for optimiser groups of its own (--lru-slow-lr-scale), which fairseq's --fp16/--bf16 "
                "optimizer cannot keep (it trains flattened copies): train in fp32, with --amp, or with "
                "--memory-efficient-bf16, or drop --lru-slow-lr-scale"
            )
        return build_optimizer(self)

    wrapped._hgrn_groups = True
    return wrapped


def install_optimizer_groups() -> None:
    from fairseq import optim, trainer
    from fairseq.optim.fairseq_optimizer import FairseqOptimizer

    # (fairseq.optim.build_optimizer flattens dict groups, then calls the registry's _build_optimizer)
    if not getattr(optim._build_optimizer, "_hgrn_groups", False):
        optim._build_optimizer = _grouped_build(optim._build_optimizer)
    if not getattr(FairseqOptimizer.set_lr, "_hgrn_groups", False):
        FairseqOptimizer.set_lr = _scaled_set_lr
    if not getattr(trainer.Trainer._build_optimizer, "_hgrn_groups", False):
        trainer.Trainer._build_optimizer = _refuse_flattened(trainer.Trainer._build_optimizer)
