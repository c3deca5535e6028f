#!/usr/bin/env python3
"""Before an LRA GPU call: where would each run of the committed state resume, and does the copy fit?

    python bench/lra_state_check.py [--state bench/results/lra_state] [--carry PATH ...]

For every run in the state's ``lra_state.tar.part*`` (plain or gzip-compressed) it unpacks the run's files
into a temporary folder, asks ``hgrn_fairseq.checkpoint_safety.resume_choice`` (the code a GPU call runs)
which checkpoint fairseq would resume from, reads its update count and whether it holds optimizer state,
and compares that update with the end of the run's last filed slice in ``bench/results/lra_<task>_full/``
(``lra_collect.py``'s names). A run that would resume elsewhere than where its slices end, or from a
checkpoint without optimizer state (fairseq then starts again at update 0), is a problem: on
2026-11-27 two GPU calls were lost to a stripped best that the resume picked. A finished run (its
``finished_max_update_N`` mark, no last checkpoint) is listed as such.

``--carry PATH ...``: the files the run tool will carry beside the tracked ones (e.g. ``.whl/prebuilt``
and the other wheels); their size plus that of every file git tracks or would add (untracked, not
ignored) is checked against the run tool's 64 MiB. Exit status 1 when anything is wrong, with one line
per problem; 0 otherwise. Reads nothing on a GPU; a few seconds on a CPU.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
import lra_collect as collect  # noqa: E402  (its slice names and state parts)

LIMIT = 64 * 1024 * 1024  # what the run tool copies to the GPU machine (tree + carry)


def check_state(state: str, dest_root: str):
    """(rows, problems): one row per run of the state: (run, resumes from, update, optimizer state, filed end)."""
    import torch

    from hgrn_fairseq.checkpoint_safety import has_optimizer_state, resume_choice

    parts = sorted(glob.glob(os.path.join(state, "lra_state.tar.part*")))
    if not parts:
        return [], [f"{state} has no lra_state.tar.part* files"]
    members = collect.read_parts(parts)
    rows, problems = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (info, data) in members.items():
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            os.utime(path, (info.mtime, info.mtime))  # as tar restores them: the resume looks at the times
        for run in sorted({name.split("/", 1)[0] for name in members}):
            folder = os.path.join(tmp, run)
            task = run.split("_", 1)[0]
            _, filed_end = collect.last_slice(os.path.join(dest_root, f"lra_{task}_full"), collect.prefix_of(run, task))
            marks = glob.glob(os.path.join(folder, "finished_max_update_*"))
            last = os.path.join(folder, "checkpoint_last.pt")
            if marks and not os.path.exists(last):
                rows.append((run, "finished (" + os.path.basename(marks[0]) + ")", "-", "-", filed_end))
                continue
            choice = resume_choice(folder, last, master=False) or (last if os.path.exists(last) else None)
            if choice is None:
                rows.append((run, "nothing (starts from 0)", 0, "-", filed_end))
                problems.append(f"{run}: no checkpoint to resume from, while its filed slices end at {filed_end}")
                continue
            ckpt = torch.load(choice, map_location="cpu", weights_only=False, mmap=True)
            update = ckpt["optimizer_history"][-1]["num_updates"]
            optimizer = has_optimizer_state(choice)
            rows.append((run, os.path.basename(choice), update, "yes" if optimizer else "NO", filed_end))
            if not optimizer:
                problems.append(f"{run}: would resume from {os.path.basename(choice)}, which holds no optimizer "
                                f"state (fairseq starts again at update 0)")
            elif update != filed_end:
                problems.append(f"{run}: would resume at update {update} while its filed slices end at {filed_end}")
    return rows, problems


def tree_bytes(carry) -> int:
    """Bytes the run tool copies: files git tracks or would add (untracked, not ignored), plus ``carry``."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True).stdout
    total = 0
    for rel in filter(None, out.split(b"\0")):
        path = os.path.join(REPO, rel.decode())
        if os.path.isfile(path):
            total += os.path.getsize(path)
    for item in carry:
        paths = [item] if os.path.isfile(item) else [os.path.join(d, f) for d, _, fs in os.walk(item) for f in fs]
        total += sum(os.path.getsize(p) for p in paths)
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default=os.path.join(REPO, "bench", "results", "lra_state"))
    ap.add_argument("--dest-root", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--carry", nargs="*", default=None, metavar="PATH",
                    help="the paths the run tool will carry (files or folders): checks tree + carry <= 64 MiB")
    args = ap.parse_args(argv)
    rows, problems = check_state(args.state, args.dest_root)
    print("| run | resumes from | at update | optimizer state | filed slices end |")
    print("| --- | --- | ---: | --- | ---: |")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    if args.carry is not None:
        missing = [p for p in args.carry if not os.path.exists(p)]
        if missing:
            problems.append(f"--carry {' '.join(missing)}: no such file or folder")
        else:
            total = tree_bytes(args.carry)
            print(f"copy: {total:,} bytes of {LIMIT:,} (tree and carry)")
            if total > LIMIT:
                problems.append(f"the tree and the carry take {total:,} bytes, over the run tool's {LIMIT:,}: carry "
                                f"the fairseq sdist instead of .whl/prebuilt, or drop finished runs from the state "
                                f"(lra_collect.py --drop)")
    for line in problems:
        print(f"lra_state_check: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
