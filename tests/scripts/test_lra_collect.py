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
        "lra/runs/train_pathfinder6_hgrn2_s2222.log": valid_line(75),  # an easier Pathfinder: its own folder
        "lra.log": "== lra\n",
    }, [b"new"])
    lines = collect.collect(str(call), "two_h200", str(results), str(state), None, False)
    assert (listops / "hgrn2_s2222_eos_train_slice3_updates_180-250_two_h200.log").read_text().endswith(valid_line(250, 55.5))
    assert json.load(open(listops / "hgrn2_s2222_eos_test_result_after_250.json"))["accuracy"] == 55.5
    assert (results / "lra_pathfinder_full" / "hgrn1_train_slice1_updates_0-50_two_h200.log").is_file()
    assert (results / "lra_pathfinder6_full" / "hgrn2_s2222_train_slice1_updates_0-75_two_h200.log").is_file()
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
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
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
    assert (state / "lra_state.tar.part00").read_bytes()[:2] == b"\x1f\x8b"  # repacked gzip-compressed, as gpu_lra.sh packs
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


def resumed_line(n):
    if n == 0:
        return "2026-11-27 00:09:44 | INFO | fairseq.trainer | No existing checkpoint found /tmp/r/checkpoint_last.pt\n"
    return (f"2026-11-27 00:27:37 | INFO | fairseq.trainer | Loaded checkpoint /tmp/r/checkpoint_last.pt "
            f"(epoch 22 @ {n} updates)\n")


def test_a_log_that_did_not_resume_where_the_slices_end_is_refused_or_filed_as_restarted(tmp_path):
    """A call given no state restarts its runs from 0: collecting its log as the next slice would give it a wrong
    update range (2026-11-27: 'slice 2 (4567-5079)' for a run that had trained 0-5079). Refused before anything is
    filed; --restarted renames the old files discarded_restarted_* and files the log as slice 1; a log resumed from
    another update than the slices' end is refused too; a log that resumed where they end is filed as before."""
    results, state = tmp_path / "results", tmp_path / "state"
    listops = results / "lra_listops_full"
    os.makedirs(listops)
    old_slice = listops / "hgrn1_s2222_layernorm_eos_train_slice1_updates_0-4567_c3.log"
    old_slice.write_text("old")
    old_json = listops / "hgrn1_s2222_layernorm_eos_test_result_after_4567.json"
    old_json.write_text("{}")
    (listops / "hgrn2_train_slice1_updates_0-100_a.log").write_text("x")
    call = tmp_path / "call"
    write_call(str(call), {
        "lra/runs/train_listops_hgrn2.log": resumed_line(100) + valid_line(300),  # resumed where it should
        "lra/runs/train_listops_hgrn1_s2222_layernorm_eos.log": resumed_line(0) + valid_line(500) + valid_line(5079),
        "lra/runs/listops_hgrn1_s2222_layernorm_eos.test_result.json": json.dumps({"num_updates": 5079, "accuracy": 35.8}),
        "lra.log": "x\n",
    }, [b"s"])
    before = sorted(os.listdir(listops))
    try:
        collect.collect(str(call), "c2", str(results), str(state), None, False)
    except collect.CollectError as e:
        assert "listops_hgrn1_s2222_layernorm_eos: its log starts from update 0" in str(e)
        assert "--restarted listops_hgrn1_s2222_layernorm_eos" in str(e)
    else:
        raise AssertionError("a log restarted from 0 was filed as the next slice")
    assert sorted(os.listdir(listops)) == before and not state.exists()  # nothing filed, not even the good run
    # a dry run with --restarted says what it would do and moves nothing
    lines = collect.collect(str(call), "c2", str(results), str(state), None, True,
                            restarted=["listops_hgrn1_s2222_layernorm_eos"])
    assert sorted(os.listdir(listops)) == before
    assert any("slice 1 (0-5079)" in line for line in lines)
    collect.collect(str(call), "c2", str(results), str(state), None, False, restarted=["listops_hgrn1_s2222_layernorm_eos"])
    assert not old_slice.exists() and not old_json.exists()
    assert (listops / ("discarded_restarted_" + old_slice.name)).read_text() == "old"
    assert (listops / ("discarded_restarted_" + old_json.name)).read_text() == "{}"
    assert (listops / "hgrn1_s2222_layernorm_eos_train_slice1_updates_0-5079_c2.log").is_file()
    assert json.load(open(listops / "hgrn1_s2222_layernorm_eos_test_result_after_5079.json"))["accuracy"] == 35.8
    assert (listops / "hgrn2_train_slice2_updates_100-300_c2.log").is_file()
    # a log resumed from an older checkpoint than the slices' end (another state was carried): refused
    call2 = tmp_path / "call2"
    write_call(str(call2), {"lra/runs/train_listops_hgrn2.log": resumed_line(100) + valid_line(400), "lra.log": "x\n"}, [])
    try:
        collect.collect(str(call2), "c3", str(results), str(state), None, False)
    except collect.CollectError as e:
        assert "listops_hgrn2: its log resumed from update 100 while its filed slices end at 300" in str(e)
    else:
        raise AssertionError("a log resumed from an older state was filed as the next slice")
    # --restarted names a run the call did not train: one line
    try:
        collect.collect(str(call2), "c3", str(results), str(state), None, False, restarted=["listops_nope"])
    except collect.CollectError as e:
        assert "--restarted listops_nope: the call trained no such run" in str(e)
    else:
        raise AssertionError("--restarted accepted a run the call did not train")


def test_a_log_resumed_at_0_from_a_checkpoint_is_refused_then_discarded_and_finished_runs_dropped(tmp_path):
    """2026-11-27: a run resumed from a best stripped of its optimizer state ('Loaded checkpoint .../checkpoint_best.pt
    (epoch 22 @ 0 updates)'): the schedule restarted on the best's weights, no continuation of the filed slices.
    Refused with a line naming --discard; --discard keeps the log as discarded_* (no slice, no test JSON) and the
    run's old checkpoints in the new state, not the call's; --drop leaves runs out of the new state."""
    results, state = tmp_path / "results", tmp_path / "state"
    listops = results / "lra_listops_full"
    os.makedirs(listops)
    os.makedirs(state)
    (listops / "hgrn2_s2222_layernorm_eos_train_slice2_updates_9000-15761_a.log").write_text("x")
    old = {"listops_hgrn2_s2222_layernorm_eos/checkpoint_last.pt": b"ln-15761",
           "listops_done/checkpoint_best.pt": b"done", "listops_done/finished_max_update_37500": b"37500"}
    for i, part in enumerate(tar_parts(old)):
        (state / f"lra_state.tar.part{i:02d}").write_bytes(part)
    stripped = ("2026-11-27 11:18:07 | INFO | fairseq.trainer | Loaded checkpoint "
                "/tmp/r/listops_hgrn2_s2222_layernorm_eos/checkpoint_best.pt (epoch 22 @ 0 updates)\n")
    call = tmp_path / "call"
    new = {"listops_hgrn2_s2222_layernorm_eos/checkpoint_last.pt": b"ln-restarted-3031",
           "listops_hgrn1_s2222_repocfg_eos/checkpoint_last.pt": b"repo-3947"}
    write_call(str(call), {
        "lra/runs/train_listops_hgrn2_s2222_layernorm_eos.log": stripped + valid_line(500) + valid_line(3031),
        "lra/runs/listops_hgrn2_s2222_layernorm_eos.test_result.json": json.dumps({"num_updates": 3031, "accuracy": 46.1}),
        "lra/runs/train_listops_hgrn1_s2222_repocfg_eos.log": resumed_line(0) + valid_line(3947),
        "lra/runs/listops_hgrn1_s2222_repocfg_eos.test_result.json": json.dumps({"num_updates": 3947, "accuracy": 36.1}),
        "lra.log": "x\n",
    }, tar_parts(new))
    before = sorted(os.listdir(listops))
    try:
        collect.collect(str(call), "c", str(results), str(state), None, False, keep_other_runs=True)
    except collect.CollectError as e:
        assert "listops_hgrn2_s2222_layernorm_eos: its log loaded" in str(e) and "at update 0" in str(e)
        assert "--discard listops_hgrn2_s2222_layernorm_eos" in str(e)
    else:
        raise AssertionError("a log that restarted at update 0 from a checkpoint was filed as the next slice")
    assert sorted(os.listdir(listops)) == before
    lines = collect.collect(str(call), "c", str(results), str(state), None, False, keep_other_runs=True,
                            discard=["listops_hgrn2_s2222_layernorm_eos"], drop=["listops_done"])
    assert (listops / "discarded_hgrn2_s2222_layernorm_eos_train_0-3031_c.log").is_file()
    assert not (listops / "hgrn2_s2222_layernorm_eos_test_result_after_3031.json").exists()
    assert (listops / "hgrn1_s2222_repocfg_eos_train_slice1_updates_0-3947_c.log").is_file()
    assert untar(state) == {"listops_hgrn2_s2222_layernorm_eos/checkpoint_last.pt": b"ln-15761",
                            "listops_hgrn1_s2222_repocfg_eos/checkpoint_last.pt": b"repo-3947"}
    assert ("state: from the call listops_hgrn1_s2222_repocfg_eos; from the old state listops_hgrn2_s2222_layernorm_eos; "
            "left out listops_done: 1 part(s)") in "\n".join(lines), lines
    # --drop of a run the new state would not hold, --discard of a run the call did not train: one line each
    for kwargs, message in (({"drop": ["listops_nope"]}, "--drop listops_nope: the new state would hold no such run"),
                            ({"discard": ["listops_nope"]}, "--discard listops_nope: the call trained no such run")):
        try:
            collect.collect(str(call), "c2", str(results), str(state), None, False, keep_other_runs=True,
                            **{"discard": ["listops_hgrn2_s2222_layernorm_eos", "listops_hgrn1_s2222_repocfg_eos"],
                               **kwargs})
        except collect.CollectError as e:
            assert message in str(e), str(e)
        else:
            raise AssertionError(f"{kwargs} was accepted")
        assert not any(name.startswith("discarded_") and "_c2." in name for name in os.listdir(listops))
    # --drop on a call that packed no state: one line, nothing filed
    bare = tmp_path / "bare"
    write_call(str(bare), {"lra/runs/train_listops_hgrn1_s2222_repocfg_eos.log": valid_line(5000), "lra.log": "x\n"}, [])
    try:
        collect.collect(str(bare), "c3", str(results), str(state), None, False, drop=["listops_done"])
    except collect.CollectError as e:
        assert "--drop listops_done:" in str(e) and "packed no state" in str(e)
    else:
        raise AssertionError("--drop without state parts was accepted")
    assert not any("_c3" in name for name in os.listdir(listops))
