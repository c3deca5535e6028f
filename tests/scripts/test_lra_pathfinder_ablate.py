"""bench/explore/lra_pathfinder_ablate.py: variant parsing, the pooling choices, and a run stopped by time
that resumes from its --state to the same training losses as a run that was never stopped."""
import importlib
import json
import os

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ablate = importlib.import_module("bench.explore.lra_pathfinder_ablate")


def test_variants_parse_over_the_defaults_and_refuse_bad_keys():
    assert ablate.parse_variant("base") == ablate.DEFAULTS
    v = ablate.parse_variant("mixer=hgru,expand=1,lr=2e-4,pool=last,augment=1")
    assert (v["mixer"], v["expand"], v["lr"], v["pool"], v["augment"]) == ("hgru", 1, 2e-4, "last", 1)
    assert v["dim"] == 128 and v["norm"] == "batch"  # the rest stays HGRN2's Pathfinder settings
    with pytest.raises(SystemExit, match="unknown key 'depth'"):
        ablate.parse_variant("depth=3")
    with pytest.raises(SystemExit, match="is not key=value"):
        ablate.parse_variant("pool")
    with pytest.raises(SystemExit, match="pool 'first' is not one of"):
        ablate.parse_variant("pool=first")


def test_gate_bias_shifts_only_the_forget_logits():
    torch.manual_seed(0)
    plain = ablate.Classifier(ablate.parse_variant("dim=8,layers=2,scan=series"), 1, 2, side=4)
    torch.manual_seed(0)
    shifted = ablate.Classifier(ablate.parse_variant("dim=8,layers=2,scan=series,gatebias=3"), 1, 2, side=4)
    for name, p in shifted.named_parameters():
        q = dict(plain.named_parameters())[name]
        if ".mixer." in name and name.endswith("in_proj.bias"):  # [v, q, f]: only the forget third moves, by 3
            torch.testing.assert_close(p[:16], q[:16])
            torch.testing.assert_close(p[16:], q[16:] + 3)
        else:
            torch.testing.assert_close(p, q)
    assert sum(".mixer." in n and n.endswith("in_proj.bias") for n, _ in shifted.named_parameters()) == 4  # 2 x 2
    with pytest.raises(SystemExit, match="not an HGRN2 mixer"):
        ablate.Classifier(ablate.parse_variant("mixer=hgru,expand=1,dim=8,layers=1,gatebias=3"), 1, 2, side=4)


@pytest.mark.parametrize("pool, pos", [("last", 15), ("center", 2 * 4 + 2)])
def test_single_position_pools_read_that_position(pool, pos):
    torch.manual_seed(0)
    cfg = ablate.parse_variant(f"dim=4,layers=1,expand=1,norm=layer,pool={pool}")
    model = ablate.Classifier(cfg, 1, 2, side=4).eval()
    x = torch.randn(2, 1, 4, 4)
    feats = model.encoder.features(x.flatten(2).transpose(1, 2))
    torch.testing.assert_close(model(x), model.head(feats[:, pos]))


def test_stopped_run_resumes_to_the_same_losses(tmp_path):
    from hgrn_fairseq.preprocessing import lra_pathfinder
    from data_prep import prepare_lra

    lra_pathfinder.generate(str(tmp_path / "gen"), num=20, seed=3, workers=1, progress=False, log=lambda m: None,
                            contour_length=6)
    data = str(tmp_path / "pf6")
    prepare_lra.prepare("pathfinder", str(tmp_path / "gen"), data, log=lambda m: None, contour_length=6)
    common = [data, "--steps", "5", "--log-every", "1", "--eval-every", "10", "--device", "cpu",
              "--variant", "dim=4,layers=1,expand=1,batch=4"]
    assert ablate.main(common + ["--out", str(tmp_path / "straight.json")]) == 0
    state = str(tmp_path / "state.pt")
    assert ablate.main(common + ["--out", str(tmp_path / "a.json"), "--state", state, "--minutes", "1e-9"]) == 0
    first = json.loads((tmp_path / "a.json").read_text())[0]
    assert first["status"] == "stopped_by_time" and first["stopped_by_time_at"] == [1]
    assert ablate.main(common + ["--out", str(tmp_path / "b.json"), "--state", state]) == 0
    straight = json.loads((tmp_path / "straight.json").read_text())[0]
    resumed = json.loads((tmp_path / "b.json").read_text())[0]
    assert resumed["status"] == "done" and resumed["resumed_at"] == [1]
    assert [r["step"] for r in resumed["log"]] == [1, 2, 3, 4, 5]
    assert [r["loss_bits"] for r in resumed["log"]] == [r["loss_bits"] for r in straight["log"]]
    # a state of another variant is refused, not continued
    with pytest.raises(SystemExit, match="holds 'dim=4,layers=1,expand=1,batch=4'"):
        ablate.main([data, "--steps", "5", "--device", "cpu", "--variant", "dim=4,layers=2,expand=1,batch=4",
                     "--out", str(tmp_path / "c.json"), "--state", state])


def test_embed_stem_reads_the_grey_levels_and_conv_stem_runs():
    torch.manual_seed(0)
    u8 = torch.randint(0, 256, (2, 1, 4, 4), dtype=torch.uint8)
    emb = ablate.Classifier(ablate.parse_variant("dim=4,layers=1,expand=1,norm=layer,stem=embed"), 1, 2, 4).eval()
    tokens = u8.long().flatten(1)  # every one of the 16 levels, by hand
    torch.testing.assert_close(emb(ablate.normalise(u8)), emb.head(emb.encoder(tokens)))
    conv = ablate.Classifier(ablate.parse_variant("dim=4,layers=1,expand=1,norm=layer,stem=conv"), 1, 2, 4).eval()
    assert conv.encoder.embed.in_features == ablate.STEM_CHANNELS and conv(ablate.normalise(u8)).shape == (2, 2)
    with pytest.raises(SystemExit, match="stem 'resnet' is not one of"):
        ablate.parse_variant("stem=resnet")
