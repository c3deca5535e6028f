"""The ``lra_text`` / ``lra_image`` tasks: batching (padding, pairs, pixels, augmentation), every example
scored, and ``fairseq-train`` end to end on tiny generated data of every LRA task (ListOps-like data
learned well above chance), plus the bad-input errors a user meets first."""
import importlib
import json
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from hgrn_fairseq.tasks import lra_format as lf
from hgrn_fairseq.tasks.lra import (
    NORMALISATION,
    LraImageConfig,
    LraImageTask,
    LraTextConfig,
    LraTextTask,
    LraTokenDataset,
    check_batches_cover,
    crop_and_flip,
)

from .test_lra_format import write_tiny
from tests import pyrun

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))


def text_task(dest, **kw):
    return LraTextTask.setup_task(LraTextConfig(data=dest, seed=1, **kw))


def test_token_batches_pad_to_the_longest_and_pairs_to_a_common_length(tmp_path):
    dest = str(tmp_path / "retrieval")
    write_tiny(dest, "retrieval", sizes=(8, 4, 4), max_len=10)
    task = text_task(dest)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    items = [ds[i] for i in range(4)]
    batch = ds.collater(items)
    longest = max(max(len(it["source"]), len(it["source1"])) for it in items)
    pad = task.source_dictionary.pad()
    for key, src in (("src_tokens", "source"), ("src_tokens1", "source1")):
        t = batch["net_input"][key]
        assert t.shape == (4, longest)
        for row, it in zip(t, items):
            n = len(it[src])
            assert torch.equal(row[:n], it[src]) and (row[n:] == pad).all()
    assert batch["target"].tolist() == [int(x) for x in lf.load_split(dest, "valid").labels[:4]]
    assert batch["ntokens"] == sum(len(it["source"]) + len(it["source1"]) for it in items)
    # whether anything is padded is decided on the host (the model then skips the masks)
    lengths = [len(it[k]) for it in items for k in ("source", "source1")]
    assert batch["net_input"]["padded"] is (min(lengths) < longest)
    same = [dict(it, source=it["source"][:2], source1=it["source1"][:2]) for it in items]
    assert ds.collater(same)["net_input"]["padded"] is False
    empty = dict(items[1], source1=items[1]["source1"][:0])
    with pytest.raises(ValueError, match=rf"example {items[1]['id']} has no tokens: every example needs at least one"):
        ds.collater([items[0], empty])


def test_append_eos_ends_every_sequence_with_the_end_token(tmp_path):
    """--append-eos: each document (both of a pair) is the stored tokens followed by the dictionary's
    </s>, counted in the sizes and the task's maximum length; off, the stored tokens unchanged."""
    dest = str(tmp_path / "retrieval")
    write_tiny(dest, "retrieval", sizes=(8, 4, 4), max_len=10)
    raw = lf.load_split(dest, "valid")
    plain, eos = text_task(dest), text_task(dest, append_eos=True)
    for t in (plain, eos):
        t.load_dataset("valid")
    d0, d1 = plain.dataset("valid"), eos.dataset("valid")
    end = eos.source_dictionary.index("</s>")
    assert end == eos.source_dictionary.eos() and end != eos.source_dictionary.pad()
    for i in range(4):
        for key, stream in (("source", raw.input0), ("source1", raw.input1)):
            stored = stream[i].tolist()
            assert d0[i][key].tolist() == stored
            assert d1[i][key].tolist() == stored + [end]
    assert (d1.sizes == d0.sizes + 1).all()
    assert plain.max_positions() == 10 and eos.max_positions() == 11
    assert plain.lra_model_inputs()["max_len"] == 10 and eos.lra_model_inputs()["max_len"] == 11
    batch = d1.collater([d1[i] for i in range(4)])
    row = batch["net_input"]["src_tokens"][0]
    n = len(d1[0]["source"])
    assert row[n - 1] == end and (row[n:] == eos.source_dictionary.pad()).all()
    assert batch["net_input"]["src_lengths"].tolist() == [len(d1[i]["source"]) for i in range(4)]
    # an eos task's checkpoint is refused on the same data without the option, and the other way round
    with pytest.raises(ValueError, match="differs in append_eos"):
        text_task(dest).load_state_dict(eos.state_dict())
    with pytest.raises(ValueError, match="differs in append_eos"):
        text_task(dest, append_eos=True).load_state_dict(plain.state_dict())
    text_task(dest, append_eos=True).load_state_dict(eos.state_dict())


def test_scratch_positions_follow_the_end_token_and_are_recorded(tmp_path):
    """--scratch-positions K: K copies of <s> after the stored tokens (after </s> with --append-eos), in
    both documents of a pair, counted in the sizes and the maximum length; the data record keeps K, so a
    checkpoint of one setting is refused with another; a negative K is one line naming the option."""
    dest = str(tmp_path / "retrieval")
    write_tiny(dest, "retrieval", sizes=(8, 4, 4), max_len=10)
    raw = lf.load_split(dest, "valid")
    plain, scratch = text_task(dest, append_eos=True), text_task(dest, append_eos=True, scratch_positions=3)
    only = text_task(dest, scratch_positions=2)
    for t in (plain, scratch, only):
        t.load_dataset("valid")
    d = scratch.dataset("valid")
    end, s = scratch.source_dictionary.eos(), scratch.source_dictionary.bos()
    assert s == scratch.source_dictionary.index("<s>") and s not in (end, scratch.source_dictionary.pad())
    for i in range(4):
        for key, stream in (("source", raw.input0), ("source1", raw.input1)):
            stored = stream[i].tolist()
            assert s not in stored  # (prepared LRA data never holds <s>)
            assert d[i][key].tolist() == stored + [end, s, s, s]
            assert only.dataset("valid")[i][key].tolist() == stored + [s, s]
    assert (d.sizes == plain.dataset("valid").sizes + 3).all()
    assert scratch.max_positions() == 14 and only.max_positions() == 12
    info = scratch.lra_model_inputs()
    assert info["max_len"] == 14 and info["scratch_idx"] == s and info["appended"] == 4
    assert "scratch_idx" not in plain.lra_model_inputs()
    assert scratch.data_fingerprint()["scratch_positions"] == 3 and "scratch_positions" not in plain.data_fingerprint()
    with pytest.raises(ValueError, match="differs in scratch_positions"):
        text_task(dest, append_eos=True).load_state_dict(scratch.state_dict())
    with pytest.raises(ValueError, match="differs in scratch_positions"):
        text_task(dest, append_eos=True, scratch_positions=2).load_state_dict(scratch.state_dict())
    text_task(dest, append_eos=True, scratch_positions=3).load_state_dict(scratch.state_dict())
    with pytest.raises(ValueError, match=r"--scratch-positions=-1 is invalid: give 0 \(none\) or a positive count"):
        text_task(dest, scratch_positions=-1)


def test_pad_to_length_pads_every_batch_to_n(tmp_path):
    """--pad-to-length N: every batch (both documents of a pair) is N positions wide, its rows the
    per-batch padding's followed by more pads; N below the task's maximum length, negative N, a longer
    sequence in the collater and the option on an image task are one line each."""
    dest = str(tmp_path / "retrieval")
    write_tiny(dest, "retrieval", sizes=(8, 4, 4), max_len=10)
    plain, fixed = text_task(dest, append_eos=True), text_task(dest, append_eos=True, pad_to_length=16)
    for t in (plain, fixed):
        t.load_dataset("valid")
    d0, d1 = plain.dataset("valid"), fixed.dataset("valid")
    pad = plain.source_dictionary.pad()
    for idx in ([0], [0, 1, 2, 3], [3, 1]):
        b0, b1 = d0.collater([d0[i] for i in idx]), d1.collater([d1[i] for i in idx])
        n0, n1 = b0["net_input"], b1["net_input"]
        T = n0["src_tokens"].shape[1]
        for key in ("src_tokens", "src_tokens1"):
            assert n1[key].shape == (len(idx), 16)
            assert torch.equal(n1[key][:, :T], n0[key]) and (n1[key][:, T:] == pad).all()
        assert torch.equal(n1["src_lengths"], n0["src_lengths"]) and b1["ntokens"] == b0["ntokens"]
        assert n1["padded"] is True
    with pytest.raises(ValueError, match=r"--pad-to-length=10 is invalid: give 0 \(pad each batch to its longest "
                                         r"sequence\) or at least the task's maximum length, 11"):
        text_task(dest, append_eos=True, pad_to_length=10)
    text_task(dest, append_eos=True, pad_to_length=11)
    with pytest.raises(ValueError, match=r"--pad-to-length=-1 is invalid"):
        text_task(dest, pad_to_length=-1)
    short = LraTokenDataset(lf.load_split(dest, "valid"), pad, shuffle=False, name="valid", pad_to=3)
    with pytest.raises(ValueError, match=r"valid: a sequence of \d+ positions is longer than --pad-to-length 3"):
        short.collater([short[0]])
    pixels = str(tmp_path / "pathfinder")
    write_tiny(pixels, "pathfinder", sizes=(4, 2, 2))
    from omegaconf import OmegaConf, open_dict

    cfg = OmegaConf.structured(LraImageConfig(data=pixels, seed=1))
    with open_dict(cfg):  # (as scripts/lra_eval.py --pad-to-length adds it to a checkpoint's task config)
        cfg.pad_to_length = 16
    with pytest.raises(ValueError, match="--pad-to-length is for the token tasks"):
        LraImageTask.setup_task(cfg)


def _listops_model(task, padding, **kw):
    """A tiny float64 hgrn1_lra_listops in eval mode; padding: masked, unmasked (the official code's) or scan
    (--scan-padding); batch-norm running statistics away from 0 / 1, so the pads' values matter."""
    from fairseq.models import ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY
    import argparse

    args = argparse.Namespace(**{**dict(encoder_embed_dim=8, encoder_layers=2, kernel_backend="reference", norm="batch",
                                        unmasked_padding=padding == "unmasked", scan_padding=padding == "scan",
                                        max_positions=32), **kw})
    ARCH_CONFIG_REGISTRY["hgrn1_lra_listops"](args)
    torch.manual_seed(0)
    m = ARCH_MODEL_REGISTRY["hgrn1_lra_listops"].build_model(args, task).double().eval()
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            mod.running_mean.copy_(torch.rand(mod.running_mean.shape, generator=g) - 0.5)
            mod.running_var.copy_(0.5 + 1.5 * torch.rand(mod.running_var.shape, generator=g))
    return m


def test_unmasked_model_with_fixed_padding_does_not_depend_on_the_batch(tmp_path):
    """With --unmasked-padding (or --scan-padding) the scans see the pads, so an example's logits change
    with the batch's longest sequence (checked, so the test can fail); with --pad-to-length every example's
    row is the same whichever batch it is in. Masked padding: the fixed width changes nothing."""
    dest = str(tmp_path / "listops")
    write_tiny(dest, "listops", sizes=(8, 6, 6), max_len=24)
    batches = [[0], [1], [2], [0, 1, 2, 3, 4, 5], [2, 5], [1, 0]]
    tasks = {}
    for width in (0, 32):
        tasks[width] = text_task(dest, append_eos=True, pad_to_length=width)
        tasks[width].load_dataset("valid")
    lengths = [len(tasks[0].dataset("valid")[i]["source"]) for i in range(6)]
    assert len(set(lengths[:3])) > 1  # (examples of different lengths, so per-batch padding differs)
    results = {}
    for padding in ("masked", "unmasked", "scan"):
        m = _listops_model(tasks[32], padding)  # (--scan-padding is refused without a fixed width: built on it)
        for width, task in tasks.items():
            d, rows = task.dataset("valid"), {}
            with torch.no_grad():
                for idx in batches:
                    logits = m(**d.collater([d[i] for i in idx])["net_input"])
                    for j, i in enumerate(idx):
                        rows.setdefault(i, []).append(logits[j])
            results[width, padding] = rows
    spread = lambda r: max(float((a - b).abs().max()) for v in r.values() for a in v for b in v)
    for padding in ("unmasked", "scan"):
        assert spread(results[0, padding]) > 1e-3, padding  # per-batch padding: the batch changes the logits
        assert spread(results[32, padding]) < 1e-12, padding  # fixed width: it does not
    assert spread(results[0, "masked"]) < 1e-12 and spread(results[32, "masked"]) < 1e-12  # masked: never
    for i in range(3):  # masked: the fixed width gives the same logits as per-batch padding
        assert torch.allclose(results[0, "masked"][i][0], results[32, "masked"][i][0], atol=1e-12, rtol=0)


def test_scan_padding_lets_the_mixers_see_the_pads_and_keeps_them_out_of_the_norms(tmp_path):
    """--scan-padding, float64: in training the logits are those of the blocks composed by hand, with batch
    norms written out (mean and variance over the valid positions, every position normalised) and mixers
    given no padding mask, pooled over the valid positions; different from the masked and the unmasked
    model with the same weights there; in evaluation (running statistics, no batch statistics)
    equal to the unmasked model's. Without --pad-to-length, and together with --unmasked-padding: one line."""
    dest = str(tmp_path / "listops")
    write_tiny(dest, "listops", sizes=(8, 6, 6), max_len=24)
    task = text_task(dest, append_eos=True, pad_to_length=30)
    task.load_dataset("valid")
    d = task.dataset("valid")
    net = d.collater([d[i] for i in range(6)])["net_input"]
    tokens, pad = net["src_tokens"], net["src_tokens"].eq(task.source_dictionary.pad())
    assert pad.any(1).all()
    scan, unmasked, masked = (_listops_model(task, p) for p in ("scan", "unmasked", "masked"))
    unmasked.load_state_dict(scan.state_dict())
    masked.load_state_dict(scan.state_dict())
    enc = scan.classifier.encoder
    for m in (scan, unmasked, masked):
        m.train()

    def bn(norm, h):  # training batch norm by hand: statistics over the valid positions, every position normalised
        valid = h[~pad]
        mean, var = valid.mean(0), valid.var(0, unbiased=False)
        return (h - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

    def by_hand(x):
        h = enc.embed(x)
        h = h + enc._positions(x.shape[1], h)  # (position dropout is the identity here: p set to 0 below)
        bounds = enc.lower_bounds()
        for i, layer in enumerate(enc.layers):
            y, _ = layer.mixer(bn(layer.mixer_norm, h), bounds[i], None, False)  # no mask: the scans run through the pads
            h = h + y
            h = h + layer.glu(bn(layer.glu_norm, h))
        h = bn(enc.final_norm, h)
        keep = (~pad).unsqueeze(-1).double()
        return scan.classifier.head((h * keep).sum(1) / keep.sum(1))

    for m in (scan, unmasked, masked):
        m.classifier.encoder.position_dropout.p = 0.0
    with torch.no_grad():
        want = by_hand(tokens)
        saved = {k: v.clone() for k, v in scan.state_dict().items()}
        got = scan(**net)
        scan.load_state_dict(saved)  # (a training forward moved the running statistics)
        other = [m(**net) for m in (unmasked, masked)]
    assert torch.allclose(got, want, atol=1e-10, rtol=0)
    for o in other:
        assert not torch.allclose(got, o, atol=1e-6)
    for m in (scan, unmasked):
        m.eval()
    unmasked.load_state_dict(scan.state_dict())
    with torch.no_grad():
        assert torch.allclose(scan(**net), unmasked(**net), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="--scan-padding lets the scans see the padding, so predictions would "
                                         "depend on the batch: pad every batch alike with the task's --pad-to-length N"):
        _listops_model(text_task(dest, append_eos=True), "scan")
    with pytest.raises(ValueError, match="unmasked_padding and scan_padding are two settings of the padding: give one"):
        _listops_model(task, "scan", unmasked_padding=True)


def test_every_example_of_an_evaluated_split_is_batched(tmp_path):
    dest = str(tmp_path / "listops")
    write_tiny(dest, "listops", sizes=(8, 13, 4))
    task = text_task(dest)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    itr = task.get_batch_iterator(ds, max_sentences=5, required_batch_size_multiple=8, num_shards=1)
    batches = itr.frozen_batches
    assert [len(b) for b in batches] == [5, 5, 3]  # fairseq's multiple of 8 would have cut 5 to... nothing
    assert sorted(np.concatenate(batches).tolist()) == list(range(13))
    lengths = ds.sizes[np.concatenate(batches)]
    assert (np.diff(lengths) >= 0).all()  # evaluation batches group similar lengths
    with pytest.raises(RuntimeError, match="the batches hold 12 examples but the split has 13"):
        check_batches_cover([np.arange(6), np.arange(6, 12)], 13, "valid")


def test_pixel_batches_are_normalised_and_augmentation_is_seeded(tmp_path):
    dest = str(tmp_path / "image")
    write_tiny(dest, "image", sizes=(6, 2, 2), image=(4, 4, 3))
    task = LraImageTask.setup_task(LraImageConfig(data=dest, seed=3, augment=True))
    task.load_dataset("train")
    task.load_dataset("valid")
    valid = task.dataset("valid")
    raw = np.load(lf.pixels_path(dest, "valid"))
    batch = valid.collater([valid[0], valid[1]])
    mean, std = NORMALISATION[("image", 3)]
    want = (raw[:2].astype(np.float64) / 255.0 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(batch["net_input"]["pixels"].numpy(), want.reshape(2, 16, 3), rtol=1e-5, atol=1e-6)
    assert not valid.augment  # only the training split is augmented
    train = task.dataset("train")
    a, b = train[2]["image"], train[2]["image"]
    assert torch.equal(a, b)  # a function of (seed, epoch, index): a resumed run sees the same images
    train.set_epoch(2)
    assert any(not torch.equal(train[i]["image"], a if i == 2 else train[i]["image"] * 0 + 1) for i in range(6))
    # pickled (to DataLoader workers) without the image array
    assert len(pickle.dumps(train)) < 4096 and pickle.loads(pickle.dumps(train))[0]["image"].shape == (4, 4, 3)
    assert NORMALISATION[("pathfinder", 1)] == ((0.5,), (0.5,)) and NORMALISATION[("pathx", 1)] == ((0.5,), (0.5,))


def test_crop_and_flip_by_hand():
    img = np.arange(4 * 4 * 1, dtype=np.uint8).reshape(4, 4, 1) + 1

    class Rng:  # top 0, left 8 (the largest shift), then flip
        def integers(self, lo, hi, size):
            return np.array([0, 8])

        def random(self):
            return 0.0

    out = crop_and_flip(img, Rng())
    padded = np.zeros((12, 12, 1), dtype=np.uint8)
    padded[4:8, 4:8] = img
    np.testing.assert_array_equal(out, padded[0:4, 8:12][:, ::-1])


# ----------------------------------------------------------------------------------------------
# fairseq-train end to end: every task, both models, in one Python process (importing fairseq and
# torch costs ~12 s of CPU a process; a 20-update run of these models ~1-2 s).
DRIVER = r"""
import json, sys, traceback
from fairseq import checkpoint_utils
from fairseq_cli import train
for name, argv in json.loads(sys.argv[1]):
    print(f"=== begin {name}", flush=True)
    if hasattr(checkpoint_utils.save_checkpoint, "best"):  # fairseq keeps the best score on the function
        del checkpoint_utils.save_checkpoint.best
    sys.argv = ["fairseq-train", *argv]
    try:
        train.cli_main()
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception:
        traceback.print_exc(file=sys.stdout)
        rc = 1
    print(f"=== end {name} rc={rc}", flush=True)
"""

TINY = ["--encoder-embed-dim", "8", "--encoder-layers", "1"]
RUNS = {  # name: (task data, arch, extra flags, updates)
    "listops_hgrn1_learns": ("listops", "hgrn1_lra_listops", ["--encoder-embed-dim", "16", "--encoder-layers", "2",
                                                              "--norm", "batch"], 160),
    "lines_hgrn1_learns": ("lines", "hgrn1_lra_pathfinder", ["--encoder-embed-dim", "16", "--encoder-layers", "2"], 150),
    "lines_hgrn2_learns": ("lines", "hgrn2_lra_pathfinder", ["--encoder-embed-dim", "16", "--encoder-layers", "2"], 150),
    "listops_hgrn2": ("listops", "hgrn2_lra_listops", TINY + ["--expand-ratio", "4"], 20),
    "listops_hgrn1_eos": ("listops", "hgrn1_lra_listops", TINY + ["--append-eos"], 20),
    "listops_hgrn1_scratch": ("listops", "hgrn1_lra_listops", TINY + ["--append-eos", "--scratch-positions", "3"], 20),
    "listops_hgrn1_unmasked_fixed": ("listops", "hgrn1_lra_listops", TINY + ["--append-eos", "--unmasked-padding",
                                                                           "--pad-to-length", "30"], 20),
    "listops_hgrn1_scan_fixed": ("listops", "hgrn1_lra_listops", TINY + ["--append-eos", "--scan-padding",
                                                                     "--pad-to-length", "30"], 20),
    "text_hgrn2": ("text", "hgrn2_lra_text", TINY + ["--expand-ratio", "4"], 20),
    "retrieval_hgrn1": ("retrieval", "hgrn1_lra_retrieval", TINY, 20),
    "retrieval_hgrn2": ("retrieval", "hgrn2_lra_retrieval", TINY + ["--expand-ratio", "4"], 20),
    "retrieval_hgrn2_eos": ("retrieval", "hgrn2_lra_retrieval", TINY + ["--expand-ratio", "4", "--append-eos"], 20),
    "image_hgrn1": ("image", "hgrn1_lra_image", TINY + ["--augment"], 20),
    "pathfinder_hgrn2": ("pathfinder", "hgrn2_lra_pathfinder", TINY + ["--expand-ratio", "4"], 20),
    "pathx_hgrn1": ("pathx", "hgrn1_lra_pathx", TINY, 20),
    "pathx_hgrn2_series": ("pathx", "hgrn2_lra_pathx", TINY, 20),
    # bad input
    "too_long": ("listops", "hgrn1_lra_listops", TINY + ["--max-positions", "10"], 2),
    "too_long_eos": ("listops", "hgrn1_lra_listops", TINY + ["--append-eos", "--max-positions", "24"], 2),
    "bad_labels": ("bad_labels", "hgrn1_lra_listops", TINY, 2),
    "missing_file": ("missing_file", "hgrn1_lra_listops", TINY, 2),
    "wrong_task": ("pathfinder", "hgrn1_lra_listops", TINY + ["--task", "lra_text"], 2),
    "cut_validation": ("text", "hgrn1_lra_text", TINY + ["--max-valid-steps", "0"], 2),
    # validating on the training split as well (a fit check): each subset's count against its own split
    "valid_on_train_too": ("pathfinder", "hgrn1_lra_pathfinder", TINY + ["--valid-subset", "train,valid"], 2),
}
SPLITS = {"listops": (600, 100, 100), "lines": (240, 60, 60)}


def write_lines(dest, sizes, side=8, seed=3):
    """Pathfinder-shaped data (grayscale side x side, 2 classes) that needs the 2-D structure: ``side``
    bright pixels forming one full row or column (label 1), or the same number at random places not all on
    one line (label 0), over dim noise. The mean brightness says nothing; the label is the same for an image
    and its transpose, as Pathfinder's is (the 2-D models without positions cannot tell the two apart)."""
    rng = np.random.default_rng(seed)
    lf.begin(dest)
    splits = {}
    for split, n in zip(lf.SPLITS, sizes):
        px = rng.integers(0, 90, size=(n, side, side, 1), dtype=np.uint8)
        labels = rng.integers(0, 2, n)
        for i in range(n):
            if labels[i]:
                where = rng.integers(0, side)
                if rng.random() < 0.5:
                    px[i, :, where, 0] = 255
                else:
                    px[i, where, :, 0] = 255
            else:
                while True:
                    cells = rng.choice(side * side, side, replace=False)
                    rows, cols = cells // side, cells % side
                    if len(set(rows)) > 1 and len(set(cols)) > 1:
                        break
                px[i, rows, cols, 0] = 255
        with lf.pixels_writer(dest, split, n, (side, side, 1)) as arr:
            arr[:] = px
        lf.write_labels(dest, split, labels, 2)
        splits[split] = n
    return lf.write_meta(dest, task="pathfinder", input="pixels", num_classes=2, max_len=side * side,
                         image_shape=[side, side, 1], splits=splits, inputs_fingerprint="sha256:test",
                         comparable=False)


def train_argv(data, save_dir, arch, flags, updates):
    task = "lra_image" if os.path.basename(data) in ("image", "pathfinder", "pathx") else "lra_text"
    return [data, "--user-dir", PLUGIN, "--task", task, "--arch", arch, *flags,
            "--criterion", "classification_accuracy", "--optimizer", "adam", "--lr", "3e-3",
            "--lr-scheduler", "cosine", "--warmup-updates", "10", "--max-update", str(updates),
            "--batch-size", "16", "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
            "--log-format", "json", "--log-interval", "50", "--num-workers", "0", "--cpu", "--seed", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lra")
    data = {}
    for task in ("listops", "text", "retrieval"):
        data[task] = str(root / task)
        write_tiny(data[task], task, sizes=SPLITS.get(task, (48, 20, 20)))
    data["image"] = str(root / "image")
    write_tiny(data["image"], "image", sizes=(48, 20, 20), image=(4, 4, 3))
    for task in ("pathfinder", "pathx"):
        data[task] = str(root / task)
        write_tiny(data[task], task, sizes=(48, 20, 20), image=(4, 4, 1))
    data["lines"] = str(root / "lines" / "pathfinder")
    write_lines(data["lines"], SPLITS["lines"])
    data["bad_labels"] = str(root / "bad" / "listops")
    write_tiny(data["bad_labels"], "listops", sizes=(8, 4, 4))
    np.save(lf.label_path(data["bad_labels"], "valid"), np.array([0, 1, 12, 3]))
    data["missing_file"] = str(root / "missing" / "listops")
    write_tiny(data["missing_file"], "listops", sizes=(8, 4, 4))
    os.remove(lf.stream_prefix(data["missing_file"], "train") + ".idx")
    jobs = [(name, train_argv(data[d], str(root / "ck" / name), arch, flags, n))
            for name, (d, arch, flags, n) in RUNS.items()]
    proc = pyrun.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = proc.stdout
    results = {}
    for name, argv in jobs:
        begin, end = f"=== begin {name}\n", f"=== end {name} rc="
        assert begin in out and end in out, f"{name} did not finish (driver rc {proc.returncode}):\n{out[-3000:]}"
        body = out[out.index(begin) + len(begin): out.index(end)]
        rc = int(out[out.index(end) + len(end):].split("\n", 1)[0])
        results[name] = (rc, body, argv[argv.index("--save-dir") + 1])
    return results


def valid_stats(body):
    # (the first run's logging set-up prints "| valid | {...}", later ones in the process "INFO:valid:{...}")
    return [json.loads(m) for m in re.findall(r"valid(?: \| |:)(\{.*\})", body)]


BAD = ("too_long", "too_long_eos", "bad_labels", "missing_file", "wrong_task", "cut_validation")


@pytest.mark.integration
@pytest.mark.parametrize("name", [n for n in RUNS if n not in BAD])
def test_fairseq_train_end_to_end(name, runs):
    rc, out, save_dir = runs[name]
    assert rc == 0, out[-3000:]
    stats = valid_stats(out)
    assert stats, out[-2000:]
    n_valid = SPLITS.get(RUNS[name][0], (48, 20, 20))[1]
    assert all(int(s["valid_examples"]) == n_valid for s in stats)  # every validation example scored
    assert os.path.isfile(os.path.join(save_dir, "checkpoint_best.pt"))
    assert f"'_name': '{RUNS[name][1]}'" in out


@pytest.mark.integration
def test_listops_like_data_is_learned_above_chance(runs):
    rc, out, _ = runs["listops_hgrn1_learns"]
    assert rc == 0, out[-3000:]
    accs = [float(s["valid_accuracy"]) for s in valid_stats(out)]
    print("validation accuracy per epoch:", accs)
    assert max(accs) > 40, accs  # chance is 10% (the label is the first of ~15 symbols' digit)


@pytest.mark.integration
def test_append_eos_reaches_the_checkpoint(runs):
    """A run with --append-eos keeps the option in its checkpoint (config and data record), so that
    evaluation (scripts/lra_eval.py loads the task from it) appends the same token."""
    rc, out, save_dir = runs["listops_hgrn1_eos"]
    assert rc == 0, out[-3000:]
    state = torch.load(os.path.join(save_dir, "checkpoint_best.pt"), map_location="cpu", weights_only=True)
    assert state["cfg"]["task"]["append_eos"] is True
    assert state["task_state"]["hgrn_lra_data"]["append_eos"] is True
    _, _, plain_dir = runs["listops_hgrn2"]
    plain = torch.load(os.path.join(plain_dir, "checkpoint_best.pt"), map_location="cpu", weights_only=True)
    assert plain["cfg"]["task"]["append_eos"] is False and "append_eos" not in plain["task_state"]["hgrn_lra_data"]
    # scripts/lra_eval.py scores both the way they trained: with the token, and (a checkpoint from before
    # the option existed, its config without the key) without it

    lra_eval = importlib.import_module("scripts.lra_eval")
    del plain["cfg"]["task"]["append_eos"]
    old = os.path.join(os.path.dirname(save_dir), "old_checkpoint_best.pt")
    torch.save(plain, old)
    for path, eos in ((os.path.join(save_dir, "checkpoint_best.pt"), True), (old, False)):
        model, cfg, task, _, _ = lra_eval.load(path, cpu=True)
        task.load_dataset("test")
        item = task.dataset("test")[0]
        assert (item["source"][-1].item() == task.source_dictionary.eos()) is eos
        r = lra_eval.evaluate(path, cpu=True)
        assert r["append_eos"] is eos and r["examples"] == SPLITS["listops"][2]


@pytest.mark.integration
def test_pad_to_length_reaches_the_checkpoint_and_the_evaluation(runs, capsys):
    """A run with --pad-to-length keeps N in its checkpoint's config; scripts/lra_eval.py pads as the run did,
    or to the N it is given (also for a checkpoint from before the option); the JSON names N, the results
    table lists an unmasked run so padded apart from the recipe, and N over --max-positions is one line."""
    rc, out, save_dir = runs["listops_hgrn1_unmasked_fixed"]
    assert rc == 0, out[-3000:]
    path = os.path.join(save_dir, "checkpoint_best.pt")
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["cfg"]["task"]["pad_to_length"] == 30 and state["cfg"]["model"]["unmasked_padding"] is True

    scripts = os.path.join(os.path.dirname(PLUGIN), "scripts")
    lra_eval = importlib.import_module("scripts.lra_eval")
    _, _, task, _, _ = lra_eval.load(path, cpu=True)
    task.load_dataset("test")
    d = task.dataset("test")
    assert d.collater([d[0], d[1]])["net_input"]["src_tokens"].shape[1] == 30
    r = lra_eval.evaluate(path, cpu=True)
    assert r["pad_to_length"] == 30 and r["unmasked_padding"] is True and r["examples"] == SPLITS["listops"][2]
    per_batch = lra_eval.evaluate(path, cpu=True, pad_to_length=0)
    assert per_batch["pad_to_length"] == 0 and per_batch["examples"] == r["examples"]
    lra_results = importlib.import_module("hgrn_fairseq.recipes.lra_results")
    assert "unmasked padding, every batch padded to 30" in lra_results.other_runs([r])
    # a checkpoint from before the option (no pad_to_length in its task config): padded to N when asked
    _, _, eos_dir = runs["listops_hgrn1_eos"]
    old_state = torch.load(os.path.join(eos_dir, "checkpoint_best.pt"), map_location="cpu", weights_only=True)
    del old_state["cfg"]["task"]["pad_to_length"]
    old = os.path.join(os.path.dirname(eos_dir), "pre_pad_to_checkpoint_best.pt")
    torch.save(old_state, old)
    assert lra_eval.evaluate(old, cpu=True)["pad_to_length"] == 0
    _, _, task, _, _ = lra_eval.load(old, cpu=True, pad_to_length=28)
    task.load_dataset("test")
    d = task.dataset("test")
    assert d.collater([d[0]])["net_input"]["src_tokens"].shape[1] == 28
    capsys.readouterr()
    assert lra_eval.main([old, "--cpu", "--pad-to-length", "4096"]) == 2  # over the arch's --max-positions
    assert "--pad-to-length 4096 is more than --max-positions 2048" in capsys.readouterr().err
    assert lra_eval.main([old, "--cpu", "--pad-to-length", "20"]) == 2  # under the task's maximum length
    assert "--pad-to-length=20 is invalid" in capsys.readouterr().err
    # --scan-padding: kept in the checkpoint and the JSON, listed apart; scored per batch it is refused
    rc, out, scan_dir = runs["listops_hgrn1_scan_fixed"]
    assert rc == 0, out[-3000:]
    scan_ck = os.path.join(scan_dir, "checkpoint_best.pt")
    r = lra_eval.evaluate(scan_ck, cpu=True)
    assert r["scan_padding"] is True and r["pad_to_length"] == 30 and r["unmasked_padding"] is False
    assert r["norm"] == r["recipe_norm"] == "syncbatch"  # (the listops arch's)
    # the run's own model options (the test's command line, TINY): --encoder-embed-dim 8 --encoder-layers 1 on
    # the listops arch (6 x 32); they alone keep a run out of the recipe's cell
    assert r["arch_overrides"] == {"encoder_embed_dim": 8, "encoder_layers": 1}
    # and its training settings against the ListOps HGRN1 recipe (AdamW, lr 5e-4, weight decay 0.01,
    # batch 128, warm-up 5,000 of 50,000, here scaled to the run's 20 updates: 2; no clipping, fp32): train_argv
    # gives adam, lr 3e-3, no weight decay, warm-up 10, batch 16 (clipping, cosine and fp32 as the recipe)
    assert r["recipe_overrides"] == {"optimizer": "adam", "lr": 0.003, "weight_decay": 0.0, "warmup_updates": 10,
                                     "batch": 16}
    recipe_like = dict(r, seed=lra_results.SEED, scan_padding=False, pad_to_length=0)
    assert not lra_results.is_recipe_run(dict(recipe_like, recipe_overrides={}), "listops")
    assert not lra_results.is_recipe_run(dict(recipe_like, arch_overrides={}), "listops")
    assert lra_results.is_recipe_run(dict(recipe_like, arch_overrides={}, recipe_overrides={}), "listops")
    assert "encoder_embed_dim 8 (not the arch's), encoder_layers 1 (not the arch's)" in lra_results.other_runs([recipe_like])
    assert "batch 16 (not the recipe's), lr 0.003 (not the recipe's)" in lra_results.other_runs([recipe_like])
    assert not lra_results.is_recipe_run(dict(r, seed=lra_results.SEED), "listops")
    assert "scans see the padding, every batch padded to 30" in lra_results.other_runs([r])
    capsys.readouterr()
    assert lra_eval.main([scan_ck, "--cpu", "--pad-to-length", "0"]) == 2
    assert "--scan-padding lets the scans see the padding" in capsys.readouterr().err


@pytest.mark.integration
def test_scratch_positions_reach_the_checkpoint_and_the_evaluation(runs):
    """A run with --scratch-positions keeps K in its checkpoint (config and data record); scripts/lra_eval.py
    rebuilds the task from it, so the test examples end with </s> and K x <s>, the model leaves them out of
    its pooling, and the result JSON names K (the results table lists such a run apart from the recipe's)."""
    rc, out, save_dir = runs["listops_hgrn1_scratch"]
    assert rc == 0, out[-3000:]
    path = os.path.join(save_dir, "checkpoint_best.pt")
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["cfg"]["task"]["scratch_positions"] == 3
    assert state["task_state"]["hgrn_lra_data"]["scratch_positions"] == 3

    scripts = os.path.join(os.path.dirname(PLUGIN), "scripts")
    lra_eval = importlib.import_module("scripts.lra_eval")
    model, cfg, task, _, _ = lra_eval.load(path, cpu=True)
    task.load_dataset("test")
    d = task.source_dictionary
    assert task.dataset("test")[0]["source"][-4:].tolist() == [d.eos(), d.bos(), d.bos(), d.bos()]
    assert model.scratch_idx == d.bos()
    r = lra_eval.evaluate(path, cpu=True)
    assert r["scratch_positions"] == 3 and r["append_eos"] is True and r["examples"] == SPLITS["listops"][2]
    lra_results = importlib.import_module("hgrn_fairseq.recipes.lra_results")
    assert not lra_results.is_recipe_run(r, "listops") and lra_results.is_recipe_run(
        dict(r, scratch_positions=0, seed=lra_results.SEED, arch_overrides={}, recipe_overrides={}), "listops")
    assert "3 scratch positions" in lra_results.other_runs([r])


@pytest.mark.integration
@pytest.mark.parametrize("name", ["lines_hgrn1_learns", "lines_hgrn2_learns"])
def test_pixels_need_and_get_the_2d_structure(name, runs):
    """Whether a row's or column's worth of bright pixels forms a line is learned far above chance (50%)
    by the 2-D models through fairseq-train: pixels, labels, normalisation and the 2-D scan line up (the
    GPU Pathfinder run at 0.3% of its recipe stayed at chance; this says that was the budget)."""
    rc, out, _ = runs[name]
    assert rc == 0, out[-3000:]
    accs = [float(s["valid_accuracy"]) for s in valid_stats(out)]
    print("validation accuracy per epoch:", accs)
    assert max(accs) > 85, accs


@pytest.mark.integration
@pytest.mark.parametrize("name, message", [
    ("too_long", "sequences of up to 24 positions but --max-positions is 10: use the arch made for this task"),
    ("too_long_eos", "sequences of up to 25 positions (with the tokens --append-eos / --scratch-positions add) but --max-positions is 24"),
    ("bad_labels", "valid.label.npy: labels 0..12 outside 0..9 (num_classes 10)"),
    ("missing_file", "train.input0.idx: missing; fix: rerun data_prep/prepare_lra.py"),
    ("wrong_task", "this directory holds pixels inputs (task 'pathfinder') but the task reads tokens; "
                   "fix: use --task lra_image"),
    ("cut_validation", "validation on valid scored 16 examples but the split has 20: every example must be scored"),
])
def test_bad_input_is_refused_with_the_fix(name, message, runs):
    rc, out, _ = runs[name]
    assert rc != 0
    assert message in out, out[-2000:]


def test_wrong_norm_name_is_refused_by_the_command_line(tmp_path):
    from fairseq import options

    parser = options.get_training_parser()
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(parser, [str(tmp_path), "--user-dir", PLUGIN, "--task", "lra_text",
                                             "--arch", "hgrn1_lra_listops", "--norm", "group"])


def test_a_checkpoint_knows_its_data(tmp_path):
    """The task state saved in checkpoints records the dictionary (tokens) or image shape and the task;
    loading it into a task on other data is an error, on the same data it is not."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_tiny(a, "listops", sizes=(16, 4, 4), seed=0)
    write_tiny(b, "listops", sizes=(16, 4, 4), seed=5)
    task_a, task_b = text_task(a), text_task(b)
    with open(os.path.join(a, "dict.txt")) as fa, open(os.path.join(b, "dict.txt")) as fb:
        assert fa.read() != fb.read()  # the two tiny sets' dictionaries differ (order of counts)
    state = task_a.state_dict()
    text_task(a).load_state_dict(state)  # same data: fine
    with pytest.raises(ValueError, match=r"trained on other data than .*differs in dictionary_sha256"):
        task_b.load_state_dict(state)
    img = str(tmp_path / "img")
    write_tiny(img, "image", sizes=(8, 4, 4), image=(4, 4, 3))
    pix = LraImageTask.setup_task(LraImageConfig(data=img, seed=1))
    with pytest.raises(ValueError, match="differs in .*task"):
        pix.load_state_dict(state)


@pytest.mark.integration
def test_resuming_with_other_settings_is_refused_in_one_line(runs):
    """scripts/fairseq_train.py (what train_lra.sh runs): a command that would resume --save-dir's
    checkpoint_last.pt with other run settings (the norm, padding, <eos>, the arch, the learning-rate schedule)
    exits with one line naming them; the same settings, a longer --max-update that leaves the schedule as it was,
    a reset flag or a new --save-dir go on."""
    from fairseq import options

    fairseq_train = importlib.import_module("hgrn_fairseq.cli.fairseq_train")
    rc, out, save_dir = runs["listops_hgrn1_eos"]
    assert rc == 0, out[-3000:]
    data = os.path.join(os.path.dirname(os.path.dirname(save_dir)), "listops")
    _, arch, flags, updates = RUNS["listops_hgrn1_eos"]

    def check(extra=(), drop=(), updates=updates, save=save_dir, arch=arch):
        argv = [a for a in train_argv(data, save, arch, flags, updates) if a not in drop] + list(extra)
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        try:
            fairseq_train.check_lra_resume(args)
        except SystemExit as e:
            return str(e.code)
        return None

    assert check() is None
    # the run's cosine took its period from --max-update (updates - 10 warm-up): a longer --max-update alone
    # would stretch the cosine of every later update; with that period given, it only moves the end
    period = f"{updates - 10}"
    msg = check(updates=updates * 2)
    assert msg is not None and "\n" not in msg, msg
    assert f"cosine period {float(updates - 10)} (now {float(2 * updates - 10)})" in msg
    assert "add --reset-lr-scheduler" in msg
    assert check(["--lr-period-updates", period], updates=updates * 2) is None
    assert check(["--reset-lr-scheduler"], updates=updates * 2) is None  # a change on purpose
    assert "--reset-lr-scheduler" not in check(["--norm", "layer", "--reset-lr-scheduler"])  # only the schedule
    assert "--warmup-updates 10 (now 20)" in check(["--warmup-updates", "20"])
    assert "--lr 0.003 (now 0.001)" in check(["--lr", "1e-3"])
    assert "--weight-decay 0.0 (now 0.1)" in check(["--weight-decay", "0.1"])
    assert "--min-lr 0.0 (now 1e-05)" in check(["--min-lr", "1e-5"])
    assert check(["--warmup-init-lr", "0"]) is None  # fairseq's default start of the warm-up is the floor, 0 here
    assert check(["--reset-optimizer", "--norm", "layer"]) is None  # a reset starts something new: fairseq's
    assert check(["--norm", "layer"], save=save_dir + "_new") is None  # nothing to resume there
    msg = check(["--norm", "layer"])
    assert msg.startswith(f"fairseq_train.py: {os.path.join(save_dir, 'checkpoint_last.pt')} trained with other "
                          f"settings than this command: --norm syncbatch (now layer): ")
    assert "give another --save-dir" in msg and "\n" not in msg
    assert check(["--unmasked-padding", "--pad-to-length", "40"]).count("(now ") == 2
    assert "--append-eos True (now False)" in check(drop=("--append-eos",))
    assert "--encoder-layers 1 (now 2)" in check(["--encoder-layers", "2"])
    assert "--arch hgrn1_lra_listops (now hgrn1_lra_text)" in check(arch="hgrn1_lra_text")
    # options that do not change the function are not settings
    assert check(["--max-positions", "4096", "--kernel-backend", "reference"]) is None
    # nor is fixed-width padding for a model that masks its padding (the one shape --cuda-graphs wants)
    assert check(["--pad-to-length", "40", "--cuda-graphs"]) is None
    assert check(["--scan-padding", "--pad-to-length", "40"]).count("(now ") == 2
