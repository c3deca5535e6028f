"""Zero-shot evaluation of this package's fairseq language models with EleutherAI's lm-evaluation-harness.

    python -m hgrn_fairseq.evaluation.lm_eval --path CKPT --data DATA_DIR --tasks piqa,hellaswag \\
        [--batch-size 8] [--output results.json] [--include-path DIR_OF_LOCAL_TASK_YAMLS]

Importing this module registers the harness model ``hgrn_fairseq`` (``lm_eval.api.registry``), so a
process that imported it can call ``lm_eval.simple_evaluate(model="hgrn_fairseq",
model_args="path=CKPT,data=DATA_DIR", ...)``, or pass ``HgrnFairseqLM(path=..., data=...)`` as the model.

The model is any fairseq language model this package trains (``hgrn_lm`` archs, fairseq's
``transformer_lm``), loaded with the dictionary of ``DATA_DIR`` after the same checks as the
extrapolation tool (the checkpoint's embedding size, the training data directory's dictionary and
tokenizer marker): a model never scores text with a dictionary it was not trained with. Text becomes
ids with the tokenizer the data directory names in ``TOKENIZER_INFO.json`` (``data_prep/`` writes it):

* ``sentencepiece-bpe``: ``spm.model`` in DATA_DIR (or ``--spm-model``), checked against the marker's
  SHA-256;
* ``gpt2-bpe``: ``encoder.json`` / ``vocab.bpe`` from ``--gpt2-dir``, checked against the SHA-256s the
  marker records;
* ``space``: whitespace-separated symbols of ``dict.txt`` (data binarised from pre-tokenised text); a data
  directory without a marker needs ``--tokenizer`` to say which.

A line break is the end-of-sentence symbol, as in fairseq-preprocessed data, and every scored sequence
starts after one (what ``fairseq-generate`` feeds an LM first).

* ``loglikelihood``: requests sorted by length (longest first), batched with right padding. The
  continuation's tokens are those the encoding of context + continuation has beyond the context's
  own encoding (the harness's split); where a tokenizer merges tokens across that boundary, the
  context keeps only the tokens it shares with the whole encoding, so the sequence scored is always
  the encoding of the whole text and each token is scored once (such pairs are counted).
* ``loglikelihood_rolling``: recurrent models (``hgrn_lm``) read a document of any length in chunks of
  ``rolling_chunk`` tokens and carry their state across chunks, so every token is scored once with its
  whole past; models with a position limit (``transformer_lm``) use the harness's disjoint rolling
  windows of their maximum length.
* ``generate_until``: greedy; recurrent models keep their state and read one new token per step
  (O(1) per token); others re-read the prefix. Stops at an ``until`` string (cut there), at
  ``max_gen_toks``, or at end of sentence when ``"\\n"`` is an ``until`` string.

Tasks defined from local files (``--include-path`` YAMLs with ``dataset_path: json``) are checked
before anything loads: every line one JSON object, and for multiple choice a non-empty choices list
and a label in range; the first bad line is an error naming the file and line.

``--dtype bf16`` runs the model in bfloat16 on CUDA (log-probabilities are taken in float32).
Symbols of the text missing from the dictionary are scored as ``<unk>`` and counted; the command
prints the count and writes it to ``--output``. The table is printed in the papers' layout (a column
per task, rows for acc and acc_norm, then the papers' rows for the same tasks: ``PAPER_HGRN``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..checkpoint_io import TRUST_FLAG, TRUST_HELP

INSTALL_HINT = (
    "lm-evaluation-harness is not installed: pip install -e '.[eval]' (or pip install lm_eval==0.4.13) "
    "in this environment"
)
TOKENIZERS = ("sentencepiece-bpe", "gpt2-bpe", "space")
# The papers' task lists (HGRN Tables 4 and 5, in their column order), as the harness names them.
COMMONSENSE_TASKS = ("boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
SUPERGLUE_TASKS = ("wsc", "wic", "rte", "cb", "multirc", "boolq", "copa")

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
        self.unknown_symbols = self.encoded_symbols = 0
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
        """Ids of ``text``; each line break becomes the end-of-sentence id (fairseq-preprocess's lines).
        Symbols missing from the dictionary become ``<unk>`` and are counted (``unknown_symbols``)."""
        ids: List[int] = []
        unk = self.dictionary.unk()
        for i, line in enumerate(text.split("\n")):
            if i:
                ids.append(self.dictionary.eos())
            symbols = self._symbols(line)
            line_ids = [self.dictionary.index(s) for s in symbols]
            self.unknown_symbols += sum(1 for s, t in zip(symbols, line_ids) if t == unk and s != "<unk>")
            self.encoded_symbols += len(symbols)
            ids.extend(line_ids)
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
        recorded = (marker or {}).get("gpt2_sha256") or {}
        for name in ("encoder.json", "vocab.bpe"):
            if recorded.get(name) and _sha256(os.path.join(gpt2_dir, name)) != recorded[name]:
                raise ZeroShotError(
                    f"{os.path.join(gpt2_dir, name)} is not the file {data_dir} was encoded with (its SHA-256 "
                    f"differs from {TOKENIZER_MARKER}'s): pass --gpt2-dir with the GPT-2 files data_prep used"
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
    ``trust_checkpoint``: unpickle a checkpoint that holds other Python types fully (only for trusted files).
    """

    def __init__(self, path: str, data: Optional[str] = None, batch_size: int = 8, rolling_chunk: int = 2048,
                 max_gen_toks: int = 256, device: Optional[str] = None, dtype: str = "fp32",
                 tokenizer: Optional[str] = None, spm_model: Optional[str] = None, gpt2_dir: Optional[str] = None,
                 trust_checkpoint=False, **unused):
        if _HARNESS_ERROR is not None:
            raise ImportError(INSTALL_HINT) from _HARNESS_ERROR
        super().__init__()
        import torch

        from ..data_checks import DataError
        from .extrapolation import load_checkpoint_for_eval, supports_stateful

        sizes = {"batch_size": batch_size, "rolling_chunk": rolling_chunk, "max_gen_toks": max_gen_toks}
        for name, value in sizes.items():
            if not str(value).isdigit() or int(value) < 1:
                raise ZeroShotError(f"{name}={value} is invalid: it must be an integer >= 1 ('auto' is not supported)")
        batch_size, rolling_chunk, max_gen_toks = (int(sizes[n]) for n in ("batch_size", "rolling_chunk", "max_gen_toks"))
        if dtype not in ("fp32", "bf16"):
            raise ZeroShotError(f"dtype={dtype!r} is not one of fp32, bf16")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "bf16" and not str(device).startswith("cuda"):
            raise ZeroShotError("dtype=bf16 is for CUDA: use dtype=fp32 on the CPU")
        try:
            trust = str(trust_checkpoint).strip().lower() in ("1", "true", "yes", "on")
            loaded = load_checkpoint_for_eval(path, data, split=None, device=device, dtype=dtype,
                                              lift_max_positions=False, trust_checkpoint=trust)
        except DataError as e:  # ExtrapolationError and the task's data checks
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
        self.boundary_merges = 0  # context/continuation pairs whose encodings merge across the boundary
        self.info = dict(loaded.info, tokenizer_kind=self.tokenizer_.kind, recurrent=self.recurrent,
                         max_length=self.max_length, batch_size=batch_size)

    def token_report(self) -> Dict[str, int]:
        """What encoding did to the text so far: symbols read, symbols missing from the dictionary
        (scored as ``<unk>``), and context/continuation pairs split at a merged boundary."""
        return {"symbols": self.tokenizer_.encoded_symbols, "unknown_symbols": self.tokenizer_.unknown_symbols,
                "boundary_merges": self.boundary_merges}

    # -- tokens --------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.dictionary.eos()

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> List[int]:
        return self.tokenizer_.encode(string)

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer_.decode(list(ids))

    def _encode_pair(self, context: str, continuation: str) -> Tuple[List[int], List[int]]:
        """The harness's split (trailing spaces of the context move to the continuation; the
        continuation is what the encoding of context + continuation has beyond the context's), made
        exact where a tokenizer merges across the boundary: the context keeps only the tokens it shares
        with the whole encoding, so the scored sequence is always the encoding of the whole text and
        each of its tokens is scored once."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self.tok_encode(context + continuation)
        context_ids = self.tok_encode(context)
        shared = 0
        for a, b in zip(context_ids, whole):
            if a != b:
                break
            shared += 1
        if shared != len(context_ids):
            self.boundary_merges += 1
        return whole[:shared], whole[shared:]

    def _with_prefix(self, ids: List[int]) -> List[int]:
        """Every scored sequence starts after an end of sentence (as fairseq-generate feeds an LM)."""
        return ids if ids and ids[0] == self.eot_token_id else [self.eot_token_id] + ids

    # -- forward -------------------------------------------------------------------------------
    def _logits(self, tokens, incremental_state=None, continue_stream: bool = False):
        """``tokens``: [B, T] ids -> [B, T, V] logits (model dtype)."""
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
        """``requests``: ((context, continuation), context ids, continuation ids) -> (sum of the
        continuation's log-probs, whether greedy decoding gives the continuation). The sequence read is
        end of sentence + context + continuation; a model with a position limit reads its last
        positions (context dropped from the left, the harness's convention)."""
        rows = []
        for i, (_, context, continuation) in enumerate(requests):
            if not continuation:
                raise ZeroShotError(f"request {i} has an empty continuation: nothing to score")
            if self.max_length is not None and len(continuation) > self.max_length:
                raise ZeroShotError(
                    f"request {i}: its continuation has {len(continuation)} tokens, more than the model's "
                    f"{self.max_length} positions: it cannot be scored in one window"
                )
            full = self._with_prefix(list(context)) + list(continuation)
            if self.max_length is not None and len(full) - 1 > self.max_length:
                full = full[-(self.max_length + 1):]
            rows.append((full[:-1], full[1:], len(continuation)))
        return self._score_rows(rows)

    def _score_rows(self, rows) -> List[Tuple[float, bool]]:
        """``rows``: (inputs, targets, n) -> (sum of log p of the last n targets, all of them greedy).
        Longest first, ``batch_size`` rows per forward, right padded (causal: padding is never read)."""
        import torch

        results: List[Optional[Tuple[float, bool]]] = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        pad = self.dictionary.pad()
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            width = len(rows[batch[0]][0])
            tokens = torch.full((len(batch), width), pad, dtype=torch.long)
            for b, i in enumerate(batch):
                tokens[b, :len(rows[i][0])] = torch.tensor(rows[i][0])
            logits = self._logits(tokens.to(self._device))
            for b, i in enumerate(batch):
                inputs, targets, n = rows[i]
                lp = self._log_probs(logits[b, len(inputs) - n:len(inputs)])
                target = torch.tensor(targets[-n:], device=lp.device)
                score = lp.gather(-1, target[:, None]).sum().item()
                greedy = bool((lp.argmax(-1) == target).all().item())
                results[i] = (score, greedy)
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
        return [self.rolling_log_likelihood(self.tok_encode(req.args[0])) for req in requests]

    def rolling_log_likelihood(self, ids: List[int]) -> float:
        """Sum of log p(token | everything before it, after an end of sentence) over ``ids``.
        Recurrent models: chunks of ``rolling_chunk`` tokens, state carried (the whole past). Models
        with a position limit: the harness's disjoint windows of ``max_length`` positions."""
        import torch

        if not ids:
            return 0.0
        if not self.recurrent:
            from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

            rows = []
            for context, targets in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=ids, prefix_token=self.eot_token_id, max_seq_len=self.max_length, context_len=1)):
                full = context + targets
                rows.append((full[:-1], full[1:], len(targets)))
            return sum(score for score, _ in self._score_rows(rows))
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
        """Greedy continuation of ``context`` (see the module docstring for when it stops). The padding
        symbol is never generated (as in fairseq's SequenceGenerator)."""
        import torch

        if do_sample and temperature not in (0, 0.0, None):
            raise ZeroShotError("generate_until: only greedy decoding is implemented (do_sample=False)")
        until = [until] if isinstance(until, str) else list(until or [])
        budget = int(max_gen_toks or self.max_gen_toks)
        prefix = self._with_prefix(self.tok_encode(context))
        stop_at_eos = "\n" in until
        generated: List[int] = []
        state: Optional[Dict] = {} if self.recurrent else None

        def window(ids):
            ids = ids if self.max_length is None else ids[-self.max_length:]
            return torch.tensor([ids], device=self._device)

        logits = self._logits(window(prefix), incremental_state=state)
        for _ in range(budget):
            scores = logits[0, -1].float().clone()
            scores[self.dictionary.pad()] = float("-inf")
            nxt = int(scores.argmax().item())
            if nxt == self.eot_token_id and stop_at_eos:
                break
            generated.append(nxt)
            text = self.tok_decode(generated)
            if any(u and u in text for u in until):
                break
            if self.recurrent:  # O(1) per token: one new token on top of the carried state
                logits = self._logits(torch.tensor([[nxt]], device=self._device), incremental_state=state,
                                      continue_stream=True)
            else:
                logits = self._logits(window(prefix + generated))
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
    p.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    return p


_TRUE = ("1", "ON", "YES", "TRUE")


def use_offline_hub() -> None:
    """Hugging Face datasets / hub offline for this process (``HF_DATASETS_OFFLINE=1``,
    ``HF_HUB_OFFLINE=1``) unless the environment already says otherwise. Both libraries read these
    variables when first imported, so modules already imported (a caller that used them before) are
    switched too."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    offline = os.environ["HF_DATASETS_OFFLINE"].upper() in _TRUE
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None and hasattr(hub, "HF_HUB_OFFLINE"):
        hub.HF_HUB_OFFLINE = os.environ["HF_HUB_OFFLINE"].upper() in _TRUE
    config = sys.modules.get("datasets.config")
    if config is not None:
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            if hasattr(config, name):
                setattr(config, name, offline)


def _offline_now() -> bool:
    config = sys.modules.get("datasets.config")
    if config is not None and hasattr(config, "HF_DATASETS_OFFLINE"):
        return bool(config.HF_DATASETS_OFFLINE)
    return os.environ.get("HF_DATASETS_OFFLINE", "").upper() in _TRUE


def _task_yamls(include_paths: Sequence[str]) -> Dict[str, Tuple[str, dict]]:
    """{task name: (YAML path, its config)} of the task YAMLs under ``include_paths``. Tags such as
    ``!function`` load as None: only the plain data fields are read here."""
    import yaml

    class _AnyTagLoader(yaml.SafeLoader):
        pass

    _AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)
    found: Dict[str, Tuple[str, dict]] = {}
    for root in include_paths:
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith((".yaml", ".yml")):
                    continue
                path = os.path.join(folder, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        config = yaml.load(f, Loader=_AnyTagLoader)
                except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
                    first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
                    raise ZeroShotError(f"{path}: not a readable task YAML ({first}): fix or remove it") from None
                if isinstance(config, dict) and isinstance(config.get("task"), str):
                    found.setdefault(config["task"], (path, config))
    return found


def _template_field(template) -> Optional[str]:
    """``"{{choices}}"`` -> ``"choices"``; None for anything but a single plain field reference."""
    import re

    match = re.fullmatch(r"\s*\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*", template) if isinstance(template, str) else None
    return match.group(1) if match else None


def _local_data_files(config: dict, yaml_path: str) -> List[str]:
    """The local files a ``dataset_path: json`` task reads (``dataset_kwargs.data_files``: a path, a
    list, or a {split: path or list} mapping)."""
    files = ((config.get("dataset_kwargs") or {}).get("data_files")) if isinstance(config.get("dataset_kwargs"), dict) else None
    if files is None:
        raise ZeroShotError(f"{yaml_path}: dataset_path json without dataset_kwargs.data_files: name the JSONL file(s)")
    values = list(files.values()) if isinstance(files, dict) else [files]
    paths: List[str] = []
    for value in values:
        paths.extend(value if isinstance(value, list) else [value])
    return [str(p) for p in paths]


def check_local_task_file(path: str, choices_field: Optional[str], label_field: Optional[str]) -> int:
    """Check a local JSON-lines task file before anything is scored: every non-blank line one JSON
    object; with ``choices_field``/``label_field`` (the task's ``doc_to_choice``/``doc_to_target``
    fields), a non-empty list of choices and a label indexing them (or equal to one of them).
    Returns the number of items; raises ``ZeroShotError`` naming the file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise ZeroShotError(f"{path}: task data file not found (relative paths are read from the current "
                            f"directory): write it, or fix data_files in the task YAML") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ZeroShotError(f"{path}: cannot be read as UTF-8 text ({type(e).__name__}): write it as JSON lines") from None
    entries: List[Tuple[str, object]] = []
    text = "\n".join(lines)
    if text.lstrip().startswith("["):  # a .json file holding one array of items, which datasets also reads
        try:
            entries = [(f"{path} item {i}", doc) for i, doc in enumerate(json.loads(text))]
        except ValueError as e:
            raise ZeroShotError(f"{path}: not valid JSON ({e}): one JSON object per line, or one array") from None
    else:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entries.append((f"{path} line {number}", json.loads(line)))
            except ValueError as e:
                raise ZeroShotError(f"{path} line {number}: not valid JSON ({e}): one JSON object per line") from None
    items = 0
    for where, doc in entries:
        if not isinstance(doc, dict):
            raise ZeroShotError(f"{where}: a JSON {type(doc).__name__}, not an object: one JSON object per line")
        items += 1
        if choices_field is None:
            continue
        choices = doc.get(choices_field)
        if not isinstance(choices, list) or not choices:
            raise ZeroShotError(f"{where}: no choices ('{choices_field}' is {choices!r}): give a non-empty "
                                f"list of choices")
        if label_field is None:
            continue
        if label_field not in doc:
            raise ZeroShotError(f"{where}: no label ('{label_field}' missing): give the index of the right choice")
        label = doc[label_field]
        if isinstance(label, str) and label.strip().lstrip("-").isdigit():
            label = int(label)
        if isinstance(label, bool) or not (isinstance(label, int) and 0 <= label < len(choices)
                                           or isinstance(label, str) and label in choices):
            raise ZeroShotError(f"{where}: label {doc[label_field]!r} is out of range for its {len(choices)} "
                                f"choices: give an index from 0 to {len(choices) - 1}")
    if not items:
        raise ZeroShotError(f"{path}: no items (the file is empty): write one JSON object per line")
    return items


def check_local_tasks(names: Sequence[str], include_paths: Sequence[str]) -> None:
    """Validate the local data of every requested task defined in ``include_paths`` with
    ``dataset_path: json`` (what ``write_local_multiple_choice_task`` writes), before the harness
    loads it: a bad line would otherwise be scored, or fail later under a misleading cause."""
    yamls = _task_yamls(include_paths)
    for name in names:
        if name not in yamls:
            continue
        yaml_path, config = yamls[name]
        if config.get("dataset_path") != "json":
            continue
        multiple_choice = config.get("output_type") == "multiple_choice"
        choices_field = _template_field(config.get("doc_to_choice")) if multiple_choice else None
        label_field = _template_field(config.get("doc_to_target")) if choices_field else None
        for path in _local_data_files(config, yaml_path):
            check_local_task_file(path, choices_field, label_field)


def load_tasks(names: Sequence[str], include_paths: Sequence[str]):
    """The harness's task manager and task dict for ``names``. Tasks all found in ``include_paths``
    are loaded without indexing the harness's own ~15,000 task files; a task whose data cannot be had
    is named in the error, with how to make its data available."""
    from lm_eval.tasks import TaskManager, get_task_dict

    check_local_tasks(names, include_paths)
    manager = None
    if include_paths:
        local = TaskManager(include_path=list(include_paths), include_defaults=False)
        if all(n in local.all_tasks for n in names):
            manager = local
    manager = manager or TaskManager(include_path=list(include_paths) or None)
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
            first_line = next((line for line in str(e).splitlines() if line.strip()), "")[:200]
            raise ZeroShotError(
                f"task {name}: its data could not be loaded ({type(e).__name__}: {first_line})"
                + (": it is not in the local Hugging Face cache and this run is offline; load it once on a "
                   "machine with network (python -c \"import lm_eval.tasks as t; t.get_task_dict(['" + name
                   + "'])\"), copy the Hugging Face cache (~/.cache/huggingface, or $HF_HOME) here, or define "
                   "the task from local JSONL files (docs/zero_shot.md) and pass --include-path"
                   if _offline_now() else
                   ": check the network, or define the task from local JSONL files (docs/zero_shot.md) and pass "
                   "--include-path")
            ) from None
    return manager, tasks


# Column names of the papers' tables for the harness's task names.
PAPER_COLUMNS = {"piqa": "PIQA", "hellaswag": "HS", "winogrande": "WG", "arc_easy": "ARC-e",
                 "arc_challenge": "ARC-c", "openbookqa": "OBQA", "boolq": "BoolQ", "wsc": "WSC", "wic": "WIC",
                 "rte": "RTE", "cb": "CB", "multirc": "MultiRC", "copa": "COPA"}


class PaperRow(NamedTuple):
    model: str
    params: str  # billions, as the paper writes it
    values: Tuple[str, ...]  # one per task of its table, as printed
    avg: str  # the paper's AVG, over its table's tasks


class PaperTable(NamedTuple):
    source: str
    tasks: Tuple[str, ...]
    rows: Tuple[PaperRow, ...]


_TABLE6 = ("piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
# The papers' zero-shot rows as published (lm-evaluation-harness; every model trained on 100B tokens):
# HGRN (NeurIPS 2023) Tables 4 and 5, HGRN2 (2024) Table 6 with its ~1.3B peers.
PAPER_HGRN: Tuple[PaperTable, ...] = (
    PaperTable("HGRN paper, Table 4", COMMONSENSE_TASKS, (
        PaperRow("HGRN", "0.15", ("59.91", "65.02", "33.33", "50.20", "46.68", "23.81", "28.60"), "43.94"),
        PaperRow("HGRN", "0.35", ("59.05", "66.70", "38.12", "51.70", "49.20", "25.26", "30.60"), "45.80"),
        PaperRow("HGRN", "1", ("58.69", "70.89", "48.02", "51.62", "55.64", "27.90", "31.60"), "49.19"),
    )),
    PaperTable("HGRN paper, Table 5", SUPERGLUE_TASKS, (
        PaperRow("HGRN", "0.15", ("38.46", "51.10", "56.68", "42.86", "1.47", "59.91", "65.00"), "45.07"),
        PaperRow("HGRN", "0.35", ("38.46", "50.16", "52.71", "51.79", "1.99", "59.05", "73.00"), "46.74"),
        PaperRow("HGRN", "1", ("40.38", "50.78", "53.43", "42.86", "3.04", "58.69", "70.00"), "45.60"),
    )),
    PaperTable("HGRN2 paper, Table 6", _TABLE6, (
        PaperRow("HGRN1", "0.15", ("65.02", "33.33", "50.20", "46.68", "23.81", "28.60"), "41.27"),
        PaperRow("HGRN2", "0.15", ("66.43", "35.44", "51.70", "46.63", "24.32", "28.40"), "42.15"),
        PaperRow("HGRN1", "0.35", ("66.70", "38.12", "51.70", "49.20", "25.26", "30.60"), "43.60"),
        PaperRow("HGRN2", "0.39", ("69.97", "46.16", "52.72", "53.58", "23.98", "32.40"), "46.47"),
        PaperRow("HGRN1", "1.0", ("70.89", "48.02", "51.62", "55.64", "27.90", "31.60"), "47.61"),
        PaperRow("HGRN2", "1.0", ("74.16", "54.85", "56.12", "58.71", "27.22", "34.00"), "50.84"),
        PaperRow("HGRN2", "2.9", ("74.59", "59.92", "57.46", "62.58", "29.86", "35.00"), "53.24"),
        PaperRow("GLA", "1.3", ("71.90", "49.90", "54.40", "61.80", "28.40", "34.20"), "50.10"),
        PaperRow("Mamba", "1.3", ("71.40", "51.20", "54.10", "60.10", "30.40", "33.80"), "50.20"),
        PaperRow("RetNet", "1.3", ("69.80", "47.50", "51.10", "58.50", "27.40", "31.80"), "47.68"),
    )),
)
PAPER_CAVEAT = ("Papers' rows: as published (HGRN paper Tables 4 and 5, HGRN2 paper Table 6; 100B training tokens "
                "each; models of 0.15-2.9B parameters, so context rather than a target for this checkpoint). The "
                "papers do not say whether a column is acc or acc_norm; the usual convention (also fla's README) "
                "is acc_norm for HellaSwag and ARC-c, acc for the rest. '-': not in that paper's table.")
PAPER_AVG_NOTE = "*: the paper's AVG over its own table's tasks, which are not this table's columns."


def paper_rows(tasks: Sequence[str]) -> List[str]:
    """The markdown rows of ``PAPER_HGRN`` for ``tasks``: every row of each table that holds more than
    half of them (so BoolQ alone does not bring the SuperGLUE table into the commonsense one), its value
    per task ('-' where its table lacks the task) and the paper's AVG (marked ``*`` where the table's tasks
    are not exactly ``tasks``)."""
    lines = []
    for table in PAPER_HGRN:
        if 2 * len(set(tasks) & set(table.tasks)) <= len(set(tasks)):
            continue
        same = set(tasks) == set(table.tasks)
        for row in table.rows:
            by_task = dict(zip(table.tasks, row.values))
            cells = [by_task.get(name, "-") for name in tasks] + [row.avg if same else row.avg + "*"]
            lines.append(f"| {row.model} {row.params}B ({table.source}) | " + " | ".join(cells) + " |")
    return lines


def results_table(results: Dict, tasks: Sequence[str], label: str = "this checkpoint") -> str:
    """Markdown in the papers' layout: a column per task (the paper's names) and AVG; rows: this
    checkpoint's acc and acc_norm as the harness reports them (x100; '-' where a task has no such
    metric; AVG only when every task has it), then the papers' rows for these tasks (``paper_rows``)
    and the caveat on acc / acc_norm."""
    per_task = results.get("results", {})

    def metric_row(key: str) -> List[str]:
        values = []
        for name in tasks:
            r = per_task.get(name, {})
            v = r.get(f"{key},none", r.get(key))
            values.append(100 * v if isinstance(v, (int, float)) else None)
        avg = sum(values) / len(values) if values and all(v is not None for v in values) else None
        return [f"{v:.2f}" if v is not None else "-" for v in values + [avg]]

    papers = paper_rows(tasks)
    lines = ["| model | " + " | ".join(PAPER_COLUMNS.get(n, n) for n in tasks) + " | AVG |",
             "|---|" + "---|" * (len(tasks) + 1),
             f"| {label}: acc | " + " | ".join(metric_row("acc")) + " |",
             f"| {label}: acc_norm | " + " | ".join(metric_row("acc_norm")) + " |"] + papers
    if papers:
        lines.append("\n" + PAPER_CAVEAT)
        if any(line.endswith("* |") for line in papers):
            lines.append(PAPER_AVG_NOTE)
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if _HARNESS_ERROR is not None:
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    if not args.online:
        use_offline_hub()
    import logging

    # importing fairseq leaves the root logger at DEBUG: keep Hugging Face datasets' import chatter
    # off stderr, where an error is one line
    logging.getLogger("datasets").setLevel(logging.WARNING)
    import lm_eval

    names = [t for t in args.tasks.split(",") if t]
    try:
        # the inputs first (local task files, then the checkpoint and data): loading the harness's tasks
        # takes a while and fails on its own terms
        check_local_tasks(names, args.include_path)
        if not os.path.isfile(args.path):
            raise ZeroShotError(f"--path {args.path}: checkpoint not found")
        if args.data is not None and not os.path.isfile(os.path.join(args.data, "dict.txt")):
            raise ZeroShotError(f"--data {args.data}: {os.path.join(args.data, 'dict.txt')} not found")
        manager, tasks = load_tasks(names, args.include_path)
        model = HgrnFairseqLM(path=args.path, data=args.data, batch_size=args.batch_size,
                              rolling_chunk=args.rolling_chunk, device=args.device, dtype=args.dtype,
                              tokenizer=args.tokenizer, spm_model=args.spm_model, gpt2_dir=args.gpt2_dir,
                              trust_checkpoint=args.trust_checkpoint)
    except (ZeroShotError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        results = lm_eval.simple_evaluate(model=model, tasks=names, task_manager=manager,
                                          num_fewshot=args.num_fewshot, limit=args.limit, batch_size=args.batch_size,
                                          log_samples=False, random_seed=args.seed, numpy_random_seed=args.seed,
                                          torch_random_seed=args.seed, fewshot_random_seed=args.seed)
    except ZeroShotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(results_table(results, names))
    report = model.token_report()
    print(f"tokens: {report['symbols']} symbols encoded, {report['unknown_symbols']} not in the dictionary (scored "
          f"as <unk>), {report['boundary_merges']} context/continuation pairs merged at the boundary (split exactly)")
    if args.output:
        payload = {"model": {k: str(v) for k, v in model.info.items()}, "tokens": report,
                   "results": results.get("results", {}), "n_samples": results.get("n-samples", {}),
                   "versions": results.get("versions", {}), "table": results_table(results, names)}
        tmp = args.output + ".tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1, default=str)
        os.replace(tmp, args.output)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
