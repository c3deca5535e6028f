"""``mqar``: multi-query associative recall (Zoology; HGRN2 paper Fig. 3), generated in memory.

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

One example of length ``seq_len`` (task tokens; the fairseq dictionary adds its 4 specials in front)::

    k1 v1 k2 v2 ... kN vN | _ _ k2 _ _ k1 _ _ _ _ kN _ _ ...
    '--- N pairs -------'   '--- every key queried once; its value is the target there ---'

* token 0 ``_`` is a blank filler; keys are drawn from the lower half of the vocabulary
  (``1 .. (V-1)//2``), values from the upper half; the N keys of an example are distinct, and so
  are its N values;
* after the 2N context tokens come ``(seq_len - 2N) // 2`` two-token slots; N of them, drawn
  without replacement with probability proportional to ``(slot + 1) ** (power_a - 1)`` (Zoology's
  power law, so queries cluster near the context), hold a key in their first position, the N keys
  in a fresh random order; every other position is blank;
* the target of a query position (the key) is its value, so the task is next-token prediction
  scored at the N query positions only; every other target is padding, ignored by the loss. Use
  ``--criterion mqar_cross_entropy`` for the accuracy.

This is Zoology's ``multiquery_ar`` with ``random_non_queries=False``, the configuration of the
HGRN2 paper's Fig. 3 (OpenNLPLab's Zoology configs): the value is never shown after its query.
``--reveal-answers`` puts it there (``... k2 v2 _ k1 v1 ...``). That layout leaks: by the j-th
query, j of the N values have been shown as answers, so a model that only knows the set of the
example's values and guesses among the ones not shown yet scores ``mean_j 1/(N - j)`` (21.1% at
16 pairs) without any recall (docs/mqar.md, Findings; ``scripts/mqar_diagnose.py`` measures it).

Splits: ``train`` has ``--train-size`` examples; ``valid`` and ``test`` are the same held-out set of
``--test-size`` examples. Each is a pure function of (``--data-seed``, split, options), drawn
from its own random stream, so train and test differ and every run sees the same data.
"""

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task

logger = logging.getLogger(__name__)

BLANK = 0  # task token of the filler
SPLIT_STREAMS = {"train": 0, "valid": 1, "test": 1}  # valid and test: the same held-out set


class MqarExamples(NamedTuple):
    """A batch of generated examples, in task tokens (0 .. vocab_size - 1).

    inputs: ``[n, seq_len]`` model inputs (int16 or int32).
    query_positions: ``[n, N]`` int64, ascending: where the queried keys sit in ``inputs``.
    answers: ``[n, N]`` int64: the value the model must predict at each query position.
    """

    inputs: np.ndarray
    query_positions: np.ndarray
    answers: np.ndarray


def key_range(vocab_size: int):
    """``[low, high)`` of the key tokens: the lower half of the vocabulary after the blank."""
    return 1, 1 + (vocab_size - 1) // 2


def value_range(vocab_size: int):
    """``[low, high)`` of the value tokens: the upper half of the vocabulary."""
    return 1 + (vocab_size - 1) // 2, vocab_size


def check_mqar_options(vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float = 0.01) -> None:
    """Raise a ValueError naming the option, its value and what is needed."""
    if num_kv_pairs < 1:
        raise ValueError(f"mqar: --num-kv-pairs={num_kv_pairs} is invalid: it must be >= 1")
    if vocab_size < 3:
        raise ValueError(f"mqar: --vocab-size={vocab_size} is invalid: it must be >= 3 (blank, key, value)")
    if not power_a > 0:
        raise ValueError(f"mqar: --power-a={power_a} is invalid: it must be > 0 (Zoology uses 0.01)")
    klo, khi = key_range(vocab_size)
    vlo, vhi = value_range(vocab_size)
    if num_kv_pairs > khi - klo or num_kv_pairs > vhi - vlo:
        raise ValueError(
            f"mqar: --num-kv-pairs={num_kv_pairs} needs {num_kv_pairs} distinct keys and values, but "
            f"--vocab-size={vocab_size} has only {khi - klo} keys (tokens {klo}..{khi - 1}) and "
            f"{vhi - vlo} values (tokens {vlo}..{vhi - 1}): raise --vocab-size to at least "
            f"{2 * num_kv_pairs + 1} or lower --num-kv-pairs"
        )
    if seq_len < 4 * num_kv_pairs:
        raise ValueError(
            f"mqar: --num-kv-pairs={num_kv_pairs} does not fit --seq-len={seq_len}: the {num_kv_pairs} "
            f"pairs and their {num_kv_pairs} query/answer pairs need --seq-len >= 4 * num_kv_pairs = "
            f"{4 * num_kv_pairs}"
        )


def _distinct_draws(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
    """``[n, k]`` int64: per row, k distinct integers of ``[low, high)`` in uniformly random order."""
    span = high - low
    if k * (k - 1) <= span:
        # Few collisions (acceptance >= exp(-1/2)): draw with replacement, redraw rows with a repeat.
        out = rng.integers(0, span, size=(n, k))
        while True:
            s = np.sort(out, axis=1)
            bad = np.nonzero((s[:, 1:] == s[:, :-1]).any(axis=1))[0]
            if bad.size == 0:
                break
            out[bad] = rng.integers(0, span, size=(bad.size, k))
    else:
        # The k smallest of span uniforms, ordered by their value: a uniformly random ordered subset.
        u = rng.random((n, span))
        idx = np.argpartition(u, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(u, idx, axis=1), axis=1)
        out = np.take_along_axis(idx, order, axis=1)
    return out + low


def generate_mqar(
    num_examples: int,
    vocab_size: int = 8192,
    seq_len: int = 256,
    num_kv_pairs: int = 16,
    seed: int = 1,
    split: str = "train",
    power_a: float = 0.01,
    chunk_size: int = 8192,
    reveal_answers: bool = False,
) -> MqarExamples:
    """Generate ``num_examples`` MQAR examples; a pure function of all its arguments.

    ``split`` picks the random stream (``train``; ``valid`` and ``test`` share the held-out one).
    The layout is in the module docstring; ``reveal_answers`` writes each query's value right after
    it (the leaking layout). The random draws do not depend on it: both layouts of one seed
    have the same pairs, query slots and order.
    """
    check_mqar_options(vocab_size, seq_len, num_kv_pairs, power_a)
    if num_examples < 0:
        raise ValueError(f"mqar: num_examples={num_examples} is invalid: it must be >= 0")
    if split not in SPLIT_STREAMS:
        raise ValueError(f"mqar: split={split!r} is not one of {sorted(SPLIT_STREAMS)}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, SPLIT_STREAMS[split]]))
    n_pairs, context = num_kv_pairs, 2 * num_kv_pairs
    num_slots = (seq_len - context) // 2
    log_w = (power_a - 1.0) * np.log(np.arange(1, num_slots + 1, dtype=np.float64))
    dtype = np.int16 if vocab_size + 8 <= np.iinfo(np.int16).max else np.int32

    inputs = np.full((num_examples, seq_len), BLANK, dtype=dtype)
    query_positions = np.empty((num_examples, n_pairs), dtype=np.int64)
    answers = np.empty((num_examples, n_pairs), dtype=np.int64)
    for start in range(0, num_examples, chunk_size):
        n = min(chunk_size, num_examples - start)
        rows = np.arange(n)[:, None]
        keys = _distinct_draws(rng, n, *key_range(vocab_size), n_pairs)
        values = _distinct_draws(rng, n, *value_range(vocab_size), n_pairs)
        # Weighted sampling of N slots without replacement: the N largest log-weight + Gumbel.
        scores = log_w + rng.gumbel(size=(n, num_slots))
        slots = np.sort(np.argpartition(-scores, n_pairs - 1, axis=1)[:, :n_pairs], axis=1)
        order = np.argsort(rng.random((n, n_pairs)), axis=1)  # which pair each query asks for
        qpos = context + 2 * slots

        block = inputs[start : start + n]
        block[:, 0:context:2] = keys
        block[:, 1:context:2] = values
        block[rows, qpos] = np.take_along_axis(keys, order, axis=1)
        asked = np.take_along_axis(values, order, axis=1)
        if reveal_answers:
            block[rows, qpos + 1] = asked
        query_positions[start : start + n] = qpos
        answers[start : start + n] = asked
    return MqarExamples(inputs, query_positions, answers)


def build_mqar_dictionary(vocab_size: int) -> Dictionary:
    """fairseq's 4 specials, then task token t as symbol ``str(t)`` at index ``nspecial + t``."""
    dictionary = Dictionary()
    for token in range(vocab_size):
        dictionary.add_symbol(str(token))
    return dictionary


class MqarDataset(FairseqDataset):
    """Generated examples as a fairseq dataset; targets are padding except at query positions.

    A batch: ``net_input.src_tokens`` ``[B, seq_len]``, ``target`` ``[B, seq_len]`` (pad but at the
    queries), ``ntokens`` = the number of scored (query) targets.
    """

    def __init__(self, examples: MqarExamples, dictionary: Dictionary, shuffle: bool):
        self.examples = examples
        self.offset = dictionary.nspecial
        self.pad = dictionary.pad()
        self.shuffle = shuffle
        n, seq_len = examples.inputs.shape
        self.sizes = np.full(n, seq_len, dtype=np.int64)

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, index):
        ex = self.examples
        source = torch.from_numpy(ex.inputs[index].astype(np.int64) + self.offset)
        target = torch.full_like(source, self.pad)
        target[torch.from_numpy(ex.query_positions[index])] = torch.from_numpy(ex.answers[index] + self.offset)
        return {"id": index, "source": source, "target": target}

    def collater(self, samples):
        if len(samples) == 0:
            return {}
        source = torch.stack([s["source"] for s in samples])
        target = torch.stack([s["target"] for s in samples])
        return {
            "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
            "nsentences": len(samples),
            "ntokens": int(target.ne(self.pad).sum()),
            "net_input": {
                "src_tokens": source,
                "src_lengths": torch.full((len(samples),), source.size(1), dtype=torch.long),
            },
            "target": target,
        }

    def num_tokens(self, index):
        return int(self.sizes[index])

    def num_tokens_vec(self, indices):
        return self.sizes[indices]

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        # fairseq seeds numpy with (seed + epoch) around this call: a new order every epoch.
        return np.random.permutation(len(self)) if self.shuffle else np.arange(len(self))

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return not self.shuffle  # rebuild the training batches each epoch (new order, new batches)

    @property
    def supports_prefetch(self):
        return False


@dataclass
class MqarConfig(FairseqDataclass):
    vocab_size: int = field(default=8192, metadata={"help": "task vocabulary: blank, keys, values"})
    seq_len: int = field(default=256, metadata={"help": "length of every example"})
    num_kv_pairs: int = field(default=16, metadata={"help": "key-value pairs (and queries) per example"})
    train_size: int = field(default=100_000, metadata={"help": "training examples"})
    test_size: int = field(default=3_000, metadata={"help": "held-out examples (the valid and test splits)"})
    data_seed: int = field(default=1, metadata={"help": "seed of the generator (the model's is --seed)"})
    power_a: float = field(
        default=0.01, metadata={"help": "query slots drawn with probability ~ (slot+1)^(power_a-1)"}
    )
    reveal_answers: bool = field(
        default=False,
        metadata={"help": "write each query's value right after it in the input (a leaking layout: "
                  "it lets a model score mean_j 1/(N-j) by elimination, 21%% at 16 pairs, without recall). "
                  "Default: Zoology's layout, the value is only the target"},
    )


@register_task("mqar", dataclass=MqarConfig)
class MqarTask(FairseqTask):
    """Multi-query associative recall on synthetic data; see the module docstring."""

    def __init__(self, cfg: MqarConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def setup_task(cls, cfg: MqarConfig, **kwargs):
        check_mqar_options(cfg.vocab_size, cfg.seq_len, cfg.num_kv_pairs, cfg.power_a)
        for name in ("train_size", "test_size"):
            if getattr(cfg, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"mqar: {flag}={getattr(cfg, name)} is invalid: it must be >= 1")
        chance = chance_accuracy(cfg.vocab_size)
        logger.info(
            f"mqar: vocab {cfg.vocab_size}, seq_len {cfg.seq_len}, {cfg.num_kv_pairs} kv pairs, "
            f"{cfg.train_size} train / {cfg.test_size} test examples, data seed {cfg.data_seed}, "
            f"{'answers shown after the queries (--reveal-answers)' if cfg.reveal_answers else 'Zoology layout'} "
            f"(chance accuracy {100 * chance:.3g}%)"
        )
        return cls(cfg, build_mqar_dictionary(cfg.vocab_size))

    def load_dataset(self, split: str, epoch=1, combine=False, **kwargs):
        if split not in SPLIT_STREAMS:
            raise ValueError(
                f"mqar: split {split!r} does not exist: the task generates 'train', and 'valid' / 'test' "
                f"(the same held-out set); pass one of those to --valid-subset / --gen-subset"
            )
        cfg = self.cfg
        n = cfg.train_size if split == "train" else cfg.test_size
        examples = generate_mqar(
            n, cfg.vocab_size, cfg.seq_len, cfg.num_kv_pairs, cfg.data_seed, split, cfg.power_a,
            reveal_answers=cfg.reveal_answers,
        )
        self.datasets[split] = MqarDataset(examples, self.dictionary, shuffle=split == "train")
        logger.info(f"mqar: generated {n} {split} examples")

    def max_positions(self):
        return self.cfg.seq_len

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


def chance_accuracy(vocab_size: int) -> float:
    """Accuracy of guessing a value uniformly: ``1 / number of value tokens``."""
    low, high = value_range(vocab_size)
    return 1.0 / (high - low)


__all__ = [
    "BLANK",
    "MqarExamples",
    "MqarDataset",
    "MqarTask",
    "MqarConfig",
    "build_mqar_dictionary",
    "chance_accuracy",
    "check_mqar_options",
    "generate_mqar",
    "key_range",
    "value_range",
]
