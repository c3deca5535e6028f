"""``hgrn_lra``: the per-task archs set the papers' settings, parameter counts by hand formulas
(the numbers docs/lra.md gives), the model built through fairseq from a task's data, bad options."""
import argparse
import re
import types

import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from fairseq.models import ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY

from hgrn_fairseq.models.hgrn_lra import HgrnLraConfig, HgrnLraModel, validate_config

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")

# the papers' LRA settings, written out again here (not read from the code under test):
# HGRN1: layers, d, norm, dropout, GLU multiple, positions; 2-D for image / pathfinder / pathx
PAPER_HGRN1 = {
    "listops": (6, 32, "syncbatch", 0.0, 1, "sin"),
    "text": (4, 128, "syncbatch", 0.1, 1, "sin"),
    "retrieval": (2, 64, "batch", 0.0, 2, "sin"),
    "image": (6, 512, "batch", 0.0, 1, "sin"),
    "pathfinder": (6, 128, "batch", 0.0, 1, "none"),
    "pathx": (6, 64, "syncbatch", 0.0, 1, "none"),
}
# HGRN2: layers, d, norm, dropout, GLU multiple, positions, expand ratio
PAPER_HGRN2 = {
    "listops": (5, 64, "syncbatch", 0.0, 1, "sin", 4),
    "text": (4, 128, "layer", 0.1, 1, "none", 8),
    "retrieval": (2, 256, "syncbatch", 0.0, 2, "sin", 2),
    "image": (6, 512, "syncbatch", 0.0, 1, "sin", 2),
    "pathfinder": (6, 128, "batch", 0.0, 1, "none", 2),
    "pathx": (6, 32, "batch", 0.0, 1, "sin", 1),
}
# Inputs used for the counts in docs/lra.md: ListOps' 15 symbols + fairseq's 4 specials; Text and
# Retrieval byte-level vocabularies of 256 symbols + 4 (the real count depends on the data prep:
# add (V - 260) * d); Image RGB (3 channels), Pathfinder / Path-X grayscale.
INPUTS = {"listops": ("tokens", 19, 10), "text": ("tokens", 260, 2), "retrieval": ("tokens", 260, 2),
          "image": ("pixels", 3, 10), "pathfinder": ("pixels", 1, 2), "pathx": ("pixels", 1, 2)}


def arch_args(arch, **overrides):
    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


@pytest.mark.parametrize("task", TASKS)
def test_archs_set_the_papers_settings(task):
    a = arch_args(f"hgrn1_lra_{task}")
    L, d, norm, drop, mult, pos = PAPER_HGRN1[task]
    assert (a.token_mixer, a.encoder_layers, a.encoder_embed_dim, a.norm, a.dropout, a.glu_multiple, a.positions) == \
        ("hgru", L, d, norm, drop, mult, pos)
    assert a.scan_2d == ("parallel" if task in ("image", "pathfinder", "pathx") else "none")
    assert a.no_lower_bound is False and a.position_dropout == 0.1 and a.pool == "mean"
    b = arch_args(f"hgrn2_lra_{task}")
    L, d, norm, drop, mult, pos, e = PAPER_HGRN2[task]
    assert (b.token_mixer, b.encoder_layers, b.encoder_embed_dim, b.norm, b.dropout, b.glu_multiple, b.positions,
            b.expand_ratio) == ("hgru2", L, d, norm, drop, mult, pos, e)
    assert b.scan_2d == {"pathx": "series", "image": "parallel", "pathfinder": "parallel"}.get(task, "none")
    # token tasks: the official harness's lengths with its <eos> (ListOps 2,048; Text / Retrieval prepared to
    # 4,095 / 3,999 tokens, + <eos>)
    max_len = {"listops": 2048, "text": 4096, "retrieval": 4000, "image": 1024, "pathfinder": 1024, "pathx": 16384}
    assert a.max_positions == b.max_positions == max_len[task]
    # the command line wins over the arch
    assert arch_args(f"hgrn1_lra_{task}", encoder_embed_dim=8).encoder_embed_dim == 8


def hand_count(mixer, L, d, mult, kind, n_in, classes, pair=False, series=False, e=None):
    """Parameters by the papers' formulas (written out here, docs/lra.md shows them)."""
    if mixer == "hgru":  # in_proj d->5d (+b), out 2d->d (+b), LayerNorm(2d), theta fwd + rev
        m = (5 * d * d + 5 * d) + (2 * d * d + d) + 4 * d + 2 * d
    else:  # HGRU2: in d->3d (+b), LayerNorm(d), out d->d (+b)
        m = (3 * d * d + 3 * d) + 2 * d + (d * d + d)
    if series:
        m *= 2
    h = int(mult * d)
    glu = (2 * h * d + 2 * h) + (h * d + d)
    block = m + glu + 2 * (2 * d)  # two norms of 2d (LayerNorm or batch norm: weight + bias)
    embed = n_in * d if kind == "tokens" else n_in * d + d
    body = embed + L * block + L * d + 2 * d  # lower bounds [L, d], final norm
    head = (4 * d * d + d) + (d * classes + classes) if pair else d * classes + classes
    return body + head


# the totals as docs/lra.md lists them (for the INPUTS above), checked against the formula and the model
DOC_COUNTS = {
    "hgrn1_lra_listops": 66_282, "hgrn1_lra_text": 699_394, "hgrn1_lra_retrieval": 142_658,
    "hgrn1_lra_image": 15_798_282, "hgrn1_lra_pathfinder": 999_170, "hgrn1_lra_pathx": 253_826,
    "hgrn2_lra_listops": 149_834, "hgrn2_lra_text": 499_714, "hgrn2_lra_retrieval": 1_648_898,
    "hgrn2_lra_image": 11_061_258, "hgrn2_lra_pathfinder": 699_650, "hgrn2_lra_pathx": 71_618,
}


class FakeTask:
    def __init__(self, kind, n_in, classes, pair=False, grid=(32, 32), max_len=16):
        self.cfg = types.SimpleNamespace(data="fake")
        self.info = {"input": kind, "num_classes": classes, "pair": pair, "max_len": max_len}
        if kind == "tokens":
            self.info.update(vocab_size=n_in, padding_idx=1)
        else:
            self.info.update(channels=n_in, grid=grid)

    def lra_model_inputs(self):
        return dict(self.info)


def build(arch, task, **overrides):
    args = arch_args(arch, **overrides)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)


@pytest.mark.parametrize("model", ["hgrn1", "hgrn2"])
@pytest.mark.parametrize("task", TASKS)
def test_parameter_counts(model, task):
    kind, n_in, classes = INPUTS[task]
    pair = task == "retrieval"
    if model == "hgrn1":
        L, d, _, _, mult, _ = PAPER_HGRN1[task]
        want = hand_count("hgru", L, d, mult, kind, n_in, classes, pair)
    else:
        L, d, _, _, mult, _, e = PAPER_HGRN2[task]
        want = hand_count("hgru2", L, d, mult, kind, n_in, classes, pair, series=task == "pathx")
    arch = f"{model}_lra_{task}"
    assert want == DOC_COUNTS[arch]
    if d >= 512:  # building the 512-wide models costs seconds on CPU: the formula and the doc agree above,
        d_small = 16  # and the model at a smaller width checks the formula's shape
        want = (hand_count("hgru" if model == "hgrn1" else "hgru2", L, d_small, mult, kind, n_in, classes, pair,
                           series=task == "pathx"))
        m = build(arch, FakeTask(kind, n_in, classes, pair), encoder_embed_dim=d_small, expand_ratio=2)
    else:
        m = build(arch, FakeTask(kind, n_in, classes, pair))
    assert sum(p.numel() for p in m.parameters()) == want


def test_docs_list_the_counts():
    import os

    with open(os.path.join(os.path.dirname(hgrn_fairseq.__file__), "..", "docs", "lra.md")) as f:
        text = f.read()
    for arch, count in DOC_COUNTS.items():
        assert re.search(rf"`{arch}`.*\| {count:,} \|", text), arch


def test_forward_shapes_and_pair_and_pixels():
    m = build("hgrn1_lra_listops", FakeTask("tokens", 19, 10), encoder_embed_dim=8, encoder_layers=1,
              kernel_backend="reference", norm="batch")
    tokens = torch.randint(4, 19, (3, 7))
    tokens[0, 5:] = 1
    assert m(src_tokens=tokens, src_lengths=torch.tensor([5, 7, 7])).shape == (3, 10)
    assert not m.classifier.encoder.unmasked_padding and m.classifier.encoder.embed.padding_idx == 1
    u = build("hgrn1_lra_listops", FakeTask("tokens", 19, 10), encoder_embed_dim=8, encoder_layers=1,
              kernel_backend="reference", norm="batch", unmasked_padding=True)  # the ablation's switch
    assert u.classifier.encoder.unmasked_padding and u.classifier.encoder.embed.padding_idx is None
    r = build("hgrn2_lra_retrieval", FakeTask("tokens", 30, 2, pair=True), encoder_embed_dim=8,
              kernel_backend="reference")
    out = r(src_tokens=torch.randint(4, 30, (2, 6)), src_tokens1=torch.randint(4, 30, (2, 6)))
    assert out.shape == (2, 2)
    with pytest.raises(ValueError, match="got one document per example"):
        r(src_tokens=torch.randint(4, 30, (2, 6)))
    p = build("hgrn2_lra_pathx", FakeTask("pixels", 1, 2, grid=(4, 4)), encoder_embed_dim=8, kernel_backend="reference")
    assert p.grid == (4, 4)
    assert p(pixels=torch.randn(2, 16, 1)).shape == (2, 2)
    t = build("transformer_lra", FakeTask("tokens", 19, 10), encoder_embed_dim=8, attention_heads=2)
    assert t.cfg.token_mixer == "attention" and t.classifier.encoder.lower_bounds is None
    assert t(src_tokens=tokens).shape == (3, 10)


def test_data_longer_than_the_arch_and_bad_options():
    with pytest.raises(ValueError, match=r"sequences of up to 5000 positions but --max-positions is 2048: use the "
                                         r"arch made for this task"):
        build("hgrn1_lra_listops", FakeTask("tokens", 19, 10, max_len=5000))
    with pytest.raises(ValueError, match=r"--expand-ratio=3 does not divide --encoder-embed-dim=64"):
        build("hgrn2_lra_listops", FakeTask("tokens", 19, 10), expand_ratio=3)
    with pytest.raises(ValueError, match=r"--norm=group is not one of layer, batch, syncbatch"):
        validate_config(argparse.Namespace(**dict(HgrnLraConfig().__dict__, norm="group")))
    with pytest.raises(ValueError, match=r"--scan-2d is for pixel tasks"):
        build("hgrn1_lra_listops", FakeTask("tokens", 19, 10), scan_2d="parallel")
    assert isinstance(build("hgrn1_lra_listops", FakeTask("tokens", 19, 10), encoder_embed_dim=4), HgrnLraModel)


@pytest.mark.parametrize("arch", ["hgrn1_lra_listops", "hgrn2_lra_retrieval"])
def test_scratch_positions_are_seen_by_the_layers_but_left_out_of_the_pooling(arch):
    """With the task's --scratch-positions (``scratch_idx`` in its model inputs) the model's logits are the
    head of the mean of the final features over the positions that are neither padding nor scratch
    (float64, the features computed once and averaged by hand here); the scratch positions still change
    the features (they are not removed from the input); and an example's logits do not depend on the
    padding its batch adds (masked padding: batch-independent)."""
    torch.manual_seed(0)
    pair = arch.endswith("retrieval")
    task = FakeTask("tokens", 19, 10 if not pair else 2, pair=pair, max_len=16)
    task.info["scratch_idx"] = 0  # fairseq's <s>
    m = build(arch, task, encoder_embed_dim=8, encoder_layers=2, kernel_backend="reference", norm="batch",
              expand_ratio=2).double().eval()
    assert m.scratch_idx == 0
    body = torch.randint(4, 19, (3, 9))
    lengths = [9, 6, 4]
    rows = [torch.cat([body[i, :n], torch.tensor([2, 0, 0, 0])]) for i, n in enumerate(lengths)]  # </s> + 3 x <s>
    T = max(len(r) for r in rows)
    tokens = torch.full((3, T), 1, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    pad = tokens.eq(1)
    enc = m.classifier.encoder

    def by_hand(x, padding):
        h = enc.features(x, padding)
        keep = (~padding) & x.ne(0)
        return torch.stack([h[i][keep[i]].mean(0) for i in range(x.shape[0])])

    with torch.no_grad():
        if pair:
            other = tokens.flip(0)
            got = m(src_tokens=tokens, src_tokens1=other, padded=True)
            both = torch.cat([tokens, other])
            pooled = by_hand(both, both.eq(1))
            want = m.classifier.head(pooled[:3], pooled[3:])
        else:
            got = m(src_tokens=tokens, padded=True)
            want = m.classifier.head(by_hand(tokens, pad))
            # the pooling with the scratch positions averaged in is another function (so the test can fail)
            assert not torch.allclose(got, m.classifier.head(enc(tokens, pad)), atol=1e-6)
            # the layers see the scratch positions: dropping them from the input changes the result
            no_scratch = tokens.masked_fill(tokens.eq(0), 1)
            assert not torch.allclose(got, m(src_tokens=no_scratch, padded=True), atol=1e-6)
            # each example alone (no padding) gives its row of the padded batch
            for i, r in enumerate(rows):
                alone = m(src_tokens=r[None], padded=False)
                assert torch.allclose(alone, got[i : i + 1], atol=1e-10, rtol=0)
    assert torch.allclose(got, want, atol=1e-10, rtol=0)


def test_max_pooling_is_an_option_the_results_record():
    """--pool max reaches the encoder and is recorded as a change from the arch (the papers' mean)."""
    from hgrn_fairseq.models.hgrn_lra import arch_overrides

    a = arch_args("hgrn2_lra_pathfinder", pool="max")
    assert arch_overrides(a, "hgrn2_lra_pathfinder") == {"pool": "max"}
    assert arch_overrides(arch_args("hgrn2_lra_pathfinder"), "hgrn2_lra_pathfinder") == {}
    m = build("hgrn2_lra_pathfinder", FakeTask("pixels", 1, 2, grid=(4, 4)), encoder_embed_dim=8, encoder_layers=1,
              kernel_backend="reference", pool="max")
    assert m.classifier.encoder.pool == "max" and m(pixels=torch.randn(2, 16, 1)).shape == (2, 2)
    assert build("hgrn2_lra_pathfinder", FakeTask("pixels", 1, 2, grid=(4, 4)), encoder_embed_dim=8,
                 encoder_layers=1, kernel_backend="reference").classifier.encoder.pool == "mean"
