"""fairseq registration of the Long Range Arena classifiers: model ``hgrn_lra`` and its named archs.

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

The network is ``modules/lra_encoder.py`` (fairseq-free); this file only maps options to it and
names the papers' per-task settings:

* ``hgrn1_lra_{listops,text,retrieval,image,pathfinder,pathx}``: HGRN1 (complex HGRU, a theta per
  scan direction), the HGRN paper's layers / width / norm / dropout / GLU multiple / positions.
* ``hgrn2_lra_{...}``: HGRN2 (HGRU2, LRA variant), the HGRN2 paper's settings incl. the expand ratio;
  Path-X uses the "series" 2-D scan.
* ``transformer_lra``: the same encoder with softmax self-attention as the token mixer (no lower
  bounds): the Transformer of the throughput comparison (bench/bench_lra.py). Width, depth and GLU
  follow the command line (defaults: hgrn1_lra_listops's).

What the task supplies: the input kind (tokens with the dictionary, or pixels with C channels), the
number of classes, whether examples are document pairs (Retrieval) and the image grid (2-D tasks).
The training recipes (optimiser, schedule, batch, precision) are in scripts/lra_recipes.py.
"""

import dataclasses
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import ARCH_CONFIG_REGISTRY, BaseFairseqModel, register_model, register_model_architecture
from fairseq.utils import safe_getattr

from torch import nn

from ..kernels import BACKENDS
from ..modules.cuda_graph import GraphedCallCache
from ..modules.lra_encoder import (
    LRA_MIXERS,
    POOLS,
    POSITIONS,
    SCAN_2D,
    LraClassifier,
    LraEncoder,
    LraPairClassifier,
)
from ..modules.norms import NORMS, syncs_across_processes
from ..modules.transient import TransientAttrs
from ..recipes.lra import TASKS as LRA_TASKS, arch_settings  # the per-task model settings: the one recipe source


@dataclass
class HgrnLraConfig(FairseqDataclass):
    token_mixer: ChoiceEnum(list(LRA_MIXERS)) = field(
        default="hgru", metadata={"help": "hgru: HGRN1 (complex); hgru2: HGRN2 (LRA variant); attention: Transformer"}
    )
    encoder_embed_dim: int = field(default=32, metadata={"help": "model width d"})
    encoder_layers: int = field(default=6, metadata={"help": "number of blocks [mixer, GLU]"})
    glu_multiple: float = field(default=1.0, metadata={"help": "GLU hidden width = int(multiple * d)"})
    norm: ChoiceEnum(list(NORMS)) = field(
        default="layer",
        metadata={"help": "block and final norms: layer, batch or syncbatch (batch norms skip padded positions)"},
    )
    dropout: float = field(default=0.0, metadata={"help": "dropout on the residual branches"})
    positions: ChoiceEnum(list(POSITIONS)) = field(
        default="sin", metadata={"help": "sin: fixed sinusoidal positions added to the input; none: no positions"}
    )
    position_dropout: float = field(default=0.1, metadata={"help": "dropout after adding the positions"})
    expand_ratio: int = field(default=1, metadata={"help": "hgru2: head (expand) dimension"})
    attention_heads: int = field(default=4, metadata={"help": "attention: number of heads"})
    scan_2d: ChoiceEnum(list(SCAN_2D)) = field(
        default="none",
        metadata={"help": "none: 1-D scans; parallel: rows and columns, both ways, summed; series: a whole "
                  "mixer along the rows, then one down the columns (HGRN2 Path-X)"},
    )
    no_lower_bound: bool = field(default=False, metadata={"help": "no layer-wise lower bounds (ablation)"})
    pool: ChoiceEnum(list(POOLS)) = field(
        default="mean", metadata={"help": "pooling over the valid positions: mean (the papers') or max (an ablation)"}
    )
    unmasked_padding: bool = field(
        default=False,
        metadata={"help": "ablation, the official LRA code's handling of padding: a learned pad embedding, the "
                  "mixers and norms see the padded positions (the reverse scan starts in the padding, batch "
                  "norms count it); the pooling still averages the valid positions"},
    )
    scan_padding: bool = field(
        default=False,
        metadata={"help": "only the mixers see the padded positions (a learned pad embedding; the scans run through "
                  "the pads, as the official LRA code's do), while the batch norms' statistics and the pooling "
                  "skip them; needs the task's --pad-to-length (every example padded alike, so a prediction does "
                  "not depend on its batch)"},
    )
    max_positions: int = field(default=2000, metadata={"help": "longest sequence (positions) the model takes"})
    kernel_backend: ChoiceEnum(list(BACKENDS)) = field(
        default="auto", metadata={"help": "auto: Triton kernels on CUDA, PyTorch reference on CPU"}
    )
    compile_blocks: bool = field(
        default=False, metadata={"help": "torch.compile each block for training (our scan kernels stay eager)"}
    )
    cuda_graphs: bool = field(
        default=False,
        metadata={"help": "CUDA training steps replay the classifier's forward and backward as CUDA graphs, one "
                  "capture per batch shape (up to 8 per padding mode; more run eagerly): the host issues a few launches instead of "
                  "~1,300. Give token tasks the task's --pad-to-length so that the batches share one shape. "
                  "Evaluation and CPU run eagerly; so do sync-batch norms over several GPUs"},
    )


def validate_config(cfg) -> None:
    """Raise a one-line ValueError naming the option and the fix."""
    def get(name):
        return safe_getattr(cfg, name, None)

    rules = [
        ("encoder_layers", lambda v: v >= 1, "it must be >= 1"),
        ("encoder_embed_dim", lambda v: v >= 1, "it must be >= 1"),
        ("glu_multiple", lambda v: v > 0, "it must be > 0"),
        ("dropout", lambda v: 0.0 <= v < 1.0, "it must be in [0, 1)"),
        ("position_dropout", lambda v: 0.0 <= v < 1.0, "it must be in [0, 1)"),
        ("expand_ratio", lambda v: v >= 1, "it must be >= 1"),
        ("max_positions", lambda v: v >= 1, "it must be >= 1"),
    ]
    for name, ok, fix in rules:
        value = get(name)
        if value is None or not ok(value):
            raise ValueError(f"hgrn_lra: --{name.replace('_', '-')}={value} is invalid: {fix}")
    if get("norm") not in NORMS:
        raise ValueError(f"hgrn_lra: --norm={get('norm')} is not one of {', '.join(NORMS)}")
    if get("token_mixer") == "hgru2" and get("encoder_embed_dim") % get("expand_ratio") != 0:
        raise ValueError(f"hgrn_lra: --expand-ratio={get('expand_ratio')} does not divide --encoder-embed-dim="
                         f"{get('encoder_embed_dim')}: pick a divisor of the model width")
    if get("cuda_graphs") and get("compile_blocks"):
        raise ValueError("hgrn_lra: --cuda-graphs and --compile-blocks do not combine (a graph records the eager "
                         "kernels): pick one")
    if get("token_mixer") == "attention":
        if get("encoder_embed_dim") % get("attention_heads") != 0:
            raise ValueError(f"hgrn_lra: --attention-heads={get('attention_heads')} does not divide "
                             f"--encoder-embed-dim={get('encoder_embed_dim')}")
        if get("scan_2d") == "series":
            raise ValueError("hgrn_lra: --scan-2d series needs a recurrent --token-mixer (hgru or hgru2)")


@register_model("hgrn_lra", dataclass=HgrnLraConfig)
class HgrnLraModel(TransientAttrs, BaseFairseqModel):
    """LRA classifier: ``forward(**net_input) -> logits [B, num_classes]``.

    net_input: ``src_tokens [B, T]`` (+ ``src_tokens1`` for document pairs) for token tasks, padded
    with the dictionary's pad; ``pixels [B, H*W, C]`` (normalised floats) for pixel tasks.
    """

    def __init__(self, cfg, classifier, padding_idx, grid, pair, scratch_idx=None):
        super().__init__()
        self.cfg = cfg
        self.classifier = classifier
        self.padding_idx = padding_idx
        self.grid = grid
        self.pair = pair
        self.scratch_idx = scratch_idx  # (the task's --scratch-positions token: seen by the layers, not pooled)

    @classmethod
    def build_model(cls, cfg, task):
        validate_config(cfg)
        info = task.lra_model_inputs()  # kind, vocab / channels, classes, pair, grid, longest sequence
        if info["max_len"] > cfg.max_positions:
            eos = " (with the tokens --append-eos / --scratch-positions add)" if info.get("appended") else ""
            raise ValueError(
                f"hgrn_lra: the data ({task.cfg.data}) hold sequences of up to {info['max_len']} positions{eos} but "
                f"--max-positions is {cfg.max_positions}: use the arch made for this task, raise --max-positions, "
                f"or prepare the data truncated to {cfg.max_positions - info.get('appended', 0)} "
                f"(data_prep/prepare_lra.py --max-len)")
        pad_to = info.get("pad_to", 0)  # (the task's --pad-to-length)
        if safe_getattr(cfg, "scan_padding", False) and not pad_to:
            raise ValueError("hgrn_lra: --scan-padding lets the scans see the padding, so predictions would depend "
                             "on the batch: pad every batch alike with the task's --pad-to-length N")
        if pad_to > cfg.max_positions:
            raise ValueError(f"hgrn_lra: --pad-to-length {pad_to} is more than --max-positions {cfg.max_positions}: "
                             f"pad to at most {cfg.max_positions} or raise --max-positions")
        if cfg.scan_2d != "none" and info["input"] == "tokens":
            raise ValueError("hgrn_lra: --scan-2d is for pixel tasks (lra_image); token sequences are 1-D")
        encoder = LraEncoder(
            mixer=cfg.token_mixer,
            dim=cfg.encoder_embed_dim,
            num_layers=cfg.encoder_layers,
            glu_multiple=cfg.glu_multiple,
            norm=cfg.norm,
            input=info["input"],
            vocab_size=info.get("vocab_size"),
            padding_idx=info.get("padding_idx"),
            in_channels=info.get("channels"),
            positions=cfg.positions,
            position_dropout=cfg.position_dropout,
            dropout=cfg.dropout,
            expand_ratio=cfg.expand_ratio,
            num_heads=cfg.attention_heads,
            scan_2d=cfg.scan_2d,
            lower_bound=not cfg.no_lower_bound,
            max_len=cfg.max_positions,
            backend=cfg.kernel_backend,
            compile="train" if cfg.compile_blocks else "none",
            unmasked_padding=bool(safe_getattr(cfg, "unmasked_padding", False)),
            scan_padding=bool(safe_getattr(cfg, "scan_padding", False)),
            pool=str(safe_getattr(cfg, "pool", "mean")),
        )
        head = LraPairClassifier if info["pair"] else LraClassifier
        grid = tuple(info["grid"]) if cfg.scan_2d != "none" else None
        return cls(cfg, head(encoder, info["num_classes"]), info.get("padding_idx"), grid, info["pair"],
                   info.get("scratch_idx"))

    _TRANSIENT = ("_graphs",)  # built on first use, never pickled or deep-copied (modules/transient.py)

    def forward(self, src_tokens=None, src_lengths=None, src_tokens1=None, src_lengths1=None, pixels=None,
                padded=None, **unused):
        """``padded`` (the collater's host-side flag): False when no example of the batch is padded, so
        the unmasked kernels run; None (unknown) masks the pad positions."""
        if pixels is not None:
            inputs, masked = (pixels,), False
        elif src_tokens is None:
            raise ValueError("hgrn_lra: the batch has neither src_tokens nor pixels (use --task lra_text or lra_image)")
        elif self.pair:
            if src_tokens1 is None:
                raise ValueError("hgrn_lra: a pair model (retrieval data) got one document per example")
            inputs, masked = (src_tokens, src_tokens1), padded is None or bool(padded)
        else:
            inputs, masked = (src_tokens,), padded is None or bool(padded)
        if safe_getattr(self.cfg, "cuda_graphs", False) and GraphedCallCache.usable(self, *inputs) \
                and not self._sync_across_gpus():
            # (the logits are the graph's output buffer: valid until the next training forward of this shape)
            caches = self._transient("_graphs", dict)
            cache = caches.get(masked)
            if cache is None:
                cache = caches[masked] = GraphedCallCache(_Eager(self, masked), max_graphs=8, name="hgrn_lra")
            return cache(*inputs)
        return self.logits(masked, *inputs)

    def logits(self, masked: bool, *inputs):
        """The classifier's eager forward: ``inputs`` are (pixels,), (src_tokens,) or (src_tokens,
        src_tokens1); ``masked``: token inputs' pad positions are masked."""
        if len(inputs) == 1 and inputs[0].is_floating_point():
            return self.classifier(inputs[0], None, self.grid)
        src_tokens = inputs[0]
        mask = src_tokens.eq(self.padding_idx) if masked else None
        if len(inputs) == 2:
            src_tokens1 = inputs[1]
            return self.classifier(src_tokens, mask, src_tokens1, src_tokens1.eq(self.padding_idx) if masked else None,
                                   pad_value=self.padding_idx, exclude_value=self.scratch_idx)
        exclude = None if self.scratch_idx is None else src_tokens.eq(self.scratch_idx)
        return self.classifier(src_tokens, mask, None, exclude)

    def _sync_across_gpus(self) -> bool:
        """Sync-batch norms over several GPUs (their all-reduce is not captured: such steps run eagerly)."""
        return str(self.cfg.norm) == "syncbatch" and syncs_across_processes()

    def max_positions(self):
        return self.cfg.max_positions

    def get_targets(self, sample, net_output):
        return sample["target"]


class _Eager(nn.Module):
    """The eager forward of an ``HgrnLraModel`` (whose parameters it shares) for one padding mode: what a
    CUDA graph records."""

    def __init__(self, model: HgrnLraModel, masked: bool):
        super().__init__()
        self.model, self.masked = model, masked

    def forward(self, *inputs):
        return self.model.logits(self.masked, *inputs)


def _set_defaults(args, **defaults):
    for name, value in defaults.items():
        setattr(args, name, safe_getattr(args, name, value))


def hgrn_lra_default(args):
    _set_defaults(args, **{f.name: f.default for f in dataclasses.fields(HgrnLraConfig) if not f.name.startswith("_")})


def _register(model: str, task: str):
    def arch(args):
        _set_defaults(args, **arch_settings(model, task))
        hgrn_lra_default(args)

    arch.__name__ = f"{model}_lra_{task}"
    arch.__doc__ = f"{model.upper()} on LRA {task}: {arch_settings(model, task)}"
    register_model_architecture("hgrn_lra", arch.__name__)(arch)
    return arch


LRA_ARCHS = {f"{m}_lra_{t}": _register(m, t) for m in ("hgrn1", "hgrn2") for t in LRA_TASKS}

# Model options a result records on their own ("norm", "unmasked_padding", "scan_padding"), and those that do
# not change what the model computes: max_positions only bounds the lengths (the sinusoidal table is made per
# length), the kernel backend, compilation and CUDA graphs change the kernels or their launch, not the function.
_RECORDED_APART = ("norm", "unmasked_padding", "scan_padding")
_SAME_FUNCTION = ("max_positions", "kernel_backend", "compile_blocks", "cuda_graphs")


def same_option(a, b) -> bool:
    """Option values equal as numbers (2 == 2.0, True == 1) or else as text (enum choices)."""
    if isinstance(a, (bool, int, float)) and isinstance(b, (bool, int, float)):
        return float(a) == float(b)
    return str(a) == str(b)


def arch_overrides(model_cfg, arch: str) -> dict:
    """The model options of a trained run that differ from what its arch sets (``--encoder-layers 4`` on
    ``hgrn1_lra_listops``: ``{"encoder_layers": 4}``), apart from the options results record on their own
    and those that do not change the model's function. Empty for a run of the arch as registered."""
    import argparse

    expected = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](expected)
    out = {}
    for name, want in sorted(vars(expected).items()):
        if name in _RECORDED_APART or name in _SAME_FUNCTION:
            continue
        got = safe_getattr(model_cfg, name, want)
        if not same_option(got, want):
            out[name] = got if isinstance(got, (bool, int, float)) else str(got)
    return out


# The task options that define an LRA run beside the model's (hgrn_fairseq/tasks/lra.py).
_TASK_SETTINGS = ("append_eos", "scratch_positions", "pad_to_length", "augment")


def resume_changes(saved_cfg, args) -> list:
    """What resuming an LRA checkpoint with the parsed command line ``args`` would change from the settings
    it trained with: ``["--norm syncbatch (now layer)", ...]``, empty when nothing. The arch, the task, every
    model option that changes the function (not max_positions, the kernel backend or compilation) and the
    task options that define the run (<eos>, scratch positions, fixed-width padding, augmentation).
    Fixed-width padding counts only where the padding reaches the layers (``--unmasked-padding`` /
    ``--scan-padding``, saved or now): a model that masks its padding computes the same function at any
    padded width, so such a run may go on with ``--pad-to-length`` (the one batch shape ``--cuda-graphs``
    wants) or without it."""
    model, task = saved_cfg["model"], saved_cfg["task"]
    sees_padding = any(bool(safe_getattr(model, name, False)) or bool(getattr(args, name, False))
                       for name in ("unmasked_padding", "scan_padding"))
    task_settings = _TASK_SETTINGS if sees_padding else tuple(n for n in _TASK_SETTINGS if n != "pad_to_length")
    out = []
    if not same_option(safe_getattr(model, "_name", None), getattr(args, "arch", None)):
        out.append(f"--arch {safe_getattr(model, '_name', None)} (now {getattr(args, 'arch', None)})")
    if not same_option(safe_getattr(task, "_name", None), getattr(args, "task", None)):
        out.append(f"--task {safe_getattr(task, '_name', None)} (now {getattr(args, 'task', None)})")
    names = [f.name for f in dataclasses.fields(HgrnLraConfig) if f.name not in _SAME_FUNCTION]
    for section, keys in ((model, names), (task, task_settings)):
        for name in keys:
            if name not in section or not hasattr(args, name):
                continue
            was, now = section[name], getattr(args, name)
            if not same_option(was, now):
                out.append(f"--{name.replace('_', '-')} {was} (now {now})")
    return out


@register_model_architecture("hgrn_lra", "transformer_lra")
def transformer_lra(args):
    """Softmax self-attention in the same blocks (GLU, norms, pooling, head), no lower bounds;
    width / depth from the command line (default hgrn1_lra_listops's 6 x 32, 4 heads)."""
    _set_defaults(args, token_mixer="attention", no_lower_bound=True, **{
        k: v for k, v in arch_settings("hgrn1", "listops").items() if k not in ("token_mixer", "norm")})
    _set_defaults(args, norm="layer")
    hgrn_lra_default(args)
