"""Move an MQAR sweep (scripts/mqar_sweep.py ``--out``) between machines in a few small files.

``pack STATE DEST``: writes into DEST

* ``mqar_results.tgz``: everything but the checkpoints (``runs/*.json``, ``logs/``, ``runs.csv``,
  ``table.md``, ``plot.png``);
* ``mqar_ckpt.tar.partNN``: the ``checkpoint_last.pt`` of paused runs, smallest first, while their
  sum stays within ``--ckpt-mb`` MiB, cut into parts of ``--part-mb`` MiB (the GPU machine returns at
  most 8 files of 16 MiB, and the run tool carries at most 64 MiB into a call).

It prints which paused runs' checkpoints were left out: where the sweep is restored from these
files, those runs start over (``mqar_sweep.py`` records a restart and says so).

``restore CARRY STATE``: unpacks ``CARRY/mqar_results.tgz`` and the joined parts into STATE (which
must not hold a sweep already: a warm machine continues its own). The archive names the sweep folder it
was packed from; STATE must have the same folder name (``--any-name`` lifts that), so that a carried
sweep is never unpacked into another sweep's folder (bench/gpu_mqar.sh restores whatever lies in its
carry folder into MQAR_STATE).
"""
import argparse
import glob
import io
import json
import os
import sys
import tarfile
from typing import List, Tuple

RESULTS = "mqar_results.tgz"
PARTS = "mqar_ckpt.tar.part"
RECORDS = ("runs", "logs", "runs.csv", "table.md", "plot.png")
NAME = "sweep_name.txt"  # in mqar_results.tgz: the folder name of the sweep it was packed from


def sweep_name(state: str) -> str:
    return os.path.basename(os.path.normpath(os.path.abspath(state)))


def paused_checkpoints(state: str) -> List[Tuple[int, str, str]]:
    """(size, path relative to state, run name) of every paused run's checkpoint_last.pt."""
    found = []
    for path in sorted(glob.glob(os.path.join(state, "runs", "*.json"))):
        with open(path) as f:
            run = json.load(f)
        if run.get("status") != "paused":
            continue
        rel = os.path.join("checkpoints", run["name"], "checkpoint_last.pt")
        if os.path.isfile(os.path.join(state, rel)):
            found.append((os.path.getsize(os.path.join(state, rel)), rel, run["name"]))
    return found


def pack(state: str, dest: str, ckpt_mb: float = 26.0, part_mb: float = 15.0) -> str:
    """Write the files of the module docstring; return a one-line account of the checkpoints."""
    if not os.path.isdir(os.path.join(state, "runs")):
        raise SystemExit(f"mqar_state pack: {state} has no runs/ folder: not a sweep's --out")
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(os.path.join(dest, RESULTS), "w:gz") as tar:
        for name in RECORDS:
            if os.path.exists(os.path.join(state, name)):
                tar.add(os.path.join(state, name), arcname=name)
        data = sweep_name(state).encode()
        info = tarfile.TarInfo(NAME)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    for old in glob.glob(os.path.join(dest, PARTS + "*")):
        os.remove(old)
    limit = ckpt_mb * 2**20
    candidates = paused_checkpoints(state)
    total, kept, left = 0, [], []
    for size, rel, name in sorted(candidates):
        if total + size <= limit:
            total += size
            kept.append(rel)
        else:
            left.append(f"{name} ({size / 2**20:.1f} MiB)")
    if kept:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel in kept:
                tar.add(os.path.join(state, rel), arcname=rel)
        data, step = buf.getvalue(), max(1, int(part_mb * 2**20))
        for i in range(0, len(data), step):
            with open(os.path.join(dest, f"{PARTS}{i // step:02d}"), "wb") as f:
                f.write(data[i : i + step])
    note = f"{len(kept)} of {len(candidates)} paused runs' checkpoints packed ({total / 2**20:.1f} MiB)"
    if left:
        note += f"; not packed (they start over where the sweep is restored from these files): {', '.join(left)}"
    return note


def restore(carry: str, state: str, any_name: bool = False) -> str:
    results = os.path.join(carry, RESULTS)
    if not os.path.isfile(results):
        raise SystemExit(f"mqar_state restore: no {results}: copy the files a GPU call returned into {carry}")
    if glob.glob(os.path.join(state, "runs", "*.json")):
        raise SystemExit(f"mqar_state restore: {state} holds a sweep already; continue it, or remove it first")
    with tarfile.open(results) as tar:
        members = [m for m in tar.getmembers() if m.name != NAME]
        packed = tar.extractfile(NAME).read().decode() if NAME in tar.getnames() else None  # None: packed before
        if packed is not None and packed != sweep_name(state) and not any_name:
            raise SystemExit(f"mqar_state restore: {carry} holds the sweep packed from a folder named '{packed}', "
                             f"not '{sweep_name(state)}': restore it into .../{packed} (bench/gpu_mqar.sh: "
                             f"MQAR_STATE=results/{packed}), or empty {carry} to start a new sweep")
        os.makedirs(state, exist_ok=True)
        tar.extractall(state, members=members, filter="data")
    parts = sorted(glob.glob(os.path.join(carry, PARTS + "*")))
    if parts:
        data = b"".join(open(p, "rb").read() for p in parts)
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(state, filter="data")
        except tarfile.TarError as e:
            raise SystemExit(f"mqar_state restore: the {len(parts)} checkpoint parts in {carry} do not make a "
                             f"tar ({e}): copy all of mqar_ckpt.tar.part* of one call") from None
    runs = len(glob.glob(os.path.join(state, "runs", "*.json")))
    ckpts = len(glob.glob(os.path.join(state, "checkpoints", "*", "checkpoint_last.pt")))
    return f"restored {runs} run records and {ckpts} checkpoints from {carry} into {state}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("state")
    a.add_argument("dest")
    a.add_argument("--ckpt-mb", type=float, default=26.0)
    a.add_argument("--part-mb", type=float, default=15.0)
    b = sub.add_parser("restore")
    b.add_argument("carry")
    b.add_argument("state")
    b.add_argument("--any-name", action="store_true", help="restore into a folder of another name")
    args = p.parse_args(argv)
    if args.cmd == "pack":
        print(pack(args.state, args.dest, args.ckpt_mb, args.part_mb))
    else:
        print(restore(args.carry, args.state, args.any_name))


if __name__ == "__main__":
    sys.exit(main())
