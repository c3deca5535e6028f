"""The fixes that make fairseq 0.12 (fairseq-fixed) work for this package on the current stack (torch >= 2.6,
numpy >= 2), each a named function, narrow and idempotent. ``install()`` applies them all when the fairseq side
is registered (``hgrn_fairseq.register()``, run by ``--user-dir hgrn_fairseq``); nothing else applies them.

1. ``load_checkpoints_safely``: fairseq reads checkpoints, and the state rank 0 broadcasts on several GPUs, with
   a bare ``torch.load``: on torch < 2.6 that unpickles anything (a checkpoint could run code), on torch >= 2.6 it
   refuses fairseq's own omegaconf/argparse state (every multi-GPU resume failed). They read through
   ``checkpoint_io.load_checkpoint``: ``weights_only=True`` with the types fairseq's state holds allowed.
2. ``restore_numpy_compat_long``: numpy 2 removed ``numpy.compat``, which fairseq's ``TokenBlockDataset`` still
   reads (``np.compat.long``, in the LM datasets of ``fairseq-interactive`` / ``-generate``).
3. ``install_bf16_fix``: fairseq's argparse entry points turn ``--bf16`` into ``--tpu``
   (``options.parse_args_and_arch``), so ``fairseq-train --bf16`` asks torch_xla for a TPU and fails. The
   ``convert_namespace_to_omegaconf`` the command modules call after parsing resets ``tpu`` to False when
   ``--bf16`` came without ``--tpu``. ``scripts/fairseq_train.py`` does the same for runs without the plugin.
4. ``install_help_fix``: fairseq adds a model's, task's and criterion's options only after a first parse, which
   handles ``--help``: ``fairseq-train --arch hgrn_lm --help`` printed no model option. With ``-h``/``--help``
   ``options.parse_args_and_arch`` builds the whole parser first and shows each default as the arch sets it.
5. ``install_legacy_config_upgrade``: fairseq loads ``hgrn_lm`` checkpoints from before the boolean renames (no
   option may default to True: ``models/hgrn_lm.py``) with the new meanings; they are translated on load.
6. ``install_optimizer_groups``: fairseq gives all parameters one optimizer group and one learning rate; a
   parameter with an ``optim_group`` mark (``modules/lru.py``) gets its own group and ``lr * lr_scale``, and the
   ``--fp16`` / ``--bf16`` optimizers (which train flattened copies and would drop the marks) refuse it.
7. ``install_checkpoint_safety``: fairseq-train copies checkpoints in place (a kill leaves a truncated
   ``checkpoint_last.pt``), shares a save directory between runs and ignores a missing ``--restore-file``:
   ``checkpoint_safety.py``.
8. ``install_one_line_checkpoint_errors``: fairseq's commands print a traceback for a refused or damaged
   checkpoint or unusable data; their ``main`` prints the one-line ``DataError`` message and exits with
   status 1.
9. ``install_split_checks``: fairseq reads a damaged or empty binarised split (any task) with a numpy or
   mmap traceback; ``load_indexed_dataset`` checks the ``.idx`` / ``.bin`` pair first.
"""
import argparse
import functools
import logging
import os
import sys

import numpy as np

from .modules.lru import OPTIM_GROUP_ATTR  # the optimiser-group mark (6), defined where it is set

logger = logging.getLogger(__name__)


def install() -> None:
    """Apply every fix of this module (idempotent)."""
    load_checkpoints_safely()
    restore_numpy_compat_long()
    install_bf16_fix()
    install_help_fix()
    install_legacy_config_upgrade()
    install_optimizer_groups()
    install_checkpoint_safety()
    install_one_line_checkpoint_errors()
    install_split_checks()


# -- 1. checkpoints and broadcast state read with weights_only=True ---------------------------------------
def load_checkpoints_safely() -> None:
    """Fix 1: fairseq's checkpoint and broadcast reads go through ``checkpoint_io.load_checkpoint``."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    from .checkpoint_io import TorchWithSafeLoad

    for module in (checkpoint_utils, distributed_utils):
        if not isinstance(module.torch, TorchWithSafeLoad):
            module.torch = TorchWithSafeLoad()


# -- 2. numpy.compat.long ---------------------------------------------------------------------------------
def restore_numpy_compat_long() -> None:
    """Fix 2: ``np.compat.long`` (``int``, its numpy 1.x value) for fairseq's ``TokenBlockDataset`` on numpy 2."""
    import types

    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=int)


# -- 3. --bf16 trains in bfloat16, not on a TPU -------------------------------------------------------------
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


def _cli_modules():
    """The fairseq command modules already imported (``python -m fairseq_cli.train`` runs one as __main__)."""
    modules = [sys.modules[name] for name in _CLI_MODULES if name in sys.modules]
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) in _CLI_MODULES:
        modules.append(main)
    return modules


def install_bf16_fix() -> None:
    """Fix 3: ``--bf16`` without ``--tpu`` stays off the TPU, in every fairseq command module already imported."""
    for module in _cli_modules():
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
        except RuntimeError:  # no or an unknown --arch: fairseq's own help (its options, no arch's)
            args = None
        finally:
            del parser.parse_known_args
            for action in relaxed:
                action.required = True
        if args is None:
            return parse_args_and_arch(parser, input_args, parse_known, suppress_defaults, modify_parser)
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
    """Fix 4: ``--help`` lists the options of the chosen arch, task and criterion with the arch's defaults."""
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
    """Fix 5: ``hgrn_lm`` checkpoints from before the boolean option renames load as the model they trained."""
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
    """Fix 6: parameters marked with ``optim_group`` get their own optimizer group and scaled learning rate."""
    from fairseq import optim, trainer
    from fairseq.optim.fairseq_optimizer import FairseqOptimizer

    # (fairseq.optim.build_optimizer flattens dict groups, then calls the registry's _build_optimizer)
    if not getattr(optim._build_optimizer, "_hgrn_groups", False):
        optim._build_optimizer = _grouped_build(optim._build_optimizer)
    if not getattr(FairseqOptimizer.set_lr, "_hgrn_groups", False):
        FairseqOptimizer.set_lr = _scaled_set_lr
    if not getattr(trainer.Trainer._build_optimizer, "_hgrn_groups", False):
        trainer.Trainer._build_optimizer = _refuse_flattened(trainer.Trainer._build_optimizer)


# -- 7. checkpoints that survive a kill, one run per save directory ---------------------------------------
def install_checkpoint_safety() -> None:
    """Fix 7: atomic checkpoint copies, resume from the newest intact one, a save-directory lock, a missing
    ``--restore-file`` is an error (``checkpoint_safety.py``)."""
    from . import checkpoint_safety

    checkpoint_safety.install()


# -- 8. one line for a refused or damaged checkpoint, or data that cannot be used ------------------------------
def _one_line_for_checkpoint_errors(main):
    from .data_checks import DataError  # CheckpointError is one

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(1)

    wrapped._hgrn_one_line = True
    return wrapped


def install_one_line_checkpoint_errors() -> None:
    """Fix 8: a ``DataError`` (a refused or damaged checkpoint, a dictionary the model was not trained with, a
    damaged split, options the data cannot satisfy) in a fairseq command is one line on stderr
    and exit status 1, not a traceback: the ``main`` of every fairseq command module already imported (its
    ``cli_main`` looks it up when it runs it, after ``--user-dir`` imported the plugin) reports it so."""
    for module in _cli_modules():
        main = getattr(module, "main", None)
        if main is not None and not getattr(main, "_hgrn_one_line", False):
            module.main = _one_line_for_checkpoint_errors(main)


# -- 9. a damaged or empty binarised split, whatever the task ---------------------------------------------
def _checked_load_indexed_dataset(load):
    from .data_checks import MMAP_MAGIC, check_split_files

    def mmap_pair(path, impl):
        """Whether ``path`` names an mmap-format pair (or what is left of one); other formats pass through."""
        if impl not in (None, "mmap") or not (os.path.isfile(path + ".idx") or os.path.isfile(path + ".bin")):
            return False
        if not os.path.isfile(path + ".idx"):
            return True
        with open(path + ".idx", "rb") as f:
            head = f.read(len(MMAP_MAGIC))
        return MMAP_MAGIC.startswith(head)

    @functools.wraps(load)
    def wrapped(path, dictionary=None, dataset_impl=None, *args, **kwargs):
        if mmap_pair(path, dataset_impl):
            check_split_files(path)
        return load(path, dictionary, dataset_impl, *args, **kwargs)

    wrapped._hgrn_split_check = True
    return wrapped


def install_split_checks() -> None:
    """Fix 9: fairseq reads a truncated, mismatched or empty ``.idx`` / ``.bin`` pair with a numpy or mmap
    traceback (``cannot mmap an empty file``), in any task; its ``load_indexed_dataset`` now checks the
    pair first (index only, no token read) and raises the one-line ``DataError``."""
    from fairseq.data import data_utils

    if not getattr(data_utils.load_indexed_dataset, "_hgrn_split_check", False):
        data_utils.load_indexed_dataset = _checked_load_indexed_dataset(data_utils.load_indexed_dataset)
