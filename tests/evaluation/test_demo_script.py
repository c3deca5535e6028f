"""scripts/demo.sh: argument handling (the full run takes minutes; it is timed by hand, see the
issue note). Bad options must fail at once, before any work, with a one-line reason."""
import os

from tests import fixtures_corpus
from tests import pyrun

DEMO = os.path.join(fixtures_corpus.REPO, "scripts", "demo.sh")


def _run(*args):
    return pyrun.run(["bash", DEMO, *args], capture_output=True, text=True, timeout=60,
                     env=fixtures_corpus.subprocess_env())


def test_syntax_and_help():
    assert pyrun.run(["bash", "-n", DEMO]).returncode == 0
    proc = _run("--help")
    assert proc.returncode == 0 and "--workdir" in proc.stdout and "--max-update" in proc.stdout


def test_bad_options_fail_fast(tmp_path):
    proc = _run("--max-update", "abc", "--workdir", str(tmp_path / "w"))
    assert proc.returncode != 0 and "--max-update abc: expected a positive integer" in proc.stderr
    assert not (tmp_path / "w").exists()  # nothing was done
    proc = _run("--bogus")
    assert proc.returncode != 0 and "unknown option --bogus" in proc.stderr
