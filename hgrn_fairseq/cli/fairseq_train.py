"""``fairseq-train`` with ``--bf16`` meaning bfloat16 on the GPU (or CPU) it runs on.

fairseq 0.12's command line turns ``--bf16`` into ``--tpu`` (``fairseq/options.py``,
``parse_args_and_arch``: "if args.bf16: args.tpu = True"). On a GPU machine the trainer then asks
torch_xla for a TPU device and fails; with several GPUs it tries to spawn TPU processes. The hydra
entry point (``fairseq-hydra-train``) does not have this coupling: there ``common.bf16: true`` with
``common.tpu: false`` trains in bfloat16 on CUDA, and that is what this launcher reproduces for the
argparse entry point.

What it changes: after fairseq has parsed the command line, ``tpu`` is reset to False unless
``--tpu`` itself was given, and an LRA run that would resume its checkpoint with other run settings
stops with one line (``check_lra_resume``). Nothing else: the arguments, the training loop and the
checkpoints are fairseq's. ``scripts/train_wt103.sh``, ``scripts/train_lra.sh`` and ``scripts/mqar_sweep.py``
run their recipes through this file, on one process (``python3 scripts/fairseq_train.py ...``) or one per
GPU (``torchrun ... scripts/fairseq_train.py``).

With ``--bf16`` fairseq keeps the model in bfloat16 and an fp32 master copy of the weights in its
FP16Optimizer (no loss scaling for bf16).
"""
import sys


def _bf16_without_tpu(parse_args_and_arch):
    def parse(parser, input_args=None, *args, **kwargs):
        parsed = parse_args_and_arch(parser, input_args, *args, **kwargs)
        argv = sys.argv[1:] if input_args is None else input_args
        asked_for_tpu = any(a == "--tpu" for a in argv)
        if isinstance(parsed, tuple):  # parse_known_args=True returns (args, extra)
            namespace = parsed[0]
        else:
            namespace = parsed
        if getattr(namespace, "bf16", False) and not asked_for_tpu:
            namespace.tpu = False
        check_lra_resume(namespace)
        return parsed

    parse.__wrapped__ = parse_args_and_arch
    parse._hgrn_bf16_without_tpu = True
    return parse


def check_lra_resume(args) -> None:
    """An LRA run (``hgrn_lra`` archs) that resumes ``--save-dir``'s checkpoint_last.pt must keep the settings
    it trained with: fairseq would load the weights of a run trained with, say, masked padding into one that
    goes on with ``--unmasked-padding`` and mix the two settings silently (an other norm fails to load, with
    a traceback), or go on with another learning-rate schedule from the resumed update (``schedule_changes``).
    One line naming the changed options and the fix instead. Not checked: ``--restore-file`` other than the
    default, ``--finetune-from-model``, ``--reset-optimizer`` / ``--reset-dataloader`` / ``--reset-meters``
    (those start something new); ``--reset-lr-scheduler`` lets the schedule change on purpose and checks the
    rest."""
    import os

    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    if ARCH_MODEL_NAME_REGISTRY.get(getattr(args, "arch", None)) != "hgrn_lra":
        return
    if (getattr(args, "restore_file", "checkpoint_last.pt") != "checkpoint_last.pt"
            or getattr(args, "finetune_from_model", None) or getattr(args, "reset_optimizer", False)
            or getattr(args, "reset_dataloader", False) or getattr(args, "reset_meters", False)):
        return
    path = os.path.join(args.save_dir, "checkpoint_last.pt")
    if not os.path.isfile(path):
        return
    from fairseq import checkpoint_utils

    from hgrn_fairseq.models.hgrn_lra import resume_changes

    from hgrn_fairseq.checkpoint_io import CheckpointError, UnsafeCheckpointError

    try:
        cfg = checkpoint_utils.load_checkpoint_to_cpu(path).get("cfg")
    except UnsafeCheckpointError as e:
        sys.exit(f"fairseq_train.py: error: {e}")
    except CheckpointError:  # damaged: fairseq-train resumes from the newest intact one (checkpoint_safety)
        return
    if cfg is None:
        return
    changes = resume_changes(cfg, args)
    schedule = [] if getattr(args, "reset_lr_scheduler", False) else schedule_changes(cfg, args)
    if changes or schedule:
        sys.exit(f"fairseq_train.py: {path} trained with other settings than this command: "
                 f"{', '.join(changes + schedule)}: rerun with the checkpoint's settings to resume it"
                 + (" (a schedule changed on purpose: add --reset-lr-scheduler)" if schedule and not changes else "")
                 + ", or give another --save-dir (SAVE_DIR) to start a run with these")


def _effective_schedule(cfg) -> dict:
    """The learning-rate schedule a run's config (``optimization`` / ``lr_scheduler`` / ``optimizer`` sections)
    follows, as fairseq's schedulers compute it: the peak, the warm-up, and for ``cosine`` the period
    (``--lr-period-updates``, or when that is not positive ``--max-update`` less the warm-up), the floor, the
    warm-up's start, ``t_mult`` and ``lr_shrink``; the optimizer and its weight decay."""
    sched, opt = cfg["lr_scheduler"] or {}, cfg["optimizer"] or {}
    lr, max_update = cfg["optimization"]["lr"], cfg["optimization"]["max_update"]
    out = {"--lr-scheduler": sched.get("_name"), "--lr": float(lr if isinstance(lr, (int, float)) else lr[0]),
           "--warmup-updates": int(sched.get("warmup_updates", 0) or 0),
           "--optimizer": opt.get("_name"), "--weight-decay": float(opt.get("weight_decay", 0.0) or 0.0)}
    if out["--lr-scheduler"] == "cosine":
        period = float(sched.get("lr_period_updates", -1) or -1)
        out["cosine period"] = period if period > 0 else float(max_update) - out["--warmup-updates"]
        floor = float(sched.get("min_lr", 0.0) or 0.0)
        init = sched.get("warmup_init_lr", -1)
        init = -1.0 if init is None else float(init)
        out["--min-lr"] = floor
        out["--warmup-init-lr"] = init if init >= 0 else floor  # fairseq's default: the floor
        out["--t-mult"] = float(sched.get("t_mult", 1.0))
        out["--lr-shrink"] = float(sched.get("lr_shrink", 0.1))
    return out


def schedule_changes(saved_cfg, args) -> list:
    """What resuming with ``args`` would change in the learning-rate schedule a checkpoint trained on
    (``["--warmup-updates 3750 (now 5000)", "cosine period 33750.0 (now 45000.0)"]``), empty when nothing.
    A longer ``--max-update`` with the period given (``--lr-period-updates``) changes nothing but where the run
    stops; with the period taken from ``--max-update`` it changes the cosine of every later update, which fairseq
    would apply silently from the resumed update on."""
    from hgrn_fairseq.models.hgrn_lra import same_option

    flat = vars(args)  # the command line's options, in the sections a saved config has
    now = {"optimization": flat, "lr_scheduler": dict(flat, _name=args.lr_scheduler),
           "optimizer": dict(flat, _name=args.optimizer)}
    was, now = _effective_schedule(saved_cfg), _effective_schedule(now)
    return [f"{k} {was[k]} (now {now.get(k)})" for k in was if not same_option(was[k], now.get(k))]


MATMUL_PRECISIONS = {"fp32": "highest", "tf32": "high"}


def set_matmul_precision() -> None:
    """``HGRN_MATMUL_PRECISION=tf32`` (what ``scripts/train_wt103.sh`` sets for ``PRECISION=tf32``): fp32
    matrix products on CUDA take TensorFloat-32 (``torch.set_float32_matmul_precision("high")``)."""
    import os

    name = os.environ.get("HGRN_MATMUL_PRECISION", "fp32")
    if name not in MATMUL_PRECISIONS:
        sys.exit(f"fairseq_train.py: HGRN_MATMUL_PRECISION={name!r} is not one of {sorted(MATMUL_PRECISIONS)}")
    import torch

    torch.set_float32_matmul_precision(MATMUL_PRECISIONS[name])
    torch.backends.cudnn.allow_tf32 = name == "tf32"
    if name != "fp32":
        print(f"fairseq_train.py: fp32 matrix products in {name} (HGRN_MATMUL_PRECISION)", file=sys.stderr)


def main() -> None:
    set_matmul_precision()
    # fairseq_cli.train first: it sets up fairseq's logging (its format, on stdout) before any fairseq
    # module is imported; imported after `fairseq.options`, a module of fairseq's that configures the
    # root logger on import wins and the log lines lose the "| valid | {...}" form parsers expect
    from fairseq_cli import train
    from fairseq import options

    # (its own marker: the plugin's --help fix wraps this function too, with functools.wraps)
    if not getattr(options.parse_args_and_arch, "_hgrn_bf16_without_tpu", False):
        options.parse_args_and_arch = _bf16_without_tpu(options.parse_args_and_arch)
    _log_file_once()
    train.cli_main()
    exit_now()


def _log_file_once() -> None:
    """``--log-file`` writes each line once.

    fairseq 0.12's ``progress_bar()`` adds a new ``FileHandler`` for ``--log-file`` to its module's
    logger every time it makes a progress bar, i.e. once per epoch: from the second epoch on every
    progress and validation line of the file is repeated, n times in epoch n of the process. Wrapped here: the handler is added only when that logger has
    none for the same file yet."""
    import logging
    import os

    from fairseq.logging import progress_bar as module

    if getattr(module.progress_bar, "_hgrn_log_once", False):
        return
    make = module.progress_bar
    logger = logging.getLogger(module.__name__)

    def progress_bar(*args, log_file=None, **kwargs):
        if log_file is not None:
            path = os.path.abspath(log_file)
            if any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in logger.handlers):
                log_file = None
        return make(*args, log_file=log_file, **kwargs)

    progress_bar.__wrapped__ = make
    progress_bar._hgrn_log_once = True
    module.progress_bar = progress_bar


def exit_now() -> None:
    """End the process as soon as fairseq's training has returned.

    On some GPU machines fairseq-train prints "done training" and then stays alive for minutes before
    exiting, a hang others report for fairseq too (microsoft/unilm#1250). Everything a run
    leaves is on disk by then (fairseq writes checkpoints synchronously); this closes what the exit
    handlers would (fairseq's tensorboard writers, the log handlers, stdout/stderr) and exits without
    waiting on whatever the interpreter's shutdown waits for."""
    import logging
    import os

    try:
        from fairseq.logging import progress_bar

        progress_bar._close_writers()
    except (ImportError, AttributeError):
        pass
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
