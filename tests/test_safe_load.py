"""checkpoint_io.load_checkpoint: weights_only loading under the allowlist; a hostile file is refused before any of
it runs, in one line naming the file, the refused type and the opt-in; damaged files are one line; the opt-in
(argument, context, environment variable) unpickles fully with a warning."""
import argparse
import collections
import io
import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hgrn_fairseq import checkpoint_io
from hgrn_fairseq.checkpoint_io import CheckpointError, UnsafeCheckpointError, load_checkpoint
from tests import hostile_checkpoints as hostile

REFUSED = {"os.system": "posix.system", "exec": "builtins.exec", "subprocess": "subprocess.call"}


@pytest.fixture(autouse=True)
def no_trust_from_environment(monkeypatch):
    monkeypatch.delenv(checkpoint_io.TRUST_ENV, raising=False)


@pytest.mark.parametrize("way", hostile.WAYS)
def test_hostile_checkpoint_is_refused_before_it_runs(tmp_path, way):
    marker = tmp_path / "MARKER"
    path = hostile.write_hostile(tmp_path / "ckpt.pt", marker, way)
    before = set(map(repr, torch.serialization.get_safe_globals()))
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and path in message, message
    assert REFUSED[way] in message, message
    assert "--trust-checkpoint" in message and "HGRN_TRUST_CHECKPOINTS=1" in message, message
    assert not marker.exists()
    assert set(map(repr, torch.serialization.get_safe_globals())) == before  # the allowlist was scoped to the load


@pytest.mark.parametrize("way", hostile.WAYS)
def test_the_payload_is_real_and_the_opt_in_runs_it_with_a_warning(tmp_path, way, caplog):
    """The control for the test above: fully unpickled, the same file creates the marker."""
    marker = tmp_path / "MARKER"
    path = hostile.write_hostile(tmp_path / "ckpt.pt", marker, way)
    with caplog.at_level(logging.WARNING, logger="hgrn_fairseq.checkpoint_io"):
        state = load_checkpoint(path, trust=True)
    assert marker.exists() and torch.equal(state["model"]["w"], torch.zeros(2))
    assert any("unpickled fully" in r.getMessage() and path in r.getMessage() for r in caplog.records)


def test_the_environment_variable_and_the_context_opt_in(tmp_path, monkeypatch):
    marker = tmp_path / "MARKER"
    path = hostile.write_hostile(tmp_path / "ckpt.pt", marker)
    with checkpoint_io.trusted_checkpoints(False):
        with pytest.raises(UnsafeCheckpointError):
            load_checkpoint(path)
    with checkpoint_io.trusted_checkpoints(True):
        load_checkpoint(path)
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UnsafeCheckpointError):  # the context ended
        load_checkpoint(path)
    monkeypatch.setenv(checkpoint_io.TRUST_ENV, "1")
    load_checkpoint(path)
    assert marker.exists()


def test_legacy_file_with_another_type_loads_only_with_the_opt_in(tmp_path):
    """A trusted legacy file holding a type outside the allowlist (here ``fractions.Fraction``)."""
    import fractions

    path = str(tmp_path / "legacy.pt")
    torch.save({"model": {"w": torch.ones(1)}, "extra_state": {"ratio": fractions.Fraction(1, 3)}}, path)
    with pytest.raises(UnsafeCheckpointError, match=r"holds fractions\.Fraction"):
        load_checkpoint(path)
    assert load_checkpoint(path, trust=True)["extra_state"]["ratio"] == fractions.Fraction(1, 3)


@pytest.mark.parametrize("kind", ["empty", "truncated", "random", "text"])
def test_damaged_files_are_one_line_naming_the_file(tmp_path, kind):
    good = str(tmp_path / "good.pt")
    torch.save({"model": {"w": torch.arange(1000.0)}}, good)
    path = str(tmp_path / f"{kind}.pt")
    if kind == "empty":
        open(path, "wb").close()
    elif kind == "truncated":
        hostile.write_truncated(path, good)
    elif kind == "random":
        hostile.write_random_bytes(path)
    else:
        with open(path, "w") as f:
            f.write("not a checkpoint\n")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert not isinstance(info.value, UnsafeCheckpointError)
    message = str(info.value)
    assert "\n" not in message and path in message and ("cannot be read" in message or "empty" in message), message


def _roundtrip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return load_checkpoint(buffer, name="state")


def test_what_fairseq_and_the_package_store_loads_without_the_opt_in():
    """The types of the allowlist, each as fairseq holds it: a config with argparse values (fairseq's
    argparse-era cfg.model), its args Namespace, numpy scalars of logged values, counters."""
    cfg = OmegaConf.create({"model": {"_name": "hgrn_lm", "ns": argparse.Namespace(arch="hgrn_lm_tiny")},
                            "optimization": {"lr": [5e-4]}, "common": {"bf16": False, "seed": 1, "x": None}},
                           flags={"allow_objects": True})
    state = {"cfg": cfg, "args": argparse.Namespace(arch="hgrn_lm", lr=[0.1], tokens_per_sample=512),
             "extra_state": {"val_loss": np.float64(3.5), "n": np.int64(7), "f": np.float32(0.25),
                             "flag": np.bool_(True), "counts": collections.Counter(a=2)},
             "model": collections.OrderedDict(w=torch.arange(3.0))}
    got = _roundtrip(state)
    assert OmegaConf.to_container(got["cfg"]) == OmegaConf.to_container(cfg)
    assert got["args"] == state["args"]
    extra = got["extra_state"]
    assert extra["val_loss"] == 3.5 and extra["val_loss"].dtype == np.float64 and extra["n"] == 7
    assert extra["f"] == np.float32(0.25) and bool(extra["flag"]) and extra["counts"] == {"a": 2}
    assert torch.equal(got["model"]["w"], torch.tensor([0.0, 1.0, 2.0]))


def test_refused_type_reads_torch_messages():
    assert checkpoint_io.refused_type(
        "Weights only load failed.\n WeightsUnpickler error: Unsupported global: GLOBAL posix.system was not an "
        "allowed global by default. Please use ...") == "posix.system"
    assert checkpoint_io.refused_type("Trying to load unsupported GLOBAL os.system whose module os is blocked.") \
        == "os.system"
    assert checkpoint_io.refused_type("Can only build Tensor, Parameter, OrderedDict or types allowlisted via "
                                      "`add_safe_globals`, but got <class 'foo.Bar'>") == "foo.Bar"
    assert checkpoint_io.refused_type("Weights only load failed. Unsupported operand 149") is None
