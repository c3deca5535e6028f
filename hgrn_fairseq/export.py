"""Export a trained model as ``model.safetensors`` + ``config.json`` (the format to share models in), and
load that pair back with no pickle at all.

    python -m hgrn_fairseq.export CHECKPOINT OUT_DIR [--data DIR] [--ema] [--force]

    from hgrn_fairseq.export import load_exported
    model, config = load_exported(OUT_DIR)

Checkpoints: fairseq ones (language models, LRA classifiers, MQAR: read with
``checkpoint_io.read_fairseq_checkpoint``) and the image trainer's (``hgrn_fairseq.image.train``: read
with ``torch.load(weights_only=True)``). OUT_DIR gets:

* ``model.safetensors``: the state dict, each tensor contiguous; a tensor that shares its storage with
  another of the same shape (tied embeddings) is stored once, its other names kept in ``aliases``.
* ``config.json``: format version, the model (fairseq: name, arch and every model argument; image: the
  timm name and its arguments), the task and what the model needs from it, the sha256 of the weights
  file, and the vocabulary: fairseq models with a dictionary get ``dict.txt`` beside it, its sha256
  recorded and checked on load, so the model is never used with another dictionary.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import zipfile
from typing import Any, Dict, Optional, Sequence, Tuple

from .preprocessing.sentencepiece_bpe import sha256_file

FORMAT = "hgrn-fairseq-export/1"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
DICTIONARY = "dict.txt"
# fairseq tasks whose models export builds back: what each needs from its task is recorded in config.json
LM_TASKS = ("language_modeling", "hgrn_language_modeling", "mqar")
LRA_TASKS = ("lra_text", "lra_image")
# top-level keys of the image trainer's checkpoints (hgrn_fairseq.image.train), none of them fairseq's
IMAGE_KEYS = ("best_top1", "unreadable_images", "batch_in_epoch", "plan")


class ExportError(ValueError):
    """A checkpoint or export directory that cannot be used: one line naming the file and the fix."""




# ------------------------------------------------------------------------------------------- reading
def _pickle_strings(path: str) -> Optional[set]:
    """The strings in a torch zip checkpoint's pickle, read with ``pickletools`` (nothing is built or
    run); None when the file is not a torch zip archive."""
    import pickletools

    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None:
                return None
            data = z.read(name)
    except (OSError, zipfile.BadZipFile, EOFError, RuntimeError, ValueError):
        return None
    strings = set()
    try:
        for op, arg, _ in pickletools.genops(data):
            if isinstance(arg, str):
                strings.add(arg)
    except Exception:  # a damaged pickle: the reader that loads it says so in one line
        return None
    return strings


def checkpoint_kind(path: str) -> str:
    """``"image"`` for the image trainer's checkpoints, else ``"fairseq"`` (decided without unpickling)."""
    strings = _pickle_strings(path)
    if strings is not None and all(k in strings for k in IMAGE_KEYS) and "optimizer_history" not in strings:
        return "image"
    return "fairseq"


def read_image_checkpoint(path: str) -> dict:
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), "")[:120]
        raise ExportError(f"image checkpoint {path} cannot be read with weights_only=True ({type(e).__name__}: "
                          f"{first}): pass a checkpoint_*.pt written by hgrn_fairseq.image.train") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict) or \
            not isinstance(state.get("config"), dict):
        raise ExportError(f"{path} is not an image trainer checkpoint (no 'model' weights or 'config'): pass a "
                          "checkpoint_*.pt written by hgrn_fairseq.image.train")
    return state


# ------------------------------------------------------------------------------------------- tensors
def split_shared(state: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, str], Dict[str, Any]]:
    """(tensors to write, aliases, extra states): each tensor contiguous and owning its storage; a name whose
    tensor is the very same view as an earlier one's (tied weights) becomes ``aliases[name] = earlier name``;
    a module's non-tensor extra state (the LM decoder's dictionary record) goes to the JSON config."""
    import torch

    tensors: Dict[str, Any] = {}
    aliases: Dict[str, str] = {}
    extra: Dict[str, Any] = {}
    seen: Dict[tuple, str] = {}
    for name, t in state.items():
        if not torch.is_tensor(t):
            try:
                json.dumps(t)
            except (TypeError, ValueError):
                raise ExportError(f"state entry {name} is a {type(t).__name__} that JSON cannot hold: it cannot "
                                  "be exported") from None
            extra[name] = t
            continue
        if t.device.type != "cpu":
            t = t.cpu()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        # a copy of its own: views that share storage without being the same tensor are written apart
        tensors[name] = t.detach().clone().contiguous()
    return tensors, aliases, extra


def check_keys(expected, got, weights: str) -> None:
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    if missing or unexpected:
        def show(keys):
            return ", ".join(keys[:3]) + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "") if keys else "none"
        raise ExportError(f"{weights} does not fit the model {CONFIG} describes: missing keys {show(missing)}; "
                          f"unexpected keys {show(unexpected)}: export the checkpoint again")


def load_strict(model, tensors: Dict[str, Any], where: str) -> None:
    """Load ``tensors`` into ``model``; any missing/unexpected key or shape difference is one line."""
    import torch

    expected = model.state_dict()
    check_keys(expected, tensors, where)
    for name, t in tensors.items():
        if not torch.is_tensor(t):  # a module's extra state
            continue
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ExportError(f"{where}: {name} has shape {tuple(t.shape)}, the model built from {CONFIG} has "
                              f"{tuple(expected[name].shape)}: export the checkpoint again")
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise ExportError(f"{where} does not load into the model: {str(e).splitlines()[0]}") from None


# ------------------------------------------------------------------------------------------ fairseq
def _to_plain(node) -> Any:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    if isinstance(node, argparse.Namespace):
        return dict(vars(node))
    return node


def _fairseq_cfg(state: dict, path: str):
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    if state.get("args") is not None:
        return convert_namespace_to_omegaconf(state["args"])
    if state.get("cfg") is None:
        raise ExportError(f"{path} has no fairseq config (cfg/args): pass a checkpoint fairseq-train wrote")
    return state["cfg"]


def _model_name(model_cfg) -> Tuple[str, str]:
    name = model_cfg.get("_name", None) if hasattr(model_cfg, "get") else getattr(model_cfg, "_name", None)
    arch = model_cfg.get("arch", None) if hasattr(model_cfg, "get") else getattr(model_cfg, "arch", None)
    return str(name or arch), str(arch or name)


class ExportedTask:
    """What a fairseq model's ``build_model`` reads from its task, rebuilt from ``config.json`` (no data)."""

    def __init__(self, task_cfg, dictionary=None, lra_inputs: Optional[dict] = None):
        self.cfg = self.args = task_cfg
        self.dictionary = dictionary
        self._lra_inputs = lra_inputs

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def lra_model_inputs(self) -> dict:
        if self._lra_inputs is None:
            raise ExportError(f"{CONFIG} records no LRA model inputs for this model")
        return dict(self._lra_inputs)


def _build_fairseq_model(model_args: dict, task) -> Any:
    from fairseq import models
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(model_args)
    return models.build_model(cfg, task, from_checkpoint=True)


def export_fairseq(checkpoint: str, data: Optional[str]) -> Tuple[dict, Dict[str, Any], Optional[str], dict]:
    """(config, state dict, dict.txt to copy or None, extra files {name: Dictionary to save})."""
    import hgrn_fairseq  # noqa: F401  (registers the package's models and tasks)
    from fairseq import tasks
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.dataclass.utils import overwrite_args_by_name

    from .checkpoint_io import CheckpointError, read_fairseq_checkpoint

    try:
        state = read_fairseq_checkpoint(checkpoint)
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    cfg = _fairseq_cfg(state, checkpoint)
    task_name = cfg.task.get("_name", None) if hasattr(cfg.task, "get") else getattr(cfg.task, "_name", None)
    name, arch = _model_name(cfg.model)
    if task_name not in LM_TASKS + LRA_TASKS:
        raise ExportError(f"{checkpoint} was trained with task {task_name!r}; export supports "
                          f"{', '.join(LM_TASKS + LRA_TASKS)} (fairseq checkpoints) and image trainer checkpoints")
    if arch not in ARCH_MODEL_REGISTRY and name not in MODEL_REGISTRY:
        raise ExportError(f"{checkpoint} holds model {arch!r}, which is not registered with fairseq: "
                          "export models of hgrn_fairseq or stock fairseq")
    if data is not None:
        overwrite_args_by_name(cfg, {"data": data})
    try:
        task = tasks.setup_task(cfg.task)
    except (ValueError, OSError, FileNotFoundError) as e:
        where = getattr(cfg.task, "data", None)
        raise ExportError(f"{checkpoint}: task {task_name} cannot be set up from {where!r} ("
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}): pass --data DIR, the data "
                          "directory the model was trained on (its dictionary is exported with the weights)") from None
    task_state = state.get("task_state") or {}
    if task_state:
        try:
            task.load_state_dict(task_state)  # the package's tasks refuse data other than the trained
        except ValueError as e:
            raise ExportError(f"{checkpoint}: {str(e).splitlines()[0]}") from None
    model = task.build_model(cfg.model, from_checkpoint=True)
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    except RuntimeError as e:
        raise ExportError(f"{checkpoint}: its weights do not fit model {arch} ({str(e).splitlines()[0]})") from None

    config: Dict[str, Any] = {
        "format": FORMAT,
        "kind": "fairseq",
        "model": {"name": name, "arch": arch, "args": _to_plain(cfg.model)},
        "task": {"name": task_name, "args": _to_plain(cfg.task)},
    }
    history = state.get("optimizer_history") or []
    config["source"] = {"checkpoint": os.path.basename(checkpoint),
                        "num_updates": history[-1].get("num_updates") if history else None}
    fingerprint = task_state.get("hgrn_data") if isinstance(task_state, dict) else None
    if fingerprint is not None:
        config["task"]["data_fingerprint"] = fingerprint
    copy_dict = None
    save_dict = None
    dictionary = getattr(task, "target_dictionary", None) if task_name in LM_TASKS else getattr(task, "dictionary", None)
    if dictionary is not None:
        data_dir = str(getattr(cfg.task, "data", "") or "").split(os.pathsep)[0]
        on_disk = os.path.join(data_dir, DICTIONARY) if data_dir else ""
        if on_disk and os.path.isfile(on_disk):
            copy_dict = on_disk  # byte for byte: the file the data was binarised with
        else:
            save_dict = dictionary  # a generated vocabulary (MQAR): written by fairseq's Dictionary.save
        config["dictionary"] = {"file": DICTIONARY, "size": len(dictionary)}
    if task_name in LRA_TASKS:
        config["lra_model_inputs"] = _to_plain(task.lra_model_inputs())
    return config, model.state_dict(), copy_dict, save_dict


def load_fairseq(directory: str, config: dict, tensors: Dict[str, Any]):
    import hgrn_fairseq  # noqa: F401  (registers the package's models and tasks)
    from fairseq.data import Dictionary
    from omegaconf import OmegaConf

    dictionary = None
    record = config.get("dictionary")
    if record:
        path = os.path.join(directory, record["file"])
        if not os.path.isfile(path):
            raise ExportError(f"{path} is missing: the model's dictionary is part of the export; export it again")
        digest = sha256_file(path)
        if digest != record.get("sha256"):
            raise ExportError(f"{path} is not the dictionary the model was exported with (sha256 {digest[:12]}... "
                              f"vs {str(record.get('sha256'))[:12]}... in {CONFIG}): use the exported dict.txt")
        dictionary = Dictionary.load(path)
        if len(dictionary) != record.get("size"):
            raise ExportError(f"{path} reads as {len(dictionary)} entries, {CONFIG} says {record.get('size')}")
    task = ExportedTask(OmegaConf.create(config["task"]["args"]), dictionary, config.get("lra_model_inputs"))
    try:
        return _build_fairseq_model(config["model"]["args"], task)
    except (KeyError, ValueError, TypeError, AssertionError) as e:
        raise ExportError(f"{os.path.join(directory, CONFIG)}: model {config['model'].get('arch')!r} cannot be "
                          f"built ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


# --------------------------------------------------------------------------------------------- image
def export_image(checkpoint: str, use_ema: bool) -> Tuple[dict, Dict[str, Any]]:
    state = read_image_checkpoint(checkpoint)
    key = "ema" if use_ema else "model"
    if state.get(key) is None:
        raise ExportError(f"{checkpoint} holds no EMA weights (trained with ema.decay=0): drop --ema")
    model_cfg = dict(state["config"].get("model") or {})
    plan = state.get("plan") or {}
    num_classes = plan.get("classes")
    if num_classes is None:
        head = state[key].get("head.weight")
        num_classes = int(head.shape[0]) if head is not None else None
    if not model_cfg.get("name") or num_classes is None:
        raise ExportError(f"{checkpoint} records no model name or class count: pass a checkpoint written by "
                          "hgrn_fairseq.image.train")
    config = {
        "format": FORMAT,
        "kind": "image",
        "model": {"name": model_cfg["name"], "num_classes": int(num_classes),
                  "img_size": int(model_cfg.get("img_size", 224)), "drop": float(model_cfg.get("drop", 0.0)),
                  "drop_path": float(model_cfg.get("drop_path", 0.0)), "kwargs": dict(model_cfg.get("kwargs") or {})},
        "classes": {"count": int(num_classes), "sha256": plan.get("classes_sha256")},
        "weights_from": key,
        "source": {"checkpoint": os.path.basename(checkpoint), "num_updates": state.get("num_updates"),
                   "epoch": state.get("epoch")},
    }
    return config, state[key]


def load_image(directory: str, config: dict):
    from omegaconf import OmegaConf

    from .image.train import UsageError, build_model

    m = config["model"]
    cfg = OmegaConf.create({"model": {"name": m["name"], "img_size": m["img_size"], "drop": m["drop"],
                                      "drop_path": m["drop_path"], "kwargs": m["kwargs"]}})
    try:
        return build_model(cfg, int(m["num_classes"]))
    except UsageError as e:
        raise ExportError(f"{os.path.join(directory, CONFIG)}: {e}") from None


# -------------------------------------------------------------------------------------------- public
def export(checkpoint: str, out_dir: str, data: Optional[str] = None, use_ema: bool = False,
           force: bool = False) -> dict:
    """Write ``out_dir/model.safetensors`` + ``config.json`` (+ ``dict.txt``) from ``checkpoint``;
    returns the config."""
    from safetensors.torch import save_file

    if not os.path.exists(checkpoint):
        raise ExportError(f"checkpoint {checkpoint} not found: pass the checkpoint_*.pt file training wrote")
    if not os.path.isfile(checkpoint):
        raise ExportError(f"checkpoint {checkpoint} is not a file: pass the checkpoint_*.pt file training wrote")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ExportError(f"output {out_dir} exists and is not a directory: pass a new directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not force:
        raise ExportError(f"output directory {out_dir} is not empty: pass an empty or new one, or --force to "
                          "replace its export")
    if os.path.getsize(checkpoint) == 0:
        raise ExportError(f"checkpoint {checkpoint} is empty (0 bytes): pass a checkpoint that training wrote "
                          "completely")
    kind = checkpoint_kind(checkpoint)
    copy_dict = save_dict = None
    if kind == "image":
        if data is not None:
            raise ExportError(f"--data is for fairseq checkpoints; {checkpoint} is an image trainer checkpoint")
        config, state = export_image(checkpoint, use_ema)
    else:
        if use_ema:
            raise ExportError(f"--ema is for image trainer checkpoints; {checkpoint} is a fairseq checkpoint")
        config, state, copy_dict, save_dict = export_fairseq(checkpoint, data)

    tensors, aliases, extra = split_shared(state)
    os.makedirs(out_dir, exist_ok=True)
    for name in (WEIGHTS, CONFIG, DICTIONARY):  # --force: nothing of an earlier export survives
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    weights = os.path.join(out_dir, WEIGHTS)
    save_file(tensors, weights + ".tmp", metadata={"format": FORMAT})
    os.replace(weights + ".tmp", weights)
    if copy_dict or save_dict is not None:
        dict_path = os.path.join(out_dir, DICTIONARY)
        if copy_dict:
            shutil.copyfile(copy_dict, dict_path)
        else:
            save_dict.save(dict_path)
        config["dictionary"]["sha256"] = sha256_file(dict_path)
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in tensors.values()})
    config["weights"] = {"file": WEIGHTS, "sha256": sha256_file(weights), "tensors": len(tensors),
                         "numel": int(sum(t.numel() for t in tensors.values())), "dtypes": dtypes,
                         "aliases": aliases, "extra_state": extra}
    tmp = os.path.join(out_dir, CONFIG + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, CONFIG))  # written last: a directory with config.json is complete
    return config


def read_config(directory: str) -> dict:
    path = os.path.join(directory, CONFIG)
    if not os.path.isfile(path):
        raise ExportError(f"{path} not found: pass a directory written by python -m hgrn_fairseq.export")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ExportError(f"{path} is not valid JSON ({e}): export the checkpoint again") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise ExportError(f"{path} has format {found!r}, this version reads {FORMAT!r}: export the checkpoint "
                          "again with this version")
    if config.get("kind") not in ("fairseq", "image"):
        raise ExportError(f"{path}: unknown model kind {config.get('kind')!r} (expected 'fairseq' or 'image')")
    return config


def load_exported(directory: str):
    """(model in eval mode, config dict) from a directory written by ``export``. The weights are read with
    ``safetensors.torch.load_file`` (no pickle); their sha256, the dictionary's and every key are checked.
    A fairseq LM's dictionary is ``model.decoder.dictionary`` (read from the exported ``dict.txt``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_config(directory)
    weights = os.path.join(directory, config.get("weights", {}).get("file", WEIGHTS))
    if not os.path.isfile(weights):
        raise ExportError(f"{weights} not found: export the checkpoint again")
    digest = sha256_file(weights)
    if digest != config["weights"].get("sha256"):
        raise ExportError(f"{weights} is damaged or not the exported file (sha256 {digest[:12]}... vs "
                          f"{str(config['weights'].get('sha256'))[:12]}... in {CONFIG}): copy or export it again")
    try:
        tensors = load_file(weights)
    except (SafetensorError, OSError, ValueError) as e:
        raise ExportError(f"{weights} cannot be read ({str(e).splitlines()[0]}): copy or export it again") from None
    for alias, target in (config["weights"].get("aliases") or {}).items():
        if target not in tensors:
            raise ExportError(f"{weights}: alias {alias} -> {target}, which is not in the file: export it again")
        tensors[alias] = tensors[target]
    tensors.update(config["weights"].get("extra_state") or {})
    if config["kind"] == "image":
        model = load_image(directory, config)
    else:
        model = load_fairseq(directory, config, tensors)
    load_strict(model, tensors, weights)
    model.eval()
    return model, config


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hgrn_fairseq.export",
        description="Write a checkpoint's weights and config as OUT_DIR/model.safetensors + config.json "
                    "(+ dict.txt); load them with hgrn_fairseq.export.load_exported(OUT_DIR).")
    parser.add_argument("checkpoint", help="checkpoint_*.pt written by fairseq-train or hgrn_fairseq.image.train")
    parser.add_argument("out_dir", help="output directory (new or empty; --force to replace an export)")
    parser.add_argument("--data", default=None,
                        help="fairseq checkpoints: the data directory trained on, if not where the checkpoint "
                             "says (its dict.txt is exported)")
    parser.add_argument("--ema", action="store_true", help="image checkpoints: export the EMA weights")
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    from .data_checks import DataError

    try:
        config = export(args.checkpoint, args.out_dir, data=args.data, use_ema=args.ema, force=args.force)
    except (ExportError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    what = config["model"].get("arch") or config["model"].get("name")
    print(f"exported {what} ({config['weights']['numel']:,} values in {config['weights']['tensors']} tensors) "
          f"to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
