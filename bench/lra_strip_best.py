#!/usr/bin/env python3
"""Drop the optimizer state from LRA runs' ``checkpoint_best.pt`` files, in place (atomically).

    python3 bench/lra_strip_best.py RUNS_DIR/RUN/checkpoint_best.pt ...

A best checkpoint is only ever evaluated (``scripts/lra_eval.py``; fairseq resumes from
``checkpoint_last.pt``), but fairseq writes it with the optimizer's moments: two more copies of the
weights. ``bench/gpu_lra.sh`` strips the bests it packs into ``lra_state.tar`` so that the state handed
from one GPU call to the next stays inside the 64 MiB the run tool copies (a d-128 ListOps model's best
goes from 15.7 to ~5.2 MB). Prints one line per file; a file without optimizer state is left alone. The
file keeps its modification time: rewritten after ``checkpoint_last.pt`` it would be the newer file, which
the resume once took for a save whose copy to the last was cut short, and resumed from (restarting at
update 0: hgrn_fairseq/checkpoint_safety.py now refuses checkpoints without optimizer state).
"""
import os
import sys

import torch


def strip(path: str) -> str:
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("last_optimizer_state") is None:
        return f"{path}: no optimizer state, left as is"
    before = os.stat(path)
    del state["last_optimizer_state"]
    tmp = path + ".strip.tmp"
    torch.save(state, tmp)
    # the file keeps its times: a best newer than checkpoint_last.pt looks like a save the last copy missed
    os.utime(tmp, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(tmp, path)
    return f"{path}: optimizer state dropped, {before.st_size:,} -> {os.path.getsize(path):,} bytes"


def main(argv) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for path in argv:
        if os.path.basename(path) != "checkpoint_best.pt":
            print(f"lra_strip_best.py: {path} is not a checkpoint_best.pt (a run resumes from its last checkpoint, "
                  "which keeps its optimizer state)", file=sys.stderr)
            return 2
        print(strip(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
