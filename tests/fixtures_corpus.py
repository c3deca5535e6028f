"""Small, deterministic inputs for the data_prep and evaluation tests (no network, seconds to build).

* ``write_source_tree``: a fake "library" of .py/.txt/.rst files for the corpus builder;
* ``write_wikitext_folder`` / ``write_wikitext_zip``: WikiText-103-shaped raw files;
* ``write_byte_level_gpt2_files``: a GPT-2-format ``encoder.json``/``vocab.bpe``/``dict.txt`` with
  the 256 byte symbols and two merges, so the GPT-2 code path runs without the real files;
* ``build_lm_data``: text -> sentencepiece -> fairseq-preprocess, through data_prep itself;
* ``train_checkpoint``: a few fairseq-train updates on CPU in a subprocess.
"""
import json
import os
import random
import subprocess
import sys
import zipfile
from typing import Dict, List, Optional, Sequence
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_PREP = os.path.join(REPO, "data_prep")  # the entry points that the tests run

WORDS = (
    "the of and in to a was is for on as by with from at his that an it were are which this be or "
    "first also new had after but river city team season album song film game war army".split()
)


def subprocess_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return pyrun.script_env(env)  # (the scripts' python commands from tests/pyrun.py's warm interpreter)


def _sentence(rng: random.Random, n_min: int = 6, n_max: int = 18) -> str:
    # a Markov-ish chain so that a model can learn something in a few updates
    w = rng.randrange(len(WORDS))
    out = []
    for _ in range(rng.randint(n_min, n_max)):
        out.append(WORDS[w])
        w = (w + 1) % len(WORDS) if rng.random() < 0.7 else rng.randrange(len(WORDS))
    return " ".join(out)


def write_source_tree(root: str, n_docs: int = 40, seed: int = 0) -> List[str]:
    """``n_docs`` text files in nested folders (plus files the builder must ignore)."""
    rng = random.Random(seed)
    paths = []
    for i in range(n_docs):
        sub = os.path.join(root, f"pkg{i % 4}", "sub" if i % 3 == 0 else "")
        os.makedirs(sub, exist_ok=True)
        ext = (".py", ".txt", ".rst")[i % 3]
        path = os.path.join(sub, f"doc{i:03d}{ext}")
        lines = [f"# document {i}"]
        for _ in range(rng.randint(8, 30)):
            lines.append(("    " if rng.random() < 0.3 else "") + _sentence(rng) + "   ")
            if rng.random() < 0.2:
                lines += ["", ""]
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        paths.append(path)
    # must be skipped: wrong suffix, site-packages, undecodable, too short
    os.makedirs(os.path.join(root, "site-packages"), exist_ok=True)
    with open(os.path.join(root, "site-packages", "installed.py"), "w") as f:
        f.write("INSTALLED = True\n" * 100)
    with open(os.path.join(root, "binary.py"), "wb") as f:
        f.write(b"\xff\xfe\x00bad" * 100)
    with open(os.path.join(root, "data.json"), "w") as f:
        f.write("{}" * 500)
    with open(os.path.join(root, "tiny.py"), "w") as f:
        f.write("x = 1\n")
    return paths


def write_wikitext_folder(root: str, sizes: Optional[Dict[str, int]] = None, seed: int = 0) -> str:
    """``root/wikitext-103-raw/wiki.{train,valid,test}.raw`` in WikiText's raw layout (titles
    ``= T =``, blank lines, leading spaces). ``sizes``: articles per split."""
    sizes = sizes or {"train": 40, "valid": 4, "test": 4}
    rng = random.Random(seed)
    folder = os.path.join(root, "wikitext-103-raw")
    os.makedirs(folder, exist_ok=True)
    for split, articles in sizes.items():
        with open(os.path.join(folder, f"wiki.{split}.raw"), "w", encoding="utf-8") as f:
            for a in range(articles):
                f.write(f" \n = {split.title()} article {a} = \n \n")
                for _ in range(rng.randint(3, 7)):
                    f.write(" " + " . ".join(_sentence(rng) for _ in range(rng.randint(1, 4))) + " . \n")
                f.write(" \n = = Section = = \n \n " + _sentence(rng) + " , café – 1 @,@ 000 . \n")
    return folder


def write_wikitext_zip(folder: str, zip_path: str) -> str:
    with zipfile.ZipFile(zip_path, "w") as z:
        for name in sorted(os.listdir(folder)):
            z.write(os.path.join(folder, name), f"wikitext-103-raw/{name}")
    return zip_path


def write_byte_level_gpt2_files(directory: str) -> Dict[str, str]:
    """GPT-2-format BPE files over bytes: ids 0..255 are bytes, 256 = 'th', 257 = 'the'."""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    os.makedirs(directory, exist_ok=True)
    b2u = bytes_to_unicode()
    encoder = {b2u[b]: b for b in range(256)}
    encoder["th"], encoder["the"] = 256, 257
    paths = {n: os.path.join(directory, n) for n in ("encoder.json", "vocab.bpe", "dict.txt")}
    with open(paths["encoder.json"], "w") as f:
        json.dump(encoder, f)
    with open(paths["vocab.bpe"], "w", encoding="utf-8") as f:
        f.write("#version: 0.2\nt h\nth e\n")
    with open(paths["dict.txt"], "w") as f:
        f.write("".join(f"{i} {1000 - i}\n" for i in range(258)))
    return paths


def write_plain_splits(directory: str, lines: Dict[str, int], seed: int = 0) -> Dict[str, str]:
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    out = {}
    for split, n in lines.items():
        out[split] = os.path.join(directory, f"{split}.txt")
        with open(out[split], "w", encoding="utf-8") as f:
            for _ in range(n):
                f.write(_sentence(rng) + "\n")
    return out


def build_lm_data(root: str, vocab_size: int = 120, lines: Optional[Dict[str, int]] = None,
                  seed: int = 0) -> str:
    """Plain text -> sentencepiece BPE -> fairseq-preprocess; returns the data-bin directory."""
    from hgrn_fairseq.preprocessing import fairseq_binarize
    from hgrn_fairseq.preprocessing import sentencepiece_bpe

    lines = lines or {"train": 1200, "valid": 60, "test": 80}
    texts = write_plain_splits(os.path.join(root, "text"), lines, seed)
    spm_dir = os.path.join(root, "spm")
    sentencepiece_bpe.prepare_sentencepiece(texts, spm_dir, vocab_size=vocab_size, workers=1, log=lambda *_: None)
    dest = os.path.join(root, "data-bin")
    fairseq_binarize.binarize({s: os.path.join(spm_dir, f"{s}.bpe") for s in texts},
                              os.path.join(spm_dir, "dict.txt"), dest, workers=1, log=lambda *_: None)
    sentencepiece_bpe.write_marker(dest, sentencepiece_bpe.read_marker(spm_dir))
    return dest


def train_checkpoint(data: str, save_dir: str, arch_args: Sequence[str], tokens_per_sample: int = 32,
                     updates: int = 5, extra: Sequence[str] = ()) -> str:
    """A few fairseq-train updates on CPU; returns the path of checkpoint_last.pt."""
    cmd = [
        sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", os.path.join(REPO, "hgrn_fairseq"),
        "--task", "language_modeling", *arch_args,
        "--tokens-per-sample", str(tokens_per_sample), "--sample-break-mode", "none",
        "--batch-size", "8", "--optimizer", "adam", "--lr", "3e-3", "--max-update", str(updates),
        "--cpu", "--num-workers", "0", "--seed", "1", "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--disable-validation", "--log-format", "none", *extra,
    ]
    proc = pyrun.run(cmd, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError("fairseq-train failed:\n" + proc.stdout[-3000:])
    path = os.path.join(save_dir, "checkpoint_last.pt")
    assert os.path.isfile(path), proc.stdout[-3000:]
    return path
