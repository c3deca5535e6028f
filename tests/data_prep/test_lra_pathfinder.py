"""The offline Pathfinder generator (data_prep/lra_pathfinder.py): images, labels, layout."""
import math
import os
import sys
from collections import deque

import numpy as np
import pytest
from hgrn_fairseq.preprocessing import lra_pathfinder as pf
from tests import pyrun

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "data_prep", "lra_pathfinder.py")


def components(mask):
    """8-connected component id of every True pixel (-1 elsewhere), by breadth-first search."""
    comp = -np.ones(mask.shape, dtype=np.int64)
    h, w = mask.shape
    n = 0
    for y0, x0 in zip(*np.nonzero(mask)):
        if comp[y0, x0] >= 0:
            continue
        comp[y0, x0] = n
        queue = deque([(y0, x0)])
        while queue:
            y, x = queue.popleft()
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    yy, xx = y + dy, x + dx
                    if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and comp[yy, xx] < 0:
                        comp[yy, xx] = n
                        queue.append((yy, xx))
        n += 1
    return comp


def seg_distance(a0, a1, b0, b1, steps=16):
    """Smallest distance between two segments, by dense sampling of one against the other."""
    best = math.inf
    for t in np.linspace(0, 1, steps + 1):
        p = (a0[0] + t * (a1[0] - a0[0]), a0[1] + t * (a1[1] - a0[1]))
        dy, dx = b1[0] - b0[0], b1[1] - b0[1]
        n2 = dy * dy + dx * dx
        u = 0.0 if n2 == 0 else min(1.0, max(0.0, ((p[0] - b0[0]) * dy + (p[1] - b0[1]) * dx) / n2))
        best = min(best, math.hypot(p[0] - b0[0] - u * dy, p[1] - b0[1] - u * dx))
    return best


@pytest.fixture(scope="module")
def samples():
    s = pf.PRESETS[32]
    rng = np.random.default_rng(5)
    return s, [pf.render(s, rng, i % 2, with_geometry=True) for i in range(24)]


def test_image_shape_dtype_label(samples):
    s, outs = samples
    for i, o in enumerate(outs):
        assert o["image"].shape == (32, 32) and o["image"].dtype == np.uint8
        assert o["image"].max() == 255
        assert o["label"] == i % 2
        assert len(o["targets"]) == 2 and all(len(t) == s.contour_length for t in o["targets"])
        assert all(len(d) == s.distractor_length for d in o["distractors"])


def test_markers_are_bright_and_on_target_ends(samples):
    _, outs = samples
    for o in outs:
        ends = [(t[0][0], t[-1][1]) for t in o["targets"]]
        starts = {tuple(map(int, e[0])) for e in ends}
        finals = {tuple(map(int, e[1])) for e in ends}
        m0, m1 = (tuple(map(int, m)) for m in o["markers"])
        assert m0 in starts and m1 in finals
        for y, x in (m0, m1):
            # a marker is a disk of radius 1.5: its centre pixel is fully covered (value 255 / peak >= 127)
            assert o["image"][y, x] >= 120, (y, x, o["image"][y, x])


def test_label_one_iff_markers_connected_by_one_path(samples):
    _, outs = samples
    for o in outs:
        traces = o["trace"]  # one centre-line picture per target path (paths may cross in gaps)
        assert traces.shape[0] == 2
        k = traces.shape[1] // 32
        joined, on_path = [], [False, False]
        for trace in traces:
            comp = components(trace)
            # markers sit on path ends: look them up at their centres on the fine grid
            a, b = (comp[int(m[0]) * k, int(m[1]) * k] for m in o["markers"])
            joined.append(a >= 0 and a == b)
            on_path = [on_path[0] or a >= 0, on_path[1] or b >= 0]
        assert all(on_path)
        assert any(joined) == (o["label"] == 1)


def test_paths_are_drawn_and_kept_apart(samples):
    _, outs = samples
    for o in outs:
        img = o["image"]
        for snake in o["targets"]:
            for p0, p1 in snake:
                y, x = round((p0[0] + p1[0]) / 2), round((p0[1] + p1[1]) / 2)
                # every paddle shows up in the image
                assert img[max(y - 1, 0):y + 2, max(x - 1, 0):x + 2].max() >= 60
        t0, t1 = o["targets"]
        assert min(seg_distance(*a, *b) for a in t0 for b in t1) > 1.0
        for d in o["distractors"]:
            assert min(seg_distance(*a, *b) for a in d for b in t0 + t1) > 1.0


def test_difficulties_follow_the_presets_rule(tmp_path):
    """The release's easier folders: 14 is exactly the LRA preset; 6 / 9 shorten the targets and the
    distractors (contour // 3 paddles, 20 // that many at 32 px) and land in curv_baseline / _9."""
    assert pf.settings_for(32, 14) == pf.PRESETS[32] and pf.settings_for(128, 14) == pf.PRESETS[128]
    c6, c9 = pf.settings_for(32, 6), pf.settings_for(32, 9)
    assert (c6.contour_length, c6.distractor_length, c6.num_distractor_snakes) == (6, 2, 10)
    assert (c9.contour_length, c9.distractor_length, c9.num_distractor_snakes) == (9, 3, 6)
    assert c6.folder == os.path.join("pathfinder32", "curv_baseline")
    assert c9.folder == os.path.join("pathfinder32", "curv_contour_length_9")
    o = pf.render(c6, np.random.default_rng(3), 1, with_geometry=True)
    assert [len(t) for t in o["targets"]] == [6, 6] and all(len(d) == 2 for d in o["distractors"])
    pf.generate(str(tmp_path), num=4, seed=1, workers=1, progress=False, log=lambda m: None, contour_length=6)
    assert len(os.listdir(tmp_path / "pathfinder32" / "curv_baseline" / "imgs" / "0")) == 4
    with pytest.raises(ValueError, match=r"--contour-length 7: expected one of \[6, 9, 14\]"):
        pf.settings_for(32, 7)


def test_path_x_size_renders():
    s = pf.PRESETS[128]
    o = pf.render(s, np.random.default_rng(2), 1)
    assert o["image"].shape == (128, 128) and o["image"].dtype == np.uint8 and o["margin"] in (2, 3)


def read_metadata(root):
    lines = {}
    for name in sorted(os.listdir(os.path.join(root, "metadata")), key=lambda n: int(n.split(".")[0])):
        with open(os.path.join(root, "metadata", name)) as f:
            text = f.read()
        assert text.endswith("\n")
        lines[name] = [line.split(" ") for line in text.splitlines()]
    return lines


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    dest = str(tmp_path_factory.mktemp("pf"))
    pf.generate(dest, num=60, size=32, seed=1, workers=1, per_folder=40, progress=False, log=lambda m: None)
    return dest, os.path.join(dest, "pathfinder32", "curv_contour_length_14")


def test_layout_metadata_and_balance(dataset):
    from PIL import Image

    _, root = dataset
    meta = read_metadata(root)
    assert list(meta) == ["0.npy", "1.npy"]
    assert [len(v) for v in meta.values()] == [40, 20]
    labels = []
    for name, rows in meta.items():
        k = int(name.split(".")[0])
        for i, f in enumerate(rows):
            assert len(f) == 11
            assert f[0] == f"imgs/{k}" and f[1] == f"sample_{i}.png" and f[2] == str(i)
            assert f[4:10] == ["1.0", "14", "4", "2", "0.5", "1"]
            labels.append(int(f[3]))
            with Image.open(os.path.join(root, f[0], f[1])) as im:
                assert im.mode == "L" and im.size == (32, 32)
    assert labels.count(0) == labels.count(1) == 30


def test_same_seed_same_bytes_any_workers(dataset, tmp_path):
    _, root = dataset
    pf.generate(str(tmp_path), num=60, size=32, seed=1, workers=2, per_folder=40, progress=False,
                log=lambda m: None)
    other = os.path.join(str(tmp_path), "pathfinder32", "curv_contour_length_14")
    assert read_metadata(root) == read_metadata(other)
    for k, n in ((0, 40), (1, 20)):
        for i in range(n):
            rel = os.path.join("imgs", str(k), f"sample_{i}.png")
            with open(os.path.join(root, rel), "rb") as a, open(os.path.join(other, rel), "rb") as b:
                assert a.read() == b.read()


def test_rerun_resume_and_changed_options(dataset, tmp_path):
    dest, root = dataset
    messages = []
    pf.generate(dest, num=60, size=32, seed=1, workers=1, per_folder=40, progress=False, log=messages.append)
    assert "up to date" in messages[-1]
    with pytest.raises(ValueError, match="other options"):
        pf.generate(dest, num=60, size=32, seed=2, workers=1, per_folder=40, progress=False, log=messages.append)
    # a killed run: folder 1 has no metadata yet -> only it is made again, with the same result
    work = str(tmp_path / "resume")
    pf.generate(work, num=60, size=32, seed=1, workers=1, per_folder=40, progress=False, log=lambda m: None)
    wroot = os.path.join(work, "pathfinder32", "curv_contour_length_14")
    os.remove(os.path.join(wroot, "metadata", "1.npy"))
    stamp = os.path.join(wroot, pf.STAMP)
    import json

    with open(stamp) as f:
        st = json.load(f)
    st["complete"] = False
    with open(stamp, "w") as f:
        json.dump(st, f)
    messages = []
    pf.generate(work, num=60, size=32, seed=1, workers=1, per_folder=40, progress=False, log=messages.append)
    assert any("20 to make" in m for m in messages)
    assert read_metadata(wroot) == read_metadata(root)


@pytest.mark.integration
def test_cli_bad_size_is_one_line(tmp_path):
    r = pyrun.run([sys.executable, SCRIPT, "--dest", str(tmp_path), "--num", "2", "--size", "48",
                   "--no-progress"], capture_output=True, text=True,
                  env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(SCRIPT))))  # this checkout's package
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--size 48" in r.stderr
