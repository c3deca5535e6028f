#!/usr/bin/env python3
"""WikiText-103 (raw) -> fairseq binarised data for the language models.

Input: ``wikitext-103-raw-v1.zip`` or a folder holding ``wiki.train.raw``, ``wiki.valid.raw`` and
``wiki.test.raw`` (directly or in ``wikitext-103-raw/``). Nothing is downloaded unless
``--download`` is given and the network allows it.

Tokenizers (``--tokenizer``):

* ``gpt2`` (the papers' setup): GPT-2 byte-level BPE from local ``encoder.json`` and ``vocab.bpe``,
  binarised with fairseq's GPT-2 ``dict.txt`` (50260 entries + 4 specials = 50264). Lines are
  stripped and empty lines kept, like fairseq's ``examples/roberta/multiprocessing_bpe_encoder.py
  --keep-empty`` used by the published WikiText-103 recipes, so the token counts match theirs.
* ``sentencepiece`` (offline alternative): a BPE trained on ``wiki.train.raw``
  (``sentencepiece_bpe.py``). Perplexities with it are NOT comparable with the papers'; the
  ``TOKENIZER_INFO.json`` marker in the output directory says so.
* ``auto`` (default): ``gpt2`` when ``--gpt2-dir`` is given (its three files must be there),
  ``sentencepiece`` with a warning when it is not.

The GPT-2 files are verified before any work starts: ``encoder.json`` and ``vocab.bpe`` must have the
SHA-256 of the published files (OpenAI's release, which fairseq mirrors; the same digests tiktoken
pins), ``dict.txt`` must be fairseq's GPT-2 dictionary (50260 lines of encoder ids and
``madeupword`` fillers), and the encoder must load. A mismatch (a partial download, an edited file) is
an error naming the file, unless ``--custom-gpt2`` says the files are meant to differ; the output is
then marked not comparable with the papers. A tokenizer that fails to load stops the run at once
(never a pool of workers restarting forever).

Encoding runs on ``--workers`` processes (default: all cores) with a progress bar, binarisation
through ``fairseq-preprocess --workers``. The token count of every split is printed and written
to ``token_counts.json``. A ``PREPARED.json`` stamp records the inputs: re-running with the same
inputs is a no-op when the outputs are intact (``dict.txt``, the tokenizer marker, and every split's
``.bin`` the size its ``.idx`` says, with the recorded counts); a damaged or missing output is named
in a warning and the directory is rebuilt.

    python data_prep/prepare_wikitext103.py --source ~/data/wikitext-103-raw-v1.zip \\
        --gpt2-dir ~/data/gpt2_bpe --dest data-bin/wikitext-103
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import zipfile
import zlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from hgrn_fairseq.preprocessing import fairseq_binarize, sentencepiece_bpe

WIKITEXT_URL = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip"
WIKITEXT_MIRROR = "https://huggingface.co/datasets/Salesforce/wikitext (config wikitext-103-raw-v1)"
GPT2_URLS = {
    "encoder.json": "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json",
    "vocab.bpe": "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/vocab.bpe",
    "dict.txt": "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/dict.txt",
}
RAW_FILES = {"train": "wiki.train.raw", "valid": "wiki.valid.raw", "test": "wiki.test.raw"}
# SHA-256 of the published GPT-2 BPE files (OpenAI's gpt-2/encodings/main release; fairseq's
# dl.fbaipublicfiles.com/fairseq/gpt2_bpe/ copies are those files; tiktoken pins the same digests)
GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
GPT2_DICT_LINES = 50260  # fairseq's GPT-2 dict.txt: + 4 specials = 50264 entries
STAMP = "PREPARED.json"
GPT2_LABEL = "GPT-2 BPE (encoder.json / vocab.bpe) with fairseq's GPT-2 dict.txt: the papers' tokenizer"
_CHUNK_LINES = 2048


class PrepError(Exception):
    """A missing or unusable input; the message names the file and where it is published."""


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
def _fingerprint(path: str) -> dict:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": st.st_size, "mtime": int(st.st_mtime)}


def _sha256(path: str) -> str:
    return sentencepiece_bpe.sha256_file(path)


def maybe_download(url: str, dest: str, log=print) -> None:
    """Fetch ``url`` to ``dest`` (only with ``--download``); a clear error when offline."""
    import urllib.request

    log(f"[wikitext] downloading {url} ...")
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(dest + ".part", "wb") as f:
            shutil.copyfileobj(r, f)
    except OSError as e:
        raise PrepError(f"could not download {url} ({e}); fetch it by hand and pass its path") from None
    os.replace(dest + ".part", dest)


def _find_raw_in_dir(folder: str) -> Dict[str, str]:
    for candidate in (folder, os.path.join(folder, "wikitext-103-raw")):
        found = {s: os.path.join(candidate, n) for s, n in RAW_FILES.items()}
        if any(os.path.isfile(p) for p in found.values()):
            missing = [p for p in found.values() if not os.path.isfile(p)]
            if missing:
                raise PrepError(
                    f"{missing[0]} not found (the folder has some WikiText-103 files but not all); "
                    f"the raw dataset is published at {WIKITEXT_URL}"
                )
            return found
    raise PrepError(
        f"no wiki.train.raw/wiki.valid.raw/wiki.test.raw in {folder} (or {folder}/wikitext-103-raw): "
        f"wikitext-103-raw-v1.zip is published at {WIKITEXT_URL} (mirror: {WIKITEXT_MIRROR})"
    )


def locate_raw(source: str, workdir: str, log=print) -> Dict[str, str]:
    """Return {split: path of the raw text}, unpacking the zip into ``workdir/raw`` when needed."""
    if os.path.isdir(source):
        return _find_raw_in_dir(source)
    if not os.path.isfile(source):
        raise PrepError(
            f"{source} not found: wikitext-103-raw-v1.zip is published at {WIKITEXT_URL} "
            f"(mirror: {WIKITEXT_MIRROR}); download it (or pass --download) and give its path with --source"
        )
    if not zipfile.is_zipfile(source):
        raise PrepError(_damaged_archive_message(source, "not a zip archive"))
    out = os.path.join(workdir, "raw")
    stamp = os.path.join(out, "UNPACKED.json")
    fp = _fingerprint(source)
    if os.path.isfile(stamp):
        with open(stamp) as f:
            if json.load(f) == fp:
                return _find_raw_in_dir(out)
        # the files are about to change: an interrupted unpack must not leave a stamp a rerun trusts
        os.remove(stamp)
    _unpack(source, out, log)
    with open(stamp, "w") as f:
        json.dump(fp, f)
    return _find_raw_in_dir(out)


def _damaged_archive_message(source: str, why: str) -> str:
    return (f"{source} is damaged or not a complete zip archive ({why}): download it again as "
            f"wikitext-103-raw-v1.zip from {WIKITEXT_URL} (mirror: {WIKITEXT_MIRROR}) and pass its path with --source")


# what reading a damaged archive raises: a bad header or CRC, a deflate stream zlib rejects, data that
# ends early, a seek to a negative offset (OSError) from a header pointing before the file's start
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OSError)


def _from_archive(source: str, read):
    """``read()``, its errors turned into a PrepError naming the archive (only reads of the archive
    go through here: an error writing the unpacked files is not blamed on it)."""
    try:
        return read()
    except _ARCHIVE_ERRORS as e:
        raise PrepError(_damaged_archive_message(source, f"{type(e).__name__}: {str(e)[:80]}")) from None


def _unpack(source: str, out: str, log=print) -> None:
    """Unpack the three raw files of ``source`` into ``out``: each goes to a ``.part`` file first and
    all three are renamed only once every one has been read whole (CRC checked), so a damaged member
    leaves neither a partial file nor a mix of two archives' files."""
    z = _from_archive(source, lambda: zipfile.ZipFile(source))
    with z:
        members = {os.path.basename(n): n for n in z.namelist() if os.path.basename(n) in RAW_FILES.values()}
        missing = [n for n in RAW_FILES.values() if n not in members]
        if missing:
            raise PrepError(f"{source} has no {missing[0]}: expected wikitext-103-raw-v1.zip from {WIKITEXT_URL}")
        os.makedirs(out, exist_ok=True)
        parts = {name: os.path.join(out, name + ".part") for name in members}
        try:
            for name, member in members.items():
                log(f"[wikitext] unpacking {member}")
                src = _from_archive(source, lambda: z.open(member))
                with src, open(parts[name], "wb") as dst:
                    while True:
                        block = _from_archive(source, lambda: src.read(1 << 20))
                        if not block:
                            break
                        dst.write(block)
        except BaseException:
            for part in parts.values():
                if os.path.exists(part):
                    os.remove(part)
            raise
        for name, part in parts.items():
            os.replace(part, os.path.join(out, name))


def gpt2_files(gpt2_dir: Optional[str]) -> Tuple[Dict[str, str], List[str]]:
    """({name: path}, [missing names]) for encoder.json, vocab.bpe, dict.txt in ``gpt2_dir``."""
    paths = {n: os.path.join(gpt2_dir or "", n) for n in GPT2_URLS}
    missing = [n for n, p in paths.items() if not gpt2_dir or not os.path.isfile(p)]
    return paths, missing


def verify_gpt2_files(paths: Dict[str, str], custom: bool = False) -> Dict[str, str]:
    """Check the three GPT-2 files before any work; returns their SHA-256 (see the module docstring)."""
    shas = {}
    for name, path in paths.items():
        try:
            shas[name] = _sha256(path)
        except OSError as e:
            raise PrepError(f"{path} cannot be read ({e.strerror}): fetch it again from {GPT2_URLS[name]}") from None
    if not custom:
        for name, expected in GPT2_SHA256.items():
            if shas[name] != expected:
                raise PrepError(
                    f"{paths[name]} is not the published GPT-2 {name} (sha256 {shas[name][:16]}..., expected "
                    f"{expected[:16]}...): a partial or altered download? fetch it again from {GPT2_URLS[name]}, "
                    f"or pass --custom-gpt2 to use these files (the output is then marked not comparable)"
                )
    try:
        encoder = load_gpt2_bpe_utils().get_encoder(paths["encoder.json"], paths["vocab.bpe"])
    except Exception as e:  # json / unicode / index errors of a damaged file
        raise PrepError(
            f"the GPT-2 BPE files {paths['encoder.json']} / {paths['vocab.bpe']} cannot be loaded "
            f"({type(e).__name__}: {str(e)[:80]}): fetch them again from {GPT2_URLS['encoder.json']} and "
            f"{GPT2_URLS['vocab.bpe']}"
        ) from None
    _check_gpt2_dict(paths["dict.txt"], len(encoder.encoder), custom)
    return shas


def _check_gpt2_dict(path: str, vocab: int, custom: bool) -> None:
    seen = set()
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PrepError(f"{path} cannot be read ({e}): fetch it again from {GPT2_URLS['dict.txt']}") from None
    for number, line in enumerate(lines, 1):
        fields = line.split(" ")
        ok = len(fields) == 2 and fields[1].isdigit() and (
            (fields[0].isdigit() and int(fields[0]) < vocab) or fields[0].startswith("madeupword"))
        if not ok or fields[0] in seen:
            raise PrepError(
                f"{path}:{number}: {line[:40]!r} is not a line of fairseq's GPT-2 dict.txt ('<encoder id> <count>', "
                f"ids below {vocab}, each once): fetch it again from {GPT2_URLS['dict.txt']}"
            )
        seen.add(fields[0])
    if not custom and len(lines) != GPT2_DICT_LINES:
        raise PrepError(
            f"{path} has {len(lines)} lines, fairseq's GPT-2 dict.txt has {GPT2_DICT_LINES}: a partial download? "
            f"fetch it again from {GPT2_URLS['dict.txt']}, or pass --custom-gpt2"
        )


def _missing_gpt2_message(gpt2_dir: Optional[str], name: str) -> str:
    where = os.path.join(gpt2_dir, name) if gpt2_dir else f"{name} (no --gpt2-dir given)"
    return (
        f"{where} not found: it is published at {GPT2_URLS[name]}; put encoder.json, vocab.bpe and "
        f"dict.txt in one folder and pass --gpt2-dir, or use --tokenizer sentencepiece (offline, "
        f"not comparable with the paper)"
    )


# --------------------------------------------------------------------------------------------
# GPT-2 BPE encoding (parallel)
# --------------------------------------------------------------------------------------------
_GPT2 = None
_GPT2_ERROR: Optional[str] = None


def load_gpt2_bpe_utils():
    """fairseq's ``gpt2_bpe_utils`` module, loaded from its file so that encoding workers do not
    import fairseq (and torch) just for the BPE."""
    import importlib.util

    spec = importlib.util.find_spec("fairseq")  # locates the package without importing it
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "data", "encoders", "gpt2_bpe_utils.py")
        if os.path.isfile(path):
            mod_spec = importlib.util.spec_from_file_location("_hgrn_gpt2_bpe_utils", path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
            return module
    from fairseq.data.encoders import gpt2_bpe_utils

    return gpt2_bpe_utils


def _gpt2_init(encoder_json: str, vocab_bpe: str) -> None:
    # A worker whose initializer raises exits and the pool starts another, forever: keep the error
    # and raise it from the first task instead, which ends the run.
    global _GPT2, _GPT2_ERROR
    try:
        _GPT2 = load_gpt2_bpe_utils().get_encoder(encoder_json, vocab_bpe)
    except Exception as e:
        _GPT2_ERROR = f"{type(e).__name__}: {str(e)[:200]}"


def _gpt2_encode_chunk(lines: List[str]) -> Tuple[List[str], int]:
    if _GPT2 is None:
        raise RuntimeError(f"the GPT-2 BPE encoder did not load in a worker process ({_GPT2_ERROR})")
    nbytes = sum(len(line.encode("utf-8")) + 1 for line in lines)
    out = []
    for line in lines:
        line = line.strip()
        out.append(" ".join(map(str, _GPT2.encode(line))) if line else "")
    return out, nbytes


def _chunks(path: str) -> Iterator[List[str]]:
    with open(path, encoding="utf-8", newline="\n") as f:
        chunk: List[str] = []
        for line in f:
            chunk.append(line.rstrip("\n"))
            if len(chunk) == _CHUNK_LINES:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def gpt2_encode_files(
    encoder_json: str, vocab_bpe: str, files: Dict[str, Tuple[str, str]], workers: int, log=print
) -> Dict[str, int]:
    """Encode each ``{split: (raw path, output path)}`` to GPT-2 BPE ids (space-separated), one
    output line per input line, on one pool of ``workers`` processes; returns lines per split."""
    lines: Dict[str, int] = {}
    pool = None
    try:
        if workers > 1:
            pool = multiprocessing.Pool(workers, initializer=_gpt2_init, initargs=(encoder_json, vocab_bpe))
        else:
            _gpt2_init(encoder_json, vocab_bpe)
        for split, (in_path, out_path) in files.items():
            log(f"[wikitext] GPT-2 BPE encoding {split} on {workers} process(es) ...")
            bar = sentencepiece_bpe._progress(os.path.getsize(in_path), f"gpt2 bpe {os.path.basename(in_path)}")
            if pool is None:
                results = map(_gpt2_encode_chunk, _chunks(in_path))
            else:
                results = pool.imap(_gpt2_encode_chunk, _chunks(in_path), chunksize=4)
            n = 0
            with open(out_path + ".tmp", "w", encoding="utf-8", newline="\n") as out:
                for encoded, nbytes in results:
                    out.write("\n".join(encoded))
                    out.write("\n")
                    n += len(encoded)
                    bar.update(nbytes)
            bar.close()
            os.replace(out_path + ".tmp", out_path)
            lines[split] = n
    except BaseException:
        if pool is not None:
            pool.terminate()  # a failed chunk ends the run now, not after the queued ones
            pool.join()
            pool = None
        raise
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return lines


# --------------------------------------------------------------------------------------------
# pipeline
# --------------------------------------------------------------------------------------------
_IDX_MAGIC = b"MMIDIDX\x00\x00"  # fairseq's mmap index: magic, <Q version, <B dtype, <Q items, sizes, pointers
_IDX_ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 8, 8: 2, 9: 4, 10: 8}


def _split_damage(prefix: str, expected: Optional[dict]) -> Optional[str]:
    """What is wrong with the binarised split ``prefix``.{idx,bin} (None when intact): the index must
    parse, its sizes must add up to the .bin file's size and to the recorded lines and tokens."""
    import struct

    idx, binary = prefix + ".idx", prefix + ".bin"
    for path in (idx, binary):
        if not os.path.isfile(path):
            return f"{path} is missing"
    with open(idx, "rb") as f:
        header = f.read(len(_IDX_MAGIC) + 17)
        if len(header) < len(_IDX_MAGIC) + 17 or header[: len(_IDX_MAGIC)] != _IDX_MAGIC:
            return f"{idx} is not a fairseq mmap index (damaged or truncated)"
        _, code, items = struct.unpack("<QBQ", header[len(_IDX_MAGIC):])
        sizes = f.read(4 * items)
    if code not in _IDX_ITEMSIZE or len(sizes) != 4 * items or \
            os.path.getsize(idx) != len(header) + 12 * items:
        return f"{idx} is truncated or damaged (its size does not match its header)"
    tokens = sum(struct.unpack(f"<{items}i", sizes))
    if os.path.getsize(binary) != tokens * _IDX_ITEMSIZE[code]:
        return (f"{binary} has {os.path.getsize(binary):,} bytes, its .idx says {tokens * _IDX_ITEMSIZE[code]:,} "
                f"(truncated or damaged)")
    if expected is not None and expected != {"lines": items, "tokens": tokens}:
        return f"{prefix}.* hold {items:,} lines / {tokens:,} tokens, {STAMP} recorded {expected}"
    return None


def output_damage(dest: str, stamp: dict, tokenizer: str) -> Optional[str]:
    """What makes the prepared ``dest`` unusable although its stamp matches (None when intact): a
    missing dict.txt / marker / sentencepiece model, or a split whose files disagree with its index."""
    needed = ["dict.txt", sentencepiece_bpe.MARKER]
    if tokenizer == "sentencepiece":
        needed.append("spm.model")
    for name in needed:
        if not os.path.isfile(os.path.join(dest, name)) or os.path.getsize(os.path.join(dest, name)) == 0:
            return f"{os.path.join(dest, name)} is missing or empty"
    counts = stamp.get("token_counts") or {}
    for split in RAW_FILES:
        damage = _split_damage(os.path.join(dest, split), counts.get(split))
        if damage:
            return damage
    return None


def prepare(
    source: str,
    dest: str,
    tokenizer: str = "auto",
    gpt2_dir: Optional[str] = None,
    workdir: Optional[str] = None,
    workers: Optional[int] = None,
    vocab_size: int = 32000,
    download: bool = False,
    force: bool = False,
    log=print,
    custom_gpt2: bool = False,
) -> Dict[str, dict]:
    """Run the whole preparation; returns the token counts {split: {lines, tokens}}."""
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise PrepError(f"--workers {workers}: give a number of processes >= 1")
    if vocab_size < 8:
        raise PrepError(f"--vocab-size {vocab_size}: give a sentencepiece vocabulary of at least 8 pieces")
    asked_for_gpt2 = tokenizer == "gpt2" or (tokenizer == "auto" and gpt2_dir is not None)
    workdir = workdir or dest.rstrip("/") + ".work"
    if tokenizer not in ("auto", "gpt2", "sentencepiece"):
        raise PrepError(f"--tokenizer {tokenizer!r} is not one of auto, gpt2, sentencepiece")
    if download:
        if not os.path.exists(source):
            maybe_download(WIKITEXT_URL, source, log)
        if tokenizer in ("auto", "gpt2"):
            gpt2_dir = gpt2_dir or os.path.join(workdir, "gpt2_bpe")
            for name, path in gpt2_files(gpt2_dir)[0].items():
                if not os.path.isfile(path):
                    maybe_download(GPT2_URLS[name], path, log)
    raw = locate_raw(source, workdir, log)  # before the tokenizer: a missing dataset is the first problem
    if tokenizer in ("auto", "gpt2"):
        paths, missing = gpt2_files(gpt2_dir)
        if gpt2_dir and not os.path.isdir(gpt2_dir) and asked_for_gpt2:
            raise PrepError(
                f"--gpt2-dir {gpt2_dir} does not exist: put encoder.json, vocab.bpe and dict.txt "
                f"(https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/) there, or leave --gpt2-dir out and pass "
                f"--tokenizer sentencepiece (offline, not comparable with the paper)"
            )
        if missing and asked_for_gpt2:
            raise PrepError(_missing_gpt2_message(gpt2_dir, missing[0]))
        if missing:
            log(f"[wikitext] WARNING: {_missing_gpt2_message(gpt2_dir, missing[0])}")
            log("[wikitext] WARNING: falling back to the offline sentencepiece BPE: results will NOT be "
                "comparable with the papers' perplexities")
            tokenizer = "sentencepiece"
        else:
            tokenizer = "gpt2"
    inputs = {"raw": {s: _fingerprint(p) for s, p in raw.items()}, "tokenizer": tokenizer}
    if tokenizer == "gpt2":
        paths, _ = gpt2_files(gpt2_dir)
        inputs["gpt2_sha256"] = verify_gpt2_files(paths, custom_gpt2)
        inputs["custom_gpt2"] = bool(custom_gpt2)
    else:
        inputs["vocab_size"] = vocab_size
    stamp_path = os.path.join(dest, STAMP)
    if not force and os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            stamp = json.load(f)
        if stamp.get("inputs") == inputs:
            damage = output_damage(dest, stamp, tokenizer)
            if damage is None:
                log(f"[wikitext] {dest} is up to date ({tokenizer}); nothing to do")
                log(fairseq_binarize.format_counts(stamp["token_counts"]))
                return stamp["token_counts"]
            # the inputs are unchanged but an output is not intact: rebuild rather than report it ready
            log(f"[wikitext] WARNING: {dest} is not intact ({damage}): rebuilding it")
    os.makedirs(workdir, exist_ok=True)
    if tokenizer == "gpt2":
        enc_dir = os.path.join(workdir, "gpt2")
        os.makedirs(enc_dir, exist_ok=True)
        encoded = {split: os.path.join(enc_dir, f"{split}.bpe") for split in raw}
        gpt2_encode_files(paths["encoder.json"], paths["vocab.bpe"],
                          {s: (raw[s], encoded[s]) for s in raw}, workers, log)
        srcdict = paths["dict.txt"]
        marker = {
            "tokenizer": "gpt2-bpe",
            "comparable_with_paper": not custom_gpt2,
            "label": GPT2_LABEL if not custom_gpt2 else
            "custom GPT-2-style BPE files (--custom-gpt2): NOT comparable with the papers' perplexities",
            "source": os.path.abspath(source),
            "gpt2_sha256": inputs["gpt2_sha256"],
        }
    else:
        spm_dir = os.path.join(workdir, "sentencepiece")
        marker = sentencepiece_bpe.prepare_sentencepiece(
            raw, spm_dir, vocab_size=vocab_size, workers=workers, force=force,
            source_label=os.path.abspath(source), log=log,
        )
        encoded = {s: os.path.join(spm_dir, f"{s}.bpe") for s in raw}
        srcdict = os.path.join(spm_dir, "dict.txt")
        for name in ("spm.model", "spm.vocab"):
            os.makedirs(dest, exist_ok=True)
            shutil.copyfile(os.path.join(spm_dir, name), os.path.join(dest, name))
    if os.path.isfile(stamp_path):
        os.remove(stamp_path)  # a half-rebuilt directory must not look prepared
    fairseq_binarize.binarize(encoded, srcdict, dest, workers, log)
    counts = fairseq_binarize.token_counts(dest)
    sentencepiece_bpe.write_marker(dest, marker)
    with open(os.path.join(dest, "token_counts.json"), "w") as f:
        json.dump(counts, f, indent=1)
    with open(stamp_path, "w") as f:
        json.dump({"inputs": inputs, "token_counts": counts, "tokenizer_label": marker["label"]}, f, indent=1)
    log(f"[wikitext] wrote {dest} ({marker['label']})")
    log(fairseq_binarize.format_counts(counts))
    return counts


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True,
                   help=f"wikitext-103-raw-v1.zip or its unpacked folder (published at {WIKITEXT_URL})")
    p.add_argument("--dest", default="data-bin/wikitext-103", help="fairseq data directory to write")
    p.add_argument("--tokenizer", default="auto", choices=["auto", "gpt2", "sentencepiece"])
    p.add_argument("--gpt2-dir", default=None,
                   help="folder with encoder.json, vocab.bpe, dict.txt (https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/)")
    p.add_argument("--workdir", default=None, help="intermediate files (default: DEST.work)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--vocab-size", type=int, default=32000, help="sentencepiece vocabulary (offline tokenizer)")
    p.add_argument("--download", action="store_true", help="fetch missing inputs from their published URLs")
    p.add_argument("--force", action="store_true", help="redo every step")
    p.add_argument("--custom-gpt2", action="store_true",
                   help="the --gpt2-dir files are meant to differ from the published ones (no checksum check; "
                        "the output is marked not comparable with the papers)")
    args = p.parse_args(argv)
    try:
        prepare(args.source, args.dest, args.tokenizer, args.gpt2_dir, args.workdir, args.workers,
                args.vocab_size, args.download, args.force, custom_gpt2=args.custom_gpt2)
    except (PrepError, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"prepare_wikitext103.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
