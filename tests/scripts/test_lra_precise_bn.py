"""bench/explore/lra_precise_bn.py on a tiny HGRN2 ListOps model (2 blocks, width 8, 5 masked batch norms) built
through fairseq from tiny ListOps-like data of mixed lengths: the re-estimated running mean / variance of every
norm are the mean and unbiased variance over all the unpadded positions its inputs had in the first k training
batches, computed here apart (the inputs caught by forward hooks in a forward written out as precise BN: norms in
training mode, everything else in eval mode; float64, two-pass variance), for a prefix (k = 1) and for all the
batches; a momentum-0.1 running average over the same batches is far from them (the check can tell); and the
CLI end to end on a saved checkpoint."""
import importlib
import json
import os

import numpy as np
import pytest
import torch
from tests.tasks.test_lra_format import write_tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
script = importlib.import_module("bench.explore.lra_precise_bn")
BATCH, SEED, UPDATES = 8, 3, 7


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(checkpoint path, data dir): an untrained tiny hgrn2_lra_listops saved as fairseq saves a checkpoint."""
    import hgrn_fairseq
    hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    root = tmp_path_factory.mktemp("bnre")
    data = str(root / "data")
    write_tiny(data, "listops", sizes=(40, 12, 10), max_len=20)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--task", "lra_text", "--arch", "hgrn2_lra_listops", "--append-eos", "--encoder-embed-dim", "8",
        "--encoder-layers", "2", "--expand-ratio", "2", "--batch-size", str(BATCH), "--cpu",
        "--criterion", "classification_accuracy", "--optimizer", "adam", "--lr", "1e-3", "--seed", "1"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    with torch.no_grad():  # trained-looking affine parameters, stale running statistics
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.5, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.fill_(3.0)
            elif name.endswith("running_var"):
                b.fill_(0.05)
    state = {"cfg": cfg, "args": None, "model": model.state_dict(), "criterion": {},
             "optimizer_history": [{"criterion_name": "ClassificationAccuracyCriterion", "optimizer_name": "Adam",
                                    "lr_scheduler_state": {}, "num_updates": UPDATES}],
             "task_state": task.state_dict(), "extra_state": {"best": 25.0}}
    path = str(root / "checkpoint_best.pt")
    checkpoint_utils.torch_persistent_save(state, path)
    return path, data


def load(tiny):
    from scripts.lra_eval import load as lra_load

    path, data = tiny
    return lra_load(path, data, cpu=True)


def norms_of(model):
    from hgrn_fairseq.modules.norms import MaskedBatchNorm

    return [(name, m) for name, m in model.named_modules() if isinstance(m, MaskedBatchNorm)]


def caught_inputs(model, task, count):
    """Each norm's unpadded input rows (float64) in precise-BN passes over the first ``count`` training batches of
    the script's draw, caught by forward hooks; and the momentum-0.1 running averages those passes leave."""
    rows = {name: [] for name, _ in norms_of(model)}

    def hook(name):
        def catch(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            mask = args[1] if len(args) > 1 else kwargs.get("padding_mask")
            assert mask is not None and bool(mask.any())  # the padded positions are there to leave out
            rows[name].append(x.detach().double()[~mask])
        return catch

    handles = [m.register_forward_pre_hook(hook(name), with_kwargs=True) for name, m in norms_of(model)]
    model.eval()
    for _, m in norms_of(model):
        m.train()
    try:
        with torch.no_grad():
            for sample in script.train_batches(task, BATCH, count, SEED, False, False):
                model(**sample["net_input"])
    finally:
        for h in handles:
            h.remove()
        model.eval()
    momentum = {name: (m.running_mean.double().clone(), m.running_var.double().clone()) for name, m in norms_of(model)}
    return rows, momentum


def test_reestimates_are_the_pooled_statistics_of_the_unpadded_positions(tiny):
    model, cfg, task, _, _ = load(tiny)
    stored = {k: v.clone() for k, v in model.state_dict().items()}
    assert len(norms_of(model)) == 5  # 2 blocks x (mixer, GLU) + the final norm
    stats, seen = script.reestimated(model, task, [1, 3], SEED, BATCH, False, False)
    assert sorted(stats) == [1, 3]
    sizes = task.dataset("train").sizes
    for k in (1, 3):
        model.load_state_dict(stored)
        rows, momentum = caught_inputs(model, task, k)
        assert seen[k][1] == sum(len(r) for r in rows["classifier.encoder.final_norm"])  # unpadded positions
        assert seen[k][0] == min(k * BATCH, len(sizes))
        model.load_state_dict(stored)
        from hgrn_fairseq.modules.norms import set_running_stats

        set_running_stats(model, stats[k])
        for name, m in norms_of(model):
            x = torch.cat(rows[name])
            mean, var = x.mean(0), x.var(0, unbiased=True)  # two-pass, float64
            torch.testing.assert_close(m.running_mean.double(), mean, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(m.running_var.double(), var, rtol=1e-5, atol=1e-6)
            if k == 3:  # a momentum-0.1 average over the same batches is not that (so the check above can tell)
                assert not torch.allclose(momentum[name][0], mean, rtol=1e-3, atol=1e-3)
                assert not torch.allclose(momentum[name][1], var, rtol=1e-3, atol=1e-3)
    # the prefix's statistics differ from all three batches' (nested estimates, not one copied)
    final = "classifier.encoder.final_norm"
    assert not torch.allclose(stats[1][final][0], stats[3][final][0])


def test_batch_statistics_leave_the_running_statistics_alone(tiny):
    model, cfg, task, _, _ = load(tiny)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = {}
    correct = script.score_with_batch_stats(model, task, "test", 4, 1, False, False, logits)
    assert sorted(logits) == list(range(10)) and 0 <= correct <= 10
    assert not model.training and all(not m.training for m in model.modules())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_cli_end_to_end(tiny, tmp_path, capsys):
    from scripts.lra_eval import score

    path, data = tiny
    recorded = tmp_path / "test_result.json"
    model, cfg, task, _, _ = load(tiny)
    correct, _ = score(model, task, "test", 64, False, False)
    recorded.write_text(json.dumps({"accuracy": 100.0 * correct / 10, "correct": correct, "examples": 10,
                                    "device": "cpu", "precision": "fp32", "best_checkpoint_updates": UPDATES}))
    out = tmp_path / "r.json"
    assert script.main([path, "--data", data, "--batches", "3", "1", "--seeds", "1", "2", "--batch-stats", "--cpu",
                        "--recorded", str(recorded), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[as stored] test:" in printed and "(recorded: the same)" in printed
    r = json.loads(out.read_text())
    assert r["checkpoint_updates"] == UPDATES and r["recorded"]["best_valid_accuracy"] == 25.0
    assert r["recorded"]["test_correct"] == correct and r["settings"]["batch_size"] == BATCH
    assert r["data"]["splits"]["test"] == {"examples": 10, "tokens": int(task.dataset("test").sizes.sum())}
    settings = [(row["setting"], row["split"]) for row in r["rows"]]
    want = [("as stored", s) for s in ("valid", "test")]
    for seed in (1, 2):
        for n in (1, 3):
            want += [(f"re-estimated on {n} x {BATCH}, seed {seed}", s) for s in ("valid", "test")]
    want += [(f"batch statistics, random batches of {BATCH}", s) for s in ("valid", "test")]
    assert settings == want
    stored_test = r["rows"][1]
    assert stored_test["correct"] == correct and len(stored_test["predictions"]) == 10
    labels = np.asarray(task.dataset("test").labels)
    assert sum(int(p) == int(y) for p, y in zip(stored_test["predictions"], labels)) == correct
    shift = r["rows"][2]["shift_from_stored"]
    assert shift["norms"] == 5 and shift["channels"] == 40 and shift["var_ratio_max"] < 1  # stale 0.05 variances
    assert len(stored_test["margins"]) == 10 and min(stored_test["margins"]) >= 0 and stored_test["loss_bits"] > 0
    assert "margins" not in r["rows"][2]
    # the as-stored loss: each test example alone through the model, cross-entropy written out in float64, in bits
    ds = task.dataset("test")
    nll = []
    with torch.no_grad():
        for i in range(len(ds)):
            z = model(**ds.collater([ds[i]])["net_input"])[0].double()
            nll.append(float(torch.logsumexp(z, 0) - z[int(labels[i])]))
    assert stored_test["loss_bits"] == pytest.approx(sum(nll) / len(nll) / np.log(2), rel=1e-4, abs=1e-5)
    # the margins over the as-stored row of the same split, from the rows' own numbers
    stored_rows = {row["split"]: row for row in r["rows"] if row["setting"] == "as stored"}
    for row in r["rows"][2:]:
        base = stored_rows[row["split"]]
        assert row["delta_correct"] == row["correct"] - base["correct"]
        assert row["delta_accuracy"] == pytest.approx(row["accuracy"] - base["accuracy"], abs=1e-9)
        assert row["delta_loss_bits"] == pytest.approx(row["loss_bits"] - base["loss_bits"], abs=2e-5)
        assert row["changed_predictions"] == sum(a != b for a, b in zip(row["predictions"], base["predictions"]))
        task.load_dataset(row["split"])
        y = np.asarray(task.dataset(row["split"]).labels)
        now = np.array([int(c) for c in row["predictions"]]) == y
        was = np.array([int(c) for c in base["predictions"]]) == y
        assert (row["wrong_to_right"], row["right_to_wrong"]) == (int((now & ~was).sum()), int((was & ~now).sum()))
        assert row["wrong_to_right"] - row["right_to_wrong"] == row["delta_correct"]
        flips = row["wrong_to_right"] + row["right_to_wrong"]
        assert row["mcnemar_z"] == pytest.approx(row["delta_correct"] / np.sqrt(flips) if flips else 0.0, abs=0.006)
        p = row["accuracy"] / 100
        assert row["std_error"] == pytest.approx(100 * np.sqrt(p * (1 - p) / row["examples"]), abs=0.006)
    # the stale statistics (mean 3, variance 0.05) against the re-estimated ones: the loss must move
    assert all(abs(row["delta_loss_bits"]) > 1e-3 for row in r["rows"][2:10])
    only = tmp_path / "only.json"
    assert script.main([path, "--stored-only", "--fp32", "--cpu", "--splits", "test", "--out", str(only)]) == 0
    o = json.loads(only.read_text())
    assert [(row["setting"], row["split"]) for row in o["rows"]] == [("as stored", "test")]
    assert o["rows"][0]["predictions"] == stored_test["predictions"] and o["precision"] == "fp32"


def test_kernel_backend_override_reaches_the_model_config(tiny):
    """``--kernel-backend`` (lra_eval.load's ``kernel_backend``) replaces the checkpoint's, with and without --data."""
    from scripts.lra_eval import load as lra_load

    path, data = tiny
    _, cfg, _, _, _ = lra_load(path, cpu=True)
    saved = cfg.model.kernel_backend
    for other in ("reference", "triton"):
        for d in (None, data):
            _, cfg, _, _, _ = lra_load(path, d, cpu=True, kernel_backend=other)
            assert cfg.model.kernel_backend == other and cfg.task.data == data
    assert saved in ("auto", "reference", "triton")
