"""Offline tokenizer: a sentencepiece BPE trained on the train split, pieces ready for fairseq.

This is the tokenizer used when GPT-2's ``encoder.json``/``vocab.bpe`` are not available (the demo
corpus always; WikiText-103 when run offline). Perplexities measured with it are NOT comparable
with the papers' GPT-2 BPE numbers (a different vocabulary changes what one "token" is); the
marker file ``TOKENIZER_INFO.json`` written next to the outputs says so, and data_prep copies it
into the binarised data directory so that every result can be traced to its tokenizer.

Given ``--text-dir`` with ``train.txt`` (and optionally ``valid.txt``, ``test.txt``) this writes to
``--out-dir``:

* ``spm.model`` / ``spm.vocab``: the sentencepiece BPE model, trained on ``train.txt`` only;
* ``{split}.bpe``: every line encoded as space-separated pieces (empty lines stay empty);
* ``dict.txt``: the fairseq dictionary (every piece except sentencepiece's control and unknown
  symbols, in sentencepiece id order, with its count in the encoded train split). Passing it to
  ``fairseq-preprocess --srcdict`` fixes the vocabulary to the tokenizer's, instead of whatever
  subset happens to occur in the train split;
* ``TOKENIZER_INFO.json``: the marker (tokenizer, vocabulary size, SHA-256 of the model and of the
  training text, options). Re-running with the same options and inputs is a no-op.

    python data_prep/sentencepiece_bpe.py --text-dir demo_workdir/corpus --out-dir demo_workdir/spm \\
        --vocab-size 4000
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import multiprocessing
import os
import sys
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

MARKER = "TOKENIZER_INFO.json"
TOKENIZER_NAME = "sentencepiece-bpe"
NOT_COMPARABLE = (
    "offline sentencepiece BPE trained on this corpus's train split: NOT comparable with the "
    "papers' GPT-2 BPE perplexities"
)
SPLITS = ("train", "valid", "test")
_CHUNK_LINES = 4096


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _progress(total: int, desc: str):
    """tqdm when it is installed (fairseq depends on it), otherwise a silent stand-in."""
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, mininterval=1.0,
                    disable=None, file=sys.stderr)
    except ImportError:  # pragma: no cover
        class _Silent:
            def update(self, n):
                pass

            def close(self):
                pass

        return _Silent()


def train_sentencepiece(
    train_file: str,
    model_prefix: str,
    vocab_size: int,
    character_coverage: float = 0.9999,
    input_sentence_size: int = 2_000_000,
    num_threads: int = 1,
    seed: int = 1,
) -> None:
    """Train a BPE sentencepiece model on ``train_file``; writes ``model_prefix.{model,vocab}``.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): a corpus too small for it gets
    the largest vocabulary it supports, recorded in the marker. ``input_sentence_size`` lines are
    sampled (with ``seed``) when the file is larger, which keeps WikiText-103 training in memory.
    """
    import sentencepiece as spm

    if vocab_size < 8:
        raise ValueError(f"vocab_size={vocab_size}: expected at least 8 pieces")
    if not os.path.isfile(train_file):
        raise FileNotFoundError(f"training text {train_file} not found")
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=train_file,
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=character_coverage,
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,
        num_threads=num_threads,
        minloglevel=2,
    )


_WORKER_SP = None


def _worker_init(model_path: str) -> None:
    global _WORKER_SP
    import sentencepiece as spm

    _WORKER_SP = spm.SentencePieceProcessor(model_file=model_path)


def _encode_chunk(lines: List[str]) -> Tuple[List[str], int]:
    nbytes = sum(len(line.encode("utf-8")) + 1 for line in lines)
    pieces = _WORKER_SP.encode(lines, out_type=str)
    return [" ".join(p) for p in pieces], nbytes


def _read_chunks(path: str) -> Iterator[List[str]]:
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        chunk: List[str] = []
        for line in f:
            chunk.append(line.rstrip("\n").rstrip("\r"))
            if len(chunk) == _CHUNK_LINES:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def encode_file(model_path: str, in_path: str, out_path: str, workers: int = 1) -> int:
    """Encode ``in_path`` line by line into space-separated pieces; returns the number of lines.

    Runs on ``workers`` processes with a progress bar; writes ``out_path`` atomically.
    """
    if not os.path.isfile(in_path):
        raise FileNotFoundError(f"text file {in_path} not found")
    total = os.path.getsize(in_path)
    bar = _progress(total, f"spm encode {os.path.basename(in_path)}")
    tmp = out_path + ".tmp"
    nlines = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as out:
        if workers <= 1:
            _worker_init(model_path)
            results: Iterable = map(_encode_chunk, _read_chunks(in_path))
            pool = None
        else:
            pool = multiprocessing.Pool(workers, initializer=_worker_init, initargs=(model_path,))
            results = pool.imap(_encode_chunk, _read_chunks(in_path), chunksize=1)
        try:
            for encoded, nbytes in results:
                for line in encoded:
                    out.write(line)
                    out.write("\n")
                nlines += len(encoded)
                bar.update(nbytes)
        finally:
            if pool is not None:
                pool.close()
                pool.join()
            bar.close()
    os.replace(tmp, out_path)
    return nlines


def write_fairseq_dict(model_path: str, encoded_train: str, dict_path: str) -> int:
    """Write fairseq's ``dict.txt`` for the sentencepiece model; returns the number of entries.

    Every regular piece is listed (in sentencepiece id order) so that valid/test pieces that never
    occur in train still have an id; the count column is the piece's frequency in the encoded
    train split. Sentencepiece's control symbols and ``<unk>`` are left out: fairseq's Dictionary
    adds its own ``<s> <pad> </s> <unk>``.
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    counts: Dict[str, int] = collections.Counter()
    with open(encoded_train, encoding="utf-8") as f:
        for line in f:
            counts.update(line.split())
    n = 0
    with open(dict_path + ".tmp", "w", encoding="utf-8", newline="\n") as f:
        for i in range(sp.get_piece_size()):
            if sp.is_control(i) or sp.is_unknown(i):
                continue
            piece = sp.id_to_piece(i)
            if not piece or any(ch.isspace() for ch in piece):
                continue  # fairseq splits dict lines and data lines on whitespace
            f.write(f"{piece} {counts.get(piece, 0)}\n")
            n += 1
    os.replace(dict_path + ".tmp", dict_path)
    return n


def read_marker(directory: str) -> Optional[dict]:
    path = os.path.join(directory, MARKER)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_marker(directory: str, info: dict) -> None:
    with open(os.path.join(directory, MARKER + ".tmp"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    os.replace(os.path.join(directory, MARKER + ".tmp"), os.path.join(directory, MARKER))


def prepare_sentencepiece(
    inputs: Dict[str, str],
    out_dir: str,
    vocab_size: int = 4000,
    workers: int = 1,
    character_coverage: float = 0.9999,
    input_sentence_size: int = 2_000_000,
    force: bool = False,
    source_label: Optional[str] = None,
    log=print,
) -> dict:
    """Train on ``inputs['train']``, encode every split of ``inputs`` ({split: text path}) to
    ``out_dir/{split}.bpe``, write ``dict.txt`` and the marker. Returns the marker dict."""
    if "train" not in inputs:
        raise ValueError("inputs must contain a 'train' split to train the tokenizer on")
    for split, path in inputs.items():
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{split} text {path} not found")
    os.makedirs(out_dir, exist_ok=True)
    options = {
        "vocab_size_requested": vocab_size,
        "character_coverage": character_coverage,
        "input_sentence_size": input_sentence_size,
        "model_type": "bpe",
        "input_sha256": {s: sha256_file(p) for s, p in sorted(inputs.items())},
    }
    outputs = ["spm.model", "spm.vocab", "dict.txt"] + [f"{s}.bpe" for s in inputs]
    old = read_marker(out_dir)
    if (
        not force
        and old is not None
        and old.get("options") == options
        and all(os.path.isfile(os.path.join(out_dir, f)) for f in outputs)
    ):
        log(f"[spm] {out_dir} is up to date (vocab {old['vocab_size']}); nothing to do")
        return old
    prefix = os.path.join(out_dir, "spm")
    log(f"[spm] training BPE (vocab <= {vocab_size}) on {inputs['train']} ...")
    train_sentencepiece(
        inputs["train"], prefix, vocab_size, character_coverage, input_sentence_size,
        num_threads=max(1, workers),
    )
    import sentencepiece as spm

    actual_vocab = spm.SentencePieceProcessor(model_file=prefix + ".model").get_piece_size()
    lines = {}
    for split in sorted(inputs, key=lambda s: (s != "train", s)):
        log(f"[spm] encoding {split} ...")
        lines[split] = encode_file(prefix + ".model", inputs[split],
                                   os.path.join(out_dir, f"{split}.bpe"), workers)
    dict_size = write_fairseq_dict(prefix + ".model", os.path.join(out_dir, "train.bpe"),
                                   os.path.join(out_dir, "dict.txt"))
    info = {
        "tokenizer": TOKENIZER_NAME,
        "comparable_with_paper": False,
        "label": NOT_COMPARABLE,
        "source": source_label or os.path.abspath(inputs["train"]),
        "vocab_size": actual_vocab,
        "fairseq_dict_entries": dict_size,
        "spm_model_sha256": sha256_file(prefix + ".model"),
        "lines": lines,
        "options": options,
    }
    write_marker(out_dir, info)
    log(f"[spm] wrote {out_dir}: vocab {actual_vocab}, dict.txt {dict_size} entries ({NOT_COMPARABLE})")
    return info


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text-dir", required=True, help="directory with train.txt [valid.txt test.txt]")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--vocab-size", type=int, default=4000, help="upper bound on the BPE vocabulary")
    p.add_argument("--splits", default=",".join(SPLITS), help="splits to encode (train is required)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--character-coverage", type=float, default=0.9999)
    p.add_argument("--input-sentence-size", type=int, default=2_000_000,
                   help="lines sampled from train.txt for training")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    splits = [s for s in args.splits.split(",") if s]
    inputs = {s: os.path.join(args.text_dir, f"{s}.txt") for s in splits}
    try:
        prepare_sentencepiece(
            inputs, args.out_dir, args.vocab_size, args.workers, args.character_coverage,
            args.input_sentence_size, args.force,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"sentencepiece_bpe.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
