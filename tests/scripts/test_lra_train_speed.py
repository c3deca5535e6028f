"""bench/lra_train_speed.sh: each LABEL=TREE[@ARGS] side trains through its tree's scripts/train_lra.sh with
its own extra options (commas between them), and the table names them. A stand-in train_lra.sh records
its arguments and writes fairseq-like log lines (no training here)."""
import os

import pytest
from tests import pyrun

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAKE_TRAIN_LRA = """#!/usr/bin/env bash
mkdir -p "$SAVE_DIR" "$LOG_DIR"
printf '%s\\n' "$@" > "$SAVE_DIR/argv"
for ups in 3.0 10.0 12.0 14.0; do echo "| train_inner | loss=1.5, ups=$ups, wpb=1" >> "$LOG_DIR/train.log"; done
"""


def test_each_side_gets_its_own_options(tmp_path):
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    (tree / "scripts" / "train_lra.sh").write_text(FAKE_TRAIN_LRA)
    out = tmp_path / "out"
    r = pyrun.run(
        ["bash", os.path.join(REPO, "bench", "lra_train_speed.sh"), "listops", "/data/listops", "50", "hgrn1",
         f"eager={tree}", f"graphs={tree}@--cuda-graphs,--pad-to-length,2001"],
        env=dict(os.environ, OUT=str(out)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    with open("/tmp/lra_speed/eager_hgrn1/argv") as f:
        assert f.read().split() == ["listops", "hgrn1", "/data/listops"]
    with open("/tmp/lra_speed/graphs_hgrn1/argv") as f:
        assert f.read().split() == ["listops", "hgrn1", "/data/listops", "--cuda-graphs", "--pad-to-length", "2001"]
    table = (out / "lra_train_speed.md").read_text().splitlines()
    # the median of the logged rates after the first (12.0 of 10, 12, 14) and the last loss
    assert "| eager | hgrn1 | 50 | 12.0 |" in table[2] and table[2].endswith("| 1.5 |")
    assert table[3].startswith("| graphs (--cuda-graphs --pad-to-length 2001) | hgrn1 | 50 | 12.0 |")
