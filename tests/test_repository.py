"""The repository is a product: no training state or large files in git, no citations a reader cannot
open, and a fairseq start-up without dependency notices."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BYTES = 1_000_000

# Citations of things a reader of the repository cannot open. Built from parts so that this file does
# not match itself.
CITATIONS = re.compile("|".join([
    r"\b" + "SP" + r"EC\b",
    r"\b[Ii]ss" + r"ue #?\d+",
    r"\b[Ss]ess" + r"ion \d+",
    "DEV" + r"ICE\.md",
    r"\b[Ww]ork peri" + r"od",
]))
# A commit cited in code or docs ("see git" + a hash); results files record their commit: provenance.
GIT_REF = re.compile(r"\bgit [0-9a-f]{7,40}\b")
# A work-period tag in a file name, e.g. results_s10.md or bench_s7_graphed.json.
PERIOD_TAG = re.compile(r"_s\d{1,2}(?=[_./]|$)")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# Where a literal date may stand: results files, and table rows of the docs (a provenance column).
DATES_ALLOWED_UNDER = ("bench/results/",)


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.fail(f"the repository checks need a git checkout with git on PATH: {e}")
    files = [f for f in out.decode().split("\0") if f]
    assert len(files) > 50, f"git ls-files listed {len(files)} files: not this repository's checkout"
    return [f for f in files if os.path.isfile(os.path.join(ROOT, f))]  # (skips deleted, not committed)


def text_of(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        data = f.read()
    if b"\0" in data[:8192]:
        return None  # binary (images)
    return data.decode("utf-8", errors="replace")


def test_no_tracked_file_is_over_1_mb():
    big = [(f, os.path.getsize(os.path.join(ROOT, f))) for f in tracked_files()]
    big = [f"{f} ({n:,} bytes)" for f, n in big if n > MAX_BYTES]
    assert not big, ("tracked files over 1 MB (training state, checkpoints, tarballs and raw logs stay out "
                     "of git): " + ", ".join(big))


def test_no_training_state_or_checkpoints_tracked():
    bad = [f for f in tracked_files()
           if f.endswith((".pt", ".ckpt", ".safetensors", ".tar", ".tar.gz", ".tgz", ".log"))
           or re.search(r"\.part\d+$|\.tar\.part", f)]
    assert not bad, "training state, checkpoints, tarballs or raw logs are tracked: " + ", ".join(bad)


def test_no_citations_a_reader_cannot_open():
    hits = []
    for f in tracked_files():
        if PERIOD_TAG.search(os.path.basename(f)):
            hits.append(f"{f}: work-period tag in the file name")
        text = text_of(f)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = CITATIONS.search(line) or (not f.startswith(DATES_ALLOWED_UNDER) and GIT_REF.search(line))
            if m:
                hits.append(f"{f}:{n}: {m.group(0)!r}")
    assert not hits, ("tracked text cites session, issue or spec numbers, or commits (say what "
                      "the thing is instead):\n" + "\n".join(hits[:50]) + (f"\n... {len(hits)} in all" if len(hits) > 50 else ""))


def test_dates_only_in_results_and_provenance_columns():
    hits = []
    for f in tracked_files():
        if f.startswith(DATES_ALLOWED_UNDER):
            continue
        text = text_of(f)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if not DATE.search(line):
                continue
            if f.endswith(".md") and line.lstrip().startswith("|"):
                continue  # a table row: the provenance column
            hits.append(f"{f}:{n}: {line.strip()[:100]}")
    assert not hits, ("dates outside results files and table rows (prose says what, the provenance "
                      "column says when):\n" + "\n".join(hits[:50]) + (f"\n... {len(hits)} in all" if len(hits) > 50 else ""))


def test_the_patterns_can_fail():
    # the checks above are only worth what their patterns catch
    for line in ("see " + "SP" + "EC 10", "Is" + "sue 19", "Sess" + "ion 46 ran",
                 "per " + "DEV" + "ICE.md"):
        assert CITATIONS.search(line), line
    assert GIT_REF.search("see git " + "66b1495") and not GIT_REF.search("git commit")
    for line in ("a specification", "issues", "the session's time", "digit 1234567"):
        assert not CITATIONS.search(line), line
    assert PERIOD_TAG.search("bench_scan_h200_s10.json") and PERIOD_TAG.search("x_s7_graphed.md")
    assert not PERIOD_TAG.search("listops_hgrn2_s2222.json") and not PERIOD_TAG.search("test_sm90.py")
    assert DATE.search("measured 2026-11" + "-21 on") and not DATE.search("version 2.6.0")


@pytest.mark.integration
def test_fairseq_start_up_prints_no_tensorboardx_notice():
    # fairseq imports every task at start-up; one of them logs a request to install tensorboardX when it
    # is missing, on every command. The package depends on it, so the notice must not appear.
    code = "import logging; logging.basicConfig(level=logging.INFO); import fairseq.tasks"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "tensorboardX" not in res.stdout + res.stderr


def test_readme_and_docs_stay_references():
    # a README read in minutes, one reference page per experiment (the run record lives in git history)
    def lines(path):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            return sum(1 for _ in f)

    assert lines("README.md") <= 300, f"README.md has {lines('README.md')} lines (at most 300)"
    pages = [f for f in tracked_files() if f.startswith("docs/") and f.endswith(".md")]
    assert "docs/design.md" in pages and "docs/wikitext103.md" in pages, pages
    long = [f"{f} ({lines(f)} lines)" for f in pages if lines(f) > 400]
    assert not long, "docs pages over 400 lines: " + ", ".join(long)


MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_markdown_links_point_at_files_that_exist():
    broken = []
    for f in tracked_files():
        if not f.endswith(".md"):
            continue
        for target in MD_LINK.findall(text_of(f) or ""):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            if not os.path.exists(os.path.join(ROOT, os.path.dirname(f), target)):
                broken.append(f"{f}: {target}")
    assert not broken, "links to files that are not in the repository:\n" + "\n".join(broken)
