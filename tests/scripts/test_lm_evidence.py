"""scripts/lm_evidence.sh: its corpus + BPE stage on a generated source tree, and its input checks.
(The training and evaluation stages are train_wt103.sh and evaluation.extrapolation, tested on their
own; the full run needs a GPU and is reported in docs/wikitext103.md.)"""
import json
import os

import pytest

from tests.fixtures_corpus import REPO, subprocess_env, write_source_tree
from tests import pyrun

pytestmark = pytest.mark.integration

SCRIPT = os.path.join(REPO, "scripts", "lm_evidence.sh")


def _run(env_extra, tmp_path):
    env = subprocess_env()
    env.update({k: str(v) for k, v in env_extra.items()})
    return pyrun.run(["bash", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_prep_only_builds_corpus_and_bpe_from_the_given_sources(tmp_path):
    src = tmp_path / "src"
    write_source_tree(str(src), n_docs=60)
    work = tmp_path / "work"
    r = _run(dict(WORKDIR=work, CORPUS_SOURCES=src, PREP_ONLY=1, SPM_VOCAB=150, TEST_FRACTION=0.1), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "corpus and BPE ready" in r.stdout
    manifest = json.load(open(work / "corpus" / "manifest.json"))
    assert str(src) in json.dumps(manifest)  # the corpus came from the given tree, not the stdlib
    for split in ("train", "valid", "test"):
        assert os.path.getsize(work / "spm" / f"{split}.bpe") > 0
    assert not (work / "data-bin").exists()  # PREP_ONLY stops before fairseq-preprocess


def test_bad_settings_are_named(tmp_path):
    r = _run(dict(WORKDIR=tmp_path / "w", MAX_UPDATE="lots"), tmp_path)
    assert r.returncode != 0 and "MAX_UPDATE=lots: expected a positive integer" in r.stderr
    r = _run(dict(WORKDIR=tmp_path / "w", CORPUS_SOURCES=tmp_path / "nowhere"), tmp_path)
    assert r.returncode != 0 and "is not a directory" in r.stderr
