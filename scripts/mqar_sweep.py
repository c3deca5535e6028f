#!/usr/bin/env python3
"""MQAR sweep (HGRN2 paper Fig. 3): HGRN1 vs HGRN2 over model width and learning rate.

For every (seq_len, kv pairs) setting, model (``hgrn1_mqar`` / ``hgrn2_mqar``), width d and learning
rate, runs ``fairseq-train --user-dir hgrn_fairseq --task mqar`` (AdamW -- fairseq's ``adam`` decays
weights decoupled -- weight decay 0.1, cosine schedule with linear warm-up, no dropout), reads the
validation accuracy on the held-out set from its JSON log, keeps the best learning rate per
(setting, model, d) and writes into ``--out``:

* ``runs.csv``: every run (final and best validation accuracy, updates done and planned, training
  speed, wall time, GPU, status), the selected learning rates marked;
* ``table.md``: per setting, the best accuracy per d for each model, whether HGRN2 beats HGRN1 (by more
  than ``WIN_MARGIN`` points, else a tie) and the accuracy a model without recall gets;
* ``plot.png``: accuracy vs d, one line per model, one panel per setting;
* ``runs/<name>.json`` and ``logs/<name>.log``: per-run results (with every validation as
  ``valid_curve``: ``[updates, accuracy]`` pairs) and fairseq logs.

A learning rate is selected by the *final* validation accuracy (the end of the cosine schedule;
ties by the best one), so nothing is picked by peeking at the held-out set mid-run. A cell whose
runs were all cut by ``--run-timeout`` shows the best accuracy any of them reached, marked ``*``,
and stays out of the HGRN2-vs-HGRN1 verdict; ``--validate-interval-updates`` makes sure such runs
have validations on record.

The budget is ``--epochs`` or ``--max-update``, one value for every setting or one per setting
(``--settings 256:16,512:64 --max-update 6000,4000``). On GPUs the runs are spread over
``--gpus`` devices: each run gets the GPU with the fewest runs on it when it starts.

HGRN2 runs once per ``--hgrn2-expand`` ratio that d allows (<= d); a cell is the best run over the
learning rates and expand ratios. The task is Zoology's layout unless ``--reveal-answers`` (answers
shown after the queries, a layout that allows a 21%-at-16-pairs shortcut: docs/mqar.md).

Every run checkpoints (``--checkpoint-every``) into ``checkpoints/<name>/``. ``--slice-s`` stops the
runs still going after that many seconds, with a checkpoint, as ``paused``; a rerun with the same
``--out`` continues the paused runs from their checkpoints (bit-identical to an uncut run), then
starts the others. ``scripts/mqar_state.py`` packs a sweep into files that travel between machines;
``bench/gpu_mqar.sh`` runs one slice per GPU call.

The reports are rewritten after every finished run, so a sweep cut short still leaves a table of
what finished; a rerun with the same ``--out`` skips runs whose result exists (``--force`` redoes).

Example (a few minutes on CPU, for trying the pipeline)::

    python scripts/mqar_sweep.py --out /tmp/mqar --settings 32:4 --vocab-size 64 --dims 32,64 \\
        --lrs 3e-3 --train-size 2000 --test-size 300 --epochs 2 --models hgrn1

``--plan`` prints the grid's size and budget without training. ``scripts/run_mqar.sh`` wraps this
(environment variables, and a ``--yes`` before it trains); ``bench/gpu_mqar.sh`` runs one slice of it per
GPU call.
"""
import argparse
import csv
import glob
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, "hgrn_fairseq")
FAIRSEQ_TRAIN = os.path.join(REPO, "scripts", "fairseq_train.py")
ARCHS = {"hgrn1": "hgrn1_mqar", "hgrn2": "hgrn2_mqar"}
LABELS = {"hgrn1": "HGRN1", "hgrn2": "HGRN2"}
VALID_LINE = re.compile(r"\|\s*valid\s*\|\s*(\{.*\})\s*$")
TRAIN_INNER_LINE = re.compile(r"\|\s*train_inner\s*\|\s*(\{.*\})\s*$")
TRAIN_LINE = re.compile(r"\|\s*train\s*\|\s*(\{.*\})\s*$")  # the end-of-epoch summary
SEGMENT_MARK = "# segment"  # a run log's line before each fairseq-train process of the run


@dataclass
class Setting:
    seq_len: int
    num_kv_pairs: int

    @property
    def name(self) -> str:
        return f"seq{self.seq_len}_kv{self.num_kv_pairs}"

    @property
    def title(self) -> str:
        return f"seq {self.seq_len}, {self.num_kv_pairs} kv pairs"


@dataclass
class Run:
    setting: Setting
    model: str
    d: int
    lr: float
    max_update: int = 0  # the whole schedule: cosine length, warm-up share, --max-update
    expand: int = 0  # hgrn2: --expand-ratio (0: the arch's default, min(d, 128))
    batch_size: int = 0  # 0: --batch-size of the sweep
    seed: int = 1  # fairseq --seed (the model's initialisation and the batch order)

    @property
    def name(self) -> str:
        return run_name(self.setting.seq_len, self.setting.num_kv_pairs, self.model, self.d, self.lr, self.expand,
                        self.seed)


def run_name(seq_len: int, kv: int, model: str, d: int, lr: float, expand: int = 0, seed: int = 1) -> str:
    """Seed 1 has no suffix, so the records of sweeps from before --seeds keep their names."""
    variant = f"{model}_e{expand}" if expand else model
    return f"seq{seq_len}_kv{kv}_{variant}_d{d}_lr{lr:g}" + (f"_s{seed}" if seed != 1 else "")


def other_names(run: "Run") -> List[str]:
    """Names the same run may have been recorded under. HGRN2's arch default expand ratio, min(d, 128),
    is unnamed where no listed ratio fits d (``hgrn2_expands`` gives 0) and named where one does (e.g.
    d 64 with ratios 128, against 64,128): both are the same model, trained the same way."""
    if run.model != "hgrn2" or run.expand not in (0, min(run.d, 128)):
        return []
    other = min(run.d, 128) if run.expand == 0 else 0
    return [run_name(run.setting.seq_len, run.setting.num_kv_pairs, run.model, run.d, run.lr, other, run.seed)]


def adopt_record(args, old: str, run: "Run") -> str:
    """Rename the record, logs and checkpoints of ``old`` (a name from ``other_names``) to ``run.name``,
    so that a sweep continues or reports it under the name its grid gives; return a one-line account."""
    with open(os.path.join(args.out, "runs", old + ".json")) as f:
        record = RunResult.from_json(json.load(f))
    record.name, record.expand = run.name, run.expand
    write_record(args.out, record)
    os.remove(os.path.join(args.out, "runs", old + ".json"))
    for path in glob.glob(os.path.join(args.out, "logs", old + ".log*")):
        os.replace(path, os.path.join(args.out, "logs", run.name + path[len(os.path.join(args.out, "logs", old)):]))
    if os.path.isdir(checkpoint_dir(args, old)):
        os.replace(checkpoint_dir(args, old), checkpoint_dir(args, run.name))
    return f"record {old} renamed {run.name} (the same model: HGRN2's default expand ratio at d {run.d})"


def variant_label(model: str, expand: int) -> str:
    return LABELS[model] + (f" e{expand}" if expand else "")


@dataclass
class RunResult:
    name: str
    seq_len: int
    num_kv_pairs: int
    model: str
    d: int
    lr: float
    status: str  # ok | failed | timeout (--run-timeout) | skipped (--time-budget) | paused (--slice-s: resumable)
    final_acc: Optional[float] = None  # last validation of a run that finished its schedule
    best_acc: Optional[float] = None  # best validation seen, finished or not
    final_loss: Optional[float] = None
    epochs: int = 0  # epochs completed (end-of-epoch validations)
    updates: int = 0  # updates done
    wall_s: float = 0.0
    valid_acc_per_epoch: List[float] = field(default_factory=list)  # end-of-epoch validations only
    error: str = ""
    max_update: int = 0  # updates planned (0: not recorded, runs from before it was)
    updates_per_s: Optional[float] = None  # the last train_inner ``ups``, else updates / wall_s
    gpu: str = ""  # CUDA_VISIBLE_DEVICES of the run ("" on CPU)
    valid_curve: List[List[float]] = field(default_factory=list)  # every validation: [updates, accuracy]
    expand: int = 0  # hgrn2 --expand-ratio (0: the arch's default, min(d, 128))
    batch_size: int = 0  # 0: not recorded (runs from before per-setting batch sizes)
    segments: int = 0  # fairseq-train processes the run took (1 + resumptions from its checkpoint)
    restarts: int = 0  # times it started over because its checkpoint was missing
    reveal_answers: bool = False  # the leaking layout (answers shown after the queries)
    seed: int = 1  # fairseq --seed of the run (records from before --seeds: 1, the only seed then)

    @classmethod
    def from_json(cls, data: Dict) -> "RunResult":
        """A run JSON of this or an older sweep (missing fields take their defaults)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def write_record(out: str, result: RunResult) -> None:
    """``out/runs/NAME.json``, replaced whole (a kill while writing leaves the previous record)."""
    path = os.path.join(out, "runs", result.name + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(asdict(result), f, indent=1)
    os.replace(path + ".tmp", path)


def parse_list(text: str, cast):
    return [cast(x) for x in str(text).replace(" ", "").split(",") if x]


# run_mqar.sh's variable for each option, so that a refusal names what the user set there as well
ENV_NAMES = {"--settings": "SETTINGS", "--models": "MODELS", "--dims": "DIMS", "--lrs": "LRS", "--seeds": "SEEDS",
             "--hgrn2-expand": "EXPAND", "--vocab-size": "VOCAB_SIZE", "--train-size": "TRAIN_SIZE",
             "--test-size": "TEST_SIZE", "--epochs": "EPOCHS", "--max-update": "MAX_UPDATE",
             "--batch-size": "BATCH_SIZE", "--jobs": "JOBS", "--validate-interval-updates": "VALIDATE_EVERY",
             "--checkpoint-every": "CKPT_EVERY", "--slice-s": "SLICE_S", "--gpus": "GPUS",
             "--time-budget": "TIME_BUDGET"}


def refuse(option: str, value, problem: str, expected: str) -> SystemExit:
    """The one-line refusal of a bad option value: the option (and run_mqar.sh's variable), the value,
    what is wrong and what is expected."""
    where = f" ({ENV_NAMES[option]} in run_mqar.sh)" if option in ENV_NAMES else ""
    return SystemExit(f"mqar_sweep.py: {option} {str(value)!r}{where}: {problem}; expected {expected}")


def int_list(text: str, option: str, minimum: int, expected: str, allow_empty: bool = False) -> List[int]:
    """Comma-separated integers >= ``minimum`` (``SystemExit`` naming the option otherwise)."""
    values = []
    for item in parse_list(text, str):
        if not re.fullmatch(r"[+-]?\d+", item):
            raise refuse(option, text, f"{item!r} is not an integer", expected)
        if int(item) < minimum:
            raise refuse(option, text, f"{item} is below {minimum}", expected)
        values.append(int(item))
    if not values and not allow_empty:
        raise refuse(option, text, "no value", expected)
    return values


def parse_settings(text: str) -> List[Setting]:
    """``SEQ_LEN:KV_PAIRS`` list; the task's own rule (hgrn_fairseq/tasks/mqar.py, check_mqar_options):
    at least one pair, and room for the pairs and their queries (SEQ_LEN >= 4 * KV_PAIRS)."""
    expected = "SEQ_LEN:KV_PAIRS items with KV_PAIRS >= 1 and SEQ_LEN >= 4 * KV_PAIRS, e.g. 256:16,512:64"
    settings = []
    for item in parse_list(text, str):
        m = re.fullmatch(r"(\d+):(\d+)", item)
        if not m:
            raise refuse("--settings", text, f"{item!r} is not SEQ_LEN:KV_PAIRS", expected)
        seq_len, kv = int(m.group(1)), int(m.group(2))
        if kv < 1:
            raise refuse("--settings", text, f"{item!r} has {kv} kv pairs", expected)
        if seq_len < 4 * kv:
            raise refuse("--settings", text, f"{item!r}: {kv} pairs and their queries need {4 * kv} tokens",
                         expected)
        settings.append(Setting(seq_len, kv))
    if not settings:
        raise refuse("--settings", text, "no setting", expected)
    return settings


def check_options(args, settings: List[Setting]) -> None:
    """Refuse (one line, ``SystemExit``) the values no run could train with, before any work."""
    kv = max(s.num_kv_pairs for s in settings)
    if args.vocab_size < 2 * kv + 1:
        worst = next(s for s in settings if s.num_kv_pairs == kv)
        raise refuse("--vocab-size", args.vocab_size,
                     f"{kv} distinct keys and values ({worst.seq_len}:{kv}) need {2 * kv + 1} tokens (blank, "
                     f"keys, values)", f"an integer >= {2 * kv + 1}")
    for option, value in (("--train-size", args.train_size), ("--test-size", args.test_size),
                          ("--jobs", args.jobs), ("--log-interval", args.log_interval)):
        if value < 1:
            raise refuse(option, value, "below 1", "an integer >= 1")
    for option, value in (("--validate-interval-updates", args.validate_interval_updates),
                          ("--checkpoint-every", args.checkpoint_every), ("--slice-updates", args.slice_updates)):
        if value < 0:
            raise refuse(option, value, "negative", "an integer >= 0 (0: off)")
    if args.gpus is not None and args.gpus < 1:
        raise refuse("--gpus", args.gpus, "below 1", "an integer >= 1 (unset: every visible GPU)")
    if not 0 <= args.warmup_frac < 1:
        raise refuse("--warmup-frac", args.warmup_frac, "out of range", "a share of the updates in [0, 1)")
    for option, value in (("--weight-decay", args.weight_decay), ("--clip-norm", args.clip_norm)):
        if not value >= 0:
            raise refuse(option, value, "negative", "a number >= 0")
    for option, value in (("--run-timeout", args.run_timeout), ("--time-budget", args.time_budget),
                          ("--slice-s", args.slice_s)):
        if value is not None and not value > 0:
            raise refuse(option, value, "not positive", "seconds > 0")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block), naming run_mqar.sh's variable where one is set."""

    def error(self, message):
        m = re.match(r"argument (--[\w-]+)", message)
        where = f" ({ENV_NAMES[m.group(1)]} in run_mqar.sh)" if m and m.group(1) in ENV_NAMES else ""
        self.exit(2, f"mqar_sweep.py: {message}{where}; `python scripts/mqar_sweep.py --help` lists the options\n")


def per_setting(text, option: str, settings: List[Setting]) -> List[int]:
    """``"6"`` -> ``[6] * len(settings)``; ``"6,3"`` -> one positive integer per setting, in order."""
    values = []
    for item in parse_list(text, str):
        if not item.isdigit() or int(item) < 1:
            where = f" ({ENV_NAMES[option]} in run_mqar.sh)" if option in ENV_NAMES else ""
            raise SystemExit(f"mqar_sweep.py: {option}: {item!r} in {text!r} is not a positive integer{where}; "
                             "expected one integer >= 1, or one per setting")
        values.append(int(item))
    if not values:
        raise refuse(option, text, "no value", "one integer >= 1, or one per setting")
    if len(values) == 1:
        return values * len(settings)
    if len(values) != len(settings):
        names = ",".join(f"{s.seq_len}:{s.num_kv_pairs}" for s in settings)
        raise SystemExit(f"mqar_sweep.py: {option}: {len(values)} values ({text}) for {len(settings)} settings ({names}): "
                         f"give one value for every setting or one per setting, in the order of --settings")
    return values


def batch_sizes(args, settings: List[Setting]) -> Dict[str, int]:
    """Setting name -> batch size: ``--batch-size`` is one value or one per setting."""
    return {s.name: b for s, b in zip(settings, per_setting(args.batch_size, "--batch-size", settings))}


def updates_per_epoch(args, batch_size: Optional[int] = None) -> int:
    return math.ceil(args.train_size / (batch_size or int(args.batch_size)))


def planned_updates(args, settings: List[Setting]) -> Dict[str, int]:
    """Setting name -> updates per run: ``--max-update`` where given, else ``--epochs`` x updates/epoch."""
    if getattr(args, "max_update", None):
        totals = per_setting(args.max_update, "--max-update", settings)
    else:
        batches = batch_sizes(args, settings)
        totals = [e * updates_per_epoch(args, batches[s.name])
                  for s, e in zip(settings, per_setting(args.epochs, "--epochs", settings))]
    return {s.name: t for s, t in zip(settings, totals)}


def warmup_updates(total: int, args) -> int:
    return max(1, int(round(args.warmup_frac * total)))


def parse_fairseq_log(text: str) -> Dict:
    """From a fairseq JSON log: every validation as ``curve`` (``[updates, accuracy]``) and ``accs``,
    the end-of-epoch ones as ``epoch_accs`` (a validation followed by the epoch's ``train`` summary,
    not by more training), the last validation loss, the last update and the last ``ups``.

    The log of a resumed run holds several fairseq processes one after the other. One killed after
    its last checkpoint logged updates that the next one, resumed from that checkpoint, does again:
    a validation at or before updates already on the curve replaces what followed them."""
    curve, epoch_accs, loss, updates, ups = [], [], None, 0, None
    pending = None  # the last validation, until we know whether the epoch ended there
    for line in text.splitlines():
        m = VALID_LINE.search(line)
        if m:
            stats = json.loads(m.group(1))
            if "valid_accuracy" in stats:
                updates = int(float(stats.get("valid_num_updates", updates)))
                while curve and curve[-1][0] >= updates:  # a resumed process redoing lost updates
                    curve.pop()
                while epoch_accs and epoch_accs[-1][0] >= updates:
                    epoch_accs.pop()
                pending = [updates, float(stats["valid_accuracy"])]
                curve.append(pending)
                loss = float(stats["valid_loss"])
            continue
        m = TRAIN_INNER_LINE.search(line)
        if m:
            stats = json.loads(m.group(1))
            updates = int(float(stats.get("num_updates", updates)))
            if "ups" in stats:
                ups = float(stats["ups"])
            pending = None
            continue
        if TRAIN_LINE.search(line) and pending is not None:
            epoch_accs.append(pending)
            pending = None
    return {"curve": curve, "accs": [acc for _, acc in curve], "epoch_accs": [acc for _, acc in epoch_accs],
            "loss": loss, "updates": updates, "ups": ups}


def checkpoint_dir(args, name: str) -> str:
    return os.path.join(args.out, "checkpoints", name)


def checkpoint_progress(save_dir: str) -> Optional[Dict]:
    """``{"updates", "train_s"}`` of ``save_dir/checkpoint_last.pt`` (its updates and fairseq's cumulative
    training time, which ``--stop-time-hours`` is compared with), or None where there is none."""
    path = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isfile(path):
        return None
    from hgrn_fairseq.checkpoint_io import load_checkpoint

    state = load_checkpoint(path, mmap=True)
    extra = state.get("extra_state") or {}
    updates = int((state.get("optimizer_history") or [{}])[-1].get("num_updates", 0))
    return {"updates": updates, "train_s": float(extra.get("previous_training_time", 0.0))}


def fairseq_command(run: Run, args, use_cpu: bool, stop_at_update: int = 0,
                    stop_time_hours: float = 0.0) -> List[str]:
    """The run's fairseq-train command. Its schedule always spans ``run.max_update`` (``--lr-period-updates``
    pins the cosine), so ``stop_at_update`` (a lower ``--max-update``) and ``stop_time_hours`` only end
    this process early, with a checkpoint to resume from, and change nothing else."""
    total = run.max_update
    batch = run.batch_size or int(args.batch_size)
    warmup = warmup_updates(total, args)
    cmd = [
        # scripts/fairseq_train.py: fairseq-train that exits as soon as training returns (a process that
        # lingers after "done training" holds a sweep slot for nothing)
        sys.executable, FAIRSEQ_TRAIN,
        "--user-dir", PLUGIN, "--task", "mqar",
        "--vocab-size", args.vocab_size, "--seq-len", run.setting.seq_len,
        "--num-kv-pairs", run.setting.num_kv_pairs,
        "--train-size", args.train_size, "--test-size", args.test_size, "--data-seed", args.data_seed,
        "--arch", ARCHS[run.model], "--decoder-embed-dim", run.d,
        "--criterion", "mqar_cross_entropy",
        "--optimizer", "torch_adamw", "--weight-decay", args.weight_decay, "--clip-norm", args.clip_norm,
        "--lr", run.lr, "--lr-scheduler", "cosine", "--warmup-updates", warmup,
        "--lr-period-updates", max(1, total - warmup),
        "--max-update", stop_at_update or total, "--max-epoch", math.ceil(total / updates_per_epoch(args, batch)),
        "--batch-size", batch,
        "--save-dir", checkpoint_dir(args, run.name),  # per run (without checkpoints: only probed)
        "--num-workers", 0, "--log-format", "json",
        "--log-interval", args.log_interval, "--seed", run.seed,
    ]
    every = getattr(args, "checkpoint_every", 0)
    if every > 0:  # checkpoint_last.pt (and the newest interval one) only
        cmd += ["--save-interval-updates", every, "--keep-interval-updates", 1, "--no-epoch-checkpoints"]
    else:
        cmd.append("--no-save")
    if stop_time_hours > 0:
        cmd += ["--stop-time-hours", f"{stop_time_hours:.6f}"]
    if run.expand:
        cmd += ["--expand-ratio", run.expand]
    if getattr(args, "reveal_answers", False):
        cmd.append("--reveal-answers")
    if args.validate_interval_updates > 0:
        cmd += ["--validate-interval-updates", args.validate_interval_updates]
    if use_cpu:
        cmd.append("--cpu")
    cmd += shlex.split(args.fairseq_args)
    return [str(c) for c in cmd]


class GpuPool:
    """Hands each run the GPU with the fewest runs on it at the moment it starts (ties: the first
    listed) and takes it back when the run ends. Thread-safe: the sweep's worker threads share one."""

    def __init__(self, devices: List[str]):
        if not devices:
            raise ValueError("GpuPool: devices is empty; expected at least one CUDA_VISIBLE_DEVICES id")
        self.devices = list(devices)
        self.running = [0] * len(self.devices)
        self._lock = threading.Lock()

    def acquire(self) -> str:
        with self._lock:
            i = min(range(len(self.devices)), key=lambda j: self.running[j])
            self.running[i] += 1
            return self.devices[i]

    def release(self, device: str) -> None:
        with self._lock:
            i = next((j for j, d in enumerate(self.devices) if d == device and self.running[j] > 0), None)
            if i is None:
                raise ValueError(f"GpuPool.release: {device!r} has no running run (devices {self.devices})")
            self.running[i] -= 1


def visible_gpus(requested: Optional[int], available: int, environ=os.environ) -> List[str]:
    """The CUDA_VISIBLE_DEVICES ids a child may be given: the first ``requested`` (default all) of
    the ``available`` GPUs, through the inherited CUDA_VISIBLE_DEVICES list when there is one."""
    listed = [x.strip() for x in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    ids = listed[:available] if listed else [str(i) for i in range(available)]
    n = len(ids) if requested is None else requested
    if not 1 <= n <= len(ids):
        raise SystemExit(f"--gpus {requested}: expected 1 to {len(ids)} (the GPUs visible: {','.join(ids) or 'none'})")
    return ids[:n]


def set_child_threads(env: Dict[str, str], use_cpu: bool, jobs: int, cpus: int) -> None:
    """CPU runs: one thread each unless OMP_NUM_THREADS is set. GPU runs with several jobs: the cores
    split evenly, max(1, cpus // jobs) threads each, overriding an inherited value (16 runs with an
    inherited 4 threads each on 16 cores only contended)."""
    if use_cpu:
        env.setdefault("OMP_NUM_THREADS", "1")
    elif jobs > 1:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, cpus // jobs))


def run_one(run: Run, args, use_cpu: bool, deadline: Optional[float] = None,
            gpus: Optional[GpuPool] = None, previous: Optional[RunResult] = None,
            slice_end: Optional[float] = None) -> RunResult:
    """Train one run (or continue it from its checkpoint) and read its log.

    ``deadline``: no start after it (``--time-budget``). ``slice_end`` (``--slice-s``): fairseq stops at
    that time by ``--stop-time-hours`` with a checkpoint, and the run is ``paused``, to be continued by
    the next sweep with the same ``--out``; a process still alive ``--slice-grace-s`` later is killed
    (it loses the updates since its last checkpoint). ``previous``: the paused result being continued."""
    skipped = RunResult(run.name, run.setting.seq_len, run.setting.num_kv_pairs, run.model, run.d, run.lr,
                        status="skipped", max_update=run.max_update, expand=run.expand,
                        batch_size=run.batch_size or int(args.batch_size),
                        reveal_answers=bool(getattr(args, "reveal_answers", False)))
    now = time.time()
    if deadline is not None and now > deadline:
        skipped.error = "--time-budget spent before it started"
        return skipped
    if slice_end is not None and slice_end - now < args.min_slice_s:
        skipped.error = f"--slice-s: less than --min-slice-s {args.min_slice_s:g} s left when its turn came"
        return previous if previous is not None else skipped
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    log_path = os.path.join(logs, run.name + ".log")
    save_dir = checkpoint_dir(args, run.name)
    checkpointing = getattr(args, "checkpoint_every", 0) > 0
    progress = checkpoint_progress(save_dir) if checkpointing else None
    segments = previous.segments if previous is not None else 0
    restarts = previous.restarts if previous is not None else 0
    wall_before = previous.wall_s if previous is not None else 0.0
    notes = []
    if previous is not None and progress is None:  # paused, but its checkpoint did not come back
        restarts += 1
        segments = 0
        wall_before = 0.0
        notes.append(f"restarted from scratch: no checkpoint in {save_dir} (done before: {previous.updates} updates)")
        if os.path.exists(log_path):
            os.replace(log_path, log_path + f".lost{restarts}")
    elif previous is None and progress is not None:  # a checkpoint with no record: a sweep killed mid-run
        notes.append(f"continued from a checkpoint at update {progress['updates']} that had no result on record")
    done = progress["updates"] if progress else 0
    stop_at = min(run.max_update, done + args.slice_updates) if getattr(args, "slice_updates", 0) else 0
    stop_hours = 0.0
    if slice_end is not None and checkpointing:
        # fairseq's clock starts after its start-up (imports, data, model), which --slice-startup-s guesses
        left = max(0.01, slice_end - now - args.slice_startup_s)
        stop_hours = ((progress["train_s"] if progress else 0.0) + left) / 3600
    env = dict(os.environ)
    set_child_threads(env, use_cpu, args.jobs, os.cpu_count() or 1)
    if not use_cpu and args.tf32:
        env.setdefault("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
        env.setdefault("HGRN_MATMUL_PRECISION", "tf32")  # what scripts/fairseq_train.py sets for its matmuls
    gpu = gpus.acquire() if gpus is not None else ""
    if gpu:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    cmd = fairseq_command(run, args, use_cpu, stop_at_update=stop_at, stop_time_hours=stop_hours)
    timeout = args.run_timeout
    if slice_end is not None:
        left = slice_end - now + args.slice_grace_s
        timeout = left if timeout is None else min(timeout, left)
    start = time.time()
    killed = False
    try:
        with open(log_path, "a") as log:
            log.write(f"{SEGMENT_MARK} {segments + 1}: CUDA_VISIBLE_DEVICES={gpu or '-'} "
                      f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', '-')} from update {done}\n")
            for note in notes:
                log.write(f"# {note}\n")
            log.write("# " + " ".join(shlex.quote(c) for c in cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed = True
    finally:
        if gpu:
            gpus.release(gpu)
    wall = time.time() - start
    text = open(log_path, errors="replace").read()
    parsed = parse_fairseq_log(text)
    finished = parsed["updates"] >= run.max_update
    if killed:
        status = "paused" if checkpointing and slice_end is not None and checkpoint_progress(save_dir) else "timeout"
    elif proc.returncode != 0:
        status = "failed"
    elif finished:
        status = "ok"
    elif checkpointing:
        status = "paused"  # stopped by --stop-time-hours or --slice-updates, with a checkpoint
    else:
        status = "failed"
        notes.append(f"fairseq-train ended at update {parsed['updates']} of {run.max_update} without a checkpoint")
    if status == "ok" and checkpointing and not args.keep_checkpoints:
        shutil.rmtree(save_dir, ignore_errors=True)
    if not checkpointing:
        try:  # fairseq probes the (per-run, so parallel runs cannot race) save dir even with --no-save
            os.removedirs(save_dir)
        except OSError:
            pass
    error = ""
    if status in ("failed", "timeout"):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        error = " / ".join(notes + lines[-3:])[-500:]
    elif notes:
        error = " / ".join(notes)[-500:]
    accs = parsed["accs"]
    ups = parsed["ups"] if parsed["ups"] is not None else (parsed["updates"] / wall if wall > 0 else None)
    return RunResult(
        name=run.name, seq_len=run.setting.seq_len, num_kv_pairs=run.setting.num_kv_pairs,
        model=run.model, d=run.d, lr=run.lr, status=status,
        final_acc=accs[-1] if accs and status == "ok" else None,
        best_acc=max(accs) if accs else None,
        final_loss=parsed["loss"], epochs=len(parsed["epoch_accs"]), updates=parsed["updates"],
        wall_s=round(wall_before + wall, 1), valid_acc_per_epoch=parsed["epoch_accs"], error=error,
        max_update=run.max_update, updates_per_s=None if ups is None else round(ups, 2), gpu=gpu,
        valid_curve=parsed["curve"], expand=run.expand, batch_size=run.batch_size or int(args.batch_size),
        segments=segments + 1, restarts=restarts, reveal_answers=bool(getattr(args, "reveal_answers", False)),
        seed=run.seed,
    )


# ------------------------------------------------------------------------------------------------
# Reports


def select_best(results: List[RunResult]) -> Dict:
    """(seq_len, kv, model, d) -> the run with the best final accuracy (ties: best accuracy, then the
    smaller learning rate, then the smaller seed) over the learning rates, the seeds and, for HGRN2, the
    expand ratios."""
    best = {}
    for r in results:
        if r.final_acc is None:
            continue
        key = (r.seq_len, r.num_kv_pairs, r.model, r.d)
        score = (r.final_acc, r.best_acc or 0.0, -r.lr, -r.seed)
        if key not in best or score > best[key][0]:
            best[key] = (score, r)
    return {k: v[1] for k, v in best.items()}


def select_cut(results: List[RunResult], best: Dict) -> Dict:
    """(seq_len, kv, model, d) -> for cells with no finished run but runs cut by --run-timeout or paused
    by --slice-s, the unfinished run with the best accuracy seen (ties: the most updates)."""
    cut = {}
    for r in results:
        key = (r.seq_len, r.num_kv_pairs, r.model, r.d)
        if r.status not in UNFINISHED or key in best:
            continue
        score = (r.best_acc if r.best_acc is not None else -1.0, r.updates)
        if key not in cut or score > cut[key][0]:
            cut[key] = (score, r)
    return {k: v[1] for k, v in cut.items()}


UNFINISHED = ("timeout", "paused")
CSV_COLUMNS = ["seq_len", "num_kv_pairs", "model", "d", "lr", "final_acc", "best_acc", "final_loss", "epochs",
               "updates", "max_update", "updates_per_s", "wall_s", "status", "gpu", "expand", "batch_size",
               "segments", "restarts", "seed", "selected"]


def write_csv(path: str, results: List[RunResult], best: Dict) -> None:
    chosen = {r.name for r in best.values()}
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in sorted(results, key=lambda r: (r.seq_len, r.num_kv_pairs, r.model, r.d, r.lr, r.seed)):
            row = asdict(r)
            row["selected"] = int(r.name in chosen)
            writer.writerow(["" if row[c] is None else row[c] for c in CSV_COLUMNS])


def fmt_pct(x: float) -> str:
    """Accuracy in percent: one decimal, two significant digits below 1% (chance can be 0.024%)."""
    return f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def _hp(r: RunResult) -> str:
    return f"lr {r.lr:g}" + (f", e {r.expand}" if r.expand else "") + (f", seed {r.seed}" if r.seed != 1 else "")


def fmt_acc(r: Optional[RunResult]) -> str:
    return "-" if r is None else f"{fmt_pct(r.final_acc)} ({_hp(r)})"


def fmt_cut(r: RunResult) -> str:
    done = f"{r.updates}/{r.max_update}" if r.max_update else f"{r.updates}"
    acc = "-" if r.best_acc is None else fmt_pct(r.best_acc)
    verb = "paused" if r.status == "paused" else "cut"
    return f"{acc}* ({_hp(r)}, {verb} at {done} upd)"


CUT_FOOTNOTE = ("\\* no run of this cell finished its schedule (cut by the run timeout, or paused by --slice-s "
                "to be continued): the best validation accuracy any of them reached so far (so picked by "
                "looking at the held-out set, unlike finished cells), with its hyper-parameters and the updates "
                "it had done of those planned. Such cells are not counted in the verdict.")


# A cell counts as a win (or a loss) only by more than this many percentage points of held-out accuracy;
# closer is a tie. Runs on the same no-recall level differ by tenths of a point (e.g. 6.1 against 6.4
# at the 6.25% level of 16 pairs), which is not one model recalling better than the other.
WIN_MARGIN = 1.0


def compare(hgrn2: float, hgrn1: float) -> str:
    if hgrn2 > hgrn1 + WIN_MARGIN:
        return "yes"
    if hgrn1 > hgrn2 + WIN_MARGIN:
        return "no"
    return f"tie (within {WIN_MARGIN:g})"


def shortcut_level(num_kv_pairs: int, args) -> str:
    """The accuracy of a model that knows which values the example holds but not their keys."""
    n = num_kv_pairs
    if getattr(args, "reveal_answers", False):  # guesses among the values not yet shown: H_N / N
        level = 100.0 * sum(1.0 / k for k in range(1, n + 1)) / n
        return f"Without recall (the example's values known, not their keys, shown ones excluded): {fmt_pct(level)}%."
    return f"Without recall (the example's values known, not their keys): 1/{n} = {100.0 / n:.3g}%."


def write_table(path: str, results: List[RunResult], best: Dict, cut: Dict, settings, models, dims, args) -> None:
    totals = planned_updates(args, settings)
    batches = batch_sizes(args, settings)
    every = getattr(args, "validate_interval_updates", 0)
    layout = ("answers shown after the queries (--reveal-answers, a leaking layout)"
              if getattr(args, "reveal_answers", False) else "Zoology's layout (answers never in the input)")
    lines = [
        "# MQAR: validation accuracy (%) on query positions, best run per cell (learning rate; HGRN2: and expand ratio)",
        "",
        f"vocab {args.vocab_size}, {args.train_size} train / {args.test_size} held-out examples, "
        f"{layout}, batch {args.batch_size}, learning rates {args.lrs}"
        + (f", HGRN2 expand ratios {args.hgrn2_expand} (where <= d)" if getattr(args, "hgrn2_expand", "") else "")
        + f", AdamW wd "
        f"{args.weight_decay}, gradient clip {getattr(args, 'clip_norm', '-')}, cosine with "
        f"{args.warmup_frac:g} warm-up; 2 layers, no MLP, no positions. "
        + (f"Seeds {args.seeds} (best per cell over them). " if str(getattr(args, "seeds", "1")) != "1" else "")
        + f"Chance: {100.0 / (args.vocab_size - 1 - (args.vocab_size - 1) // 2):.3g}%. Validation at the end of "
        "every epoch" + (f" and every {every} updates" if every else "") + ".",
        "",
    ]
    for s in settings:
        total = totals[s.name]
        upe = updates_per_epoch(args, batches[s.name])
        lines += [f"## {s.title}", "",
                  f"{total} updates of batch {batches[s.name]} per run ({total / upe:.3g} epoch(s) of {upe}), "
                  f"{warmup_updates(total, args)} of them warm-up. {shortcut_level(s.num_kv_pairs, args)}", ""]
        header = "| d | " + " | ".join(LABELS[m] for m in models)
        sep = "|---|" + "---|" * len(models)
        both = "hgrn1" in models and "hgrn2" in models
        if both:
            header += " | HGRN2 > HGRN1"
            sep += "---|"
        lines += [header + " |", sep]
        wins = ties = compared = cut_cells = 0
        for d in dims:
            keys = [(s.seq_len, s.num_kv_pairs, m, d) for m in models]
            cut_cells += sum(k in cut for k in keys)
            row = f"| {d} | " + " | ".join(fmt_cut(cut[k]) if k in cut else fmt_acc(best.get(k)) for k in keys)
            if both:
                a = best.get((s.seq_len, s.num_kv_pairs, "hgrn1", d))
                b = best.get((s.seq_len, s.num_kv_pairs, "hgrn2", d))
                if a is not None and b is not None:
                    compared += 1
                    outcome = compare(b.final_acc, a.final_acc)
                    wins += outcome == "yes"
                    ties += outcome.startswith("tie")
                    row += " | " + outcome
                else:
                    row += " | -"
            lines.append(row + " |")
        if both:
            verdict = (f"HGRN2 beats HGRN1 by more than {WIN_MARGIN:g} point at {wins} of {compared} widths measured, "
                       f"ties at {ties} (finished runs only")
            if compared < len(dims):
                verdict += f"; {len(dims) - compared} not measured"
            verdict += ")"
            if cut_cells:
                verdict += f"; {cut_cells} of {len(dims) * len(models)} cells unfinished (marked *)"
            lines += ["", verdict + "."]
        if cut_cells:
            lines += ["", CUT_FOOTNOTE]
        failed = [r for r in results if (r.seq_len, r.num_kv_pairs) == (s.seq_len, s.num_kv_pairs) and r.status != "ok"]
        if failed:
            lines += ["", "Runs without a final result: " + ", ".join(f"{r.name} ({r.status})" for r in failed)]
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(path: str, best: Dict, cut: Dict, settings, models, dims) -> None:
    """Finished cells as lines; cells whose runs were all cut as hollow markers (best accuracy seen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6), squeeze=False)
    for ax, s in zip(axes[0], settings):
        for i, m in enumerate(models):
            color = f"C{i}"
            points = [(d, best[(s.seq_len, s.num_kv_pairs, m, d)].final_acc) for d in dims
                      if (s.seq_len, s.num_kv_pairs, m, d) in best]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", color=color, label=LABELS[m])
            cut_points = [(d, cut[k].best_acc) for d in dims for k in [(s.seq_len, s.num_kv_pairs, m, d)]
                          if k in cut and cut[k].best_acc is not None]
            if cut_points:
                xs, ys = zip(*cut_points)
                ax.scatter(xs, ys, marker="o", facecolors="none", edgecolors=color, label=f"{LABELS[m]} (cut)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims)
        ax.set_xticklabels([str(d) for d in dims])
        ax.set_ylim(-2, 102)
        ax.set_xlabel("model dimension d")
        ax.set_title(s.title)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (%)")
    axes[0][0].legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(results, settings, models, dims, args) -> None:
    best = select_best(results)
    write_csv(os.path.join(args.out, "runs.csv"), results, best)
    cut = select_cut(results, best)
    write_table(os.path.join(args.out, "table.md"), results, best, cut, settings, models, dims, args)
    if not args.no_plot:
        try:
            write_plot(os.path.join(args.out, "plot.png"), best, cut, settings, models, dims)
        except ImportError as e:  # a sweep must not die on a missing plotting library
            args.no_plot = True
            print(f"warning: no plot.png ({e}); pip install matplotlib, then rerun with --report-only",
                  flush=True)


# ------------------------------------------------------------------------------------------------


PREFLIGHT = r"""
import argparse, sys, types, torch
import hgrn_fairseq; hgrn_fairseq.register()
from fairseq.models import ARCH_CONFIG_REGISTRY
from hgrn_fairseq.models.hgrn_lm import HgrnLanguageModel
from hgrn_fairseq.tasks.mqar import build_mqar_dictionary
device = sys.argv[1]
for arch in sys.argv[2:]:
    args = argparse.Namespace(decoder_embed_dim=64)
    ARCH_CONFIG_REGISTRY[arch](args)
    task = types.SimpleNamespace(target_dictionary=build_mqar_dictionary(64))
    model = HgrnLanguageModel.build_model(args, task).to(device)
    out, _ = model(torch.randint(4, 68, (2, 16), device=device))
    out.float().sum().backward()
    print(f"preflight: {arch} forward/backward ok on {device}")
"""


def hgrn2_expands(d: int, expands: List[int]) -> List[int]:
    """The expand ratios of ``expands`` that d allows (<= d); none (0: the arch default, min(d, 128))
    where ``expands`` is empty or d is below all of them."""
    fit = [e for e in expands if 0 < e <= d]
    return fit or [0]


def order_runs(settings, models, dims, lrs, totals: Dict[str, int], expands: List[int] = (),
               batches: Optional[Dict[str, int]] = None, seeds: List[int] = (1,)) -> List[Run]:
    """Per setting, the biggest d first so parallel jobs end together. Within one d the (model, expand,
    lr) triples are rotated by one per width, so that runs started together and dealt round the GPUs
    do not give one GPU every run of one model and learning rate (HGRN2 steps cost more than HGRN1's).
    HGRN2 runs once per expand ratio that d allows (``hgrn2_expands``). Each seed repeats the whole grid
    after the one before, so a sweep cut short has every cell of the first seeds."""
    runs = []
    for seed in seeds:
        for s in settings:
            for i, d in enumerate(sorted(dims, reverse=True)):
                triples = [(m, e, lr) for m in models
                           for e in (hgrn2_expands(d, list(expands)) if m == "hgrn2" else [0]) for lr in lrs]
                shift = i % len(triples)
                runs += [Run(s, m, d, lr, totals[s.name], expand=e, batch_size=(batches or {}).get(s.name, 0),
                             seed=seed)
                         for m, e, lr in triples[shift:] + triples[:shift]]
    return runs


def plan_text(runs: List[Run], settings: List[Setting], args) -> str:
    """What the sweep would train: the number of runs (per setting and model), updates per run and in
    all, and how many of the runs already have a result in ``--out`` (read only)."""
    batches = batch_sizes(args, settings)
    total_updates = sum(r.max_update for r in runs)
    seeds = parse_list(args.seeds, int)
    lines = [f"MQAR sweep plan: {len(runs)} runs, {total_updates:,} updates in all"
             + (f" ({len(seeds)} seeds)" if len(seeds) > 1 else "")]
    for s in settings:
        mine = [r for r in runs if r.setting == s]
        per_model = ", ".join(f"{LABELS[m]} {sum(r.model == m for r in mine)}"
                              for m in dict.fromkeys(r.model for r in mine))
        total = mine[0].max_update if mine else 0
        epochs = total / updates_per_epoch(args, batches[s.name])
        lines.append(f"  {s.title}: {len(mine)} runs ({per_model}), {total:,} updates each "
                     f"({epochs:.3g} epochs of {args.train_size:,} examples, batch {batches[s.name]})")
    lines.append(f"  grid: d {args.dims}; learning rates {args.lrs}; HGRN2 expand ratios "
                 f"{args.hgrn2_expand or 'min(d, 128)'} (each where <= d); seeds {args.seeds}")
    layout = "answers shown (--reveal-answers)" if args.reveal_answers else "Zoology's layout"
    lines.append(f"  task: vocab {args.vocab_size}, {args.test_size:,} held-out examples, {layout}; output {args.out}")
    done = [r for r in runs if os.path.exists(os.path.join(args.out, "runs", r.name + ".json"))]
    if done:
        lines.append(f"  {len(done)} of the {len(runs)} runs already have a record in {args.out}/runs "
                     "(finished ones are skipped, paused ones continued)")
    return "\n".join(lines)


def preflight(models, use_cpu: bool) -> None:
    """Build each arch and run one step on the target device, so a missing module or kernel fails
    the sweep in seconds instead of in every run."""
    device = "cpu" if use_cpu else "cuda"
    cmd = [sys.executable, "-c", PREFLIGHT, device] + [ARCHS[m] for m in models]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"preflight failed (models {models} on {device}):\n{proc.stderr[-3000:]}")
    print(proc.stdout.strip(), flush=True)


def failed_runs_line(results: Dict[str, RunResult], runs: List[Run], out: str) -> str:
    """"N of M runs failed: ..." for the runs of the grid whose record says failed ("" when none did)."""
    failed = [results[r.name] for r in runs if r.name in results and results[r.name].status == "failed"]
    if not failed:
        return ""
    shown = ", ".join(r.name for r in failed[:3]) + (f" and {len(failed) - 3} more" if len(failed) > 3 else "")
    last = failed[0].error.split(" / ")[-1][-160:] if failed[0].error else "no output"
    return (f"mqar_sweep.py: {len(failed)} of {len(runs)} runs failed: {shown} (the first ended with: {last}); "
            f"logs in {os.path.join(out, 'logs')}; delete their runs/NAME.json to rerun them (--force reruns all)")


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--settings", default="256:16,512:64", help="SEQ_LEN:KV_PAIRS list")
    p.add_argument("--models", default="hgrn1,hgrn2", help="subset of hgrn1,hgrn2")
    p.add_argument("--dims", default="64,128,256,512")
    p.add_argument("--lrs", default="1e-4,5e-4,1e-3,5e-3",
                   help="learning-rate grid (default: 4 of the HGRN2 paper's 1e-5 ... 1e-2)")
    p.add_argument("--hgrn2-expand", default="64,128",
                   help="HGRN2 expand ratios (head dimensions), each run where <= d (the paper: 64, 128); "
                        "empty: the arch default min(d, 128) only")
    p.add_argument("--reveal-answers", action="store_true",
                   help="each query's answer shown after it in the input (a leaking layout: see "
                        "docs/mqar.md); default Zoology's layout")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--train-size", type=int, default=100_000)
    p.add_argument("--test-size", type=int, default=3_000)
    p.add_argument("--epochs", default="32",
                   help="epochs per run: one value, or one per setting (e.g. 6,3 for --settings 256:16,512:64)")
    p.add_argument("--max-update", default="",
                   help="updates per run, one value or one per setting (e.g. 6000,4000); overrides --epochs "
                        "(default: epochs x updates per epoch). The cosine schedule and warm-up span it")
    p.add_argument("--validate-interval-updates", type=int, default=0,
                   help="also validate every N updates (default 0: at the end of each epoch only), so a run "
                        "cut by --run-timeout still has accuracies on record")
    p.add_argument("--batch-size", default="64",
                   help="batch size, one value or one per setting (the paper: 256,64 for 256:16,512:64)")
    p.add_argument("--warmup-frac", type=float, default=0.1, help="warm-up share of all updates")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--seeds", default="1",
                   help="model seeds (fairseq --seed: initialisation and batch order), e.g. 1,2,3: the grid runs "
                        "once per seed and each cell shows its best run over them. Runs of seed 1 have no suffix, "
                        "others end in _sN")
    p.add_argument("--data-seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at the same time (they share the GPUs). On GPU with --jobs > 1 each run gets "
                        "OMP_NUM_THREADS=MKL_NUM_THREADS=max(1, CPU cores // jobs), overriding an inherited "
                        "value; on CPU each run gets 1 thread unless OMP_NUM_THREADS is set")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs to spread the runs over (default: every visible one); each run gets "
                        "CUDA_VISIBLE_DEVICES set to the one with the fewest runs when it starts")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds before a run is killed")
    p.add_argument("--checkpoint-every", type=int, default=1000,
                   help="save the run's checkpoint_last.pt every N updates (and validate then), so that a run "
                        "stopped by --slice-s or killed continues from it when the same command is rerun; 0: no "
                        "checkpoints (fairseq --no-save). A finished run's checkpoints are deleted unless "
                        "--keep-checkpoints")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep finished runs' checkpoints")
    p.add_argument("--slice-s", type=float, default=None,
                   help="this invocation's share of GPU time: each run stops (fairseq --stop-time-hours, with a "
                        "checkpoint) this many seconds after the sweep started and is 'paused'; the next "
                        "invocation with the same --out continues the paused runs first, then starts new ones. "
                        "No run starts with less than --min-slice-s left")
    p.add_argument("--slice-grace-s", type=float, default=60.0,
                   help="a run still alive this long after --slice-s is killed (losing its updates since its "
                        "last checkpoint)")
    p.add_argument("--min-slice-s", type=float, default=30.0)
    p.add_argument("--slice-startup-s", type=float, default=20.0,
                   help="seconds a fairseq-train process takes to start training (its training clock, which "
                        "--stop-time-hours reads, starts then); taken off the time a run is given")
    p.add_argument("--slice-updates", type=int, default=0,
                   help="each run advances at most N updates in this invocation (then paused); for tests")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds after which no new run starts (those left are reported as skipped)")
    p.add_argument("--cpu", action="store_true", help="train on CPU even if CUDA is available")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="keep fp32 matmuls exact on GPU (default: TF32 via TORCH_ALLOW_TF32_CUBLAS_OVERRIDE)")
    p.add_argument("--fairseq-args", default="", help="extra fairseq-train arguments, e.g. '--bf16'")
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--force", action="store_true",
                   help="rerun runs whose result already exists (their logs and checkpoints are deleted first)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the one-step check of each model on the device before the runs")
    p.add_argument("--report-only", action="store_true", help="rewrite the reports from runs/*.json")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    p.add_argument("--plan", action="store_true",
                   help="print the grid's size and budget (runs, updates) and exit; trains nothing, writes nothing")
    args = p.parse_args(argv)

    settings = parse_settings(args.settings)
    models = parse_list(args.models, str)
    for m in models:
        if m not in ARCHS:
            raise refuse("--models", args.models, f"{m!r} is not a model", f"a subset of {','.join(ARCHS)}")
    if not models:
        raise refuse("--models", args.models, "no model", f"a subset of {','.join(ARCHS)}")
    check_options(args, settings)
    per_setting(args.epochs, "--epochs", settings)  # refused even where --max-update overrides it
    dims = int_list(args.dims, "--dims", 1, "model widths d >= 1, e.g. 64,128")
    lrs = []
    for item in parse_list(args.lrs, str):
        try:
            lr = float(item)
        except ValueError:
            raise refuse("--lrs", args.lrs, f"{item!r} is not a number", "learning rates > 0, e.g. 1e-3,5e-3") from None
        if not (lr > 0 and math.isfinite(lr)):
            raise refuse("--lrs", args.lrs, f"{item} is not a positive number", "learning rates > 0, e.g. 1e-3,5e-3")
        lrs.append(lr)
    if not lrs:
        raise refuse("--lrs", args.lrs, "no value", "learning rates > 0, e.g. 1e-3,5e-3")
    seeds = int_list(args.seeds, "--seeds", 0, "distinct integers >= 0, e.g. 1,2,3")
    if len(set(seeds)) != len(seeds):
        raise refuse("--seeds", args.seeds, "a seed given twice", "distinct integers >= 0, e.g. 1,2,3")
    if (args.slice_s is not None or args.slice_updates) and not args.checkpoint_every:
        raise SystemExit("--slice-s / --slice-updates pause runs to continue them from their checkpoints: "
                         "they need --checkpoint-every > 0")
    expands = int_list(args.hgrn2_expand, "--hgrn2-expand", 1, "HGRN2 expand ratios >= 1, e.g. 64,128 "
                       "(empty: the arch default)", allow_empty=True)
    totals = planned_updates(args, settings)
    runs = order_runs(settings, models, dims, lrs, totals, expands, batch_sizes(args, settings), seeds)
    if args.plan:
        print(plan_text(runs, settings, args))
        return 0
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    import torch  # noqa: E402 (only to see whether CUDA is there)

    use_cpu = args.cpu or not torch.cuda.is_available()
    if use_cpu:  # one thread per process (the preflight's and the runs'): more only contend on a shared CPU
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.dry_run:
        for run in runs:
            print(" ".join(shlex.quote(c) for c in fairseq_command(run, args, use_cpu)))
        return 0

    results: Dict[str, RunResult] = {}
    todo, paused = [], []  # paused runs go first: they hold checkpoints to continue
    for run in runs:
        path = os.path.join(args.out, "runs", run.name + ".json")
        if not os.path.exists(path) and not args.force:
            for old in other_names(run):
                if os.path.exists(os.path.join(args.out, "runs", old + ".json")):
                    if args.report_only:  # reports leave the folder as it is
                        path = os.path.join(args.out, "runs", old + ".json")
                    else:
                        print(adopt_record(args, old, run), flush=True)
                    break
        if os.path.exists(path) and not args.force:
            results[run.name] = RunResult.from_json(json.load(open(path)))
            results[run.name].name, results[run.name].expand = run.name, run.expand
            if results[run.name].status == "paused" and not args.report_only:
                paused.append(run)
        else:
            if args.force and not args.report_only and not args.dry_run:
                shutil.rmtree(checkpoint_dir(args, run.name), ignore_errors=True)
                log = os.path.join(args.out, "logs", run.name + ".log")
                if os.path.exists(log):
                    os.remove(log)
            todo.append(run)
    todo = paused + todo
    if args.report_only:
        write_reports(list(results.values()), settings, models, dims, args)
        print(f"reports from {len(results)} runs written to {args.out}")
        return 0

    gpus = None if use_cpu else GpuPool(visible_gpus(args.gpus, torch.cuda.device_count()))
    if use_cpu:
        device = "CPU"
    else:
        threads = {}
        set_child_threads(threads, use_cpu, args.jobs, os.cpu_count() or 1)
        device = (f"{len(gpus.devices)} x {torch.cuda.get_device_name(0)} (CUDA_VISIBLE_DEVICES "
                  f"{','.join(gpus.devices)}; OMP_NUM_THREADS {threads.get('OMP_NUM_THREADS', 'inherited')})")
    budget = ", ".join(f"{s.seq_len}:{s.num_kv_pairs} {totals[s.name]}" for s in settings)
    print(f"MQAR sweep: {len(runs)} runs ({len(runs) - len(todo)} already done, {len(paused)} paused to "
          f"continue), {args.jobs} at a time on {device}; updates per run: {budget}; output in {args.out}"
          + (f"; this slice: {args.slice_s:g} s" if args.slice_s is not None else ""), flush=True)
    if todo and not args.no_preflight:
        preflight(sorted({r.model for r in todo}), use_cpu)
    start, lock, finished = time.time(), threading.Lock(), [0]

    def done(result: RunResult):
        with lock:
            finished[0] += 1
            results[result.name] = result
            if result.status != "skipped":  # a rerun with the same --out does the skipped ones (and paused)
                write_record(args.out, result)
            write_reports(list(results.values()), settings, models, dims, args)
            elapsed = time.time() - start
            eta = elapsed / finished[0] * (len(todo) - finished[0])
            acc = "-" if result.final_acc is None else f"{result.final_acc:.1f}%"
            if result.final_acc is None and result.best_acc is not None:
                acc += f" (best seen {result.best_acc:.3g}%)"
            extra = ""
            if result.status != "ok":
                extra = f" [{result.status}" + (f": {result.error[-200:]}" if result.error else "") + "]"
            speed = "" if result.updates_per_s is None else f", {result.updates_per_s:g} upd/s"
            where = f" on GPU {result.gpu}" if result.gpu else ""
            print(f"[{finished[0]}/{len(todo)}] {result.name}: acc {acc} after {result.updates}/{result.max_update} "
                  f"updates, {result.wall_s:.0f}s{speed}{where} (elapsed {elapsed:.0f}s, eta {eta:.0f}s){extra}",
                  flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        deadline = None if args.time_budget is None else start + args.time_budget
        slice_end = None if args.slice_s is None else start + args.slice_s
        futures = [pool.submit(run_one, run, args, use_cpu, deadline, gpus, results.get(run.name), slice_end)
                   for run in todo]
        for future in as_completed(futures):
            done(future.result())
    write_reports(list(results.values()), settings, models, dims, args)
    counts = {}
    for run in runs:
        status = results[run.name].status if run.name in results else "not started"
        counts[status] = counts.get(status, 0) + 1
    print(f"done in {time.time() - start:.0f}s: {args.out}/runs.csv, table.md" + ("" if args.no_plot else ", plot.png"))
    print("runs: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
          + ("; rerun the same command to continue the paused and start the rest"
             if counts.get("paused") or counts.get("not started") or counts.get("skipped") else ""), flush=True)
    print(open(os.path.join(args.out, "table.md")).read())
    failed = failed_runs_line(results, runs, args.out)
    if failed:
        print(failed, file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
