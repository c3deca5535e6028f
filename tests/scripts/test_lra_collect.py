"""bench/lra_collect.py files a gpu_lra.sh call's logs, test JSONs and state the way bench/results keeps
them: the next slice number, the update range from the last filed slice to the log's last validation,
runs that did not train skipped, nothing overwritten."""
import io
import json
import os
import tarfile

from tests.script_module import load_script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
collect = load_script(os.path.join(REPO, "bench", "lra_collect.py"))


def valid_line(n, acc=50.0):
    return (f"2026-11-26 08:52:35 | INFO | valid | epoch 045 | valid on 'valid' subset | loss 2.1 | examples 2000 | "
            f"accuracy {acc} | wps 1 | wpb 1 | bsz 125 | num_updates {n} | best_accuracy {acc}\n")


def write_call(folder, members, state_parts):
    os.makedirs(folder)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    half = len(raw) // 2  # in two parts, as the run tool returns large archives
    open(os.path.join(folder, "session.tgz.part00"), "wb").write(raw[:half])
    open(os.path.join(folder, "session.tgz.part01"), "wb").write(raw[half:])
    for i, data in enumerate(state_parts):
        open(os.path.join(folder, f"lra_state.tar.part{i:02d}"), "wb").write(data)


def test_files_next_slices_results_and_state(tmp_path):
    results, state = tmp_path / "results", tmp_path / "state"
    listops = results / "lra_listops_full"
    os.makedirs(listops)
    (listops / "hgrn2_s2222_eos_train_slice1_updates_0-100_a.log").write_text("x")
    (listops / "hgrn2_s2222_eos_train_slice2_updates_100-180_a.log").write_text("x")
    (listops / "train_slice1_updates_0-500.log").write_text("x")  # ListOps HGRN1's first run: no prefix
    os.makedirs(state)
    for old in ("lra_state.tar.part00", "lra_state.tar.part01"):
        (state / old).write_text("old")
    call = tmp_path / "call"
    write_call(str(call), {
        "lra/runs/train_listops_hgrn2_s2222_eos.log": valid_line(200) + valid_line(250, 55.5),
        "lra/runs/listops_hgrn2_s2222_eos.test_result.json": json.dumps({"num_updates": 250, "accuracy": 55.5}),
        "lra/runs/train_listops_hgrn1.log": valid_line(400),  # did not pass its last slice (500)
        "lra/runs/train_pathfinder_hgrn1.log": valid_line(50),  # a first slice, in another task's folder
        "lra.log": "== lra\n",
    }, [b"new"])
    lines = collect.collect(str(call), "two_h200", str(results), str(state), None, False)
    assert (listops / "hgrn2_s2222_eos_train_slice3_updates_180-250_two_h200.log").read_text().endswith(valid_line(250, 55.5))
    assert json.load(open(listops / "hgrn2_s2222_eos_test_result_after_250.json"))["accuracy"] == 55.5
    assert (results / "lra_pathfinder_full" / "hgrn1_train_slice1_updates_0-50_two_h200.log").is_file()
    assert not any("slice2" in p for p in os.listdir(listops) if p.startswith("train_"))
    assert any(line.startswith("skipped listops_hgrn1: its log validated up to 400, not past the last filed slice's 500")
               for line in lines)
    assert sorted(os.listdir(state)) == ["lra_state.tar.part00"] and (state / "lra_state.tar.part00").read_bytes() == b"new"
    # a second collection of the same call files nothing again and keeps the test JSON
    (listops / "hgrn2_s2222_eos_test_result_after_250.json").write_text('{"kept": 1}')
    lines = collect.collect(str(call), "two_h200", str(results), str(state), None, False)
    assert json.load(open(listops / "hgrn2_s2222_eos_test_result_after_250.json")) == {"kept": 1}
    assert any(line.startswith("skipped listops_hgrn2_s2222_eos") for line in lines)


def test_dry_run_files_nothing_and_bad_folders_say_so(tmp_path, capsys):
    call = tmp_path / "call"
    write_call(str(call), {"lra/runs/train_listops_hgrn1_s2.log": valid_line(10), "lra.log": "x\n"}, [b"s"])
    results, state = tmp_path / "results", tmp_path / "state"
    assert collect.main([str(call), "--tag", "t", "--dest-root", str(results), "--state", str(state), "--dry-run",
                         "--gpu-log", "gpu.log"]) == 0
    assert "slice 1 (0-10)" in capsys.readouterr().out
    assert not results.exists() and not state.exists()
    assert collect.main([str(tmp_path), "--tag", "t"]) == 2
    assert "no session.tgz.part* in" in capsys.readouterr().err
    assert collect.main([str(call), "--tag", "a/b"]) == 2
    assert "goes into file names" in capsys.readouterr().err


def tar_parts(files, part_bytes=None):
    """A tar of {name: bytes}, whole or split every ``part_bytes`` bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    step = part_bytes or len(raw)
    return [raw[i: i + step] for i in range(0, len(raw), step)]


def untar(folder):
    data = b"".join(open(os.path.join(folder, p), "rb").read() for p in sorted(os.listdir(folder)))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_keep_other_runs_merges_the_paused_runs_into_the_new_state(tmp_path):
    """--keep-other-runs: the new state holds the call's runs (their new checkpoints) and the old state's other
    runs untouched; without it the call's parts replace the old ones; parts that are no tar: one line."""
    results, state = tmp_path / "results", tmp_path / "state"
    os.makedirs(state)
    old = {"listops_a/checkpoint_last.pt": b"a-old", "listops_a/checkpoint_best.pt": b"a-best-old",
           "listops_paused/checkpoint_last.pt": b"p" * 3000, "listops_paused/checkpoint_best.pt": b"q"}
    for i, part in enumerate(tar_parts(old, part_bytes=4096)):  # in several parts, as gpu_lra.sh splits them
        (state / f"lra_state.tar.part{i:02d}").write_bytes(part)
    call = tmp_path / "call"
    new = {"listops_a/checkpoint_last.pt": b"a-new", "listops_b/checkpoint_last.pt": b"b-new"}
    write_call(str(call), {"lra/runs/train_listops_a.log": valid_line(10), "lra.log": "x\n"}, tar_parts(new))
    lines = collect.collect(str(call), "t", str(results), str(state), None, False, keep_other_runs=True)
    assert untar(state) == {"listops_a/checkpoint_last.pt": b"a-new", "listops_b/checkpoint_last.pt": b"b-new",
                            "listops_paused/checkpoint_last.pt": b"p" * 3000, "listops_paused/checkpoint_best.pt": b"q"}
    assert any("listops_paused from the old state" in line for line in lines)
    # without the option: the call's parts alone
    collect.collect(str(call), "t2", str(results), str(state), None, False)
    assert untar(state) == new
    (state / "lra_state.tar.part00").write_bytes(b"not a tar")
    try:
        collect.collect(str(call), "t3", str(results), str(state), None, False, keep_other_runs=True)
    except collect.CollectError as e:
        assert "its lra_state.tar parts do not form a tar archive" in str(e)
    else:
        raise AssertionError("a state that is no tar archive was merged")
