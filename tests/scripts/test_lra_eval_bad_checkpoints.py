"""scripts/lra_eval.py refuses a damaged checkpoint or one of another kind in one line naming the file."""
import importlib
import os
import re
import sys

import pytest
import torch

from tests import fixtures_corpus, pyrun

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "lra_eval.py")


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """A real (tiny, one update) language-model checkpoint: a valid fairseq file of the wrong task."""
    root = tmp_path_factory.mktemp("lm")
    data = fixtures_corpus.build_lm_data(str(root))
    return fixtures_corpus.train_checkpoint(data, str(root / "lm"), ["--arch", "hgrn_lm_tiny"], 16, updates=1)


def _bad_checkpoints(lm, folder):
    os.makedirs(folder, exist_ok=True)
    data = open(lm, "rb").read()
    paths = {kind: os.path.join(folder, f"{kind}_ckpt.pt") for kind in ("empty", "truncated", "random", "image",
                                                                          "weights_only", "lm")}
    open(paths["empty"], "wb").close()
    open(paths["truncated"], "wb").write(data[: len(data) // 2])
    open(paths["random"], "wb").write(bytes((i * 37 + 11) % 256 for i in range(5000)))
    # an image classifier's checkpoint: weights under another key, no fairseq training state
    torch.save({"net": {"fc.weight": torch.ones(3, 2)}, "epoch": 7}, paths["image"])
    # a bare state dict of tensors (torch.save(model.state_dict()))
    torch.save({"conv1.weight": torch.zeros(4, 3, 3, 3), "conv1.bias": torch.zeros(4)}, paths["weights_only"])
    with open(paths["lm"], "wb") as f:
        f.write(data)
    return paths


@pytest.mark.parametrize("kind, message", [
    ("empty", r"is empty \(0 bytes\)"),
    ("truncated", r"cannot be read .*truncated or damaged"),
    ("random", r"cannot be read .*truncated or damaged"),
    ("image", r"is not a fairseq checkpoint"),
    ("weights_only", r"is not a fairseq checkpoint"),
    ("lm", r"is not an LRA checkpoint \(trained with task 'language_modeling'"),
])
def test_bad_checkpoint_is_one_line_naming_the_file(lm_checkpoint, tmp_path, kind, message):
    path = _bad_checkpoints(lm_checkpoint, str(tmp_path / "ckpts"))[kind]
    env = dict(fixtures_corpus.subprocess_env(), PYTHONWARNINGS="ignore")
    proc = pyrun.run([sys.executable, SCRIPT, path, "--cpu"], capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("lra_eval.py: error: ") and path in lines[0], lines[0]
    assert re.search(message, lines[0]), lines[0]


def test_an_lra_checkpoint_passes_the_check(tmp_path):
    """A minimal fairseq state of the lra_text task (no trained model: the check reads only the state)."""
    ev = importlib.import_module("scripts.lra_eval")
    path = str(tmp_path / "checkpoint_best.pt")
    torch.save({"model": {"w": torch.zeros(2)}, "cfg": {"task": {"_name": "lra_text"}},
                "optimizer_history": [{"num_updates": 3, "lr_scheduler_state": {}, "optimizer_name": "adam"}], "extra_state": {}}, path)
    state = ev.check_lra_checkpoint(path)
    assert state["optimizer_history"][-1]["num_updates"] == 3
