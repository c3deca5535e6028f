"""``hgrn_language_modeling``: fairseq's ``language_modeling`` task with its silent failure modes
turned into clear errors.

Same options and data format as ``language_modeling``, plus:

* a missing data directory, dictionary or split is reported with the file it looked for and how
  to make it (``fairseq-preprocess``);
* a training split with fewer tokens than ``--tokens-per-sample`` is refused;
* samples longer than the model's ``max_positions()`` are never skipped in silence: fairseq's
  ``eval_lm`` asks tasks to *ignore* them, we raise instead, naming the fix;
* a ``--max-tokens`` below the longest sample (a block of ``--tokens-per-sample``) is refused before
  batching, naming both options (fairseq caps the positions at ``--max-tokens`` and fails later);
* every split is checked before it is read (``data_checks.check_split``: not empty, ``.bin`` matches its
  index, no token id past the dictionary); ``--tokens-per-sample`` and friends must be >= 1;
* every example of an evaluation split is scored: fairseq's batching drops a last batch smaller than
  ``--required-batch-size-multiple`` (``fairseq-validate --batch-size 8`` scored 2,512 of 2,768
  validation tokens; ``fairseq-generate`` left out the 6 longest of 494 test lines), so splits other
  than the training one are batched with multiple 1 and the batches are counted against the split;
  a training epoch that leaves examples out says how many;
* the checkpoint records the training dictionary's SHA-256 (and the tokenizer of
  ``TOKENIZER_INFO.json``) in its task state; every command that loads the checkpoint with this task
  (``fairseq-eval-lm``, ``-validate``, ``-generate``, ``-interactive``, the extrapolation tool, the
  lm-evaluation-harness model) compares it with the dictionary it is given: a mismatch is an error;
* generation refuses a prompt that fills the length budget (``--max-len-a`` * prompt + ``--max-len-b``,
  capped by the model's positions): fairseq would return the prompt cut to the budget and generate nothing.
"""

import logging
import os

import numpy as np
from fairseq import utils
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from ..data_checks import (DataError, RecordsDataInCheckpoints, check_positive, check_split, compare_fingerprints,
                           data_fingerprint)

logger = logging.getLogger(__name__)

PREPROCESS_HINT = (
    "binarise your text with: fairseq-preprocess --only-source --trainpref train.txt "
    "--validpref valid.txt --testpref test.txt --destdir DATA_DIR"
)


def check_data_dir(data: str) -> str:
    """Return the first data path after checking it holds a dictionary."""
    paths = utils.split_paths(data)
    if not paths:
        raise DataError(f"no data directory given: pass the binarised data directory; {PREPROCESS_HINT}")
    first = paths[0]
    if not os.path.isdir(first):
        raise DataError(f"data directory {first!r} does not exist: {PREPROCESS_HINT}")
    if not os.path.isfile(os.path.join(first, "dict.txt")):
        raise DataError(
            f"dictionary {os.path.join(first, 'dict.txt')!r} is missing: fairseq-preprocess writes it "
            f"(or copy the dict.txt the data was binarised with); {PREPROCESS_HINT}"
        )
    return first


@register_task("hgrn_language_modeling", dataclass=LanguageModelingConfig)
class CheckedLanguageModelingTask(RecordsDataInCheckpoints, LanguageModelingTask):
    @classmethod
    def setup_task(cls, args, **kwargs):
        check_positive("--tokens-per-sample", getattr(args, "tokens_per_sample", None),
                       "the number of tokens per training/evaluation block")
        for name in ("max_target_positions", "max_source_positions"):
            if getattr(args, name, None) is not None:
                check_positive("--" + name.replace("_", "-"), getattr(args, name))
        check_data_dir(args.data)
        return super().setup_task(args, **kwargs)

    # ---- what a checkpoint records about its data ----------------------------------------------
    def data_fingerprint(self):
        data_dir = utils.split_paths(self.args.data)[0]
        return data_fingerprint(data_dir, self.dictionary.symbols, self.dictionary.nspecial)

    def data_description(self) -> str:
        return os.path.join(utils.split_paths(self.args.data)[0], "dict.txt")

    def check_data_fingerprint(self, trained) -> None:
        data_dir = utils.split_paths(self.args.data)[0]
        compare_fingerprints(trained, self.data_fingerprint(), data_dir, "the checkpoint")

    def load_dataset(self, split: str, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.args.data)
        data_path = paths[(epoch - 1) % len(paths)]
        prefix = os.path.join(data_path, split)
        missing = [prefix + ext for ext in (".bin", ".idx") if not os.path.isfile(prefix + ext)]
        if missing:
            raise DataError(
                f"split {split!r} not found: {', '.join(missing)} missing; binarise it with "
                f"fairseq-preprocess (--trainpref/--validpref/--testpref) or choose another split "
                f"with --valid-subset / --gen-subset"
            )
        check_split(prefix, len(self.dictionary))
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        num_tokens = int(np.sum(self.datasets[split].sizes))
        if split.startswith("train") and num_tokens < self.args.tokens_per_sample:
            raise DataError(
                f"split {split!r} has {num_tokens} tokens, fewer than --tokens-per-sample="
                f"{self.args.tokens_per_sample}: lower --tokens-per-sample or use a larger corpus"
            )

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
        if len(ignored) > 0:
            raise DataError(
                f"{len(ignored)} samples are longer than the model's max_positions={max_positions} "
                f"(first: #{ignored[0]} of size {dataset.size(ignored[0])}); fairseq would drop them "
                f"without a word. Lift the model's limit (e.g. --model-overrides "
                f"\"{{'max_target_positions': N}}\") or lower --tokens-per-sample"
            )
        return indices

    # ---- every example of an evaluation split is scored ---------------------------------------------
    def _split_of(self, dataset):
        return next((name for name, ds in self.datasets.items() if ds is dataset), None)

    def get_batch_iterator(self, dataset, *args, **kwargs):
        split = self._split_of(dataset)
        check_max_tokens(kwargs.get("max_tokens", args[0] if args else None), dataset, split,
                         getattr(self.args, "tokens_per_sample", None))
        # fairseq names training splits train, train1, ... (--train-subset); anything else is evaluated
        training = split is not None and split.startswith("train")
        if not training:
            # fairseq's batch_by_size drops a last batch smaller than the multiple
            kwargs["required_batch_size_multiple"] = 1
        itr = super().get_batch_iterator(dataset, *args, **kwargs)
        batches = getattr(itr, "frozen_batches", None)
        if batches is not None:
            covered = sum(len(b) for b in batches)
            if covered != len(dataset):
                left = len(dataset) - covered
                if not training:
                    raise DataError(
                        f"{left} of {len(dataset)} examples of split {split or '?'!r} are in no batch: every "
                        f"example of an evaluation split must be scored; report this with the command line"
                    )
                logger.warning("%d of %d training examples are in no batch this epoch "
                               "(--required-batch-size-multiple drops a last smaller batch)", left, len(dataset))
        return itr

    # ---- generation says what it did ------------------------------------------------------------------
    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        # the prompt as fairseq's LanguageModelingTask.inference_step builds it: the prefix tokens, else the
        # source without its leading begin-of-sentence token (eos, or bos with --add-bos-token)
        dictionary = self.source_dictionary
        bos = dictionary.bos() if getattr(self.args, "add_bos_token", False) else dictionary.eos()
        check_length_budget(generator, sample, prefix_tokens, dictionary.pad(), bos)
        return super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints)


def check_max_tokens(max_tokens, dataset, split, tokens_per_sample) -> None:
    """Refuse a ``--max-tokens`` below the longest sample before batching: fairseq lowers the positions
    limit to it and the refusal would blame the model's positions."""
    sizes = getattr(dataset, "sizes", None)
    if max_tokens is None or sizes is None or len(sizes) == 0:
        return
    longest = int(np.max(sizes))
    if longest > max_tokens:
        raise DataError(
            f"--max-tokens={max_tokens} is smaller than one sample of split {split or '?'!r} ({longest} tokens; "
            f"--tokens-per-sample={tokens_per_sample}): a batch must hold at least one sample; pass --max-tokens "
            f">= {longest} or a smaller --tokens-per-sample"
        )


def check_length_budget(generator, sample, prefix_tokens, pad: int, bos: int) -> None:
    """Refuse prompts that fill the generator's length budget: fairseq caps prompt plus continuation at
    ``min(max_len_a * source length + max_len_b, model positions - 1)`` and would return the prompt cut
    to that budget, with nothing generated."""
    max_len_a, max_len_b = getattr(generator, "max_len_a", None), getattr(generator, "max_len_b", None)
    if max_len_b is None or sample is None or "net_input" not in sample:
        return
    src_tokens = sample["net_input"]["src_tokens"]
    if prefix_tokens is None:
        prompt = src_tokens
        if prompt.size(1) > 0 and bool(prompt[:, 0].eq(bos).all()):
            prompt = prompt[:, 1:]
    else:
        prompt = prefix_tokens
    if prompt.numel() == 0:
        return
    lengths = prompt.ne(pad).sum(dim=1)
    budget = int(max_len_a * src_tokens.size(1) + max_len_b)
    model_cap = getattr(generator, "max_len", None)
    if model_cap:
        budget = min(budget, int(model_cap) - 1)
    longest = int(lengths.max())
    if longest >= budget:
        over = int((lengths >= budget).sum())
        raise DataError(
            f"{over} prompt(s) of up to {longest} tokens fill the length budget of {budget} tokens "
            f"(--max-len-b caps prompt plus continuation, not the continuation alone): nothing would be "
            f"generated and the prompt cut by {longest - budget} tokens; pass --max-len-b <prompt tokens + "
            f"tokens to generate> (e.g. {longest + 100})"
        )
