"""The repository's import layout: bench/, scripts/, tests/ and data_prep/ import the package and each other as
packages, never by editing ``sys.path`` or loading a file by its path."""
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("bench", "scripts", "tests", "data_prep")
# tests/pyrun.py gives the commands it starts a fresh interpreter's sys.path; its client and test check that
OWN_PATH_HANDLING = {"tests/pyrun.py", "tests/pyrun_client.py", "tests/test_pyrun.py", "tests/test_layout.py"}
# a third-party file loaded by path on purpose (fairseq's GPT-2 BPE without importing fairseq and torch)
THIRD_PARTY_LOADS = ("_hgrn_gpt2_bpe_utils",)
PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove)|\[[^\]]*\]\s*=|\+=|=)|load_script|"
                       r"spec_from_file_location")


def path_edits(root, files):
    """``(file, line number, line)`` of every sys.path edit or by-path module load in ``files`` (under ``root``)."""
    hits = []
    for name in files:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if PATH_EDIT.search(line) and not any(name in line for name in THIRD_PARTY_LOADS):
                    hits.append((name, n, line.strip()))
    return hits


def tracked(folders):
    out = subprocess.run(["git", "ls-files", "--", *folders], cwd=REPO, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.split() if f.endswith((".py", ".sh")) and f not in OWN_PATH_HANDLING]


def test_no_sys_path_edits_outside_the_package():
    hits = path_edits(REPO, tracked(FOLDERS))
    assert not hits, "import as a package instead (python -m bench.NAME from the root):\n" + "\n".join(
        f"{f}:{n}: {line}" for f, n, line in hits)


def test_the_check_sees_each_kind_of_edit(tmp_path):
    lines = ["sys.path.insert(0, REPO)", "sys.path[:0] = [REPO]", "sys.path.append('bench')",
             "mod = load_script(path)", "spec = importlib.util.spec_from_file_location(name, path)",
             "import sys  # sys.path is read, not written: fine"]
    (tmp_path / "x.py").write_text("\n".join(lines) + "\n")
    assert [n for _, n, _ in path_edits(str(tmp_path), ["x.py"])] == [1, 2, 3, 4, 5]


def test_entry_point_folders_are_packages():
    for folder in ("bench", "bench/explore", "scripts", "data_prep"):
        assert os.path.isfile(os.path.join(REPO, folder, "__init__.py")), f"{folder}/__init__.py is missing"
