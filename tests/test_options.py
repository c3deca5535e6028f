"""Command-line options of everything the plugin registers.

* No boolean option defaults to True: fairseq turns such a field into a flag that switches it *off*.
* Each boolean flag of ``hgrn_lm`` changes the model the way its name says.
* ``fairseq-train --arch ARCH --help`` / ``--task TASK --help`` list the model's and task's options,
  with the arch's defaults.
* Checkpoints written before the boolean renames load as the model they were trained as.
"""
import argparse
import dataclasses
import io
import contextlib
import os

import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from fairseq import checkpoint_utils, options
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
from fairseq.data import Dictionary
from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY, build_model
from fairseq.tasks import TASK_DATACLASS_REGISTRY, TASK_REGISTRY
from omegaconf import OmegaConf

PLUGIN = "hgrn_fairseq"


def _ours(cls) -> bool:
    return cls.__module__.startswith(PLUGIN)


def plugin_dataclasses():
    """(registry kind, name, dataclass) for every model, task and criterion of the plugin, with the
    dataclasses they nest."""
    found = []
    from fairseq.models import MODEL_REGISTRY
    from fairseq.criterions import CRITERION_REGISTRY

    for kind, registry, dataclasses_of in [
        ("model", MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY),
        ("task", TASK_REGISTRY, TASK_DATACLASS_REGISTRY),
        ("criterion", CRITERION_REGISTRY, CRITERION_DATACLASS_REGISTRY),
    ]:
        for name, cls in registry.items():
            dc = dataclasses_of.get(name)
            if _ours(cls) and dc is not None:
                found.append((kind, name, dc))
    return found


def true_booleans(dc, prefix=""):
    bad = []
    for f in dataclasses.fields(dc):
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if isinstance(f.type, type) and issubclass(f.type, FairseqDataclass):
            bad += true_booleans(f.type, prefix + f.name + ".")
        elif default is True:
            bad.append(prefix + f.name)
    return bad


def test_the_walk_sees_the_plugin():
    names = {(kind, name) for kind, name, _ in plugin_dataclasses()}
    # what exists today; every new registration is walked too
    assert {("model", "hgrn_lm"), ("task", "hgrn_language_modeling"), ("task", "mqar"),
            ("criterion", "linear_cross_entropy")} <= names


def test_no_boolean_option_defaults_to_true():
    offenders = {f"{kind} {name}: {field}" for kind, name, dc in plugin_dataclasses() for field in true_booleans(dc)}
    assert not offenders, f"boolean options that default to True (their fairseq flag would switch them off): {offenders}"


def test_the_walk_would_catch_one():
    @dataclasses.dataclass
    class Bad(FairseqDataclass):
        fine: bool = False
        inverted: bool = True

    assert true_booleans(Bad) == ["inverted"]


# ---- the LM's flags do what they say --------------------------------------------------------------
V, D, L, G = 1000, 48, 3, 80


def dictionary(size=V):
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


def build_from_command_line(arch, *flags):
    argv = ["/unused", "--task", "language_modeling", "--arch", arch, "--kernel-backend", "reference", *flags]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = argparse.Namespace(source_dictionary=dictionary(), target_dictionary=dictionary())
    return build_model(convert_namespace_to_omegaconf(args).model, task)


def count(model):
    return sum(p.numel() for p in model.parameters())


SIZE = ["--decoder-embed-dim", str(D), "--decoder-layers", str(L), "--glu-dim", str(G)]


def test_flags_change_the_model_as_named():
    base = build_from_command_line("hgrn_lm_tiny", *SIZE)
    n = count(base)
    assert base.decoder.output_projection is None and base.decoder.lower_bounds.gamma is not None

    tied = build_from_command_line("hgrn_lm_tiny", *SIZE, "--share-decoder-input-output-embed")
    assert tied.decoder.output_projection is None and count(tied) == n  # fairseq's meaning: tie

    untied = build_from_command_line("hgrn_lm_tiny", *SIZE, "--untie-embeddings")
    assert untied.decoder.output_projection is not None and count(untied) == n + V * D

    no_bound = build_from_command_line("hgrn_lm_tiny", *SIZE, "--no-lower-bound")
    assert no_bound.decoder.lower_bounds.gamma is None and count(no_bound) == n - L * D
    assert torch.all(no_bound.decoder.lower_bounds() == 0)

    paper_order = build_from_command_line("hgrn_lm_tiny", *SIZE, "--gate-before-norm")
    assert all(not layer.mixer.norm_before_gate for layer in paper_order.decoder.layers)
    assert all(layer.mixer.norm_before_gate for layer in base.decoder.layers)

    no_bias = build_from_command_line("hgrn_lm_tiny", *SIZE, "--no-glu-bias")
    assert all(layer.glu.in_proj.bias is None and layer.glu.out_proj.bias is None for layer in no_bias.decoder.layers)
    assert count(no_bias) == n - L * (2 * G + D)


def test_paper_model_count_with_fairseqs_tie_flag():
    # the authors' launcher passes --share-decoder-input-output-embed to hgrn_lm_base: 46,247,936 params
    argv = ["/unused", "--task", "language_modeling", "--arch", "hgrn_lm_base", "--share-decoder-input-output-embed"]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = argparse.Namespace(source_dictionary=dictionary(50264), target_dictionary=dictionary(50264))
    assert count(build_model(convert_namespace_to_omegaconf(args).model, task)) == 46_247_936


def test_contradicting_tie_flags_are_refused():
    with pytest.raises(ValueError, match="--untie-embeddings and --share-decoder-input-output-embed contradict"):
        build_from_command_line("hgrn_lm_tiny", *SIZE, "--untie-embeddings", "--share-decoder-input-output-embed")


# ---- --help -----------------------------------------------------------------------------------------
def help_text(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        options.parse_args_and_arch(options.get_training_parser(), ["--user-dir", PLUGIN, *argv, "--help"])
    assert stop.value.code == 0
    return out.getvalue()


def option_names(dc):
    return ["--" + f.name.replace("_", "-") for f in dataclasses.fields(dc) if not f.name.startswith("_")]


OUR_ARCHS = sorted(a for a, cls in ARCH_MODEL_REGISTRY.items() if _ours(cls))


@pytest.mark.parametrize("arch", OUR_ARCHS)
def test_help_lists_the_arch_options(arch):
    text = help_text("--task", "language_modeling", "--arch", arch)
    model_name = next(name for name, cls in MODEL_DATACLASS_REGISTRY.items()
                      if ARCH_MODEL_REGISTRY[arch] is __import__("fairseq").models.MODEL_REGISTRY.get(name))
    missing = [o for o in option_names(MODEL_DATACLASS_REGISTRY[model_name]) if o not in text]
    assert not missing, f"--arch {arch} --help does not list {missing}"
    assert "Model-specific configuration" in text


def test_help_shows_the_archs_defaults():
    text = " ".join(help_text("--task", "language_modeling", "--arch", "hgrn2_lm_base").split())
    assert "MLGRU (Zhu et al. 2024) (default: hgru2)" in text  # set by the arch, not the dataclass
    assert "hgru2 only: head (expand) dimension (default: 128)" in text
    text = " ".join(help_text("--task", "language_modeling", "--arch", "hgrn_lm_tiny").split())
    assert "(default: hgru)" in text and "model width d (default: 64)" in text


OUR_TASKS = sorted(t for t, cls in TASK_REGISTRY.items() if _ours(cls))


@pytest.mark.parametrize("task", OUR_TASKS)
def test_help_lists_the_task_options(task):
    text = help_text("--task", task, "--arch", "hgrn_lm_tiny")
    dc = TASK_DATACLASS_REGISTRY.get(task)
    assert dc is not None, f"task {task} has no dataclass: its options cannot be listed"
    missing = [o for o in option_names(dc) if o not in text and o != "--data"]
    assert not missing, f"--task {task} --help does not list {missing}"


def test_help_without_data_directory_does_not_fail():
    text = help_text("--task", "hgrn_language_modeling", "--arch", "hgrn_lm_base")
    assert "--no-lower-bound" in text and "--tokens-per-sample" in text


def test_help_without_an_arch_is_fairseqs_own_help():
    """``--help`` with no ``--arch`` (fairseq cannot pick an arch's options) prints fairseq's own help."""
    text = help_text()
    assert "--max-tokens" in text and "--arch" in text and "Model-specific configuration" not in text


# ---- checkpoints written before the rename -----------------------------------------------------
def legacy_checkpoint(tmp_path, **old):
    """A checkpoint whose model config has the options as they were named before the rename."""
    argv = ["/unused", "--task", "language_modeling", "--arch", "hgrn_lm_tiny", *SIZE, "--kernel-backend", "reference"]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    model_cfg = OmegaConf.to_container(cfg.model)
    for new in ("no_lower_bound", "gate_before_norm", "no_glu_bias", "untie_embeddings"):
        model_cfg.pop(new)
    model_cfg.update({"use_lower_bound": True, "norm_before_gate": True, "glu_bias": True,
                      "share_decoder_input_output_embed": True, **old})
    # the old model, built by hand with the old meaning
    legacy_meaning = dict(model_cfg, no_lower_bound=not model_cfg["use_lower_bound"],
                          gate_before_norm=not model_cfg["norm_before_gate"], no_glu_bias=not model_cfg["glu_bias"],
                          untie_embeddings=not model_cfg["share_decoder_input_output_embed"],
                          share_decoder_input_output_embed=False)
    for key in ("use_lower_bound", "norm_before_gate", "glu_bias"):
        legacy_meaning.pop(key)
    task = argparse.Namespace(source_dictionary=dictionary(), target_dictionary=dictionary())
    torch.manual_seed(0)
    reference = build_model(OmegaConf.create(legacy_meaning), task)
    state = {"cfg": {**OmegaConf.to_container(cfg), "model": model_cfg}, "model": reference.state_dict(),
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                   "lr_scheduler_state": {"best": None}, "num_updates": 5}],
             "extra_state": {"train_iterator": {"epoch": 1}}, "last_optimizer_state": None}
    path = os.path.join(str(tmp_path), "old.pt")
    torch.save(state, path)
    return path, reference, task


@pytest.mark.parametrize("old", [
    {},
    {"share_decoder_input_output_embed": False},  # the old flag, which untied
    {"use_lower_bound": False, "norm_before_gate": False, "glu_bias": False},
])
def test_checkpoints_from_before_the_rename_load_the_same_model(tmp_path, old):
    path, reference, task = legacy_checkpoint(tmp_path, **old)
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    model = build_model(state["cfg"].model, task, from_checkpoint=True)
    model.load_state_dict(state["model"], strict=True)
    dec = model.decoder
    assert (dec.output_projection is not None) == (old.get("share_decoder_input_output_embed") is False)
    assert (dec.lower_bounds.gamma is None) == (old.get("use_lower_bound") is False)
    assert all(layer.mixer.norm_before_gate == old.get("norm_before_gate", True) for layer in dec.layers)
    assert all((layer.glu.in_proj.bias is not None) == old.get("glu_bias", True) for layer in dec.layers)
    tokens = torch.randint(4, V, (2, 7))
    with torch.no_grad():
        assert torch.equal(model.eval()(tokens)[0], reference.eval()(tokens)[0])
