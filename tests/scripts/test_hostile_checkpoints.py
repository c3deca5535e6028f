"""Every command that reads a checkpoint refuses a hostile one (its unpickling would create a marker file) in one
line naming the file, the refused type and the opt-in, with a non-zero exit and the marker never created:
fairseq-train's resume, fairseq-eval-lm, -validate, -generate, -interactive, the extrapolation tool, the
lm-evaluation-harness model, the LRA evaluation and the image trainer (resume and evaluation). Truncated and random-bytes files: one line, no
traceback. The checkpoints the commands write load without the opt-in; the opt-in loads a legacy file with a
warning."""
import fractions
import os
import shutil
import sys

import pytest
import torch

from hgrn_fairseq.checkpoint_io import load_checkpoint
from tests import fixtures_corpus, pyrun
from tests import hostile_checkpoints as hostile

pytestmark = pytest.mark.integration  # runs the commands

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = os.path.join(REPO, "hgrn_fairseq")
REFUSED = {"os.system": "posix.system", "exec": "builtins.exec", "subprocess": "subprocess.call"}
OPT_IN = ("--trust-checkpoint", "HGRN_TRUST_CHECKPOINTS=1")


def train_command(data, save_dir, updates):
    return [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN, "--task", "language_modeling",
            "--arch", "hgrn_lm_tiny", "--tokens-per-sample", "16", "--sample-break-mode", "none", "--batch-size", "8",
            "--optimizer", "adam", "--lr", "3e-3", "--max-update", str(updates), "--cpu", "--num-workers", "0",
            "--seed", "1", "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--disable-validation",
            "--log-format", "none"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """(data directory, save directory, its checkpoint_last.pt) of a 2-update hgrn_lm_tiny run."""
    root = tmp_path_factory.mktemp("lm")
    data = fixtures_corpus.build_lm_data(str(root))
    save = root / "save"
    proc = run(train_command(data, save, 2))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return data, save, str(save / "checkpoint_last.pt")


def run(cmd, **env):
    full_env = dict(fixtures_corpus.subprocess_env(), PYTHONWARNINGS="ignore")
    full_env.pop("HGRN_TRUST_CHECKPOINTS", None)
    full_env.update(env)
    return pyrun.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=300)


def assert_one_line_refusal(proc, path, *wanted):
    """Non-zero exit, no traceback, and one line of the output naming ``path`` and each of ``wanted``: the
    last line on stderr (fairseq's commands log before it)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, out[-3000:]
    assert path in lines[-1] and all(w in lines[-1] for w in wanted), lines[-1]
    assert sum(f"checkpoint {path} " in line for line in out.splitlines()) == 1, out[-3000:]


def hostile_file(folder, way, name="checkpoint_last.pt"):
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "MARKER"
    return hostile.write_hostile(folder / name, marker, way), marker


def damaged_file(folder, kind, lm_checkpoint):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.pt"
    if kind == "truncated":
        return hostile.write_truncated(path, lm_checkpoint)
    return hostile.write_random_bytes(path)


# ----------------------------------------------------------------------------------------- what is written
def test_the_lm_checkpoints_load_without_the_opt_in(lm):
    _, save, last = lm
    for name in sorted(os.listdir(save)):
        if name.endswith(".pt"):
            state = load_checkpoint(str(save / name))
            assert state["cfg"]["model"]["_name"].startswith("hgrn_lm") and state["model"], name
    assert load_checkpoint(last)["optimizer_history"][-1]["num_updates"] == 2


# ----------------------------------------------------------------------------------------------- fairseq
@pytest.mark.parametrize("way", hostile.WAYS)
def test_fairseq_train_refuses_a_hostile_checkpoint_last(lm, tmp_path, way):
    data, save, _ = lm
    work = tmp_path / "save"
    shutil.copytree(save, work)
    path, marker = hostile_file(work, way)  # written last: the newest checkpoint of the directory
    proc = run(train_command(data, work, 4))
    assert_one_line_refusal(proc, path, REFUSED[way], *OPT_IN)
    assert not marker.exists()


def test_fairseq_train_refuses_a_hostile_newer_checkpoint(lm, tmp_path):
    """A resume that looks past checkpoint_last.pt at a newer file reads it safely too."""
    data, save, _ = lm
    work = tmp_path / "save"
    shutil.copytree(save, work)
    path, marker = hostile_file(work, "os.system", "checkpoint_1_3.pt")
    os.utime(work / "checkpoint_last.pt", (1, 1))
    proc = run(train_command(data, work, 4))
    assert_one_line_refusal(proc, path, "posix.system")
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["truncated", "random"])
def test_fairseq_train_restore_file_damaged_is_one_line(lm, tmp_path, kind):
    data, _, last = lm
    path = damaged_file(tmp_path, kind, last)
    proc = run(train_command(data, tmp_path / "save", 4) + ["--restore-file", path])
    assert_one_line_refusal(proc, path, "cannot be read")


def eval_lm_command(data, path):
    return [sys.executable, "-m", "fairseq_cli.eval_lm", data, "--path", path, "--user-dir", PLUGIN, "--cpu",
            "--tokens-per-sample", "16", "--batch-size", "8", "--num-workers", "0", "--max-valid-steps", "1",
            "--gen-subset", "valid"]


@pytest.mark.parametrize("case", ["os.system", "exec", "subprocess", "truncated", "random"])
def test_fairseq_eval_lm(lm, tmp_path, case):
    data, _, last = lm
    if case in hostile.WAYS:
        path, marker = hostile_file(tmp_path, case)
        assert_one_line_refusal(run(eval_lm_command(data, path)), path, REFUSED[case], *OPT_IN)
        assert not marker.exists()
    else:
        path = damaged_file(tmp_path, case, last)
        assert_one_line_refusal(run(eval_lm_command(data, path)), path, "cannot be read")


def test_fairseq_eval_lm_scores_a_written_checkpoint(lm):
    data, _, last = lm
    proc = run(eval_lm_command(data, last))
    assert proc.returncode == 0 and "Loss (base 2)" in proc.stdout + proc.stderr, proc.stderr[-3000:]


def validate_command(data, path):
    return [sys.executable, "-m", "fairseq_cli.validate", data, "--path", path, "--user-dir", PLUGIN, "--cpu",
            "--task", "language_modeling", "--tokens-per-sample", "16", "--batch-size", "8", "--num-workers", "0",
            "--valid-subset", "valid"]


@pytest.mark.parametrize("case", ["os.system", "truncated"])
def test_fairseq_validate(lm, tmp_path, case):
    data, _, last = lm
    if case in hostile.WAYS:
        path, marker = hostile_file(tmp_path, case)
        assert_one_line_refusal(run(validate_command(data, path)), path, REFUSED[case], *OPT_IN)
        assert not marker.exists()
    else:
        path = damaged_file(tmp_path, case, last)
        assert_one_line_refusal(run(validate_command(data, path)), path, "cannot be read")


def test_fairseq_validate_scores_a_written_checkpoint(lm):
    data, _, last = lm
    proc = run(validate_command(data, last))
    assert proc.returncode == 0 and "valid on 'valid' subset" in proc.stdout + proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("command", ["generate", "interactive"])
def test_fairseq_generate_and_interactive(lm, tmp_path, command):
    """Both read the checkpoint before any generation: refused there, whatever would follow."""
    data, _, _ = lm
    path, marker = hostile_file(tmp_path, "exec")
    cmd = [sys.executable, "-m", f"fairseq_cli.{command}", data, "--path", path, "--user-dir", PLUGIN, "--cpu",
           "--task", "language_modeling", "--tokens-per-sample", "16", "--batch-size", "1", "--num-workers", "0"]
    if command == "generate":
        cmd += ["--gen-subset", "valid", "--max-len-b", "4"]
    else:
        cmd += ["--input", os.devnull]
    assert_one_line_refusal(run(cmd), path, REFUSED["exec"], *OPT_IN)
    assert not marker.exists()


# -------------------------------------------------------------------------------- the package's own tools
def extrapolation_command(path, data, *extra):
    return [sys.executable, "-m", "hgrn_fairseq.evaluation.extrapolation", path, data, "--lengths", "16", "--cpu",
            "--no-plot", "--no-progress", "--mode", "stateless", "--out-dir", os.path.dirname(path), *extra]


@pytest.mark.parametrize("case", ["exec", "truncated", "random"])
def test_extrapolation_tool(lm, tmp_path, case):
    data, _, last = lm
    if case in hostile.WAYS:
        path, marker = hostile_file(tmp_path, case)
        proc = run(extrapolation_command(path, data))
        assert_one_line_refusal(proc, path, REFUSED[case], *OPT_IN)
        assert proc.returncode == 2 and not marker.exists()
    else:
        path = damaged_file(tmp_path, case, last)
        assert_one_line_refusal(run(extrapolation_command(path, data)), path, "cannot be read")


def test_the_opt_in_loads_a_trusted_legacy_file_with_a_warning(lm, tmp_path):
    """A real checkpoint that also holds a type outside the allowlist: refused, then evaluated with the flag
    (and with the environment variable), each time with a warning naming the file."""
    data, _, last = lm
    state = torch.load(last, map_location="cpu", weights_only=True)
    state["extra_state"]["legacy_ratio"] = fractions.Fraction(1, 3)
    path = str(tmp_path / "legacy.pt")
    torch.save(state, path)
    assert_one_line_refusal(run(extrapolation_command(path, data)), path, "fractions.Fraction")
    for proc in (run(extrapolation_command(path, data, "--trust-checkpoint")),
                 run(extrapolation_command(path, data), HGRN_TRUST_CHECKPOINTS="1")):
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "unpickled fully" in out and path in out, out[-3000:]


@pytest.mark.parametrize("case", ["subprocess", "truncated", "random"])
def test_lm_eval_model(lm, tmp_path, case):
    pytest.importorskip("lm_eval")
    from hgrn_fairseq.evaluation.lm_eval import HgrnFairseqLM, ZeroShotError

    data, _, last = lm
    marker = None
    if case in hostile.WAYS:
        path, marker = hostile_file(tmp_path, case)
    else:
        path = damaged_file(tmp_path, case, last)
    with pytest.raises(ZeroShotError) as info:
        HgrnFairseqLM(path=path, data=data, device="cpu")
    message = str(info.value)
    assert "\n" not in message and path in message, message
    if marker is not None:
        assert REFUSED[case] in message and all(w in message for w in OPT_IN) and not marker.exists(), message
    else:
        assert "cannot be read" in message, message


@pytest.mark.parametrize("way", ["os.system", "exec"])
def test_lra_eval(tmp_path, way):
    path, marker = hostile_file(tmp_path, way)
    proc = run([sys.executable, os.path.join(REPO, "scripts", "lra_eval.py"), path, "--cpu"])
    assert_one_line_refusal(proc, path, REFUSED[way], *OPT_IN)
    assert proc.stderr.strip().startswith("lra_eval.py: error: ") and not marker.exists()


# ------------------------------------------------------------------------------------------ image trainer
TINY_IMAGE = ["model.img_size=16", "+model.kwargs.patch_size=4", "+model.kwargs.embed_dim=8",
              "+model.kwargs.depth=1", "+model.kwargs.glu_dim=8", "optim.batch_size=8", "data.workers=0",
              "train.precision=fp32", "train.no_progress=true", "train.device=cpu", "optim.epochs=3",
              "optim.warmup_epochs=1", "aug.repeated_aug=0"]


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """(image folder, output directory) of a one-update image training run."""
    pytest.importorskip("timm")
    from hgrn_fairseq.image import train
    from scripts import make_image_folder

    root = tmp_path_factory.mktemp("img")
    assert make_image_folder.main(["--dest", str(root / "shapes"), "--per-class", "5", "--size", "16"]) == 0
    out = root / "run"
    assert train.main([f"data.path={root / 'shapes'}", f"train.output_dir={out}", "train.max_updates=1",
                       *TINY_IMAGE]) == 0
    return root / "shapes", out


def test_the_image_checkpoints_load_without_the_opt_in(image_run):
    _, out = image_run
    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        state = load_checkpoint(str(out / name))
        assert state["num_updates"] == 1 and state["model"] and state["optimizer"]["state"], name


@pytest.mark.parametrize("case", ["subprocess", "os.system", "truncated", "random"])
@pytest.mark.parametrize("use", ["resume", "eval"])
def test_image_trainer(image_run, tmp_path, capsys, case, use):
    from hgrn_fairseq.image import train

    folder, out = image_run
    work = tmp_path / "run"
    marker = None
    if case in hostile.WAYS:
        path, marker = hostile_file(work, case)
    else:
        path = damaged_file(work, case, str(out / "checkpoint_last.pt"))
    extra = ["train.max_updates=2"] if use == "resume" else ["train.eval_only=true", f"train.checkpoint={path}"]
    if use == "resume" and case not in hostile.WAYS:
        os.replace(path, work / "checkpoint_last.pt")
        path = str(work / "checkpoint_last.pt")
    code = train.main([f"data.path={folder}", f"train.output_dir={work}", *TINY_IMAGE, *extra])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and len(lines) == 1 and path in lines[0], err[-3000:]
    if marker is not None:
        assert REFUSED[case] in lines[0] and "--trust-checkpoint" in lines[0] and not marker.exists(), lines[0]
    else:
        assert "cannot be read" in lines[0], lines[0]
