#!/usr/bin/env python3
"""File what one GPU call of ``bench/gpu_lra.sh`` brought back, the way bench/results keeps LRA runs.

    python bench/lra_collect.py FILES_AT --tag concurrent3_h200 [--gpu-log NAME] [--dry-run]

FILES_AT is the folder the run tool put the call's files in (``lra_state.tar.part*``,
``session.tgz.part*``). For every run the call trained (``lra/runs/train_<TASK>_<ID>.log`` inside the
session archive):

* its log becomes the run's next slice, ``<dest>/<prefix>train_slice<K>_updates_<A>-<B>_<tag>.log`` in
  ``<dest-root>/lra_<TASK>_full/``: K one more than the run's last slice there, A where that slice ended
  (0 for a first slice), B the last update the log validated at. A log that does not go past A (a run
  that did not train in this call) is reported and not filed.
* its test JSON becomes ``<prefix>test_result_after_<num_updates>.json`` (an existing one is kept).

``<prefix>`` is the run id without the task (``hgrn2_s2222_eos_``); the first runs of 2026-11-24 keep
their names (ListOps HGRN1: no prefix, HGRN2: ``hgrn2_``). The checkpoint parts replace those in
``--state`` (the next call's ``LRA_CARRY``), and ``--gpu-log NAME`` appends the call's ``lra.log`` to
``<dest>/NAME`` under a header. ``--keep-other-runs``: the runs that ``--state`` holds and the call's
parts do not (a run paused while others went on: ``LRA_SAVE_STATE=trained`` packs only the trained
ones) stay in the new state beside the call's, repacked in parts of 15 MiB as gpu_lra.sh splits them.
Prints what it did; nothing is overwritten.

Before filing anything it checks that every log resumed where the run's filed slices end (fairseq's
"Loaded checkpoint ... @ N updates"; "No existing checkpoint found" is 0): a call that found a fresh
machine and was given no state starts its runs from 0, and such a log is refused with one line.
``--restarted RUN_ID ...`` files it as the run's first slice after renaming the run's filed slices and
test JSONs ``discarded_restarted_*``. A log that loaded a checkpoint at update 0 resumed from one without
optimizer state (2026-11-27: a stripped best, before checkpoint_safety refused those): the schedule started
again on the best's weights, so it is no continuation either. ``--discard RUN_ID ...`` files such a log as
``<dest>/discarded_<prefix>train_<A>-<B>_<tag>.log`` for the record (A where it started, B its last
validation; no slice, no test JSON) and keeps the run's checkpoints of ``--state``, not the call's.
``--drop RUN_ID ...`` leaves runs out of the new state (finished or abandoned ones, to make room in the
run tool's 64 MiB; their checkpoints stay in git history).

"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import sys
import tarfile
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALID = re.compile(r"valid on 'valid' subset \|.*?\| num_updates (\d+)")
SLICE = re.compile(r"train_slice(\d+)_updates_(\d+)-(\d+)")
LEGACY_PREFIX = {"listops_hgrn1": "", "listops_hgrn2": "hgrn2_"}  # the first runs' file names


class CollectError(Exception):
    pass


def prefix_of(run_id: str, task: str) -> str:
    if run_id in LEGACY_PREFIX:
        return LEGACY_PREFIX[run_id]
    return run_id[len(task) + 1:] + "_"


def last_slice(dest: str, prefix: str) -> Tuple[int, int]:
    """(K, B) of the run's last filed slice in dest, (0, 0) when there is none."""
    best = (0, 0)
    for path in glob.glob(os.path.join(dest, f"{prefix}train_slice*_updates_*.log")):
        name = os.path.basename(path)
        m = SLICE.match(name[len(prefix):])
        if m and int(m.group(1)) > best[0]:
            best = (int(m.group(1)), int(m.group(3)))
    return best


RESUMED = re.compile(r"Loaded checkpoint (\S+) \(epoch \d+ @ (\d+) updates\)")


def resumed_from(text: str) -> Optional[int]:
    """The update a training log started from: fairseq's "Loaded checkpoint ... @ N updates", 0 for its
    "No existing checkpoint found", None when the log says neither (the first runs' logs)."""
    return resumed_checkpoint(text)[0]


def resumed_checkpoint(text: str) -> Tuple[Optional[int], Optional[str]]:
    """(update, checkpoint path) a training log started from: (0, None) for a fresh start."""
    for line in text.splitlines():
        m = RESUMED.search(line)
        if m:
            return int(m.group(2)), m.group(1)
        if "No existing checkpoint found" in line:
            return 0, None
    return None, None


def discard_run_files(dest: str, prefix: str, dry_run: bool) -> List[str]:
    """Renames a restarted run's filed slices and test JSONs to discarded_restarted_<name>: the names moved."""
    names = sorted(os.path.basename(p) for p in
                   glob.glob(os.path.join(dest, f"{prefix}train_slice*_updates_*.log"))
                   + glob.glob(os.path.join(dest, f"{prefix}test_result_after_*.json")))
    for name in names:
        target = os.path.join(dest, "discarded_restarted_" + name)
        if os.path.exists(target):
            raise CollectError(f"{target} exists already: move it away by hand, then collect again")
        if not dry_run:
            os.rename(os.path.join(dest, name), target)
    return names


def last_update(text: str) -> Optional[int]:
    found = [int(n) for n in VALID.findall(text)]
    return max(found) if found else None


def read_parts(paths: List[str], mode: str = "r:*") -> Dict[str, Tuple[tarfile.TarInfo, bytes]]:
    """The files of an archive split into parts (joined in order), by name: (member, bytes); plain or
    compressed (the state is gzip-compressed since 2026-11-27)."""
    out: Dict[str, Tuple[tarfile.TarInfo, bytes]] = {}
    data = b"".join(open(p, "rb").read() for p in paths)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    out[m.name.lstrip("./")] = (m, tar.extractfile(m).read())
    except tarfile.TarError as e:
        raise CollectError(f"{os.path.dirname(paths[0])}: its {os.path.basename(paths[0]).split('.part')[0]} parts "
                           f"do not form a tar archive ({e})")
    return out


def read_session(files_at: str) -> Dict[str, bytes]:
    """The members of the call's session archive (its parts joined), by name."""
    parts = sorted(glob.glob(os.path.join(files_at, "session.tgz.part*")))
    if not parts:
        raise CollectError(f"no session.tgz.part* in {files_at}: give the folder the run tool returned (files_at)")
    return {name: data for name, (_, data) in read_parts(parts, "r:gz").items()}


PART_BYTES = 15 * 1024 * 1024  # gpu_lra.sh: split -b 15M


def merged_parts(old_paths: List[str], new_paths: List[str]) -> Tuple[List[bytes], List[str]]:
    """The call's state plus the runs (top-level folders) only the old state holds: (parts, kept runs)."""
    parts, _, kept, _ = selected_parts(old_paths, new_paths, True, (), ())
    return parts, kept


def selected_parts(old_paths: List[str], new_paths: List[str], keep_other_runs: bool, discard: Sequence[str],
                   drop: Sequence[str]) -> Tuple[List[bytes], List[str], List[str], List[str]]:
    """The call's runs but the discarded ones; from the old state the discarded runs (and with keep_other_runs
    every run the call's parts do not hold); without the dropped runs: (parts, runs from the call, runs from the
    old state, dropped runs)."""
    run_of = lambda name: name.split("/", 1)[0]  # noqa: E731
    new = {n: v for n, v in read_parts(new_paths).items() if run_of(n) not in discard}
    old = read_parts(old_paths) if old_paths else {}
    new_runs = {run_of(n) for n in new}
    kept = {n: v for n, v in old.items()
            if run_of(n) in discard or (keep_other_runs and run_of(n) not in new_runs)}
    merged = {**kept, **new}
    unknown = sorted(set(drop) - {run_of(n) for n in merged})
    if unknown:
        raise CollectError(f"--drop {' '.join(unknown)}: the new state would hold no such run "
                           f"(it holds {', '.join(sorted({run_of(n) for n in merged}))})")
    merged = {n: v for n, v in merged.items() if run_of(n) not in drop}
    return (pack_members(merged), sorted(new_runs - set(drop)), sorted({run_of(n) for n in kept} - set(drop)),
            sorted(set(drop)))


def pack_members(members: Dict[str, Tuple[tarfile.TarInfo, bytes]]) -> List[bytes]:
    """A gzip-compressed tar of the members (their times kept), split in parts of PART_BYTES as gpu_lra.sh
    writes it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, (info, data) in sorted(members.items()):
            info.name, info.size = name, len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return [raw[i: i + PART_BYTES] for i in range(0, len(raw), PART_BYTES)]


def collect(files_at: str, tag: str, dest_root: str, state: str, gpu_log: Optional[str], dry_run: bool,
            keep_other_runs: bool = False, restarted: Sequence[str] = (), discard: Sequence[str] = (),
            drop: Sequence[str] = ()) -> List[str]:
    done: List[str] = []
    members = read_session(files_at)
    runs = sorted(m for m in members if re.fullmatch(r"lra/runs/train_[a-z]+[0-9]*_[^/]+\.log", m))
    if not runs:
        raise CollectError(f"the session archive in {files_at} has no lra/runs/train_*.log: was it a gpu_lra.sh call?")
    run_ids = [os.path.basename(m)[len("train_"):-len(".log")] for m in runs]
    for option, names in (("--restarted", restarted), ("--discard", discard)):
        unknown = sorted(set(names) - set(run_ids))
        if unknown:
            raise CollectError(f"{option} {' '.join(unknown)}: the call trained no such run (it trained {', '.join(run_ids)})")
    if set(restarted) & set(discard):
        raise CollectError(f"{' '.join(sorted(set(restarted) & set(discard)))}: give a run --restarted or --discard, not both")
    # Check every log before filing any: a log that did not resume where the filed slices end would be filed as
    # their continuation with a wrong update range (a call that found a fresh machine and was given no state
    # starts its runs from 0).
    for member, run_id in zip(runs, run_ids):
        task = run_id.split("_", 1)[0]
        dest = os.path.join(dest_root, f"lra_{task}_full")
        _, start = last_slice(dest, prefix_of(run_id, task))
        began, loaded = resumed_checkpoint(members[member].decode("utf-8", "replace"))
        if began is None or began == start or (began == 0 and run_id in restarted) or run_id in discard:
            continue
        if began == 0 and loaded is not None:
            raise CollectError(f"{run_id}: its log loaded {loaded} at update 0 (a checkpoint without optimizer "
                               f"state: the schedule started again on its weights) while its filed slices end at "
                               f"{start}: no continuation; pass --discard {run_id} to keep the log as discarded_* "
                               f"and the run's checkpoints of the old state")
        if began == 0:
            raise CollectError(f"{run_id}: its log starts from update 0 (no checkpoint was restored: the call was not "
                               f"given the state?) while its filed slices end at {start}: pass --restarted {run_id} "
                               f"to rename them discarded_restarted_* and file this log as the run's first slice")
        raise CollectError(f"{run_id}: its log resumed from update {began} while its filed slices end at {start} "
                           f"(the call was given another state than the last filed one): file it by hand")
    parts = sorted(glob.glob(os.path.join(files_at, "lra_state.tar.part*")))
    old_parts = sorted(glob.glob(os.path.join(state, "lra_state.tar.part*")))
    selected = None  # the new state with --discard / --drop, made (and checked) before anything is filed
    if drop and not parts:
        raise CollectError(f"--drop {' '.join(drop)}: {files_at} has no lra_state.tar.part* (the call packed no state), "
                           f"so there is no new state to leave them out of")
    if parts and (discard or drop):
        selected = selected_parts(old_parts, parts, keep_other_runs, discard, drop)
    dests = set()
    for member, run_id in zip(runs, run_ids):
        task = run_id.split("_", 1)[0]
        dest = os.path.join(dest_root, f"lra_{task}_full")
        dests.add(dest)
        prefix = prefix_of(run_id, task)
        if run_id in discard:
            text = members[member].decode("utf-8", "replace")
            began, end = resumed_from(text) or 0, last_update(text)
            target = os.path.join(dest, f"discarded_{prefix}train_{began}-{end}_{tag}.log")
            if os.path.exists(target):
                raise CollectError(f"{target} exists already: move it away by hand, then collect again")
            done.append(f"{run_id}: discarded ({began}-{end}) -> {os.path.relpath(target, REPO)}; "
                        f"the state keeps its old checkpoints")
            if not dry_run:
                os.makedirs(dest, exist_ok=True)
                with open(target, "wb") as f:
                    f.write(members[member])
            continue
        if run_id in restarted:
            moved = discard_run_files(dest, prefix, dry_run)
            done.append(f"{run_id}: restarted from 0; {len(moved)} filed file(s) renamed discarded_restarted_*")
        k, start = last_slice(dest, prefix)
        if run_id in restarted and dry_run:
            k, start = 0, 0
        text = members[member].decode("utf-8", "replace")
        end = last_update(text)
        if end is None or end <= start:
            done.append(f"skipped {run_id}: its log validated up to {end}, not past the last filed slice's {start}")
            continue
        target = os.path.join(dest, f"{prefix}train_slice{k + 1}_updates_{start}-{end}_{tag}.log")
        done.append(f"{run_id}: slice {k + 1} ({start}-{end}) -> {os.path.relpath(target, REPO)}")
        if not dry_run:
            os.makedirs(dest, exist_ok=True)
            with open(target, "wb") as f:
                f.write(members[member])
        result = members.get(f"lra/runs/{run_id}.test_result.json")
        if result is not None:
            n = json.loads(result)["num_updates"]
            target = os.path.join(dest, f"{prefix}test_result_after_{n}.json")
            if os.path.exists(target):
                done.append(f"{run_id}: kept the existing {os.path.relpath(target, REPO)}")
            else:
                done.append(f"{run_id}: test {json.loads(result)['accuracy']} -> {os.path.relpath(target, REPO)}")
                if not dry_run:
                    with open(target, "wb") as f:
                        f.write(result)
    if parts:
        if selected is not None:
            data, taken, kept, dropped = selected
            done.append(f"state: from the call {', '.join(taken) or 'no run'}; from the old state "
                        f"{', '.join(kept) or 'no run'}{'; left out ' + ', '.join(dropped) if dropped else ''}: "
                        f"{len(data)} part(s) in {os.path.relpath(state, REPO)}/lra_state.tar.part*")
        elif keep_other_runs and old_parts:
            data, kept = merged_parts(old_parts, parts)
            done.append(f"state: the call's runs and {', '.join(kept) or 'no other run'} from the old state, "
                        f"{len(data)} part(s) in {os.path.relpath(state, REPO)}/lra_state.tar.part*")
        else:
            data = [open(p, "rb").read() for p in parts]
            done.append(f"state: {len(parts)} part(s) replace {os.path.relpath(state, REPO)}/lra_state.tar.part*")
        if not dry_run:
            os.makedirs(state, exist_ok=True)
            for old in old_parts:
                os.remove(old)
            for i, chunk in enumerate(data):
                with open(os.path.join(state, f"lra_state.tar.part{i:02d}"), "wb") as f:
                    f.write(chunk)
    if gpu_log:
        log = members.get("lra.log")
        if log is None:
            raise CollectError("the session archive has no lra.log to append")
        if len(dests) != 1:
            raise CollectError(f"--gpu-log: the call trained runs of several tasks ({sorted(dests)}); append by hand")
        target = os.path.join(dests.pop(), gpu_log)
        done.append(f"lra.log appended to {os.path.relpath(target, REPO)}")
        if not dry_run:
            with open(target, "ab") as f:
                f.write(f"===== call {tag} ({os.path.basename(os.path.normpath(files_at))})\n".encode() + log)
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files_at")
    ap.add_argument("--tag", required=True, help="how the slice ran, for its file name (e.g. concurrent3_h200)")
    ap.add_argument("--dest-root", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--state", default=os.path.join(REPO, "bench", "results", "lra_state"))
    ap.add_argument("--gpu-log", default=None, help="append the call's lra.log to this file in the task's folder")
    ap.add_argument("--dry-run", action="store_true", help="say what would be filed, file nothing")
    ap.add_argument("--keep-other-runs", action="store_true",
                    help="keep the runs of --state that the call's parts do not hold (paused runs)")
    ap.add_argument("--restarted", nargs="+", default=[], metavar="RUN_ID",
                    help="runs (e.g. listops_hgrn1_s2222_layernorm_eos) that this call started again from 0: "
                         "their filed slices and test JSONs are renamed discarded_restarted_*, the log is slice 1")
    ap.add_argument("--discard", nargs="+", default=[], metavar="RUN_ID",
                    help="runs whose log this call must not file as a slice (they resumed at update 0 from a "
                         "checkpoint without optimizer state): kept as discarded_*, the state keeps their old checkpoints")
    ap.add_argument("--drop", nargs="+", default=[], metavar="RUN_ID",
                    help="runs to leave out of the new state (finished or abandoned; git history keeps them)")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.tag):
        print(f"lra_collect: --tag {args.tag!r} goes into file names: letters, digits, '_', '.', '-' only", file=sys.stderr)
        return 2
    try:
        for line in collect(args.files_at, args.tag, args.dest_root, args.state, args.gpu_log, args.dry_run,
                            args.keep_other_runs, args.restarted, args.discard, args.drop):
            print(line)
    except CollectError as e:
        print(f"lra_collect: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
