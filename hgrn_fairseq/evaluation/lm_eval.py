"""Zero-shot evaluation of this package's fairseq language models with EleutherAI's lm-evaluation-harness.

    python -m hgrn_fairseq.evaluation.lm_eval --path CKPT --data DATA_DIR --tasks piqa,hellaswag \\
        [--batch-size 8] [--output results.json] [--include-path DIR_OF_LOCAL_TASK_YAMLS]

Importing this module registers the harness model ``hgrn_fairseq`` (``lm_eval.api.registry``), so
``lm_eval --model hgrn_fairseq --model_args path=CKPT,data=DATA_DIR`` works too, and
``HgrnFairseqLM(path=..., data=...)`` can be passed as an object to ``lm_eval.simple_evaluate``.

The model is any fairseq language model this package trains (``hgrn_lm`` archs, fairseq's
``transformer_lm``), loaded with the dictionary of ``DATA_DIR`` after the same checks as the
extrapolation tool (the checkpoint's embedding size, the training data directory's dictionary and
tokenizer marker): a model never scores text with a dictionary it was not trained with. Text becomes
ids with the tokenizer the data directory names in ``TOKENIZER_INFO.json`` (``data_prep/`` writes it):

* ``sentencepiece-bpe``: ``spm.model`` in DATA_DIR (or ``--spm-model``), checked against the marker's
  SHA-256;
* ``gpt2-bpe``: ``encoder.json`` / ``vocab.bpe`` from ``--gpt2-dir``;
* ``space``: whitespace-separated symbols of ``dict.txt`` (data binarised from pre-tokenised text); a data
  directory without a marker needs ``--tokenizer`` to say which.

A line break is the end-of-sentence symbol, as in fairseq-preprocessed data, and every scored sequence
starts after one (what ``fairseq-generate`` feeds an LM first).

* ``loglikelihood``: requests sorted by length (longest first), batched with right padding; the
  continuation's tokens are the ones after the context's own encoding (the harness's context /
  continuation split), each scored once.
* ``loglikelihood_rolling``: recurrent models (``hgrn_lm``) read a document of any length in chunks of
  ``rolling_chunk`` tokens and carry their state across chunks, so every token is scored once with its
  whole past; models with a position limit (``transformer_lm``) use the harness's disjoint rolling
  windows of their maximum length.
* ``generate_until``: greedy; recurrent models keep their state and read one new token per step
  (O(1) per token); others re-read the prefix. Stops at an ``until`` string (cut there), at
  ``max_gen_toks``, or at end of sentence when ``"\\n"`` is an ``until`` string.

``--dtype bf16`` runs the model in bfloat16 on CUDA (log-probabilities are taken in float32).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

INSTALL_HINT = (
    "lm-evaluation-harness is not installed: pip install -e '.[eval]' (or pip install lm_eval==0.4.13) "
    "in this environment"
)
TOKENIZERS = ("sentencepiece-bpe", "gpt2-bpe", "space")
# The papers' task lists (HGRN Tables 4 and 5), as the harness names them.
COMMONSENSE_TASKS = ("piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa", "boolq")
SUPERGLUE_TASKS = ("wsc", "wic", "rte", "cb", "multirc", "copa")

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model

    _HARNESS_ERROR: Optional[BaseException] = None
except ImportError as e:  # the command and the class say how to install it
    TemplateLM = object  # type: ignore[misc,assignment]
    _HARNESS_ERROR = e

    def register_model(*names):  # type: ignore[no-redef]
        return lambda cls: cls


def _sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ZeroShotError(ValueError):
    """Bad input for the zero-shot evaluation; the message names the problem and the fix."""


# ---- tokenizers ------------------------------------------------------------------------------------
class DictionaryTokenizer:
    """Text <-> ids of a fairseq dictionary through the tokenizer the data was binarised with."""

    def __init__(self, dictionary, kind: str, spm_model: Optional[str] = None, gpt2_dir: Optional[str] = None):
        if kind not in TOKENIZERS:
            raise ZeroShotError(f"tokenizer {kind!r} is not one of {TOKENIZERS}")
        self.dictionary, self.kind = dictionary, kind
        if kind == "sentencepiece-bpe":
            import sentencepiece

            self._spm = sentencepiece.SentencePieceProcessor(model_file=spm_model)
        elif kind == "gpt2-bpe":
            from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

            self._bpe = get_encoder(os.path.join(gpt2_dir, "encoder.json"), os.path.join(gpt2_dir, "vocab.bpe"))

    def _symbols(self, line: str) -> List[str]:
        if self.kind == "sentencepiece-bpe":
            return self._spm.encode(line, out_type=str)
        if self.kind == "gpt2-bpe":
            return [str(i) for i in self._bpe.encode(line)]
        return line.split()

    def encode(self, text: str) -> List[int]:
        """Ids of ``text``; each line break becomes the end-of-sentence id (fairseq-preprocess's lines)."""
        ids: List[int] = []
        for i, line in enumerate(text.split("\n")):
            if i:
                ids.append(self.dictionary.eos())
            ids.extend(self.dictionary.index(s) for s in self._symbols(line))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        lines, current = [], []
        for i in ids:
            if i == self.dictionary.eos():
                lines.append(current)
                current = []
            else:
                current.append(self.dictionary[i])
        lines.append(current)
        return "\n".join(self._detokenize(symbols) for symbols in lines)

    def _detokenize(self, symbols: List[str]) -> str:
        if self.kind == "sentencepiece-bpe":
            return self._spm.decode_pieces(symbols)
        if self.kind == "gpt2-bpe":
            return self._bpe.decode([int(s) for s in symbols if s.lstrip("-").isdigit()])
        return " ".join(symbols)


def resolve_tokenizer(data_dir: str, dictionary, tokenizer: Optional[str], spm_model: Optional[str],
                      gpt2_dir: Optional[str]) -> DictionaryTokenizer:
    """The tokenizer ``data_dir`` was binarised with (its TOKENIZER_INFO.json), checked."""
    from .extrapolation import TOKENIZER_MARKER, _read_marker

    marker = _read_marker(data_dir)
    kind = marker.get("tokenizer") if marker else None
    if tokenizer and kind and tokenizer != kind:
        raise ZeroShotError(
            f"--tokenizer {tokenizer} contradicts {os.path.join(data_dir, TOKENIZER_MARKER)}, which says the "
            f"data were binarised with {kind}: drop --tokenizer"
        )
    kind = kind or tokenizer
    if kind is None:
        raise ZeroShotError(
            f"{data_dir} has no {TOKENIZER_MARKER} saying how its text was tokenised: pass --tokenizer "
            f"{{{','.join(TOKENIZERS)}}} (space: dict.txt symbols separated by whitespace)"
        )
    if kind == "sentencepiece-bpe":
        spm_model = spm_model or os.path.join(data_dir, "spm.model")
        if not os.path.isfile(spm_model):
            raise ZeroShotError(
                f"sentencepiece model {spm_model} not found: pass --spm-model with the spm.model that "
                f"data_prep/sentencepiece_bpe.py trained for this data (it sits next to the .bpe files)"
            )
        expected = (marker or {}).get("spm_model_sha256")
        if expected and _sha256(spm_model) != expected:
            raise ZeroShotError(
                f"{spm_model} is not the sentencepiece model {data_dir} was encoded with (its SHA-256 differs "
                f"from {TOKENIZER_MARKER}'s): pass --spm-model with the model data_prep trained for this data"
            )
    elif kind == "gpt2-bpe":
        missing = [n for n in ("encoder.json", "vocab.bpe") if not gpt2_dir or not os.path.isfile(os.path.join(gpt2_dir, n))]
        if missing:
            raise ZeroShotError(
                f"GPT-2 BPE file(s) {', '.join(missing)} not found in --gpt2-dir {gpt2_dir!r}: pass the folder "
                f"with encoder.json and vocab.bpe the data were encoded with (data_prep/README.md)"
            )
    return DictionaryTokenizer(dictionary, kind, spm_model=spm_model, gpt2_dir=gpt2_dir)


# ---- the harness model -----------------------------------------------------------------------------
@register_model("hgrn_fairseq")
class HgrnFairseqLM(TemplateLM):
    """lm-evaluation-harness model over a fairseq checkpoint of this package (see the module docstring).

    ``path``: the checkpoint; ``data``: its data directory (default: the one recorded at training);
    ``batch_size``: sequences per forward in ``loglikelihood``; ``rolling_chunk``: tokens per forward
    when a recurrent model reads a long document; ``device``: cpu / cuda (default: cuda if available);
    ``dtype``: fp32 or bf16 (CUDA). ``tokenizer`` / ``spm_model`` / ``gpt2_dir``: see the module docstring.
    """

    def __init__(self, path: str, data: Optional[str] = None, batch_size: int = 8, rolling_chunk: int = 2048,
                 max_gen_toks: int = 256, device: Optional[str] = None, dtype: str = "fp32",
                 tokenizer: Optional[str] = None, spm_model: Optional[str] = None, gpt2_dir: Optional[str] = None,
                 **unused):
        if _HARNESS_ERROR is not None:
            raise ImportError(INSTALL_HINT) from _HARNESS_ERROR
        super().__init__()
        import torch

        from .extrapolation import ExtrapolationError, load_checkpoint_for_eval, supports_stateful

        batch_size, rolling_chunk, max_gen_toks = int(batch_size), int(rolling_chunk), int(max_gen_toks)
        for name, value in (("batch_size", batch_size), ("rolling_chunk", rolling_chunk), ("max_gen_toks", max_gen_toks)):
            if value < 1:
                raise ZeroShotError(f"{name}={value} is invalid: it must be >= 1")
        if dtype not in ("fp32", "bf16"):
            raise ZeroShotError(f"dtype={dtype!r} is not one of fp32, bf16")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "bf16" and not str(device).startswith("cuda"):
            raise ZeroShotError("dtype=bf16 is for CUDA: use dtype=fp32 on the CPU")
        try:
            loaded = load_checkpoint_for_eval(path, data, split=None, device=device, dtype=dtype,
                                              lift_max_positions=False)
        except ExtrapolationError as e:
            raise ZeroShotError(str(e)) from None
        self.loaded, self.model, self._device = loaded, loaded.model, loaded.device
        self.dictionary = loaded.task.target_dictionary
        self.tokenizer_ = resolve_tokenizer(loaded.data.split(os.pathsep)[0], self.dictionary, tokenizer,
                                            spm_model, gpt2_dir)
        self.recurrent = supports_stateful(self.model)
        limit = self.model.max_positions()
        limit = limit[0] if isinstance(limit, tuple) else limit
        self.max_length = None if self.recurrent or limit is None or limit >= 2**30 else int(limit)
        self.batch_size, self.rolling_chunk, self.max_gen_toks = batch_size, rolling_chunk, max_gen_toks
        self.info = dict(loaded.info, tokenizer_kind=self.tokenizer_.kind, recurrent=self.recurrent,
                         max_length=self.max_length, batch_size=batch_size)

    # -- tokens --------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.dictionary.eos()

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> List[int]:
        return self.tokenizer_.encode(string)

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer_.decode(list(ids))

    def _with_prefix(self, ids: List[int]) -> List[int]:
        """Every scored sequence starts after an end of sentence (as fairseq-generate feeds an LM)."""
        return ids if ids and ids[0] == self.eot_token_id else [self.eot_token_id] + ids

    # -- forward -------------------------------------------------------------------------------
    def _logits(self, tokens, incremental_state=None, continue_stream: bool = False):
        import torch

        with torch.no_grad():
            if incremental_state is None:
                out = self.model(tokens)
            else:
                out = self.model.decoder(tokens, incremental_state=incremental_state, continue_stream=continue_stream)
        return out[0]

    def _log_probs(self, logits):
        return logits.float().log_softmax(-1)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> List[Tuple[float, bool]]:
        """``requests``: ((context, continuation), context ids, continuation ids). Longest first, right
        padded; each continuation token is scored once, given all tokens before it."""
        import torch

        results: List[Optional[Tuple[float, bool]]] = [None] * len(requests)
        rows = []
        for i, (_, context, continuation) in enumerate(requests):
            if not continuation:
                raise ZeroShotError(f"request {i} has an empty continuation: nothing to score")
            full = self._with_prefix(list(context)) + list(continuation)
            if self.max_length is not None and len(full) - 1 > self.max_length:
                full = full[-(self.max_length + 1):]  # the harness's convention: drop context from the left
            rows.append((i, full[:-1], full[1:], len(continuation)))
        rows.sort(key=lambda r: -len(r[1]))
        pad = self.dictionary.pad()
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start:start + self.batch_size]
            width = len(batch[0][1])
            tokens = torch.full((len(batch), width), pad, dtype=torch.long)
            for b, (_, inputs, _, _) in enumerate(batch):
                tokens[b, :len(inputs)] = torch.tensor(inputs)
            logits = self._logits(tokens.to(self._device))
            for b, (i, inputs, targets, n) in enumerate(batch):
                lp = self._log_probs(logits[b, len(inputs) - n:len(inputs)])
                target = torch.tensor(targets[-n:], device=lp.device)
                score = lp.gather(-1, target[:, None]).sum().item()
                greedy = bool((lp.argmax(-1) == target).all().item())
                results[i] = (score, greedy)
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
        return [self.rolling_log_likelihood(self.tok_encode(req.args[0])) for req in requests]

    def rolling_log_likelihood(self, ids: List[int]) -> float:
        """Sum of log p(token | everything before it, after an end of sentence) over ``ids``."""
        import torch

        if not ids:
            return 0.0
        if not self.recurrent:
            from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=ids, prefix_token=self.eot_token_id, max_seq_len=self.max_length, context_len=1)]
            scored = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
            return sum(score for score, _ in scored)
        inputs = [self.eot_token_id] + ids[:-1]
        state: Dict = {}
        total = 0.0
        for start in range(0, len(ids), self.rolling_chunk):
            chunk = torch.tensor([inputs[start:start + self.rolling_chunk]], device=self._device)
            logits = self._logits(chunk, incremental_state=state, continue_stream=start > 0)
            target = torch.tensor(ids[start:start + self.rolling_chunk], device=self._device)
            total += self._log_probs(logits[0]).gather(-1, target[:, None]).sum().item()
        return total

    def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
        out = []
        for req in requests:
            context, kwargs = req.args
            out.append(self.generate(context, **(kwargs or {})))
        return out

    def generate(self, context: str, until=None, max_gen_toks: Optional[int] = None, do_sample: bool = False,
                 temperature: float = 0.0, **unused) -> str:
        """Greedy continuation of ``context`` (see the module docstring for when it stops)."""
        import torch

        if do_sample and temperature not in (0, 0.0, None):
            raise ZeroShotError("generate_until: only greedy decoding is implemented (do_sample=False)")
        until = [until] if isinstance(until, str) else list(until or [])
        budget = int(max_gen_toks or self.max_gen_toks)
        prefix = self._with_prefix(self.tok_encode(context))
        stop_at_eos = "\n" in until
        generated: List[int] = []
        state: Optional[Dict] = {} if self.recurrent else None
        tokens = torch.tensor([prefix], device=self._device)
        logits = self._logits(tokens, incremental_state=state)
        for _ in range(budget):
            nxt = int(logits[0, -1].float().argmax().item())
            if nxt == self.eot_token_id and stop_at_eos:
                break
            generated.append(nxt)
            text = self.tok_decode(generated)
            if any(u and u in text for u in until):
                break
            if self.recurrent:
                logits = self._logits(torch.tensor([[nxt]], device=self._device), incremental_state=state,
                                      continue_stream=True)
            else:
                tokens = torch.tensor([prefix + generated], device=self._device)
                if self.max_length is not None:
                    tokens = tokens[:, -self.max_length:]
                logits = self._logits(tokens)
        text = self.tok_decode(generated)
        cut = min([text.index(u) for u in until if u and u in text], default=len(text))
        return text[:cut]


# ---- tasks from local files -------------------------------------------------------------------------
LOCAL_MC_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_local_multiple_choice_task(folder: str, name: str, docs: Sequence[Dict]) -> str:
    """A harness task from local data, no network: ``folder/name.jsonl`` (``docs``: dicts with
    ``context``, ``choices`` and the right choice's index ``label``) and ``folder/name.yaml``. Returns
    ``folder``, for ``--include-path`` / ``TaskManager(include_path=...)``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.abspath(os.path.join(folder, f"{name}.jsonl"))
    for i, doc in enumerate(docs):
        missing = {"context", "choices", "label"} - set(doc)
        if missing or not 0 <= int(doc["label"]) < len(doc["choices"]):
            raise ZeroShotError(f"document {i} of task {name}: needs context, choices and a label indexing the "
                                f"choices (missing: {sorted(missing)}, label {doc.get('label')})")
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    with open(os.path.join(folder, f"{name}.yaml"), "w", encoding="utf-8") as f:
        f.write(LOCAL_MC_YAML.format(name=name, path=path))
    return folder


# ---- the command -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hgrn_fairseq.evaluation.lm_eval",
                                description="Zero-shot evaluation of a fairseq checkpoint with lm-evaluation-harness")
    p.add_argument("--path", required=True, help="checkpoint (.pt) written by fairseq-train")
    p.add_argument("--data", help="its data directory (dict.txt; default: the one recorded at training)")
    p.add_argument("--tasks", required=True, help="comma-separated harness task names (e.g. piqa,hellaswag)")
    p.add_argument("--include-path", action="append", default=[],
                   help="folder of task YAMLs (e.g. tasks defined from local JSONL files); repeatable")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rolling-chunk", type=int, default=2048, help="tokens per forward of a recurrent model")
    p.add_argument("--num-fewshot", type=int, default=0)
    p.add_argument("--limit", type=float, help="examples per task (a fraction if < 1): for smoke tests")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: CUDA only")
    p.add_argument("--tokenizer", choices=TOKENIZERS, help="when the data directory has no TOKENIZER_INFO.json")
    p.add_argument("--spm-model", help="sentencepiece model (default: DATA/spm.model)")
    p.add_argument("--gpt2-dir", help="folder with GPT-2's encoder.json and vocab.bpe")
    p.add_argument("--online", action="store_true",
                   help="let Hugging Face datasets use the network (default: offline, HF_DATASETS_OFFLINE=1)")
    p.add_argument("--output", help="write the harness's results (and the model's info) as JSON here")
    p.add_argument("--seed", type=int, default=1234)
    return p


def load_tasks(names: Sequence[str], include_paths: Sequence[str]):
    """The harness's task dict for ``names``; a task whose data cannot be had is named in the error."""
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_path=list(include_paths) or None)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise ZeroShotError(
            f"unknown task(s) {', '.join(unknown)}: use lm-evaluation-harness task names (lm_eval --tasks list), "
            f"or pass --include-path with the folder of your task YAMLs"
        )
    tasks = {}
    for name in names:
        try:
            tasks.update(get_task_dict([name], manager))
        except Exception as e:  # noqa: BLE001 - datasets raises many kinds; the message names the task
            offline = os.environ.get("HF_DATASETS_OFFLINE") == "1"
            first_line = (str(e).splitlines() or [""])[0][:200]
            raise ZeroShotError(
                f"task {name}: its data could not be loaded ({type(e).__name__}: {first_line})"
                + (": it is not in the local Hugging Face cache and this run is offline; load it once on a "
                   "machine with network (python -c \"import lm_eval.tasks as t; t.get_task_dict(['" + name
                   + "'])\") and copy ~/.cache/huggingface here, or define the task from local JSONL files "
                   "(docs/zero_shot.md) and pass --include-path" if offline else "")
            ) from None
    return manager, tasks


def results_table(results: Dict, tasks: Sequence[str]) -> str:
    """Markdown: acc and acc_norm per task as the harness reports them, with the paper's HGRN column."""
    lines = ["| task | acc | acc_norm | paper (HGRN) |", "|---|---|---|---|"]
    for name in tasks:
        r = results.get("results", {}).get(name, {})

        def fmt(key):
            v = r.get(f"{key},none", r.get(key))
            return f"{100 * v:.2f}" if isinstance(v, (int, float)) else "-"

        lines.append(f"| {name} | {fmt('acc')} | {fmt('acc_norm')} | {PAPER_HGRN.get(name) or 'not verified'} |")
    return "\n".join(lines)


# The HGRN paper's Tables 4-5 rows could not be checked against the paper here (no copy of it offline);
# rather than print numbers from memory the table says so. Fill in with the paper open.
PAPER_HGRN: Dict[str, Optional[str]] = {name: None for name in COMMONSENSE_TASKS + SUPERGLUE_TASKS}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if _HARNESS_ERROR is not None:
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    if not args.online:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval

    names = [t for t in args.tasks.split(",") if t]
    try:
        manager, tasks = load_tasks(names, args.include_path)
        model = HgrnFairseqLM(path=args.path, data=args.data, batch_size=args.batch_size,
                              rolling_chunk=args.rolling_chunk, device=args.device, dtype=args.dtype,
                              tokenizer=args.tokenizer, spm_model=args.spm_model, gpt2_dir=args.gpt2_dir)
    except (ZeroShotError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = lm_eval.simple_evaluate(model=model, tasks=names, task_manager=manager, num_fewshot=args.num_fewshot,
                                      limit=args.limit, batch_size=args.batch_size, log_samples=False,
                                      random_seed=args.seed, numpy_random_seed=args.seed,
                                      torch_random_seed=args.seed, fewshot_random_seed=args.seed)
    print(results_table(results, names))
    if args.output:
        payload = {"model": {k: str(v) for k, v in model.info.items()}, "results": results.get("results", {}),
                   "n_samples": results.get("n-samples", {}), "versions": results.get("versions", {})}
        tmp = args.output + ".tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1, default=str)
        os.replace(tmp, args.output)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
