"""Length extrapolation: test perplexity of a fairseq language model at evaluation lengths L.

What is measured: the test split, as one token stream, is cut into non-overlapping blocks
of L tokens (context window 0; the last block may be shorter) and each block is scored on its own,
one block per batch. The perplexity at L is exp(total NLL / number of scored tokens). Run at the
training length and above it, this shows whether a model still works on sequences longer than any
it was trained on: the HGRN papers (Table 14) report HGRN flat and the Transformer blowing up.

Two modes:

* ``stateless`` (the paper's protocol): every block starts from an empty state. Uses fairseq's own
  ``eval_lm`` data path (``task.load_dataset`` + ``task.eval_lm_dataloader``), so anything fairseq
  does to the blocks, including silently dropping blocks longer than the model's
  ``max_positions()``, happens here too, and is caught by the token count check below.
* ``stateful`` (recurrent models only; NOT the paper's protocol): the blocks are fed in order and
  the model's recurrent state is carried from one block to the next (truncated-BPTT style), so
  every token sees the whole test text before it and L only sets the chunk size. It needs a
  decoder whose ``forward`` takes ``continue_stream`` (``hgrn_lm``).

Token count check: the number of tokens scored at every L must equal the number of tokens in the
binarised split (read from the ``.idx`` file, independently of the data path above); otherwise the
run stops with ``TokenCountMismatch``. For the Transformer the checkpoint's
``max_target_positions``/``tokens_per_sample`` are lifted to max(L) through fairseq's model
overrides (``--no-lift-max-positions`` turns that off, which makes fairseq skip long blocks and the
check fire).

A length L longer than the split is refused (the block would be the whole split, so the row would
not be at L), with the split's token count in the message. A damaged checkpoint (empty, truncated, not a
torch file) or one of another kind (no fairseq training state) is refused naming the file.

Outputs (``--out-dir``, default ``<checkpoint dir>/extrapolation``): ``extrapolation.csv``,
``extrapolation.md`` (a markdown table with the average over L, as in the paper),
``extrapolation.json`` and ``extrapolation.png`` (when matplotlib is installed). The CSV and
markdown are rewritten after every L, so a long run that fails late keeps its earlier rows.

    python -m hgrn_fairseq.evaluation.extrapolation checkpoints/hgrn/checkpoint_best.pt \\
        data-bin/wikitext-103 --lengths 512:14336:256
"""
from __future__ import annotations

import argparse
import csv
import datetime
import inspect
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..checkpoint_io import TRUST_FLAG, TRUST_HELP, trusted_checkpoints
from ..data_checks import DataError

DEFAULT_LENGTHS: Tuple[int, ...] = tuple(range(512, 14336 + 1, 256))
MODES = ("stateless", "stateful")
MODE_LABELS = {
    "stateless": "stateless (each block from an empty state; the paper's protocol)",
    "stateful": "stateful (recurrent state carried across blocks; not the paper's protocol)",
}
TOKENIZER_MARKER = "TOKENIZER_INFO.json"
REPORT_STEM = "extrapolation"
# Positions scored per log-softmax call: bounds the [chunk, vocab] fp32 buffer (50264 x 2048 x 4 B
# = 400 MB) instead of materialising [L, vocab] log-probs at L = 14336.
SOFTMAX_CHUNK = 2048


class ExtrapolationError(DataError):
    """Bad input (lengths, files, checkpoint/data mismatch, unsupported mode): a one-line message.
    (The data checks of the task the checkpoint loads with raise ``DataError``, its base class.)"""


class TokenCountMismatch(RuntimeError):
    """Fewer (or more) tokens were scored than the split holds: the perplexity would be wrong."""


@dataclass
class ExtrapolationResult:
    """Perplexity of one (mode, L) pass over the split. ``nll`` is in nats per token."""

    mode: str
    length: int
    blocks: int
    scored_tokens: int
    expected_tokens: int
    nll: float
    seconds: float

    @property
    def ppl(self) -> float:
        return math.exp(self.nll) if self.nll < 700 else float("inf")

    def as_row(self) -> Dict[str, object]:
        row = asdict(self)
        row["ppl"] = self.ppl
        return row


# --------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------
def parse_lengths(spec: str) -> List[int]:
    """``"128,256,1024"`` or ``"512:14336:256"`` (start:stop:step, stop included), or a mix
    separated by commas. Every L must be an integer >= 1; duplicates are dropped, order is kept."""
    lengths: List[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if ":" in part:
                fields = [int(x) for x in part.split(":")]
                if len(fields) != 3 or fields[2] < 1:
                    raise ValueError
                start, stop, step = fields
                values = list(range(start, stop + 1, step))
                if not values:
                    raise ValueError
            else:
                values = [int(part)]
        except ValueError:
            raise ExtrapolationError(
                f"--lengths {spec!r}: {part!r} is not an integer or a start:stop:step range"
            ) from None
        lengths.extend(values)
    check_lengths(lengths)
    return list(dict.fromkeys(lengths))


def check_lengths(lengths: Sequence[int]) -> None:
    if not lengths:
        raise ExtrapolationError("no evaluation lengths given: pass --lengths, e.g. 512,1024,2048")
    bad = [L for L in lengths if not isinstance(L, int) or L < 1]
    if bad:
        raise ExtrapolationError(f"evaluation length L={bad[0]} is invalid: every L must be an integer >= 1")


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------
def _register_plugins(user_dirs: Sequence[str]) -> None:
    import hgrn_fairseq
    from fairseq import utils

    hgrn_fairseq.register()  # hgrn_lm, the tasks, and the safe checkpoint loading

    for user_dir in user_dirs:
        utils.import_user_module(argparse.Namespace(user_dir=user_dir))


def _dict_symbols(path: str) -> List[str]:
    """The symbols of a fairseq dict.txt in id order (the counts column does not matter)."""
    with open(path, encoding="utf-8") as f:
        return [line.split(" ", 1)[0] for line in f.read().splitlines()]


def _read_marker(directory: Optional[str]) -> Optional[dict]:
    if not directory:
        return None
    path = os.path.join(directory, TOKENIZER_MARKER)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _embedding_rows(model_state: Dict[str, object]) -> Optional[int]:
    for key in ("decoder.embed_tokens.weight",):
        if key in model_state:
            return int(model_state[key].shape[0])
    for key, value in model_state.items():
        if key.endswith("embed_tokens.weight"):
            return int(value.shape[0])
    return None


def check_data_matches_checkpoint(data_dir: str, train_data: Optional[str], embed_rows: Optional[int]) -> None:
    """Refuse data binarised with another tokenizer/dictionary than the checkpoint was trained on."""
    dict_path = os.path.join(data_dir, "dict.txt")
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(dict_path)
    if embed_rows is not None and len(dictionary) != embed_rows:
        raise ExtrapolationError(
            f"tokenizer mismatch: the checkpoint's embedding has {embed_rows} rows but {dict_path} "
            f"gives a {len(dictionary)}-entry dictionary: evaluate on data binarised with the "
            f"dictionary the model was trained with"
        )
    if train_data and os.path.abspath(train_data) != os.path.abspath(data_dir):
        train_dict = os.path.join(train_data, "dict.txt")
        if os.path.isfile(train_dict) and _dict_symbols(train_dict) != _dict_symbols(dict_path):
            from hgrn_fairseq.data_checks import dictionary_difference, dictionary_record

            trained, given = (dictionary_record(list(Dictionary.load(p).symbols), Dictionary.load(p).nspecial, p)
                              for p in (train_dict, dict_path))
            raise ExtrapolationError(
                f"tokenizer mismatch: {dict_path} differs from the training dictionary {train_dict} "
                f"({dictionary_difference(trained, given)}): evaluate on data binarised with the training dictionary"
            )
        a, b = _read_marker(train_data), _read_marker(data_dir)
        if a and b and a.get("spm_model_sha256") != b.get("spm_model_sha256"):
            raise ExtrapolationError(
                f"tokenizer mismatch: {data_dir} and the training data {train_data} were encoded "
                f"with different sentencepiece models ({TOKENIZER_MARKER} differs)"
            )


def _set_task_arg(task, name: str, value) -> None:
    from omegaconf import DictConfig, open_dict

    if isinstance(task.args, DictConfig):
        with open_dict(task.args):
            setattr(task.args, name, value)
    else:
        setattr(task.args, name, value)


@dataclass
class LoadedModel:
    model: object
    task: object
    cfg: object
    data: str
    device: object
    info: Dict[str, object] = field(default_factory=dict)

    @property
    def supports_stateful(self) -> bool:
        return supports_stateful(self.model)


def supports_stateful(model) -> bool:
    """True when the decoder can continue from its carried recurrent state (``hgrn_lm``)."""
    try:
        params = inspect.signature(model.decoder.forward).parameters
    except (TypeError, ValueError):
        return False
    return "continue_stream" in params


def read_fairseq_checkpoint(checkpoint: str) -> dict:
    """``checkpoint_io.read_fairseq_checkpoint`` with its refusal (a damaged file, a checkpoint of another
    kind) raised as ``ExtrapolationError``, the tool's one-line error."""
    from ..checkpoint_io import CheckpointError
    from ..checkpoint_io import read_fairseq_checkpoint as read

    try:
        return read(checkpoint)
    except CheckpointError as e:
        raise ExtrapolationError(str(e)) from None


def load_checkpoint_for_eval(
    checkpoint: str,
    data: Optional[str] = None,
    max_length: Optional[int] = None,
    lift_max_positions: bool = True,
    split: Optional[str] = "test",
    device: Optional[str] = None,
    dtype: str = "fp32",
    user_dirs: Sequence[str] = (),
    trust_checkpoint: bool = False,
) -> LoadedModel:
    """Load ``checkpoint`` (any fairseq LM: ``hgrn_lm*``, ``transformer_lm``...) for evaluation on
    ``data`` (default: the data directory recorded in the checkpoint). ``split=None``: only the
    dictionary is needed (text from elsewhere, e.g. the lm-evaluation-harness model). ``trust_checkpoint``:
    unpickle the checkpoint fully (``checkpoint_io.trusted_checkpoints``; only for files you trust)."""
    import torch

    from ..checkpoint_io import trusted_checkpoints

    _register_plugins(user_dirs)
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf, overwrite_args_by_name

    if not os.path.isfile(checkpoint):
        raise ExtrapolationError(f"checkpoint {checkpoint!r} not found: pass the .pt file fairseq-train saved")
    with trusted_checkpoints(trust_checkpoint):
        state = read_fairseq_checkpoint(checkpoint)
    if state.get("args") is not None:
        cfg = convert_namespace_to_omegaconf(state["args"])
        state["args"] = None
    else:
        cfg = state.get("cfg")
    if cfg is None:
        raise ExtrapolationError(f"{checkpoint} has no fairseq config (cfg/args): is it a fairseq checkpoint?")
    train_data = cfg.task.get("data", None) if hasattr(cfg.task, "get") else getattr(cfg.task, "data", None)
    data = data or train_data
    if not data:
        raise ExtrapolationError(f"no data directory given and none recorded in {checkpoint}: pass DATA")
    data_dir = data.split(os.pathsep)[0]
    if not os.path.isdir(data_dir):
        raise ExtrapolationError(
            f"data directory {data_dir!r} not found: pass the fairseq-preprocess output the model was "
            f"trained on (data_prep/ writes it)"
        )
    for needed in ("dict.txt",) + ((f"{split}.bin", f"{split}.idx") if split else ()):
        if not os.path.isfile(os.path.join(data_dir, needed)):
            raise ExtrapolationError(
                f"{os.path.join(data_dir, needed)} is missing: binarise the {split} split with "
                f"fairseq-preprocess (--{'test' if split == 'test' else 'valid'}pref) into {data_dir}"
            )
    embed_rows = _embedding_rows(state["model"])
    check_data_matches_checkpoint(data_dir, train_data if isinstance(train_data, str) else None, embed_rows)
    if bool(getattr(cfg.task, "add_bos_token", False)):
        raise ExtrapolationError(f"{checkpoint} was trained with --add-bos-token, which this evaluator does not support")

    trained_tps = getattr(cfg.task, "tokens_per_sample", None)
    trained_mtp = getattr(cfg.model, "max_target_positions", None) if cfg.model is not None else None
    overrides: Dict[str, object] = {"data": data}
    if lift_max_positions and max_length is not None:
        lifted = max(max_length, int(trained_tps or 0), int(trained_mtp or 0))
        overrides.update(max_target_positions=lifted, tokens_per_sample=lifted)
    overwrite_args_by_name(cfg, overrides)
    state["cfg"] = cfg
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], state=state)
    except RuntimeError as e:
        if "size mismatch" in str(e) and "embed_positions" in str(e):
            raise ExtrapolationError(
                f"{checkpoint} has learned positional embeddings, which cannot be lifted to "
                f"L={max_length}: evaluate at L <= {trained_mtp} or pass --no-lift-max-positions"
            ) from None
        raise
    model = models[0]
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model.to(device=dev, dtype=torch_dtype)
    model.eval()
    num_updates = None
    history = state.get("optimizer_history") or []
    if history and "num_updates" in history[-1]:
        num_updates = history[-1]["num_updates"]
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None) or type(model).__name__
    marker = _read_marker(data_dir)
    if marker:
        tokenizer = f"{marker.get('tokenizer')}: {marker.get('label', '')}".rstrip(": ")
    else:
        tokenizer = f"unknown (no {TOKENIZER_MARKER} in the data directory)"
    info = {
        "checkpoint": os.path.abspath(checkpoint),
        "data": os.path.abspath(data_dir),
        "split": split,
        "arch": str(arch),
        "parameters": sum(p.numel() for p in model.parameters()),
        "num_updates": num_updates,
        "trained_tokens_per_sample": trained_tps,
        "max_positions": model.max_positions(),
        "lifted_max_positions": overrides.get("max_target_positions"),
        "tokenizer": tokenizer,
        "device": str(dev) + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""),
        "dtype": dtype,
        "torch": torch.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    return LoadedModel(model=model, task=task, cfg=cfg, data=data, device=dev, info=info)


def count_split_tokens(data_dir: str, split: str, dictionary, dataset_impl=None) -> int:
    """Tokens in the binarised split (every line's tokens plus its end-of-sentence), read from the
    index file; this is the number every evaluation length must score."""
    from fairseq.data import data_utils

    ds = data_utils.load_indexed_dataset(os.path.join(data_dir, split), dictionary, dataset_impl)
    if ds is None:
        raise ExtrapolationError(f"split {split!r} not found in {data_dir}")
    return int(ds.sizes.sum())


# --------------------------------------------------------------------------------------------
# scoring
# --------------------------------------------------------------------------------------------
def _score_block(model, sample, device, incremental_state=None) -> Tuple[float, int]:
    """Sum of the NLL (nats) of the sample's non-pad targets and their number."""
    import torch

    src = sample["net_input"]["src_tokens"].to(device)
    target = sample["target"].to(device)
    pad = model.decoder.dictionary.pad()
    kwargs = {}
    if incremental_state is not None:
        kwargs = {"incremental_state": incremental_state, "continue_stream": True}
    mask = target.ne(pad)
    if getattr(model.decoder, "adaptive_softmax", None) is not None:
        net_output = model(src, **kwargs)
        lprobs = model.get_normalized_probs(net_output, log_probs=True, sample={"target": target})
        tok = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).float()
        return float(-(tok * mask).sum()), int(mask.sum())
    features, extra = model(src, features_only=True, **kwargs)
    nll = torch.zeros((), dtype=torch.float64, device=device)
    for s in range(0, features.size(1), SOFTMAX_CHUNK):
        logits = model.decoder.output_layer(features[:, s : s + SOFTMAX_CHUNK])
        lprobs = model.get_normalized_probs((logits, extra), log_probs=True)
        tgt = target[:, s : s + SOFTMAX_CHUNK]
        tok = lprobs.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).double()
        nll -= (tok * mask[:, s : s + SOFTMAX_CHUNK]).sum()
    return float(nll), int(mask.sum())


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, mininterval=2.0, disable=None, file=sys.stderr)


def _in_order_batches(dataset) -> Iterator[dict]:
    """Blocks one at a time in stream order (fairseq's iterator sorts them by size instead)."""
    for i in range(len(dataset)):
        yield dataset.collater([dataset[i]])


def evaluate_length(
    loaded: LoadedModel, length: int, mode: str, expected_tokens: int, progress: bool = True
) -> ExtrapolationResult:
    """Score the split in blocks of ``length`` tokens; raise ``TokenCountMismatch`` unless every
    token was scored."""
    import torch
    from fairseq import utils

    check_lengths([length])
    task, model = loaded.task, loaded.model
    split = loaded.info["split"]
    _set_task_arg(task, "tokens_per_sample", length)
    _set_task_arg(task, "sample_break_mode", "none")  # blocks of exactly L tokens across lines
    _set_task_arg(task, "shorten_data_split_list", "")
    _set_task_arg(task, "pad_to_fixed_length", False)
    _set_task_arg(task, "pad_to_fixed_bsz", False)
    task.load_dataset(split)
    dataset = task.dataset(split)
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    if mode == "stateless":
        batches: Iterable = task.eval_lm_dataloader(
            dataset=dataset,
            max_tokens=None,
            batch_size=1,
            max_positions=max_positions,
            num_workers=0,
            data_buffer_size=0,
            context_window=0,
        )
    elif mode == "stateful":
        if not supports_stateful(model):
            raise ExtrapolationError(
                f"mode 'stateful' needs a recurrent decoder that carries its state across calls "
                f"(hgrn_lm); {loaded.info['arch']} has none: use --mode stateless"
            )
        batches = _in_order_batches(dataset)
    else:
        raise ExtrapolationError(f"mode={mode!r} is not one of {MODES}")
    incremental_state: Optional[dict] = {} if mode == "stateful" else None
    nll, scored, blocks = 0.0, 0, 0
    previous_last = None
    start = time.time()
    with torch.no_grad():
        for sample in _progress(batches, len(dataset), f"L={length} {mode}", progress):
            if sample is None or not sample:
                continue
            if mode == "stateful":
                first = int(sample["net_input"]["src_tokens"][0, 0])
                if previous_last is not None and first != previous_last:
                    raise RuntimeError("stateful mode: blocks are not contiguous (internal error)")
                previous_last = int(sample["target"][0, -1])
            block_nll, n = _score_block(model, sample, loaded.device, incremental_state)
            nll += block_nll
            scored += n
            blocks += int(sample["target"].size(0))
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)
    seconds = time.time() - start
    if scored != expected_tokens:
        missing_blocks = len(dataset) - blocks
        raise TokenCountMismatch(
            f"L={length} ({mode}): scored {scored} tokens but the {split} split has {expected_tokens} "
            f"({expected_tokens - scored} unscored, {missing_blocks} of {len(dataset)} blocks skipped). "
            f"fairseq drops blocks longer than the model's max_positions ({max_positions}) without an "
            f"error: lift it with model overrides (the default here; do not pass "
            f"--no-lift-max-positions), or evaluate at L <= {max_positions}"
        )
    return ExtrapolationResult(mode, length, blocks, scored, expected_tokens, nll / max(scored, 1), seconds)


def resolve_modes(mode: str, stateful_ok: bool) -> List[str]:
    if mode == "auto":
        return ["stateless", "stateful"] if stateful_ok else ["stateless"]
    if mode == "both":
        return ["stateless", "stateful"]
    if mode in MODES:
        return [mode]
    raise ExtrapolationError(f"--mode {mode!r} is not one of auto, both, {', '.join(MODES)}")


def evaluate_extrapolation(
    checkpoint: str,
    data: Optional[str] = None,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    mode: str = "auto",
    split: str = "test",
    device: Optional[str] = None,
    dtype: str = "fp32",
    lift_max_positions: bool = True,
    user_dirs: Sequence[str] = (),
    progress: bool = True,
    on_result: Optional[Callable[[List[ExtrapolationResult], dict], None]] = None,
    log: Callable[[str], None] = print,
) -> Tuple[List[ExtrapolationResult], dict]:
    """Evaluate ``checkpoint`` at every L of ``lengths``; returns (results, info).

    ``on_result(results_so_far, info)`` is called after each (mode, L).
    """
    lengths = list(lengths)
    check_lengths(lengths)
    if dtype not in ("fp32", "bf16", "fp16"):
        raise ExtrapolationError(f"--dtype {dtype!r} is not one of fp32, bf16, fp16")
    loaded = load_checkpoint_for_eval(
        checkpoint, data, max(lengths), lift_max_positions, split, device, dtype, user_dirs
    )
    modes = resolve_modes(mode, loaded.supports_stateful)
    if "stateful" in modes and not loaded.supports_stateful:
        raise ExtrapolationError(
            f"mode 'stateful' needs a recurrent decoder that carries its state across calls (hgrn_lm); "
            f"{loaded.info['arch']} has none: use --mode stateless"
        )
    expected = count_split_tokens(
        loaded.info["data"], split, loaded.task.source_dictionary, getattr(loaded.task.args, "dataset_impl", None)
    )
    too_long = [L for L in lengths if L > expected]
    if too_long:  # a block longer than the split is the whole split: its row would not be at that L
        raise ExtrapolationError(
            f"--lengths: L={too_long[0]} is longer than the {split} split of {loaded.info['data']}, which holds "
            f"{expected:,} tokens: pass lengths <= {expected}"
            + (f" ({len(too_long)} of the {len(lengths)} lengths are longer)" if len(too_long) > 1 else "")
        )
    info = dict(loaded.info, expected_tokens=expected, modes=modes, lengths=lengths)
    log(
        f"[extrapolation] {info['arch']} ({info['parameters']:,} params, {info['num_updates']} updates, "
        f"trained at L={info['trained_tokens_per_sample']}) on {info['data']} {split}: {expected:,} tokens; "
        f"{len(lengths)} lengths x {len(modes)} mode(s) on {info['device']}, {dtype}"
    )
    results: List[ExtrapolationResult] = []
    for L in lengths:
        for m in modes:
            r = evaluate_length(loaded, L, m, expected, progress)
            results.append(r)
            log(
                f"[extrapolation] L={L:>6} {m:<9} ppl {r.ppl:10.3f}  ({r.scored_tokens:,}/{expected:,} tokens, "
                f"{r.blocks} blocks, {r.seconds:.1f}s)"
            )
            if on_result is not None:
                on_result(results, info)
    return results, info


# --------------------------------------------------------------------------------------------
# reports
# --------------------------------------------------------------------------------------------
def average_ppl(results: Sequence[ExtrapolationResult], mode: str) -> Optional[float]:
    values = [r.ppl for r in results if r.mode == mode]
    return sum(values) / len(values) if values else None


def format_markdown(results: Sequence[ExtrapolationResult], info: dict) -> str:
    modes = [m for m in MODES if any(r.mode == m for r in results)]
    lengths = list(dict.fromkeys(r.length for r in results))
    by_key = {(r.mode, r.length): r for r in results}
    lines = [
        f"### Length extrapolation: `{info.get('arch')}`",
        "",
        f"- checkpoint: `{info.get('checkpoint')}` ({info.get('num_updates')} updates, trained at "
        f"L={info.get('trained_tokens_per_sample')}, {info.get('parameters', 0):,} parameters)",
        f"- data: `{info.get('data')}`, split `{info.get('split')}`: {info.get('expected_tokens', 0):,} tokens, "
        f"every one scored at every L (checked)",
        f"- tokenizer: {info.get('tokenizer')}",
        f"- blocks of L tokens, no overlap, one block per batch; {info.get('device')}, {info.get('dtype')}, "
        f"torch {info.get('torch')}, {info.get('date')}",
    ]
    for m in modes:
        lines.append(f"- {m}: {MODE_LABELS[m]}")
    lines += ["", "| L | " + " | ".join(f"PPL {m}" for m in modes) + " | scored tokens |",
              "|---:|" + "---:|" * len(modes) + "---:|"]
    for L in lengths:
        cells = [f"{by_key[(m, L)].ppl:.2f}" if (m, L) in by_key else "" for m in modes]
        scored = next(by_key[(m, L)].scored_tokens for m in modes if (m, L) in by_key)
        lines.append(f"| {L} | " + " | ".join(cells) + f" | {scored:,} |")
    avgs = [average_ppl(results, m) for m in modes]
    lines.append("| **avg** | " + " | ".join(f"**{a:.2f}**" for a in avgs) + " | |")
    return "\n".join(lines) + "\n"


def write_csv(results: Sequence[ExtrapolationResult], path: str) -> None:
    fields = ["mode", "length", "ppl", "nll", "scored_tokens", "expected_tokens", "blocks", "seconds"]
    with open(path + ".tmp", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in results:
            row = r.as_row()
            w.writerow({k: row[k] for k in fields})
    os.replace(path + ".tmp", path)


def pyplot_or_none():
    """matplotlib.pyplot on the Agg backend with its debug logging off, or None when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import logging

        import matplotlib.pyplot as plt

        logging.getLogger("matplotlib").setLevel(logging.WARNING)
    except ImportError:
        return None
    return plt


def log_y_if_wide(ax, values) -> bool:
    """Log y axis when the finite values span more than 10x (a Transformer past its training length
    spans orders of magnitude); returns whether it did."""
    finite = [v for v in values if math.isfinite(v)]
    if finite and max(finite) > 10 * min(finite):
        ax.set_yscale("log")
        return True
    return False


def save_ppl_plot(plt, fig, ax, path: str, ylabel: str, title: str) -> str:
    """The common finish of the perplexity-against-L plots (axes labels, grid, legend) and the PNG."""
    ax.set_xlabel("evaluation length L (tokens per block)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plot(results: Sequence[ExtrapolationResult], info: dict, path: str) -> Optional[str]:
    """PNG of PPL against L; returns None (and says why) when matplotlib is missing."""
    plt = pyplot_or_none()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m in MODES:
        rows = [r for r in results if r.mode == m]
        if rows:
            ax.plot([r.length for r in rows], [r.ppl for r in rows], marker="o", markersize=3, label=MODE_LABELS[m])
    trained = info.get("trained_tokens_per_sample")
    if trained:
        ax.axvline(trained, color="grey", linestyle="--", linewidth=1, label=f"training length {trained}")
    if not log_y_if_wide(ax, [r.ppl for r in results]):
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    return save_ppl_plot(plt, fig, ax, path, f"{info.get('split', 'test')} perplexity",
                         f"Length extrapolation: {info.get('arch')}")


def write_reports(
    results: Sequence[ExtrapolationResult], info: dict, out_dir: str, plot: bool = True, log=print
) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "csv": os.path.join(out_dir, f"{REPORT_STEM}.csv"),
        "md": os.path.join(out_dir, f"{REPORT_STEM}.md"),
        "json": os.path.join(out_dir, f"{REPORT_STEM}.json"),
    }
    write_csv(results, paths["csv"])
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(format_markdown(results, info))
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump({"info": info, "results": [r.as_row() for r in results]}, f, indent=1, default=str)
    if plot:
        png = write_plot(results, info, os.path.join(out_dir, f"{REPORT_STEM}.png"))
        if png is None:
            log("[extrapolation] matplotlib is not installed: no plot (pip install matplotlib to get one)")
        else:
            paths["png"] = png
    return paths


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hgrn_fairseq.evaluation.extrapolation",
        description="Test perplexity of a fairseq LM checkpoint at several evaluation lengths.",
    )
    p.add_argument("checkpoint", help="fairseq checkpoint (.pt) of hgrn_lm*, transformer_lm, ...")
    p.add_argument("data", nargs="?", default=None,
                   help="binarised data directory (default: the one recorded in the checkpoint)")
    p.add_argument("--lengths", default="512:14336:256",
                   help="comma-separated L values and/or start:stop:step ranges (default 512:14336:256)")
    p.add_argument("--mode", default="auto", choices=["auto", "both", *MODES],
                   help="auto: stateless, plus stateful for recurrent models")
    p.add_argument("--split", default="test")
    p.add_argument("--out-dir", default=None, help="default: <checkpoint dir>/extrapolation")
    p.add_argument("--cpu", action="store_true", help="evaluate on the CPU even when a GPU is present")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--no-lift-max-positions", action="store_true",
                   help="keep the checkpoint's max_target_positions (fairseq then skips longer blocks "
                        "and the token count check fails); for diagnosis")
    p.add_argument("--user-dir", action="append", default=[], help="extra fairseq plugin directories")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    return p


def _quiet_logging() -> None:
    """Importing fairseq leaves the root logger at DEBUG; keep warnings (fairseq's note that it
    skipped long samples among them), drop the chatter."""
    import logging

    import fairseq  # noqa: F401  (configures logging on import)

    logging.getLogger().setLevel(logging.WARNING)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_logging()
    try:
        lengths = parse_lengths(args.lengths)
        out_dir = args.out_dir or os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), "extrapolation")

        def on_result(results, info):
            write_reports(results, info, out_dir, plot=False)

        with trusted_checkpoints(args.trust_checkpoint):
            results, info = evaluate_extrapolation(
                args.checkpoint, args.data, lengths, args.mode, args.split,
                device="cpu" if args.cpu else None, dtype=args.dtype,
                lift_max_positions=not args.no_lift_max_positions, user_dirs=args.user_dir,
                progress=not args.no_progress, on_result=on_result,
            )
        paths = write_reports(results, info, out_dir, plot=not args.no_plot)
    except (DataError, TokenCountMismatch) as e:
        kind = "token count check failed" if isinstance(e, TokenCountMismatch) else "error"
        print(f"extrapolation: {kind}: {e}", file=sys.stderr)
        return 3 if isinstance(e, TokenCountMismatch) else 2
    print()
    print(format_markdown(results, info))
    print("wrote " + ", ".join(paths[k] for k in ("csv", "md", "json", "png") if k in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
