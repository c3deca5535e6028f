#!/usr/bin/env python3
"""Build a small plain-text corpus from text files already on the machine (no download).

By default the documents are the Python standard library's own ``.py``/``.txt``/``.rst`` files
(``sysconfig.get_paths()['stdlib']``, ``site-packages`` excluded so installed packages never change
the corpus). One file is one document; a document is never split across train/valid/test.

Determinism: documents are ordered by the SHA-1 of their path relative to the source root (a fixed
pseudo-random order, so a size cap samples the whole library rather than its first letters), the
size cap and the split boundaries are applied in that order, and the text is normalised the same
way every time. The same Python version therefore always gives byte-identical files. A different
Python version has a different stdlib and gives a different corpus: ``manifest.json`` records it.

Split rule: walking the ordered documents, the test split takes documents until it holds at least
``--test-fraction`` of the selected bytes, then valid takes ``--valid-fraction``, the rest is train.

Outputs in ``--out-dir``: ``train.txt``, ``valid.txt``, ``test.txt`` (one line of text per line,
an empty line between documents) and ``manifest.json``. Re-running with the same options and
sources is a no-op (``--force`` rebuilds).

    python data_prep/build_text_corpus.py --out-dir demo_workdir/corpus --max-bytes 3000000
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

SPLITS = ("train", "valid", "test")
DEFAULT_SUFFIXES = (".py", ".txt", ".rst")
# Directories that are not part of the fixed stdlib text (they change with what is installed).
EXCLUDED_DIRS = ("site-packages", "dist-packages", "__pycache__")
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


@dataclass
class Document:
    """One source file: ``key`` is ``<source index>/<path relative to the source root>``."""

    key: str
    path: str
    text: str

    @property
    def nbytes(self) -> int:
        return len(self.text.encode("utf-8"))


def default_sources() -> List[str]:
    return [sysconfig.get_paths()["stdlib"]]


def normalise_text(raw: str, max_line_chars: int) -> str:
    """Tabs to 4 spaces, trailing whitespace stripped, runs of blank lines collapsed to one,
    lines longer than ``max_line_chars`` dropped (data blobs, not language). No trailing newline."""
    lines: List[str] = []
    for line in raw.splitlines():
        line = line.replace("\t", "    ").rstrip()
        if len(line) > max_line_chars:
            continue
        if not line and (not lines or not lines[-1]):
            continue
        lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def iter_candidate_files(root: str, suffixes: Sequence[str]) -> Iterable[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name.endswith(tuple(suffixes)):
                yield os.path.join(dirpath, name)


def collect_documents(
    sources: Sequence[str],
    suffixes: Sequence[str] = DEFAULT_SUFFIXES,
    max_doc_bytes: int = 50_000,
    min_doc_bytes: int = 200,
    max_line_chars: int = 400,
) -> List[Document]:
    """All usable documents of ``sources`` in the fixed SHA-1 order (see the module docstring).

    Files that are not valid UTF-8, larger than ``max_doc_bytes`` on disk, or shorter than
    ``min_doc_bytes`` after normalisation are left out.
    """
    docs: List[Document] = []
    for index, root in enumerate(sources):
        if not os.path.isdir(root):
            raise FileNotFoundError(f"--source {root!r} is not a directory")
        for path in iter_candidate_files(root, suffixes):
            try:
                if os.path.getsize(path) > max_doc_bytes:
                    continue
                with open(path, "rb") as f:
                    raw = f.read().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            text = normalise_text(raw, max_line_chars)
            if len(text.encode("utf-8")) < min_doc_bytes:
                continue
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            docs.append(Document(key=f"{index}/{rel}", path=path, text=text))
    docs.sort(key=lambda d: hashlib.sha1(d.key.encode("utf-8")).hexdigest())
    return docs


def split_documents(
    docs: Sequence[Document],
    max_bytes: Optional[int],
    valid_fraction: float,
    test_fraction: float,
) -> Dict[str, List[Document]]:
    """Cap the corpus at ``max_bytes`` (whole documents, in order) and cut it into splits."""
    for name, frac in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < frac < 0.5:
            raise ValueError(f"{name}={frac} must be in (0, 0.5)")
    selected: List[Document] = []
    total = 0
    for doc in docs:
        if max_bytes is not None and selected and total + doc.nbytes > max_bytes:
            continue  # try smaller documents further on: fills the cap closely, still deterministic
        selected.append(doc)
        total += doc.nbytes
    if len(selected) < 3:
        raise ValueError(
            f"only {len(selected)} usable documents (need >= 3, one per split): add --source "
            "directories or raise --max-bytes"
        )
    splits: Dict[str, List[Document]] = {s: [] for s in SPLITS}
    targets = {"test": test_fraction * total, "valid": valid_fraction * total}
    filled = {"test": 0, "valid": 0}
    remaining = len(selected)
    for doc in selected:
        remaining -= 1
        for split in ("test", "valid"):
            # every split gets at least one document and train keeps at least one
            if (filled[split] < targets[split] or not splits[split]) and remaining >= 1:
                splits[split].append(doc)
                filled[split] += doc.nbytes
                break
        else:
            splits["train"].append(doc)
    return splits


def build_corpus(
    out_dir: str,
    sources: Optional[Sequence[str]] = None,
    max_bytes: Optional[int] = 3_000_000,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    suffixes: Sequence[str] = DEFAULT_SUFFIXES,
    max_doc_bytes: int = 50_000,
    force: bool = False,
    log=print,
) -> dict:
    """Write ``train.txt``/``valid.txt``/``test.txt`` + ``manifest.json``; returns the manifest."""
    sources = [os.path.abspath(s) for s in (sources or default_sources())]
    options = {
        "format_version": FORMAT_VERSION,
        "sources": sources,
        "suffixes": list(suffixes),
        "max_bytes": max_bytes,
        "max_doc_bytes": max_doc_bytes,
        "valid_fraction": valid_fraction,
        "test_fraction": test_fraction,
        "python_version": sys.version.split()[0],
    }
    manifest_path = os.path.join(out_dir, MANIFEST)
    if not force and os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("options") == options and all(
            os.path.isfile(os.path.join(out_dir, f"{s}.txt")) for s in SPLITS
        ):
            log(f"[corpus] {out_dir} is up to date ({_summary(old)}); nothing to do")
            return old
    log(f"[corpus] scanning {', '.join(sources)} for {'/'.join(suffixes)} files ...")
    docs = collect_documents(sources, suffixes, max_doc_bytes=max_doc_bytes)
    splits = split_documents(docs, max_bytes, valid_fraction, test_fraction)
    os.makedirs(out_dir, exist_ok=True)
    stats = {}
    for split in SPLITS:
        text = "\n\n".join(d.text for d in splits[split]) + "\n"
        tmp = os.path.join(out_dir, f"{split}.txt.tmp")
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, f"{split}.txt"))
        stats[split] = {
            "documents": len(splits[split]),
            "bytes": len(text.encode("utf-8")),
            "lines": text.count("\n"),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        }
    manifest = {
        "options": options,
        "splits": stats,
        "documents": {s: [d.key for d in splits[s]] for s in SPLITS},
    }
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    log(f"[corpus] wrote {out_dir}: {_summary(manifest)}")
    return manifest


def _summary(manifest: dict) -> str:
    return ", ".join(
        f"{s} {v['documents']} docs / {v['bytes'] / 1e6:.2f} MB" for s, v in manifest["splits"].items()
    )


def _positive_int_or_none(value: str) -> Optional[int]:
    if value.lower() in ("none", "0"):
        return None
    n = int(float(value))
    if n < 1:
        raise argparse.ArgumentTypeError(f"--max-bytes {value}: expected a positive number or 'none'")
    return n


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True, help="where train.txt/valid.txt/test.txt go")
    p.add_argument(
        "--source", action="append", default=None,
        help="directory to read (repeatable); default: the Python stdlib (site-packages excluded)",
    )
    p.add_argument("--max-bytes", type=_positive_int_or_none, default=3_000_000,
                   help="cap on the selected text in bytes, whole documents only ('none' = no cap)")
    p.add_argument("--max-doc-bytes", type=int, default=50_000,
                   help="skip files larger than this (keeps small splits from being one or two big files)")
    p.add_argument("--valid-fraction", type=float, default=0.05)
    p.add_argument("--test-fraction", type=float, default=0.05)
    p.add_argument("--suffixes", default=",".join(DEFAULT_SUFFIXES), help="comma-separated file endings")
    p.add_argument("--force", action="store_true", help="rebuild even if the outputs are up to date")
    args = p.parse_args(argv)
    try:
        build_corpus(
            args.out_dir,
            sources=args.source,
            max_bytes=args.max_bytes,
            valid_fraction=args.valid_fraction,
            test_fraction=args.test_fraction,
            suffixes=tuple(s for s in args.suffixes.split(",") if s),
            max_doc_bytes=args.max_doc_bytes,
            force=args.force,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"build_text_corpus.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
