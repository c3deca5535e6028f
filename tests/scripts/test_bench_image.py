"""bench/bench_image.py's report, from rows written here (the numbers themselves come from the GPU run):
the A/B lines put each switched row beside its base row of the same resolution and mode."""
import importlib
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("bench.bench_image")


def row(model, res, train, infer, mode="graphs"):
    return dict(model=model, res=res, mode=mode, params=6e6, train_img_s=train, infer_img_s=infer,
                train_vs_deit=1.0, infer_vs_deit=1.0)


def test_ab_lines_compare_with_the_base_row_of_the_same_resolution_and_mode(bench):
    rows = [row("hgrn2_vit_tiny", 224, 8000.0, 32000.0), row("hgrn2_vit_tiny:chunk64", 224, 7400.0, 32800.0),
            row("hgrn2_vit_tiny", 448, 2000.0, 8000.0), row("hgrn2_vit_tiny:chunk64", 448, 2100.0, 8000.0),
            row("hgrn2_vit_small:chunk64", 224, 100.0, 100.0), row("deit_tiny_patch16_224", 224, 7000.0, 30000.0)]
    assert bench.ab_lines(rows) == [
        # 7400 / 8000 = 0.925, 32800 / 32000 = 1.025
        "hgrn2_vit_tiny:chunk64 @ 224 (graphs): training 0.93x (-7.5%), inference 1.02x (+2.5%) of hgrn2_vit_tiny's",
        "hgrn2_vit_tiny:chunk64 @ 448 (graphs): training 1.05x (+5.0%), inference 1.00x (+0.0%) of hgrn2_vit_tiny's",
        "hgrn2_vit_small:chunk64 @ 224 (graphs): no hgrn2_vit_small row to compare with",
    ]
    md = bench.markdown(rows, {"device": "cpu"}, [])
    assert "- hgrn2_vit_tiny:chunk64 @ 448 (graphs): training 1.05x (+5.0%)" in md
    assert "A/B rows" not in bench.markdown([r for r in rows if ":" not in r["model"]], {"device": "cpu"}, [])


def test_a_switch_holds_its_value_while_its_row_is_measured_and_is_restored(bench, monkeypatch, capsys):
    """Each --ab-* option is an argparse flag, and a row named MODEL + its suffix is measured with the
    switch's attribute set (here the kernels' CHUNK, seen by the model build), then put back."""
    from hgrn_fairseq.kernels import hgrn2_triton

    seen = []

    class Built(Exception):
        pass

    def build(name, res, device, mode="eager"):
        seen.append((name, hgrn2_triton.CHUNK))
        raise Built

    monkeypatch.setattr(bench, "build", build)
    monkeypatch.setattr(hgrn2_triton, "CHUNK", None)
    suffix = bench.SWITCHES["--ab-chunk64"][0]
    with pytest.raises(Built):
        bench.measure("hgrn2_vit_tiny" + suffix, 224, None, "cpu")
    assert seen == [("hgrn2_vit_tiny", 64)] and hgrn2_triton.CHUNK is None
    # a switch of an autotuned kernel's space: the row sees the space without the capped config and no
    # earlier choice; afterwards the space is restored and the row's choices forgotten
    import triton

    kernel = hgrn2_triton._fwd_output
    plain = triton.Config({"BK": 64, "PREFETCH": False}, num_warps=4)
    capped = triton.Config({"BK": 64, "PREFETCH": False}, num_warps=4, maxnreg=128)
    space = [plain, capped]  # (the interpreter's space has one config)
    monkeypatch.setattr(kernel, "configs", space)
    seen.clear()
    monkeypatch.setattr(kernel, "cache", {"earlier": "choice"})

    def build_regcap(name, res, device, mode="eager"):
        seen.append((name, list(kernel.configs), dict(kernel.cache)))
        kernel.cache["row"] = "choice"
        raise Built

    monkeypatch.setattr(bench, "build", build_regcap)
    with pytest.raises(Built):
        bench.measure("hgrn2_vit_small" + bench.SWITCHES["--ab-no-regcap"][0], 224, None, "cpu")
    assert seen == [("hgrn2_vit_small", [plain], {})]
    assert kernel.configs is space and kernel.cache == {}
    with pytest.raises(SystemExit):  # every switch is an option of the command line, naming its rows
        bench.main(["--help"])
    usage = capsys.readouterr().out
    assert all(option in usage and f"MODEL{suffix}" in usage.replace("\n", "").replace(" ", "")
               for option, (suffix, *_) in bench.SWITCHES.items())
