"""fairseq_compat fixes 1 (fairseq's checkpoint reads go through checkpoint_io), 2 (numpy.compat.long) and 8 (a
refused or damaged checkpoint is one line): each test fails without its fix. Fix 1 across processes:
test_fairseq_compat_broadcast.py; fix 3: test_fairseq_compat.py; 4 and 5: test_options.py; 6: test_optim.py;
7: test_checkpoint_safety.py."""
import argparse
import sys

import numpy as np
import pytest
import torch

fairseq = pytest.importorskip("fairseq")

import hgrn_fairseq  # noqa: E402
from hgrn_fairseq import fairseq_compat  # noqa: E402
from hgrn_fairseq.checkpoint_io import CheckpointError, UnsafeCheckpointError  # noqa: E402
from tests import hostile_checkpoints as hostile  # noqa: E402

hgrn_fairseq.register()


def test_fix_1_fairseq_refuses_a_hostile_checkpoint(tmp_path):
    from fairseq import checkpoint_utils

    marker = tmp_path / "MARKER"
    path = hostile.write_hostile(tmp_path / "checkpoint_last.pt", marker, "exec")
    with pytest.raises(UnsafeCheckpointError, match="builtins.exec"):
        checkpoint_utils.load_checkpoint_to_cpu(path)
    assert not marker.exists()


def test_fix_1_fairseq_reads_an_argparse_era_checkpoint(tmp_path):
    """fairseq's own older format: the config as an argparse Namespace under "args" (torch's default
    weights_only=True refuses it)."""
    from fairseq import checkpoint_utils

    path = str(tmp_path / "old.pt")
    args = argparse.Namespace(arch="transformer_lm", task="language_modeling", data="/data", lr=[0.25],
                              tokens_per_sample=512, criterion="cross_entropy", optimizer="adam")
    torch.save({"args": args, "model": {"w": torch.ones(2)}, "optimizer_history": [
        {"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {"best": 1.5},
         "num_updates": 10}], "extra_state": {"epoch": 2, "val_loss": np.float64(1.5)}}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    assert state["args"].arch == "transformer_lm" and state["args"].lr == [0.25]
    assert torch.equal(state["model"]["w"], torch.ones(2)) and state["extra_state"]["val_loss"] == 1.5


def test_fix_2_numpy_compat_long_for_token_block_dataset():
    from fairseq.data import TokenBlockDataset

    assert np.compat.long is int
    data = [torch.tensor([4, 5, 6, 2]), torch.tensor([7, 8, 2])]
    blocks = TokenBlockDataset(data, [4, 3], block_size=3, pad=1, eos=2, break_mode="none")
    assert [blocks[i].tolist() for i in range(len(blocks))] == [[4, 5, 6], [2, 7, 8], [2]]


def test_fix_8_checkpoint_errors_are_one_line(capsys, monkeypatch):
    """The main of a fairseq command module imported before the plugin (as fairseq_cli.eval_lm is when
    --user-dir imports it) prints a CheckpointError as one line and exits 1; other errors pass through."""
    import types

    error = CheckpointError("checkpoint x.pt cannot be read (EOFError: ): a truncated or damaged file?")

    def main(cfg):
        if cfg == "other":
            raise KeyError("other")
        raise error

    module = types.ModuleType("fairseq_cli.eval_lm")
    module.main = main
    monkeypatch.setitem(sys.modules, "fairseq_cli.eval_lm", module)
    fairseq_compat.install_one_line_checkpoint_errors()
    fairseq_compat.install_one_line_checkpoint_errors()  # idempotent
    with pytest.raises(SystemExit) as info:
        module.main("cfg")
    assert info.value.code == 1 and capsys.readouterr().err == f"error: {error}\n"
    with pytest.raises(KeyError):
        module.main("other")
    assert module.main.__wrapped__ is main
