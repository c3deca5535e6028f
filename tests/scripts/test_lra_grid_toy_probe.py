"""bench/explore/lra_grid_toy_probe.py: the flood fill, the generated labels, and one tiny training run."""
import importlib
import json
import os

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
probe = importlib.import_module("bench.explore.lra_grid_toy_probe")


def grid(rows):
    """'#' ink, '.' background (characters to pixels)."""
    return np.array([[probe.INK if ch == "#" else probe.BACKGROUND for ch in r] for r in rows], np.float32)


def components(img, reach=1):
    """Connected components of the drawn pixels by repeated min-propagation over the 4 neighbours (independent
    of the script's flood fill): a label per pixel, -1 on the background. ``reach=2`` also joins pixels two
    apart along a row or column (a one-pixel gap of a dashed leg bridged)."""
    drawn = img > probe.BACKGROUND
    lab = np.where(drawn, np.arange(img.size).reshape(img.shape), img.size)
    H, W = img.shape
    steps = [(d * s, 0) for d in range(1, reach + 1) for s in (1, -1)] + \
        [(0, d * s) for d in range(1, reach + 1) for s in (1, -1)]
    while True:
        p = np.pad(lab, reach, constant_values=img.size)
        new = np.minimum.reduce([lab] + [p[reach + dr:reach + dr + H, reach + dc:reach + dc + W] for dr, dc in steps])
        new = np.where(drawn, new, img.size)
        if (new == lab).all():
            return np.where(drawn, lab, -1)
        lab = new


def test_flood_fill_follows_4_connectivity():
    img = grid(["##..",
                ".#..",
                ".###",
                "...."])
    assert probe.connected(img, (0, 0), (2, 3))
    img[2, 2] = probe.BACKGROUND  # a gap in the leg
    assert not probe.connected(img, (0, 0), (2, 3))
    diagonal = grid(["#...", ".#..", "....", "...."])
    assert not probe.connected(diagonal, (0, 0), (1, 1))  # touching corners do not join


@pytest.mark.parametrize("turns, dash, distractors", [(1, 0, 0), (3, 0, 0), (1, 3, 0), (1, 0, 3)])
def test_path_examples_have_their_label_and_balanced_classes(turns, dash, distractors):
    rng = np.random.default_rng(0)
    labels = []
    for _ in range(200):
        img, y = probe.sample("path", 12, turns, dash, rng, distractors=distractors)
        dots = np.argwhere(img == probe.DOT)
        assert len(dots) == 2
        lab = components(img, reach=2 if dash else 1)
        assert y == int(lab[tuple(dots[0])] == lab[tuple(dots[1])])
        labels.append(y)
    assert 0.4 < np.mean(labels) < 0.6


def test_dashed_positives_are_paths_not_neighbouring_dots():
    """With gaps in the legs the positives must still be dots joined by a path: their dots lie about as far apart
    as the negatives' (if the gaps broke connectivity, the only positives would be dots a pixel or two apart)."""
    rng = np.random.default_rng(3)
    dist = {0: [], 1: []}
    for _ in range(200):
        img, y = probe.sample("path", 16, 1, 3, rng)
        a, b = np.argwhere(img == probe.DOT)
        dist[y].append(np.abs(a - b).sum())
    assert np.median(dist[1]) > 0.6 * np.median(dist[0]) and np.median(dist[1]) >= 6


def test_classes_have_as_many_free_path_ends():
    """Line ends (drawn pixels with exactly one drawn 4-neighbour) must not give the label away: both classes draw
    two target paths with the dots at path ends (a positive with one path and a negative with two would differ by
    two free ends, which a 3x3 conv with global pooling reads)."""
    rng = np.random.default_rng(4)
    ends = {0: [], 1: []}
    for _ in range(300):
        img, y = probe.sample("path", 16, 1, 0, rng)
        drawn = np.pad(img > probe.BACKGROUND, 1)
        nbrs = drawn[:-2, 1:-1].astype(int) + drawn[2:, 1:-1] + drawn[1:-1, :-2] + drawn[1:-1, 2:]
        ends[y].append(int(((nbrs == 1) & drawn[1:-1, 1:-1]).sum()))
    assert abs(np.mean(ends[1]) - np.mean(ends[0])) < 0.6, (np.mean(ends[0]), np.mean(ends[1]))
    inks = {k: [] for k in (0, 1)}
    for _ in range(300):
        img, y = probe.sample("path", 16, 1, 0, rng)
        inks[y].append(int((img > probe.BACKGROUND).sum()))
    assert abs(np.mean(inks[1]) - np.mean(inks[0])) < 0.15 * np.mean(inks[0])


def test_dashed_legs_leave_gaps():
    img = np.full((8, 8), probe.BACKGROUND, np.float32)

    class Rng:  # a horizontal leg from (0, 0) to (0, 7)
        def random(self):
            return 0.0

        def integers(self, lo, hi):
            return 7

    probe.draw_path(img, 0, 0, 1, Rng(), dash=3)
    assert [int(v > probe.BACKGROUND) for v in img[0]] == [1, 1, 0, 1, 1, 0, 1, 1]


def test_rowcol_labels():
    rng = np.random.default_rng(1)
    for _ in range(200):
        img, y = probe.sample("rowcol", 8, 0, 0, rng)
        (r1, c1), (r2, c2) = np.argwhere(img == probe.DOT)
        assert y == int(r1 == r2 or c1 == c2)


@pytest.mark.integration
def test_tiny_run_writes_its_evaluations(tmp_path):
    out = tmp_path / "probe.json"
    assert probe.main(["--task", "rowcol", "--side", "6", "--dim", "4", "--layers", "1", "--steps", "2",
                       "--eval-every", "1", "--batch", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [e["step"] for e in result["evals"]] == [1, 2]
    assert 0 <= result["valid_eval_recalibrated"] <= 100 and result["settings"]["task"] == "rowcol"


def test_local_yardstick_sees_only_its_receptive_field():
    """--model localcnn: a pixel change more than `layers` pixels away from every other change cannot interact with
    it before the pooling, so two separate changes act on the pooled features additively."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = probe.LocalCNN(layers=2).eval()
    base = torch.full((1, 144, 1), probe.BACKGROUND)

    def pooled_sum(x):  # the sum over the grid of the conv features (the mean pooling without the 1/144)
        return net.convs(x.reshape(-1, 1, 12, 12)).sum((2, 3))

    a, b, ab = base.clone(), base.clone(), base.clone()
    a[0, 0] = ab[0, 0] = probe.DOT            # (0, 0)
    b[0, 143] = ab[0, 143] = probe.DOT        # (11, 11): 11 rows and columns apart, beyond 2 + 2 pixels
    torch.testing.assert_close(pooled_sum(ab) - pooled_sum(b), pooled_sum(a) - pooled_sum(base))
    near = ab.clone()
    near[0, 143], near[0, 2] = probe.BACKGROUND, probe.DOT  # (0, 2): within reach of (0, 0)
    interaction = (pooled_sum(near) - pooled_sum(base)) - 2 * (pooled_sum(a) - pooled_sum(base))
    assert interaction.abs().max() > 1e-2  # (two dots within reach do interact: the net is not pixel-wise)


@pytest.mark.integration
def test_tiny_runs_of_the_yardstick_and_of_max_pooling(tmp_path):
    for extra in (["--model", "localcnn", "--layers", "2"], ["--pool", "max", "--gate-bias", "3"]):
        out = tmp_path / "probe.json"
        assert probe.main(["--side", "6", "--dim", "4", "--layers", "1", "--steps", "2", "--eval-every", "2",
                           "--batch", "4", "--out", str(out)] + extra) == 0
        result = json.loads(out.read_text())
        assert [e["step"] for e in result["evals"]] == [2]
        assert ("valid_eval_recalibrated" in result) == (extra[0] != "--model")  # (no batch norms to re-estimate)


def test_diagonal_paths_join_at_corners_and_keep_their_labels():
    diagonal = grid(["#...", ".#..", "..#.", "...."])
    assert probe.connected(diagonal, (0, 0), (2, 2), probe.NEIGHBOURS8)
    assert not probe.connected(diagonal, (0, 0), (2, 2))
    rng = np.random.default_rng(2)
    labels = []
    for _ in range(100):
        img, y = probe.sample("path", 12, 1, 0, rng, diagonal=True)
        a, b = (tuple(d) for d in np.argwhere(img == probe.DOT))
        # 8-connected components, independently: a 3x3 dilation of the component grown from a
        drawn, comp = img > probe.BACKGROUND, np.zeros(img.shape, bool)
        comp[a] = True
        while True:
            p = np.pad(comp, 1)
            grown = drawn & np.logical_or.reduce([p[1 + dr:13 + dr, 1 + dc:13 + dc] for dr in (-1, 0, 1)
                                                  for dc in (-1, 0, 1)])
            if (grown == comp).all():
                break
            comp = grown
        assert y == int(comp[b])
        labels.append(y)
    assert 0.35 < np.mean(labels) < 0.65


def test_max_leg_caps_every_leg_and_labels_still_hold():
    """--max-leg L: no straight run of drawn pixels (a leg) longer than L + 1 pixels, and the labels still agree with
    an independent component count."""
    rng = np.random.default_rng(5)
    longest = 0
    for _ in range(150):
        img, y = probe.sample("path", 24, 1, 0, rng, max_leg=4)
        a, b = np.argwhere(img == probe.DOT)
        lab = components(img)
        assert y == int(lab[tuple(a)] == lab[tuple(b)])
        if y:  # (a positive's dots are the ends of one path of two legs of at most 4 pixels each)
            assert np.abs(a - b).sum() <= 2 * 4
        for row in (img > probe.BACKGROUND).tolist() + (img > probe.BACKGROUND).T.tolist():
            run = 0
            for v in row:
                run = run + 1 if v else 0
                longest = max(longest, run)
    # crossing legs of different paths can line up, so allow a little, but far below the 24 pixels a free leg reaches
    assert longest <= 10, longest


def test_canvas_pastes_the_example_into_a_larger_background():
    rng = np.random.default_rng(6)
    for _ in range(50):
        img, y = probe.sample("path", 8, 1, 0, rng, canvas=20)
        assert img.shape == (20, 20)
        rows, cols = np.nonzero(img > probe.BACKGROUND)
        assert rows.max() - rows.min() < 8 and cols.max() - cols.min() < 8
        a, b = np.argwhere(img == probe.DOT)
        lab = components(img)
        assert y == int(lab[tuple(a)] == lab[tuple(b)])
    x, _ = probe.batch("path", 3, 8, 1, 0, rng, canvas=20)
    assert tuple(x.shape) == (3, 400, 1)


def test_side_schedule():
    sched = probe.parse_side_schedule("8:3,12:5", 16)
    assert [probe.side_at(sched, s, 16) for s in range(1, 8)] == [8, 8, 8, 12, 12, 16, 16]
    for bad in ("8", "8:3,12:2", "20:3", "a:b"):
        with pytest.raises(SystemExit):
            probe.parse_side_schedule(bad, 16)


@pytest.mark.integration
def test_curriculum_run_trains_small_then_validates_on_the_final_side(tmp_path):
    out = tmp_path / "probe.json"
    assert probe.main(["--side", "8", "--side-schedule", "6:2", "--dim", "4", "--layers", "1", "--steps", "4",
                       "--eval-every", "1", "--batch", "4", "--out", str(out)]) == 0
    evals = json.loads(out.read_text())["evals"]
    assert [e["train_side"] for e in evals] == [6, 6, 8, 8]


@pytest.mark.integration
def test_probe_imports_without_fairseq():
    """The probe runs on a GPU machine that has PyTorch but no fairseq (nothing of fairseq is imported)."""
    import subprocess
    import sys
    code = ("import sys, runpy; sys.modules['fairseq'] = None; "
            f"runpy.run_path({os.path.join(REPO, 'bench', 'explore', 'lra_grid_toy_probe.py')!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_warmup_ramps_the_rate_and_clip_and_decay_run(tmp_path):
    out = tmp_path / "probe.json"
    assert probe.main(["--side", "6", "--dim", "4", "--layers", "1", "--steps", "4", "--eval-every", "1", "--batch", "4",
                       "--lr", "0.004", "--warmup", "2", "--clip", "0.5", "--weight-decay", "0.1", "--out", str(out)]) == 0
    assert [e["lr"] for e in json.loads(out.read_text())["evals"]] == pytest.approx([0.002, 0.004, 0.004, 0.004])


def test_diagnose_logs_gates_and_gradients(tmp_path):
    out = tmp_path / "probe.json"
    assert probe.main(["--side", "6", "--dim", "4", "--layers", "2", "--steps", "2", "--eval-every", "2", "--batch", "4",
                       "--diagnose", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())["evals"][0]
    assert len(rec["gates"]) == 2 and all(0 < g["mean"] < 1 and 0 <= g["above_099"] <= 1 for g in rec["gates"])
    assert rec["grad_norm_max"] >= rec["grad_norm_median"] > 0 and rec["logit_abs_max"] > 0


def test_save_writes_the_trained_weights(tmp_path):
    torch = pytest.importorskip("torch")
    out, saved = tmp_path / "probe.json", tmp_path / "model.pt"
    assert probe.main(["--side", "6", "--dim", "4", "--layers", "1", "--steps", "1", "--eval-every", "1", "--batch", "4",
                       "--out", str(out), "--save", str(saved)]) == 0
    state = torch.load(saved)
    assert "head.weight" in state and state["encoder.embed.weight"].shape == (4, 1)

