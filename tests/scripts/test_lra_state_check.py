"""bench/lra_state_check.py: where each run of an LRA state would resume, against its filed slices, and
whether the tree and the carry fit the run tool's copy. Checkpoints here are small dicts in fairseq's
layout, written with torch.save; the expected updates are the ones written into them."""
import io
import os
import tarfile

import torch

from tests.script_module import load_script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
check = load_script(os.path.join(REPO, "bench", "lra_state_check.py"))


def checkpoint(updates, optimizer=True):
    state = {"optimizer_history": [{"num_updates": updates}], "model": {"w": torch.zeros(2)}}
    if optimizer:
        state["last_optimizer_state"] = {"state": {0: {"exp_avg": torch.ones(2)}}}
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def write_state(folder, files):
    """files: {name: (bytes, mtime)} as a gzip-compressed tar in two parts, as gpu_lra.sh writes it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, (data, mtime) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    os.makedirs(folder)
    half = len(raw) // 2
    open(os.path.join(folder, "lra_state.tar.part00"), "wb").write(raw[:half])
    open(os.path.join(folder, "lra_state.tar.part01"), "wb").write(raw[half:])


def test_runs_resume_where_their_slices_end_or_each_problem_gets_a_line(tmp_path, capsys):
    t = 1_700_000_000
    write_state(tmp_path / "state", {
        # the state committed on 2026-11-27: a stripped best newer than the last; the resume takes the last
        "listops_hgrn1_s1_good/checkpoint_last.pt": (checkpoint(10), t),
        "listops_hgrn1_s1_good/checkpoint_best.pt": (checkpoint(10, optimizer=False), t + 30),
        # an older last than the filed slices (another state was carried)
        "listops_hgrn1_s1_old/checkpoint_last.pt": (checkpoint(7), t),
        # only a stripped best and no finished mark: nothing to resume from
        "listops_hgrn1_s1_bestonly/checkpoint_best.pt": (checkpoint(5, optimizer=False), t),
        # a finished run keeps its best and the mark
        "listops_hgrn1_s1_done/checkpoint_best.pt": (checkpoint(20, optimizer=False), t),
        "listops_hgrn1_s1_done/finished_max_update_20": (b"20", t),
    })
    listops = tmp_path / "results" / "lra_listops_full"
    listops.mkdir(parents=True)
    for prefix, end in (("hgrn1_s1_good_", 10), ("hgrn1_s1_old_", 12), ("hgrn1_s1_bestonly_", 5), ("hgrn1_s1_done_", 20)):
        (listops / f"{prefix}train_slice1_updates_0-{end}_t.log").write_text("x")
    rc = check.main(["--state", str(tmp_path / "state"), "--dest-root", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "| listops_hgrn1_s1_good | checkpoint_last.pt | 10 | yes | 10 |" in out
    assert "| listops_hgrn1_s1_done | finished (finished_max_update_20) | - | - | 20 |" in out
    problems = sorted(line for line in err.splitlines() if line.startswith("lra_state_check: "))
    assert problems == [
        "lra_state_check: listops_hgrn1_s1_bestonly: no checkpoint to resume from, while its filed slices end at 5",
        "lra_state_check: listops_hgrn1_s1_old: would resume at update 7 while its filed slices end at 12",
    ], err
    # the good run alone passes
    write_state(tmp_path / "state2", {"listops_hgrn1_s1_good/checkpoint_last.pt": (checkpoint(10), t),
                                      "listops_hgrn1_s1_good/checkpoint_best.pt": (checkpoint(10, False), t + 30)})
    assert check.main(["--state", str(tmp_path / "state2"), "--dest-root", str(tmp_path / "results")]) == 0


def test_copy_over_the_run_tools_limit_is_a_problem(tmp_path, capsys, monkeypatch):
    write_state(tmp_path / "state", {"listops_hgrn1_s1_good/checkpoint_last.pt": (checkpoint(0), 1_700_000_000)})
    carry = tmp_path / "wheel.whl"
    carry.write_bytes(b"w" * 1000)
    args = ["--state", str(tmp_path / "state"), "--dest-root", str(tmp_path / "results"), "--carry", str(carry)]
    assert check.main(args) == 0
    copied = check.tree_bytes([str(carry)])
    assert copied > 1000 and f"copy: {copied:,} bytes" in capsys.readouterr().out
    monkeypatch.setattr(check, "LIMIT", copied - 1)
    assert check.main(args) == 1
    assert "over the run tool's" in capsys.readouterr().err
    assert check.main(args[:-2] + ["--carry", str(tmp_path / "nope")]) == 1
    assert f"--carry {tmp_path / 'nope'}: no such file or folder" in capsys.readouterr().err
