"""The suite's slowest files run first (tests/conftest.py, SLOW_FILES_FIRST; scripts/test.sh keeps the
collection order across its worker processes)."""
import os
import sys

from tests.conftest import SLOW_FILES_FIRST
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_listed_slow_file_exists():
    missing = [path for path in SLOW_FILES_FIRST if not os.path.isfile(os.path.join(REPO, path))]
    assert not missing, f"SLOW_FILES_FIRST names files that are gone (renamed?): {missing}"


def test_collection_starts_with_the_slow_files():
    # two of the listed files, given last and in reverse, and one file that is not listed, given first
    listed = [SLOW_FILES_FIRST[1], SLOW_FILES_FIRST[0]]
    other = "tests/criterions/test_classification_accuracy.py"
    out = pyrun.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                     other, *listed], cwd=REPO, capture_output=True, text=True, timeout=300).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    files = list(dict.fromkeys(i.split("::")[0] for i in ids))
    assert files == [SLOW_FILES_FIRST[0], SLOW_FILES_FIRST[1], other], files
