"""A tiny synthetic corpus with learnable structure, binarised with fairseq-preprocess.

Words ``w0 .. w{V-1}``; each word is usually followed by its successor, so a model that learns
anything at all gets far below the uniform perplexity.
"""
import os
import random
import sys
from typing import Dict
from tests import pyrun

SPLITS = {"train": 1500, "valid": 120, "test": 120}


def write_corpus(directory: str, vocab: int = 120, seed: int = 0, sizes: Dict[str, int] = SPLITS) -> Dict[str, str]:
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    files = {}
    for split, num_lines in sizes.items():
        path = os.path.join(directory, f"{split}.txt")
        with open(path, "w") as f:
            for _ in range(num_lines):
                w, line = rng.randrange(vocab), []
                for _ in range(rng.randint(4, 14)):
                    line.append(f"w{w}")
                    w = (w + 1) % vocab if rng.random() < 0.8 else rng.randrange(vocab)
                f.write(" ".join(line) + "\n")
        files[split] = path
    return files


def binarise(text_dir: str, dest: str, splits=("train", "valid", "test")) -> str:
    prefs = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--destdir", dest, "--workers", "1"]
    for split in splits:
        cmd += [prefs[split], os.path.join(text_dir, f"{split}.txt")]
    pyrun.run(cmd, check=True, capture_output=True)
    return dest
