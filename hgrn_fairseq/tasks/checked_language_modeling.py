"""``hgrn_language_modeling``: fairseq's ``language_modeling`` task with its silent failure modes
turned into clear errors.

Same options and data format as ``language_modeling``, plus:

* a missing data directory, dictionary or split is reported with the file it looked for and how
  to make it (``fairseq-preprocess``);
* a training split with fewer tokens than ``--tokens-per-sample`` is refused;
* samples longer than the model's ``max_positions()`` are never skipped in silence: fairseq's
  ``eval_lm`` asks tasks to *ignore* them, we raise instead, naming the fix.
"""

import logging
import os

import numpy as np
from fairseq import utils
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

logger = logging.getLogger(__name__)

PREPROCESS_HINT = (
    "binarise your text with: fairseq-preprocess --only-source --trainpref train.txt "
    "--validpref valid.txt --testpref test.txt --destdir DATA_DIR"
)


class DataError(ValueError):
    """Input data that cannot be used as asked; the message names the problem and the fix."""


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
class CheckedLanguageModelingTask(LanguageModelingTask):
    @classmethod
    def setup_task(cls, args, **kwargs):
        check_data_dir(args.data)
        return super().setup_task(args, **kwargs)

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
