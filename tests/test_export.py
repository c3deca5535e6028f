"""python -m hgrn_fairseq.export and load_exported: tiny models with random weights (nothing trained), saved
as the package's trainers save them (fairseq LM, tied-embedding LM, MQAR, LRA, image), exported, reloaded
without pickle, and giving the same outputs; damaged or mismatched exports and bad input are one line."""
import hashlib
import json
import os
import pickle
import sys

import pytest
import torch

import hgrn_fairseq
from hgrn_fairseq import export as ex
from tests import pyrun

hgrn_fairseq.register()  # the plugin's models and tasks, as --user-dir does

pytestmark = pytest.mark.integration  # starts commands

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_dict(directory, n=20):
    from fairseq.data import Dictionary

    os.makedirs(directory, exist_ok=True)
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}", n=100 - i)
    d.save(os.path.join(directory, "dict.txt"))
    return directory


def fairseq_checkpoint(path, argv, num_updates=7, seed=0):
    """A fairseq checkpoint as fairseq-train writes it (``Trainer.state_dict`` layout: cfg as a plain
    container, the task state), holding the weights of a freshly built model. Returns (model, task)."""
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [*argv, "--optimizer", "adam", "--lr", "1e-3", "--cpu"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model).eval()
    state = {
        "args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(), "criterion": None,
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": num_updates}],
        "task_state": task.state_dict(), "extra_state": {"epoch": 1},
        "last_optimizer_state": {"state": {}, "param_groups": []},
    }
    checkpoint_utils.torch_persistent_save(state, str(path))
    return model, task


LM_ARGV = ["--task", "hgrn_language_modeling", "--arch", "hgrn_lm_tiny", "--decoder-embed-dim", "16",
           "--glu-dim", "32", "--decoder-layers", "2", "--tokens-per-sample", "16"]
TIED_ARGV = ["--task", "language_modeling", "--arch", "transformer_lm", "--decoder-embed-dim", "16",
             "--decoder-ffn-embed-dim", "32", "--decoder-layers", "1", "--decoder-attention-heads", "2",
             "--share-decoder-input-output-embed", "--tokens-per-sample", "16"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    data = write_dict(str(root / "data"))
    model, task = fairseq_checkpoint(root / "checkpoint_best.pt", [data, *LM_ARGV])
    return root / "checkpoint_best.pt", data, model


TOKENS = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 4, 5, 6, 2, 3]])


def lm_logits(model):
    with torch.no_grad():
        return model(TOKENS)[0]


# ------------------------------------------------------------------------------------------ round trips
def test_language_model_round_trip_gives_the_same_logits(lm, tmp_path):
    checkpoint, data, model = lm
    out = tmp_path / "export"
    assert ex.main([str(checkpoint), str(out)]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "dict.txt", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "hgrn-fairseq-export/1" and config["kind"] == "fairseq"
    assert config["model"]["arch"] == "hgrn_lm_tiny" and config["model"]["args"]["decoder_embed_dim"] == 16
    assert config["task"]["name"] == "hgrn_language_modeling"
    assert config["source"]["num_updates"] == 7
    # the dictionary is the training data's file byte for byte, and its hash is recorded
    assert (out / "dict.txt").read_bytes() == open(os.path.join(data, "dict.txt"), "rb").read()
    assert config["dictionary"] == {"file": "dict.txt", "size": 24, "sha256": sha256(os.path.join(data, "dict.txt"))}
    assert config["weights"]["sha256"] == sha256(out / "model.safetensors")
    assert config["weights"]["aliases"] == {}

    loaded, cfg = ex.load_exported(str(out))
    assert cfg == config and not loaded.training
    assert type(loaded) is type(model)
    assert len(loaded.decoder.dictionary) == 24 and loaded.decoder.dictionary[4] == "w0"
    assert torch.equal(lm_logits(loaded), lm_logits(model))
    for name, value in model.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(loaded.state_dict()[name], value), name
        else:  # the decoder's dictionary record, kept in config.json
            assert loaded.state_dict()[name]["dictionary_sha256"] == value["dictionary_sha256"], name
    assert "decoder._extra_state" in config["weights"]["extra_state"]


def test_tied_embeddings_are_stored_once_and_stay_tied(tmp_path):
    data = write_dict(str(tmp_path / "data"))
    model, _ = fairseq_checkpoint(tmp_path / "checkpoint_last.pt", [data, *TIED_ARGV])
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    out = tmp_path / "export"
    assert ex.main([str(tmp_path / "checkpoint_last.pt"), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["weights"]["aliases"] == {"decoder.output_projection.weight": "decoder.embed_tokens.weight"}
    from safetensors.torch import load_file

    stored = load_file(str(out / "model.safetensors"))
    assert "decoder.output_projection.weight" not in stored and "decoder.embed_tokens.weight" in stored
    loaded, _ = ex.load_exported(str(out))
    assert loaded.decoder.output_projection.weight is loaded.decoder.embed_tokens.weight
    assert torch.equal(lm_logits(loaded), lm_logits(model))


def test_mqar_model_round_trip_with_its_generated_vocabulary(tmp_path):
    argv = ["--task", "mqar", "--arch", "hgrn1_mqar", "--vocab-size", "32", "--seq-len", "16",
            "--num-kv-pairs", "2", "--decoder-embed-dim", "16", "--glu-dim", "32", "--decoder-layers", "1"]
    model, task = fairseq_checkpoint(tmp_path / "checkpoint_best.pt", argv)
    out = tmp_path / "export"
    assert ex.main([str(tmp_path / "checkpoint_best.pt"), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["task"]["name"] == "mqar" and config["dictionary"]["size"] == 4 + 32
    assert config["dictionary"]["sha256"] == sha256(out / "dict.txt")
    symbols = [line.split(" ")[0] for line in (out / "dict.txt").read_text().splitlines()]
    assert symbols == [str(t) for t in range(32)]  # the task's tokens after fairseq's 4 specials
    loaded, _ = ex.load_exported(str(out))
    tokens = torch.randint(4, 36, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(tokens)[0], model(tokens)[0])


def test_lra_classifier_round_trip_without_the_data(tmp_path):
    from tests.tasks.test_lra_format import write_tiny

    data = str(tmp_path / "listops")
    write_tiny(data, "listops", sizes=(16, 4, 4))
    argv = [data, "--task", "lra_text", "--arch", "hgrn1_lra_listops", "--encoder-embed-dim", "8",
            "--encoder-layers", "1", "--max-positions", "32", "--criterion", "classification_accuracy"]
    model, task = fairseq_checkpoint(tmp_path / "checkpoint_best.pt", argv)
    out = tmp_path / "export"
    assert ex.main([str(tmp_path / "checkpoint_best.pt"), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["lra_model_inputs"]["num_classes"] == 10 and config["lra_model_inputs"]["input"] == "tokens"
    assert config["dictionary"]["sha256"] == sha256(os.path.join(data, "dict.txt"))
    # the loader needs nothing of the data directory
    for name in os.listdir(data):
        os.remove(os.path.join(data, name))
    loaded, _ = ex.load_exported(str(out))
    pad = task.dictionary.pad()
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10], [7, 8, 9, pad, pad, pad]])
    with torch.no_grad():
        assert torch.equal(loaded(src_tokens=tokens), model(src_tokens=tokens))


TINY_IMAGE = ["data.path=/x", "model.img_size=16", "+model.kwargs.patch_size=4", "+model.kwargs.embed_dim=8",
              "+model.kwargs.depth=1", "+model.kwargs.glu_dim=8"]


def image_checkpoint(path, with_ema=True):
    """A checkpoint with the keys hgrn_fairseq.image.train writes, saved with its save_atomic."""
    from pathlib import Path

    from hgrn_fairseq.image import train
    from omegaconf import OmegaConf

    cfg = train.load_config("hgrn1", None, TINY_IMAGE)
    torch.manual_seed(0)
    model = train.build_model(cfg, 6).eval()
    ema = train.build_model(cfg, 6).eval()  # other random weights: which ones are exported is visible
    state = {
        "model": model.state_dict(), "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "scheduler": {"t_initial": 9, "warmup_t": 3}, "ema": ema.state_dict() if with_ema else None, "epoch": 1,
        "batch_in_epoch": 0, "num_updates": 3, "best_top1": 12.5, "unreadable_images": 0,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "plan": {"model": cfg.model.name, "classes": 6, "classes_sha256": "ab" * 32},
    }
    train.save_atomic(state, Path(path))
    return model, ema


def test_image_model_round_trip_model_and_ema_weights(tmp_path):
    model, ema = image_checkpoint(tmp_path / "checkpoint_last.pt")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    for flags, reference in (([], model), (["--ema"], ema)):
        out = tmp_path / ("export" + "".join(flags))
        assert ex.main([str(tmp_path / "checkpoint_last.pt"), str(out), *flags]) == 0
        assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
        config = json.loads((out / "config.json").read_text())
        assert config["kind"] == "image" and config["model"]["name"] == "hgrn1d_vit_tiny"
        assert config["model"]["num_classes"] == 6 and config["model"]["kwargs"]["embed_dim"] == 8
        assert config["classes"] == {"count": 6, "sha256": "ab" * 32}
        assert config["weights_from"] == ("ema" if flags else "model")
        loaded, _ = ex.load_exported(str(out))
        with torch.no_grad():
            assert torch.equal(loaded(x), reference(x))
    with torch.no_grad():
        assert not torch.equal(model(x), ema(x))


def test_loading_unpickles_nothing(lm, tmp_path, monkeypatch):
    out = tmp_path / "export"
    assert ex.main([str(lm[0]), str(out)]) == 0

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling while loading an export")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    loaded, _ = ex.load_exported(str(out))
    assert torch.equal(lm_logits(loaded), lm_logits(lm[2]))


class _Hostile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_an_image_checkpoint_holding_code_is_refused_before_it_runs(tmp_path, capsys):
    planted = tmp_path / "planted"
    state = {"model": {"w": torch.zeros(2)}, "config": {"model": {"name": "x"}}, "plan": {}, "best_top1": 0.0,
             "unreadable_images": 0, "batch_in_epoch": 0, "hook": _Hostile(str(planted))}
    torch.save(state, tmp_path / "checkpoint_last.pt")
    assert ex.main([str(tmp_path / "checkpoint_last.pt"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "weights_only=True" in err and err.count("\n") == 1, err
    assert not planted.exists()


# --------------------------------------------------------------------------------- damaged exports
@pytest.fixture
def exported(lm, tmp_path):
    out = tmp_path / "export"
    assert ex.main([str(lm[0]), str(out)]) == 0
    return out


def rewrite_weights(out, tensors):
    """Replace the weights file and record its hash, so that the loader's later checks are reached."""
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    config["weights"]["sha256"] = sha256(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config))


def one_line_error(out, match):
    with pytest.raises(ex.ExportError, match=match) as e:
        ex.load_exported(str(out))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_changed_byte_in_the_weights_is_found(exported):
    path = exported / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x40  # a bit of a tensor value: the file still parses
    path.write_bytes(bytes(raw))
    one_line_error(exported, r"model.safetensors is damaged or not the exported file")


def test_an_unreadable_weights_file_is_one_line(exported):
    path = exported / "model.safetensors"
    path.write_bytes(b"\xff" * 64)
    config = json.loads((exported / "config.json").read_text())
    config["weights"]["sha256"] = sha256(path)
    (exported / "config.json").write_text(json.dumps(config))
    one_line_error(exported, r"model.safetensors cannot be read")


def test_missing_and_unexpected_keys_are_one_line(exported):
    from safetensors.torch import load_file

    tensors = load_file(str(exported / "model.safetensors"))
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    tensors["decoder.surplus"] = torch.zeros(3)
    rewrite_weights(exported, tensors)
    message = one_line_error(exported, r"does not fit the model config.json describes")
    assert f"missing keys {dropped};" in message and "unexpected keys decoder.surplus" in message


def test_a_wrong_shape_is_one_line(exported):
    from safetensors.torch import load_file

    tensors = load_file(str(exported / "model.safetensors"))
    tensors["decoder.embed_tokens.weight"] = torch.zeros(5, 16)
    rewrite_weights(exported, tensors)
    one_line_error(exported, r"decoder.embed_tokens.weight has shape \(5, 16\), the model .* has \(24, 16\)")


def test_another_dictionary_is_refused(exported):
    path = exported / "dict.txt"
    lines = path.read_text().splitlines()
    lines[0], lines[1] = lines[1], lines[0]  # same size, other ids
    path.write_text("\n".join(lines) + "\n")
    one_line_error(exported, r"dict.txt is not the dictionary the model was exported with")


def test_an_unknown_format_or_kind_is_one_line(exported):
    config = json.loads((exported / "config.json").read_text())
    (exported / "config.json").write_text(json.dumps({**config, "kind": "onnx"}))
    one_line_error(exported, r"unknown model kind 'onnx'")
    (exported / "config.json").write_text(json.dumps({**config, "format": "other/9"}))
    one_line_error(exported, r"has format 'other/9'")


# ---------------------------------------------------------------------------------- command errors
def test_bad_commands_are_one_line(lm, tmp_path, capsys):
    def fails(argv, match):
        assert ex.main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and match in err, err

    fails([tmp_path / "nothing.pt", tmp_path / "o1"], "nothing.pt not found")
    (tmp_path / "random.pt").write_bytes(os.urandom(4096))
    fails([tmp_path / "random.pt", tmp_path / "o2"], "random.pt cannot be read")
    (tmp_path / "empty.pt").write_bytes(b"")
    fails([tmp_path / "empty.pt", tmp_path / "o3"], "empty.pt is empty")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    fails([lm[0], full], "is not empty: pass an empty or new one, or --force")
    assert sorted(os.listdir(full)) == ["notes.txt"]
    fails([lm[0], tmp_path / "o4", "--data", tmp_path / "nowhere"], "pass --data DIR")
    fails([lm[0], tmp_path / "o5", "--ema"], "--ema is for image trainer checkpoints")
    other = write_dict(str(tmp_path / "other_data"), n=21)
    fails([lm[0], tmp_path / "o7", "--data", other], "was trained with another dictionary than")
    # a fairseq checkpoint of a task export does not support
    translation = {"args": None, "model": {"w": torch.zeros(1)},
                   "cfg": {"task": {"_name": "translation"}, "model": {"_name": "transformer"}},
                   "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                                          "lr_scheduler_state": {"best": None}, "num_updates": 1}],
                   "extra_state": {"epoch": 1}}
    torch.save(translation, tmp_path / "translation.pt")
    fails([tmp_path / "translation.pt", tmp_path / "o6"], "trained with task 'translation'; export supports")


def test_force_replaces_an_earlier_export(lm, tmp_path):
    out = tmp_path / "export"
    assert ex.main([str(lm[0]), str(out)]) == 0
    (out / "model.safetensors").write_bytes(b"old")
    assert ex.main([str(lm[0]), str(out), "--force"]) == 0
    ex.load_exported(str(out))


def test_command_line_exit_status_without_traceback(tmp_path):
    (tmp_path / "random.pt").write_bytes(os.urandom(4096))
    proc = pyrun.run([sys.executable, "-m", "hgrn_fairseq.export", str(tmp_path / "random.pt"),
                      str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Warning" not in line
             and not line.startswith(" ")]
    assert lines == [lines[-1]] and lines[-1].startswith("error: checkpoint "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
