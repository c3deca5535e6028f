"""Long Range Arena tasks: ``lra_text`` (ListOps, Text, Retrieval) and ``lra_image``
(Image, Pathfinder, Path-X), reading the directories ``data_prep/prepare_lra.py`` writes
(``tasks/lra_format.py``).

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

* Before anything trains, ``setup_task`` validates the whole directory (``lra_format.validate``: one
  line per problem, naming the file and the fix); ``build_model`` refuses an arch whose maximum
  length is shorter than the data's (the data prep truncates explicitly and counts it).
* Token batches are padded with the dictionary's pad to the longest sequence of the batch; for
  Retrieval both documents are padded to their common maximum. ``--append-eos`` (``lra_text``; off in
  the task, on in the LRA recipe: scripts/lra_recipes.py) ends every sequence (both documents of a pair)
  with the dictionary's end-of-sequence token, as the official HGRN LRA harness does: one learned,
  unmasked token after each example (docs/lra.md, Findings); the task's maximum length grows by
  one, and checkpoints record the option (evaluation follows them). Pixel batches are ``[B, H*W, C]``
  floats, normalised per task: CIFAR-10 RGB with the usual per-channel mean/std, grayscale CIFAR
  with LRA's (122.6/255, 61.0/255), Pathfinder / Path-X with mean 0.5, std 0.5. ``--augment``
  (Image, as the HGRN runs did): random crop after zero-padding 4 pixels and a horizontal flip with
  probability 0.5 on the training split, drawn from a generator seeded by (seed, epoch, index), so
  a resumed run sees the same images.
* Every example of an evaluated split is scored: batches are built with
  ``required_batch_size_multiple=1`` and no remainder is skipped, and ``get_batch_iterator`` checks
  that the batches of a valid/test split cover each example exactly once (else an error). The
  criterion (``classification_accuracy``) logs the number of examples it scored (summed over GPUs), and
  ``post_validate`` raises when that differs from the split's size (e.g. with ``--max-valid-steps``).
"""

import logging
import os
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset, data_utils
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..data_checks import DataError, RecordsDataInCheckpoints, symbols_fingerprint
from . import lra_format

logger = logging.getLogger(__name__)

# (mean, std) per channel of the uint8 images scaled to [0, 1]
NORMALISATION = {
    ("image", 3): ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),  # CIFAR-10 RGB
    ("image", 1): ((122.6 / 255.0,), (61.0 / 255.0,)),  # LRA's grayscale CIFAR-10
    ("pathfinder", 1): ((0.5,), (0.5,)),
    ("pathx", 1): ((0.5,), (0.5,)),
}
AUGMENT_PAD = 4


class LraTokenDataset(FairseqDataset):
    """Token sequences (one, or two for Retrieval) and labels. Items are not padded; the collater pads
    to the batch's longest sequence (both documents of a pair to their common maximum), or to a fixed
    ``pad_to`` positions when that is given."""

    def __init__(self, split: lra_format.LraSplit, pad: int, shuffle: bool, name: str, eos: Optional[int] = None,
                 scratch: Optional[Tuple[int, int]] = None, pad_to: int = 0):
        """``eos``: a token id appended to every sequence (``--append-eos``), or None. ``scratch``: (token id,
        count) appended after that (``--scratch-positions``), or None. ``pad_to`` > 0: every batch is padded
        to that many positions (``--pad-to-length``), whatever its longest sequence."""
        self.input0, self.input1 = split.input0, split.input1
        self.labels = split.labels
        self.pad, self.shuffle, self.name, self.eos, self.pad_to = pad, shuffle, name, eos, int(pad_to or 0)
        tail = ([] if eos is None else [eos]) + ([scratch[0]] * scratch[1] if scratch else [])
        self._tail = torch.tensor(tail, dtype=torch.long)  # what every sequence ends with
        sizes = np.asarray(self.input0.sizes, dtype=np.int64)
        if self.input1 is not None:
            sizes = np.maximum(sizes, np.asarray(self.input1.sizes, dtype=np.int64))
        self.sizes = sizes + len(tail)

    def __len__(self):
        return len(self.labels)

    def _tokens(self, seq):
        if not len(self._tail) or not len(seq):  # (an empty one is refused later)
            return seq
        return torch.cat([seq, self._tail.to(seq.dtype)])

    def __getitem__(self, index):
        item = {"id": index, "source": self._tokens(self.input0[index]), "label": int(self.labels[index])}
        if self.input1 is not None:
            item["source1"] = self._tokens(self.input1[index])
        return item

    def _pad(self, seqs, length):
        out = torch.full((len(seqs), length), self.pad, dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = s
        return out

    def collater(self, samples):
        if not samples:
            return {}
        pair = "source1" in samples[0]
        lengths = [len(s["source"]) for s in samples] + ([len(s["source1"]) for s in samples] if pair else [])
        length, shortest = max(lengths), min(lengths)
        if shortest == 0:
            empty = next(s["id"] for s in samples if len(s["source"]) == 0 or (pair and len(s["source1"]) == 0))
            raise ValueError(f"{self.name}: example {empty} has no tokens: every example needs at least one; "
                             f"rerun data_prep/prepare_lra.py on the source data")
        if self.pad_to:
            if length > self.pad_to:
                raise ValueError(f"{self.name}: a sequence of {length} positions is longer than --pad-to-length "
                                 f"{self.pad_to}: give at least the task's maximum length")
            length = self.pad_to
        net_input = {
            "src_tokens": self._pad([s["source"] for s in samples], length),
            "src_lengths": torch.tensor([len(s["source"]) for s in samples], dtype=torch.long),
            # decided here, on the host, so that the model never asks the GPU whether a mask is empty
            "padded": shortest < length,
        }
        ntokens = int(net_input["src_lengths"].sum())
        if pair:
            net_input["src_tokens1"] = self._pad([s["source1"] for s in samples], length)
            net_input["src_lengths1"] = torch.tensor([len(s["source1"]) for s in samples], dtype=torch.long)
            ntokens += int(net_input["src_lengths1"].sum())
        return {
            "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
            "nsentences": len(samples),
            "ntokens": ntokens,
            "net_input": net_input,
            "target": torch.tensor([s["label"] for s in samples], dtype=torch.long),
        }

    def num_tokens(self, index):
        return int(self.sizes[index]) * (2 if self.input1 is not None else 1)

    def num_tokens_vec(self, indices):
        return self.sizes[indices] * (2 if self.input1 is not None else 1)

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        if self.shuffle:  # fairseq seeds numpy with (seed + epoch) around this call
            return np.random.permutation(len(self))
        return np.argsort(self.sizes, kind="stable")  # evaluation: similar lengths together, less padding

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return not self.shuffle

    @property
    def supports_prefetch(self):
        return False


class LraPixelDataset(FairseqDataset):
    """Images ``uint8 [N, H, W, C]`` (memory-mapped) and labels; batches are ``[B, H*W, C]`` floats.

    Pickles by path (DataLoader workers reopen the memory map instead of copying the array)."""

    def __init__(self, path: str, labels: np.ndarray, mean, std, augment: bool, seed: int, name: str):
        self.path, self.labels = path, labels
        self.mean = torch.tensor(mean, dtype=torch.float32)
        self.std = torch.tensor(std, dtype=torch.float32)
        self.augment, self.seed, self.name = augment, seed, name
        self.epoch = 1
        self._pixels = None
        H, W, C = self.pixels.shape[1:]
        self.image_shape = (H, W, C)
        self.sizes = np.full(len(labels), H * W, dtype=np.int64)

    @property
    def pixels(self):
        if self._pixels is None:
            self._pixels = np.load(self.path, mmap_mode="r")
        return self._pixels

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pixels"] = None
        return state

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        img = self.pixels[index]
        if self.augment:
            img = crop_and_flip(img, np.random.default_rng([self.seed, self.epoch, index]))
        return {"id": index, "image": torch.from_numpy(np.array(img)), "label": int(self.labels[index])}

    def collater(self, samples):
        if not samples:
            return {}
        images = torch.stack([s["image"] for s in samples]).float().div_(255.0)
        images = (images - self.mean) / self.std
        B, H, W, C = images.shape
        return {
            "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
            "nsentences": B,
            "ntokens": B * H * W,
            "net_input": {"pixels": images.reshape(B, H * W, C)},
            "target": torch.tensor([s["label"] for s in samples], dtype=torch.long),
        }

    def num_tokens(self, index):
        return int(self.sizes[index])

    def num_tokens_vec(self, indices):
        return self.sizes[indices]

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.random.permutation(len(self)) if self.augment or self.name == "train" else np.arange(len(self))

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return self.name != "train"

    @property
    def supports_prefetch(self):
        return False


def crop_and_flip(img: np.ndarray, rng: np.random.Generator, pad: int = AUGMENT_PAD) -> np.ndarray:
    """Zero-pad ``pad`` pixels on each side of ``img`` [H, W, C], take a random H x W crop, flip it
    left-right with probability 1/2 (torchvision's RandomCrop(padding=4) + RandomHorizontalFlip)."""
    H, W = img.shape[:2]
    padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
    top, left = rng.integers(0, 2 * pad + 1, size=2)
    out = padded[top: top + H, left: left + W]
    if rng.random() < 0.5:
        out = out[:, ::-1]
    return out


@dataclass
class LraConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "data-bin/lra/TASK, written by data_prep/prepare_lra.py"})
    seed: int = II("common.seed")


@dataclass
class LraTextConfig(LraConfig):
    append_eos: bool = field(
        default=False,
        metadata={"help": "end every sequence (both documents of a Retrieval pair) with the dictionary's "
                          "end-of-sequence token, as the official LRA harness does (the LRA recipe sets it; one "
                          "more position: the arch's --max-positions must allow it)"},
    )
    scratch_positions: int = field(
        default=0,
        metadata={"help": "K > 0: append K copies of the dictionary's <s> (unused in LRA data) after every sequence "
                          "(after --append-eos's token): positions that the scans and norms see as part of the "
                          "example, the same for every batch, left out of hgrn_lra's pooling (docs/lra.md, Options; "
                          "an experiment, not the papers' model; K more positions for --max-positions)"},
    )
    pad_to_length: int = field(
        default=0,
        metadata={"help": "N > 0: pad every batch to N positions instead of to its longest sequence, as LRA's own "
                          "input pipeline pads every example to the task's maximum length. With --unmasked-padding "
                          "each example then sees the same padding whatever its batch (its prediction no longer "
                          "depends on the batch); with masked padding it only costs time. At least the task's "
                          "maximum length (the data's max_len plus appended tokens) and at most --max-positions"},
    )


@dataclass
class LraImageConfig(LraConfig):
    augment: bool = field(
        default=False,
        metadata={"help": "training images: random crop after zero-padding 4 pixels, horizontal flip (p 0.5)"},
    )


class _LraTask(RecordsDataInCheckpoints, FairseqTask):
    FINGERPRINT_KEY = "hgrn_lra_data"  # (RecordsDataInCheckpoints: the task-state entry of checkpoints)
    INPUT = ""  # "tokens" or "pixels"

    def __init__(self, cfg, meta, dictionary: Optional[Dictionary]):
        super().__init__(cfg)
        self.meta = meta
        self.dictionary = dictionary

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if not cfg.data:
            raise ValueError(f"{cls.NAME}: no data directory: pass data-bin/lra/TASK (written by "
                             f"data_prep/prepare_lra.py) as the first argument of fairseq-train")
        scratch = getattr(cfg, "scratch_positions", 0)
        if scratch is None or scratch < 0:
            raise ValueError(f"{cls.NAME}: --scratch-positions={scratch} is invalid: give 0 (none) or a positive count")
        meta = lra_format.validate(cfg.data, input_kind=cls.INPUT)
        dictionary = Dictionary.load(lra_format.dict_path(cfg.data)) if cls.INPUT == "tokens" else None
        note = "" if meta.get("comparable", True) else " (NOT comparable with LRA's published numbers: see meta.json)"
        logger.info(f"{cls.NAME}: {meta['task']} from {cfg.data}: splits {meta['splits']}, {meta['num_classes']} "
                    f"classes, max length {meta['max_len']}, truncated {meta.get('truncated', {})}{note}")
        task = cls(cfg, meta, dictionary)
        if cls.INPUT == "tokens":
            check_pad_to_length(task.pad_to_length(), task.max_positions())
        elif task.pad_to_length():
            raise ValueError(f"{cls.NAME}: --pad-to-length is for the token tasks (lra_text); images are full grids, "
                             f"never padded: drop it")
        return task

    def lra_model_inputs(self) -> dict:
        """What ``hgrn_lra`` needs to build itself for this data."""
        meta = self.meta
        info = {"input": meta["input"], "num_classes": meta["num_classes"], "pair": bool(meta.get("pair")),
                "max_len": self.max_positions()}
        if meta["input"] == "tokens":
            info.update(vocab_size=len(self.dictionary), padding_idx=self.dictionary.pad(),
                        appended=self.appended_tokens())
            if self.scratch_positions():
                info["scratch_idx"] = self.dictionary.bos()
            if self.pad_to_length():
                info["pad_to"] = self.pad_to_length()
        else:
            H, W, C = meta["image_shape"]
            info.update(channels=C, grid=(H, W))
        return info

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        if split not in self.meta["splits"]:
            raise ValueError(f"{self.NAME}: split {split!r} is not in {self.cfg.data} (it has "
                             f"{sorted(self.meta['splits'])}); pass one of those to --valid-subset")
        data = lra_format.load_split(self.cfg.data, split, self.meta)
        if len(data) == 0:  # (validate() refuses it too; this guards a directory changed since setup_task)
            raise lra_format.LraDataError(f"{lra_format.label_path(self.cfg.data, split)}: split {split!r} has no "
                                          f"examples; fix: {lra_format.PREPARE_HINT}")
        self.datasets[split] = self._dataset(split, data)
        logger.info(f"{self.NAME}: {split}: {len(self.datasets[split])} examples")

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1, num_shards=1,
                           shard_id=0, num_workers=0, epoch=1, data_buffer_size=0, disable_iterator_cache=False,
                           skip_remainder_batch=False, grouped_shuffling=False, update_epoch_batch_itr=False):
        scored = getattr(dataset, "name", "train") != "train"
        # fairseq validates one subset at a time: post_validate checks the one asked for last. (None for
        # the train split, which --valid-subset train,... also validates: never a stale other subset.)
        self._scored_dataset = dataset if scored else None
        itr = super().get_batch_iterator(
            dataset, max_tokens=max_tokens, max_sentences=max_sentences, max_positions=max_positions,
            ignore_invalid_inputs=False if scored else ignore_invalid_inputs,
            required_batch_size_multiple=1,  # a batch size is a batch size (fairseq's default 8 rounds down)
            seed=seed, num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
            data_buffer_size=data_buffer_size, disable_iterator_cache=disable_iterator_cache,
            skip_remainder_batch=False if scored else skip_remainder_batch,
            grouped_shuffling=grouped_shuffling, update_epoch_batch_itr=update_epoch_batch_itr)
        if scored:
            check_batches_cover(itr.frozen_batches, len(dataset), f"{self.NAME} split {dataset.name}")
        return itr

    def post_validate(self, model, stats, agg):
        """After each validation subset (fairseq-train): the examples scored, summed over all GPUs by the
        criterion's ``examples``, must be the split's size (else e.g. --max-valid-steps cut it short)."""
        dataset, self._scored_dataset = getattr(self, "_scored_dataset", None), None
        if dataset is None or "examples" not in stats:
            return
        if int(stats["examples"]) != len(dataset):
            raise RuntimeError(
                f"{self.NAME}: validation on {dataset.name} scored {int(stats['examples'])} examples but the split has "
                f"{len(dataset)}: every example must be scored (drop --max-valid-steps)")

    def appended_tokens(self) -> int:
        """Tokens the task adds after every sequence (1 with --append-eos, + K with --scratch-positions K)."""
        return (1 if getattr(self.cfg, "append_eos", False) else 0) + self.scratch_positions()

    def scratch_positions(self) -> int:
        return int(getattr(self.cfg, "scratch_positions", 0) or 0)

    def pad_to_length(self) -> int:
        """--pad-to-length (0: each batch to its longest sequence)."""
        return int(getattr(self.cfg, "pad_to_length", 0) or 0)

    def max_positions(self):
        if self.INPUT == "tokens":
            return self.meta["max_len"] + self.appended_tokens()
        return int(np.prod(self.meta["image_shape"][:2]))

    # ---- a checkpoint knows its data (as hgrn_language_modeling's: data_checks.py) --------------------
    def data_fingerprint(self) -> dict:
        meta = self.meta
        record = {"task": meta["task"], "input": meta["input"], "num_classes": meta["num_classes"]}
        if self.dictionary is not None:
            record["dictionary_sha256"] = symbols_fingerprint(self.dictionary.symbols)
            record["dictionary_size"] = len(self.dictionary)
            if getattr(self.cfg, "append_eos", False):  # (recorded only when on: older checkpoints stay valid)
                record["append_eos"] = True
            if self.scratch_positions():
                record["scratch_positions"] = self.scratch_positions()
        else:
            record["image_shape"] = list(meta["image_shape"])
        return record

    def data_description(self) -> str:
        return str(self.cfg.data)

    def check_data_fingerprint(self, trained) -> None:
        given = self.data_fingerprint()
        different = [k for k in sorted(set(trained) | set(given)) if trained.get(k) != given.get(k)]
        if different:
            raise DataError(
                f"{self.NAME}: the checkpoint was trained on other data than {self.cfg.data} (differs in "
                f"{', '.join(different)}: {', '.join(f'{k}={trained.get(k)!r} vs {given.get(k)!r}' for k in different)[:300]}): "
                f"evaluate on data prepared with the training data's dictionary and task"
            )

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


def check_pad_to_length(n: int, longest: int) -> None:
    """--pad-to-length N: 0 (per batch) or at least ``longest`` (the task's maximum length), else one line."""
    if n < 0 or (n and n < longest):
        raise ValueError(f"lra_text: --pad-to-length={n} is invalid: give 0 (pad each batch to its longest "
                         f"sequence) or at least the task's maximum length, {longest}")


def check_batches_cover(batches, n: int, what: str) -> None:
    """Every index 0..n-1 exactly once in ``batches``, else a one-line error."""
    sizes = [len(b) for b in batches]
    if sum(sizes) != n or len(np.unique(np.concatenate([np.asarray(b) for b in batches]) if batches else [])) != n:
        raise RuntimeError(f"{what}: the batches hold {sum(sizes)} examples but the split has {n}; every example "
                           f"must be scored (remove --skip-invalid-size-inputs-valid-test / --max-tokens limits "
                           f"below the longest example)")


@register_task("lra_text", dataclass=LraTextConfig)
class LraTextTask(_LraTask):
    """ListOps, Text (IMDB bytes) and Retrieval (AAN pairs): token ids padded per batch."""

    NAME = "lra_text"
    INPUT = "tokens"

    def _dataset(self, split, data):
        eos = self.dictionary.eos() if self.cfg.append_eos else None
        scratch = (self.dictionary.bos(), self.scratch_positions()) if self.scratch_positions() else None
        return LraTokenDataset(data, self.dictionary.pad(), shuffle=split == "train", name=split, eos=eos,
                               scratch=scratch, pad_to=self.pad_to_length())


@register_task("lra_image", dataclass=LraImageConfig)
class LraImageTask(_LraTask):
    """Image (CIFAR-10), Pathfinder and Path-X: pixel grids, normalised per task."""

    NAME = "lra_image"
    INPUT = "pixels"

    def _dataset(self, split, data):
        H, W, C = self.meta["image_shape"]
        key = (self.meta["task"], C)
        if key not in NORMALISATION:
            raise ValueError(f"lra_image: no normalisation for task {key[0]!r} with {C} channels (known: "
                             f"{sorted(NORMALISATION)}); prepare the data with the channels LRA uses")
        mean, std = NORMALISATION[key]
        return LraPixelDataset(lra_format.pixels_path(self.cfg.data, split), data.labels, mean, std,
                               augment=bool(self.cfg.augment) and split == "train", seed=self.cfg.seed, name=split)


__all__ = ["LraTextTask", "LraImageTask", "LraTokenDataset", "LraPixelDataset", "crop_and_flip", "NORMALISATION",
           "check_batches_cover"]
