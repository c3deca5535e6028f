"""Offline Pathfinder generator with the Long Range Arena settings.

The images follow the "snakes" procedure of Linsley et al. / Kim et al. (ICLR 2020), which LRA
used for ``pathfinder{32,64,128,256}``; this is our own implementation (numpy + Pillow), written
from the published description of the algorithm:

* A *snake* is a chain of short straight *paddles* (length ``paddle_length``, thickness
  ``paddle_thickness``, drawn at ``antialias_scale`` times the resolution and averaged down).
  Each paddle owns a *mask*, the paddle widened by ``margin`` pixels; a new paddle may not overlap
  the masks of earlier paddles (masks summing to >= 1.8 anywhere count as an overlap), except the
  one just before it on the same snake, so snakes neither cross nor touch each other.
* Growing a snake: the next pivot lies ``paddle_length + 2 * margin`` ahead of the last one along
  the last paddle's direction; the next paddle's far end is one of the pixels on the circle of
  radius ``paddle_length + margin`` around the pivot, chosen with probability proportional to
  ``cos(min(turn * continuity, pi / 2)) ** 2`` times ``1 - (occupancy, dilated by margin)``;
  up to three draws, then the snake fails. Paddles are separated by gaps of about
  ``2 * margin`` pixels, which is what makes the task hard for local models.
* Two *target* snakes of ``contour_length`` paddles start ``seed_distance`` pixels apart near the
  centre (the first start lies at least ``2 * seed_distance`` from every border) and grow in turns;
  any failure restarts the pair. Then ``num_distractor_snakes`` snakes of ``distractor_length``
  paddles are added where they fit (each tried up to five times, skipped after that).
* A circle marker (radius ``marker_radius``) goes on the start of one target snake; the second on
  the end of the same snake (label 1) or on the end of the other one (label 0).
* Target paddles have intensity ``paddle_contrast * snake_contrast``, distractors
  ``snake_contrast``, markers 1; the image is scaled so that its brightest pixel is 255 (as the
  original's ``scipy.misc.imsave`` did) and saved as an 8-bit grayscale PNG.

Deliberate differences from the original code (documented in docs/lra_data.md): labels are exactly
balanced (a balanced permutation per chunk of images instead of a coin flip per image); points are
rounded to the nearest pixel instead of up; antialiasing is a box filter on the finer grid instead
of Lanczos resampling; and every paddle is checked against the other target snake's newest paddle
and both target snakes' last paddles (the original skipped those, letting the two targets touch).

Settings (``--size``; from the docstrings of LRA's ``lra_benchmarks/data/pathfinder.py``):
32 is LRA's pathfinder32 (contour length 14, paddle length 2, marker radius 1.5, thickness 0.5,
antialias 2, seed distance 7, continuity 1.0, distractors 14 // 3 paddles x 20 // (14 // 3),
snake contrast 2, paddle contrast 0.75, margin 1, padding 1); 128 is LRA's pathfinder128 =
Path-X (paddle length 5, margin 2 or 3, seed distance 20, marker radius 3, thickness 1.5,
continuity 1.8, distractors 4 paddles x 8, snake contrast 0.9); 64 and 256 likewise.

Layout (the LRA release's)::

    DEST/pathfinder32/curv_contour_length_14/imgs/<k>/sample_<i>.png
    DEST/pathfinder32/curv_contour_length_14/metadata/<k>.npy   (text, one line per image:
        imgs/<k> sample_<i>.png <i> <label> <continuity> <contour length> <distractor length>
        <paddle length> <paddle thickness> <margin> <number of paddle contrasts>)

Work is cut into chunks of ``CHUNK`` images; chunk ``c`` of folder ``k`` draws from
``numpy.random.default_rng([seed, k, c])``, so the output depends on ``--seed`` only. A folder is
finished when its metadata file exists (written last, atomically): a killed run resumes from the
unfinished folders, and a finished one prints "up to date".

    python data_prep/lra_pathfinder.py --dest data/lra_generated --num 200000 --workers 16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

CHUNK = 100  # images per work unit
STAMP = "GENERATOR.json"
FORMAT = "hgrn-pathfinder-generator/1"


@dataclasses.dataclass(frozen=True)
class Settings:
    size: int
    padding: int
    paddle_length: int
    marker_radius: float
    contour_length: int
    paddle_thickness: float
    antialias_scale: int
    seed_distance: int
    continuity: float
    distractor_length: int
    num_distractor_snakes: int
    snake_contrast: float
    paddle_contrast: float
    paddle_margins: Tuple[int, ...]
    max_paddle_retrial: int = 2
    max_distractor_retrial: int = 4
    max_target_attempts: int = 200_000  # ours: a clear error instead of looping for ever

    @property
    def folder(self) -> str:
        return os.path.join(f"pathfinder{self.size}", DIFFICULTY_FOLDER[self.contour_length])


# The LRA release's three difficulties per size: contour length -> folder (LRA's task is 14).
DIFFICULTY_FOLDER = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}
# Numerator of the distractor count per size (``num_distractor_snakes = N // distractor_length``, as for
# the presets below, whose distractor length is 14 // 3): the easier difficulties use the same rule.
DISTRACTOR_BUDGET = {32: 20, 64: 22, 128: 35, 256: 30}


# Python 2 integer division in the original wrappers: 14 / 3 == 4, 35 / 4 == 8, ...
PRESETS: Dict[int, Settings] = {
    32: Settings(32, padding=1, paddle_length=2, marker_radius=1.5, contour_length=14,
                 paddle_thickness=0.5, antialias_scale=2, seed_distance=7, continuity=1.0,
                 distractor_length=14 // 3, num_distractor_snakes=20 // (14 // 3), snake_contrast=2.0,
                 paddle_contrast=0.75, paddle_margins=(1,)),
    64: Settings(64, padding=1, paddle_length=5, marker_radius=2.5, contour_length=14,
                 paddle_thickness=1.0, antialias_scale=2, seed_distance=12, continuity=1.8,
                 distractor_length=14 // 3, num_distractor_snakes=22 // (14 // 3), snake_contrast=0.8,
                 paddle_contrast=1.0, paddle_margins=(1,)),
    128: Settings(128, padding=1, paddle_length=5, marker_radius=3.0, contour_length=14,
                  paddle_thickness=1.5, antialias_scale=2, seed_distance=20, continuity=1.8,
                  distractor_length=14 // 3, num_distractor_snakes=35 // (14 // 3), snake_contrast=0.9,
                  paddle_contrast=1.0, paddle_margins=(2, 3)),
    256: Settings(256, padding=22, paddle_length=5, marker_radius=5.0, contour_length=14,
                  paddle_thickness=2.0, antialias_scale=2, seed_distance=27, continuity=1.8,
                  distractor_length=14 // 3, num_distractor_snakes=30 // (14 // 3), snake_contrast=1.0,
                  paddle_contrast=1.0, paddle_margins=(3,)),
}


class GenerationError(RuntimeError):
    pass


def settings_for(size: int, contour_length: int = 14) -> "Settings":
    """The preset of ``size`` at one of the release's contour lengths (6 = curv_baseline, 9, 14).

    Distractor snakes are ``contour_length // 3`` paddles long and ``DISTRACTOR_BUDGET[size] //`` that
    many, the rule the LRA-size presets follow at 14 (Python 2 integer division, as the original)."""
    if size not in PRESETS:
        raise ValueError(f"--size {size}: expected one of {sorted(PRESETS)} (LRA's pathfinder sizes)")
    if contour_length not in DIFFICULTY_FOLDER:
        raise ValueError(f"--contour-length {contour_length}: expected one of {sorted(DIFFICULTY_FOLDER)} "
                         f"(the release's curv_baseline, curv_contour_length_9, curv_contour_length_14)")
    dl = contour_length // 3
    return dataclasses.replace(PRESETS[size], contour_length=contour_length, distractor_length=dl,
                               num_distractor_snakes=DISTRACTOR_BUDGET[size] // dl)


# --------------------------------------------------------------------------------------------
# rasterisation: coverage of a thick segment, computed on the antialias grid, averaged per pixel
# --------------------------------------------------------------------------------------------
def coverage(p0, p1, radius: float, aa: int, height: int, width: int):
    """Pixels near the segment ``p0``-``p1`` (pixel units, (y, x), pixel centres at integers).

    A pixel is split into ``aa x aa`` sub-pixels; pixel centre ``c`` maps to sub-pixel ``aa * c``.
    A sub-pixel is lit when its centre lies within ``radius`` (sub-pixel units) of the segment.
    Returns ``(i0, j0, patch)`` with ``patch`` float64 [h, w], the lit fraction of each pixel of
    rows ``i0:i0+h`` and columns ``j0:j0+w`` (clipped to the image), or None when outside it.
    """
    b0y, b0x = p0[0] * aa, p0[1] * aa
    b1y, b1x = p1[0] * aa, p1[1] * aa
    i0 = max(int(math.floor(min(b0y, b1y) - radius)) // aa, 0)
    i1 = min(int(math.ceil(max(b0y, b1y) + radius)) // aa + 1, height)
    j0 = max(int(math.floor(min(b0x, b1x) - radius)) // aa, 0)
    j1 = min(int(math.ceil(max(b0x, b1x) + radius)) // aa + 1, width)
    if i0 >= i1 or j0 >= j1:
        return None
    ys = np.arange(i0 * aa, i1 * aa, dtype=np.float64)[:, None] - b0y
    xs = np.arange(j0 * aa, j1 * aa, dtype=np.float64)[None, :] - b0x
    dy, dx = b1y - b0y, b1x - b0x
    n2 = dy * dy + dx * dx
    if n2 > 0:
        t = np.clip((ys * dy + xs * dx) / n2, 0.0, 1.0)
        ry, rx = ys - t * dy, xs - t * dx
    else:
        ry, rx = ys, xs
    lit = (ry * ry + rx * rx) <= radius * radius + 1e-9
    patch = lit.reshape(i1 - i0, aa, j1 - j0, aa).mean(axis=(1, 3))
    return i0, j0, patch


def _paste_max(canvas: np.ndarray, item, scale: float = 1.0) -> None:
    i0, j0, patch = item
    view = canvas[i0:i0 + patch.shape[0], j0:j0 + patch.shape[1]]
    np.maximum(view, patch * scale if scale != 1.0 else patch, out=view)


def _overlaps(mask: np.ndarray, item, limit: float = 1.8) -> bool:
    i0, j0, patch = item
    return bool((mask[i0:i0 + patch.shape[0], j0:j0 + patch.shape[1]] + patch).max() >= limit)


def _disk_offsets(r: int) -> np.ndarray:
    y, x = np.mgrid[-r:r + 1, -r:r + 1]
    keep = y * y + x * x <= r * r
    return np.stack([y[keep], x[keep]], axis=1)


# --------------------------------------------------------------------------------------------
# one image
# --------------------------------------------------------------------------------------------
class _Geometry:
    """Constants of one (settings, margin): candidate circle, dilation disk, cached patches.

    Every paddle starts on a whole pixel, and a whole-pixel shift is a whole-block shift on the
    antialias grid, so a paddle's coverage depends on its direction only: patches are computed
    once per direction (relative to the start pixel) and pasted. Canvases carry a frame of
    ``pad`` pixels (occupied in the masks) so that nothing needs clipping.
    """

    def __init__(self, s: Settings, margin: int):
        aa = s.antialias_scale
        if abs(s.paddle_thickness * aa - round(s.paddle_thickness * aa)) > 1e-9:
            raise ValueError(f"paddle thickness {s.paddle_thickness} x antialias scale {aa} must be a "
                             f"whole number of sub-pixels")
        self.s, self.margin = s, margin
        self.line_r = s.paddle_thickness * aa / 2.0
        self.mask_r = self.line_r + margin * aa
        L = s.paddle_length
        self.pad = L + 3 * margin + int(math.ceil(max(s.marker_radius, s.paddle_thickness))) + 4
        self.full = s.size + 2 * self.pad
        step = L + margin
        # one candidate per pixel of arc on the circle of radius `step` around the pivot
        angles = np.deg2rad(np.arange(0.0, 360.0, 360.0 / (2 * step * math.pi)))
        offs = np.stack([np.rint(step * np.sin(angles)), np.rint(step * np.cos(angles))], 1).astype(int)
        self.cand = np.unique(offs, axis=0)
        self.cand_angle = np.arctan2(self.cand[:, 0], self.cand[:, 1])
        dil = _disk_offsets(margin)
        self.cand_dil_y = self.cand[:, 0][:, None] + dil[None, :, 0] + self.pad
        self.cand_dil_x = self.cand[:, 1][:, None] + dil[None, :, 1] + self.pad
        # extension paddles run from the candidate back towards the pivot
        self.cand_line = [self._rel(a + math.pi, self.line_r) for a in self.cand_angle]
        self.cand_mask = [self._rel(a + math.pi, self.mask_r) for a in self.cand_angle]
        self.marker = self._rel(0.0, s.marker_radius * aa, length=0.0)
        self._seed_cache: Dict[int, tuple] = {}
        self._target_free: Dict[int, np.ndarray] = {}
        self._turn: Dict[float, np.ndarray] = {}
        P, n, p = self.pad, s.size, s.padding
        self.empty_mask = np.ones((self.full, self.full))  # the frame and LRA's `padding` border
        self.empty_mask[P + p:P + n - p, P + p:P + n - p] = 0.0
        self.scratch = (np.zeros((self.full, self.full)), np.zeros((self.full, self.full)))

    def turn_weights(self, angle: float) -> np.ndarray:
        """cos(min(turn x continuity, pi/2))^2 of each candidate after a paddle along ``angle``
        (an integer degree or a candidate's angle: few distinct values, so cached)."""
        w = self._turn.get(angle)
        if w is None:
            turn = np.abs(self.cand_angle - angle)
            turn = np.minimum(turn, 2 * math.pi - turn)
            w = self._turn[angle] = np.cos(np.minimum(turn * self.s.continuity, math.pi / 2)) ** 2
        return w

    def _rel(self, angle: float, radius: float, length: Optional[float] = None):
        s = self.s
        length = s.paddle_length if length is None else length
        c = int(math.ceil(length + radius / s.antialias_scale)) + 2
        i0, j0, patch = coverage((c, c), (c + length * math.sin(angle), c + length * math.cos(angle)),
                                 radius, s.antialias_scale, 2 * c + 1, 2 * c + 1)
        return i0 - c, j0 - c, patch

    def at(self, rel, p) -> tuple:
        """A cached patch placed with its start on image pixel ``p`` (padded coordinates)."""
        di, dj, patch = rel
        return p[0] + self.pad + di, p[1] + self.pad + dj, patch

    def seed_patches(self, degree: int) -> tuple:
        """(line, mask, stencil) of a first paddle along ``degree``; the stencil lists the pixels
        (relative to the start) that its mask mostly covers."""
        hit = self._seed_cache.get(degree)
        if hit is None:
            th = math.radians(degree)
            line, mask = self._rel(th, self.line_r), self._rel(th, self.mask_r)
            ys, xs = np.nonzero(mask[2] >= 0.5)
            hit = (line, mask, np.stack([ys + mask[0], xs + mask[1]], 1))
            self._seed_cache[degree] = hit
        return hit

    def free_starts(self, occupied_padded: np.ndarray, degree: int) -> np.ndarray:
        """Flat indices of image pixels where a first paddle along ``degree`` misses ``occupied``."""
        n, P = self.s.size, self.pad
        blocked = np.zeros((n, n), dtype=bool)
        for dy, dx in self.seed_patches(degree)[2]:
            blocked |= occupied_padded[P + dy:P + dy + n, P + dx:P + dx + n]
        return np.flatnonzero(~blocked)

    def target_free(self, degree: int, empty_occupied: np.ndarray) -> np.ndarray:
        hit = self._target_free.get(degree)
        if hit is None:
            hit = self._target_free[degree] = self.free_starts(empty_occupied, degree)
        return hit


class _Canvas:
    def __init__(self, s: Settings, g: _Geometry, rng: np.random.Generator):
        self.s, self.g, self.rng = s, g, rng
        self.mask = g.empty_mask.copy()

    def _in(self, p) -> bool:
        return 0 <= p[0] < self.s.size and 0 <= p[1] < self.s.size

    def seed(self, occupied: Optional[np.ndarray] = None, tail=None, target: bool = False):
        """A first paddle: a free start (or the given ``tail``) and a random direction."""
        s, g, rng = self.s, self.g, self.rng
        L, m, n = s.paddle_length, g.margin, s.size
        for _ in range(s.max_paddle_retrial + 1):
            degree = int(rng.integers(-180, 180))
            th = math.radians(degree)
            if tail is None:
                free = g.target_free(degree, occupied) if target else g.free_starts(occupied, degree)
                if free.size == 0:
                    return None
                k = int(free[rng.integers(free.size)])
                start = (k // n, k % n)
            else:
                start = tail
            head = (round(start[0] + L * math.sin(th)), round(start[1] + L * math.cos(th)))
            pivot = (round(head[0] - (L + m) * math.sin(th)), round(head[1] - (L + m) * math.cos(th)))
            if self._in(head) and self._in(pivot) and self._in(start):
                line, mask, _ = g.seed_patches(degree)
                end = (start[0] + L * math.sin(th), start[1] + L * math.cos(th))
                return {"tip": start, "origin": start, "pivot": pivot, "angle": th,
                        "lines": [g.at(line, start)], "masks": [g.at(mask, start)],
                        "segments": [(start, end)]}
        return None

    def extend(self, snake: dict, blocked: Sequence[np.ndarray]) -> bool:
        """Add one paddle to ``snake`` avoiding the union (maximum) of the ``blocked`` masks
        (padded canvases); False when none fits."""
        s, g, rng = self.s, self.g, self.rng
        L, m = s.paddle_length, g.margin
        th = snake["angle"]
        py = round(snake["pivot"][0] + (L + 2 * m) * math.sin(th))
        px = round(snake["pivot"][1] + (L + 2 * m) * math.cos(th))
        # occupancy dilated by the margin, read at the candidates (the frame is occupied, so
        # candidates outside the image get weight 0)
        iy, ix = g.cand_dil_y + py, g.cand_dil_x + px
        occ = blocked[0][iy, ix]
        for other in blocked[1:]:
            occ = np.maximum(occ, other[iy, ix])
        occ = occ.max(axis=1)
        w = g.turn_weights(th) * (1.0 - occ)
        total = w.sum()
        if total < 1e-4:
            return False
        cmf = np.cumsum(w)
        for _ in range(s.max_paddle_retrial + 1):
            k = min(int(np.searchsorted(cmf, rng.random() * total, side="right")), len(cmf) - 1)
            head = (py + int(g.cand[k, 0]), px + int(g.cand[k, 1]))
            mask = g.at(g.cand_mask[k], head)
            if any(_overlaps(b, mask) for b in blocked):
                continue
            back = g.cand_angle[k] + math.pi
            snake["segments"].append(((head[0] + L * math.sin(back), head[1] + L * math.cos(back)), head))
            snake["tip"] = head
            snake["pivot"] = (py, px)
            snake["angle"] = float(g.cand_angle[k])
            snake["lines"].append(g.at(g.cand_line[k], head))
            snake["masks"].append(mask)
            return True
        return False


def _target_occupied(s: Settings, g: _Geometry) -> np.ndarray:
    """Where the first target paddle may not go: the frame, the border and 2 x seed distance."""
    occ = np.ones((g.full, g.full), dtype=bool)
    lo, hi = g.pad + max(2 * s.seed_distance, s.padding), g.pad + s.size - max(2 * s.seed_distance, s.padding)
    occ[lo:hi, lo:hi] = False
    return occ


def _targets(c: _Canvas, empty_occupied: np.ndarray) -> Optional[List[dict]]:
    s = c.s
    first = c.seed(empty_occupied, target=True)
    if first is None:
        return None
    second = None
    for _ in range(s.max_paddle_retrial + 1):
        phi = math.radians(int(c.rng.integers(0, 360)))
        tail = (round(first["tip"][0] + s.seed_distance * math.sin(phi)),
                round(first["tip"][1] + s.seed_distance * math.cos(phi)))
        second = c.seed(tail=tail)
        if second is not None:
            break
    if second is None:
        return None
    snakes = [first, second]
    # each target's newest paddle mask, alone on a canvas: the other target must avoid it
    # (two scratch canvases kept by the geometry; only the one patch on each is ever non-zero)
    newest = c.g.scratch
    for i in (0, 1):
        _paste_max(newest[i], snakes[i]["masks"][-1])
    try:
        for _ in range(s.contour_length - 1):
            for i in (0, 1):
                if not c.extend(snakes[i], (c.mask, newest[1 - i])):
                    return None
                prev = snakes[i]["masks"][-2]
                _paste_max(c.mask, prev)  # the previous paddle is settled now
                _clear(newest[i], prev)
                _paste_max(newest[i], snakes[i]["masks"][-1])
    finally:
        for i in (0, 1):
            _clear(newest[i], snakes[i]["masks"][-1])
    for sn in snakes:
        _paste_max(c.mask, sn["masks"][-1])
    return snakes


def _clear(canvas: np.ndarray, item) -> None:
    i0, j0, patch = item
    canvas[i0:i0 + patch.shape[0], j0:j0 + patch.shape[1]] = 0.0


def _distractor(c: _Canvas) -> Optional[dict]:
    s, g = c.s, c.g
    occupied = c.mask > 0.3
    P, n = g.pad, s.size
    if (~occupied[P:P + n, P:P + n]).mean() < 0.01:
        return None
    snake = c.seed(occupied)
    if snake is None:
        return None
    saved = c.mask.copy()
    for _ in range(s.distractor_length - 1):
        if not c.extend(snake, (c.mask,)):
            c.mask = saved
            return None
        _paste_max(c.mask, snake["masks"][-2])
    _paste_max(c.mask, snake["masks"][-1])
    return snake


def render(s: Settings, rng: np.random.Generator, label: int, with_geometry: bool = False) -> dict:
    """One Pathfinder image with the given label.

    Returns {"image": uint8 [size, size], "label", "margin"} and, with ``with_geometry``,
    "targets" (two lists of (start, end) paddle segments, in order along each snake),
    "distractors" (their segments), "markers" (two (y, x) pixels, both ends of snakes) and
    "trace": bool [2, size * TRACE_SCALE, size * TRACE_SCALE], each target snake's centre line,
    gaps between paddles included -- what "a path" means, without distractors or intensities.
    """
    if label not in (0, 1):
        raise ValueError(f"label {label!r}: expected 0 or 1")
    margins = s.paddle_margins
    margin = int(margins[int(rng.integers(len(margins)))]) if len(margins) > 1 else int(margins[0])
    g = _geometry(s, margin)
    empty = _target_occupied(s, g)
    for _ in range(s.max_target_attempts):
        c = _Canvas(s, g, rng)
        targets = _targets(c, empty)
        if targets is not None:
            break
    else:
        raise GenerationError(f"no pair of target snakes fitted in {s.max_target_attempts} attempts "
                              f"(size {s.size}, contour length {s.contour_length})")
    distractors = []
    for _ in range(s.num_distractor_snakes):
        for _ in range(s.max_distractor_retrial + 1):
            d = _distractor(c)
            if d is not None:
                distractors.append(d)
                break
    image = np.zeros((g.full, g.full))
    target_contrast = s.paddle_contrast * s.snake_contrast
    for sn in targets:
        for item in sn["lines"]:
            _paste_max(image, item, target_contrast)
    for sn in distractors:
        for item in sn["lines"]:
            _paste_max(image, item, s.snake_contrast)
    first = int(rng.integers(2))
    second = first if label == 1 else 1 - first
    markers = [targets[first]["origin"], targets[second]["tip"]]
    for p in markers:
        _paste_max(image, g.at(g.marker, p))
    image = image[g.pad:g.pad + s.size, g.pad:g.pad + s.size]
    out = {"image": np.rint(image * (255.0 / image.max())).astype(np.uint8), "label": label,
           "margin": margin}
    if with_geometry:
        out["targets"] = [sn["segments"] for sn in targets]
        out["markers"] = markers
        out["distractors"] = [sn["segments"] for sn in distractors]
        out["trace"] = _trace(s, targets)
    return out


TRACE_SCALE = 8


def _trace(s: Settings, targets: List[dict]) -> np.ndarray:
    """Each target snake's centre line (paddles and the gaps between them) on a grid ``TRACE_SCALE``
    times finer than the image, one sub-pixel wide; pixel centre ``c`` is sub-pixel ``c * scale``.
    bool [2, size * scale, size * scale]: one picture per snake, since two snakes may cross where
    both have a gap between paddles (as in the original generator)."""
    k, n = TRACE_SCALE, s.size
    out = np.zeros((len(targets), n * k, n * k), dtype=bool)
    for si, sn in enumerate(targets):
        big = out[si]
        points = [p for seg in sn["segments"] for p in seg]
        for p0, p1 in zip(points[:-1], points[1:]):
            i0, j0, patch = coverage(p0, p1, 0.5, k, n, n)
            ys, xs = np.nonzero(patch > 0)
            # coverage() averages sub-pixels per pixel; redo the lit test on the fine grid itself
            for y, x in zip(ys + i0, xs + j0):
                yy = np.arange(y * k, (y + 1) * k, dtype=float)[:, None] - p0[0] * k
                xx = np.arange(x * k, (x + 1) * k, dtype=float)[None, :] - p0[1] * k
                dy, dx = (p1[0] - p0[0]) * k, (p1[1] - p0[1]) * k
                n2 = dy * dy + dx * dx
                t = np.clip((yy * dy + xx * dx) / n2, 0, 1) if n2 > 0 else 0.0
                big[y * k:(y + 1) * k, x * k:(x + 1) * k] |= (yy - t * dy) ** 2 + (xx - t * dx) ** 2 <= 0.25 + 1e-9
    return out


_GEOMETRY: Dict[Tuple[Settings, int], _Geometry] = {}


def _geometry(s: Settings, margin: int) -> _Geometry:
    key = (s, margin)
    if key not in _GEOMETRY:
        _GEOMETRY[key] = _Geometry(s, margin)
    return _GEOMETRY[key]


# --------------------------------------------------------------------------------------------
# the data set
# --------------------------------------------------------------------------------------------
def chunk_labels(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` labels, half 0 and half 1 (the odd one out drawn), in random order."""
    labels = np.array([0, 1] * (n // 2) + ([int(rng.integers(2))] if n % 2 else []), dtype=np.int64)
    return rng.permutation(labels)


def metadata_line(s: Settings, folder: int, index: int, label: int, margin: int) -> str:
    """One line of ``metadata/<folder>.npy`` in the LRA release's format."""
    return (f"imgs/{folder} sample_{index}.png {index} {label} {s.continuity} {s.contour_length} "
            f"{s.distractor_length} {s.paddle_length} {s.paddle_thickness} {margin} 1")


def _save_png(image: np.ndarray, path: str) -> None:
    from PIL import Image

    tmp = path + ".tmp"
    Image.fromarray(image).save(tmp, format="PNG")
    os.replace(tmp, path)


def _work(job) -> Tuple[int, int, List[str], List[int]]:
    s, root, seed, folder, chunk, start, count = job
    rng = np.random.default_rng([seed, folder, chunk])
    labels = chunk_labels(rng, count)
    lines, made = [], []
    img_dir = os.path.join(root, "imgs", str(folder))
    for j in range(count):
        i = start + j
        out = render(s, rng, int(labels[j]))
        _save_png(out["image"], os.path.join(img_dir, f"sample_{i}.png"))
        lines.append(metadata_line(s, folder, i, out["label"], out["margin"]))
        made.append(out["label"])
    return folder, chunk, lines, made


def generate(dest: str, num: int, size: int = 32, seed: int = 0, workers: int = 1,
             per_folder: int = 1000, log=print, progress: bool = True, contour_length: int = 14) -> dict:
    """Write ``num`` images and their metadata under ``dest/pathfinder<size>/curv_contour_length_14``
    (``curv_baseline`` / ``curv_contour_length_9`` for ``contour_length`` 6 / 9)."""
    s = settings_for(size, contour_length)
    if num < 1:
        raise ValueError(f"--num {num}: expected a positive number of images")
    if per_folder < 1:
        raise ValueError(f"--per-folder {per_folder}: expected a positive number")
    root = os.path.join(dest, s.folder)
    opts = {"num": num, "size": size, "seed": seed, "per_folder": per_folder, "chunk": CHUNK,
            "settings": dataclasses.asdict(s)}
    opts["settings"]["paddle_margins"] = list(s.paddle_margins)
    stamp_path = os.path.join(root, STAMP)
    if os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            old = json.load(f)
        if old.get("options") != opts:
            raise ValueError(f"{root} holds images made with other options ({stamp_path}); "
                             f"use another --dest or delete that folder")
        if old.get("complete"):
            log(f"[pathfinder] {root}: up to date ({num} images; delete {STAMP} to regenerate)")
            return old
    os.makedirs(os.path.join(root, "metadata"), exist_ok=True)
    _write_json(stamp_path, {"format": FORMAT, "options": opts, "complete": False})
    folders = [(k, min(per_folder, num - k * per_folder)) for k in range((num + per_folder - 1) // per_folder)]
    jobs, pending = [], {}
    for k, n_k in folders:
        if os.path.isfile(os.path.join(root, "metadata", f"{k}.npy")):
            continue
        os.makedirs(os.path.join(root, "imgs", str(k)), exist_ok=True)
        chunks = [(c, c * CHUNK, min(CHUNK, n_k - c * CHUNK)) for c in range((n_k + CHUNK - 1) // CHUNK)]
        pending[k] = {"left": len(chunks), "lines": {}}
        jobs += [(s, root, seed, k, c, start, count) for c, start, count in chunks]
    todo = sum(j[-1] for j in jobs)
    if todo < num:
        log(f"[pathfinder] resuming: {num - todo} images already done, {todo} to make")
    t0 = time.time()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=todo, desc=f"pathfinder{size}", unit="img", file=sys.stderr)
    pool = multiprocessing.Pool(workers) if workers > 1 and len(jobs) > 1 else None
    try:
        results = pool.imap_unordered(_work, jobs) if pool else map(_work, jobs)
        for k, c, lines, _ in results:
            pending[k]["lines"][c] = lines
            pending[k]["left"] -= 1
            if pending[k]["left"] == 0:
                text = "".join(line + "\n" for cc in sorted(pending[k]["lines"]) for line in pending[k]["lines"][cc])
                path = os.path.join(root, "metadata", f"{k}.npy")
                with open(path + ".tmp", "w") as f:
                    f.write(text)
                os.replace(path + ".tmp", path)
                del pending[k]
            if bar is not None:
                bar.update(len(lines))
    finally:
        if pool is not None:
            pool.terminate()
        if bar is not None:
            bar.close()
    seconds = time.time() - t0
    counts = [0, 0]
    for k, _ in folders:
        with open(os.path.join(root, "metadata", f"{k}.npy")) as f:
            for line in f:
                counts[int(line.split()[3])] += 1
    stamp = {"format": FORMAT, "options": opts, "complete": True, "images": num, "labels": counts,
             "folders": len(folders), "seconds_last_run": round(seconds, 1), "workers": workers,
             "images_per_second_last_run": round(todo / seconds, 1) if seconds > 0 and todo else None}
    _write_json(stamp_path, stamp)
    log(f"[pathfinder] {root}: {num} images in {len(folders)} folders, labels 0/1 = {counts[0]}/{counts[1]} "
        f"({todo} made in {seconds:.1f} s on {workers} workers)")
    return stamp


def _write_json(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", required=True, help="output folder; pathfinder<size>/curv_contour_length_14/ inside")
    p.add_argument("--num", type=int, required=True, help="number of images (LRA: 200000)")
    p.add_argument("--size", type=int, default=32, help="32 (Pathfinder), 128 (Path-X), 64 or 256")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--per-folder", type=int, default=1000, help="images per imgs/<k> folder (LRA: 1000)")
    p.add_argument("--contour-length", type=int, default=14,
                   help="6 (the release's curv_baseline), 9 or 14 (default: LRA's task, curv_contour_length_14)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    try:
        generate(a.dest, a.num, a.size, a.seed, max(1, a.workers), a.per_folder, progress=not a.no_progress,
                 contour_length=a.contour_length)
    except (ValueError, GenerationError) as e:
        print(f"lra_pathfinder.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
