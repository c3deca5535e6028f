"""data_checks: how a dictionary mismatch is described, and damaged binarised splits named by file."""
import os

import pytest

from hgrn_fairseq.data_checks import DataError, compare_fingerprints, data_fingerprint, dictionary_difference


def write_dict(directory, words):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "dict.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{w} 1\n" for w in words)
    return str(directory)


def refusal(tmp_path, trained_words, given_words):
    a = write_dict(tmp_path / "a", trained_words)
    b = write_dict(tmp_path / "b", given_words)
    with pytest.raises(DataError) as e:
        compare_fingerprints(data_fingerprint(a), data_fingerprint(b), b, "the checkpoint")
    msg = str(e.value)
    assert "\n" not in msg
    assert f"another dictionary than {b}/dict.txt (trained with {a}/dict.txt; " in msg
    return msg


def test_dictionaries_of_19_and_801_entries_are_a_size_mismatch(tmp_path):
    # 15 and 797 lines of dict.txt, plus fairseq's four specials
    msg = refusal(tmp_path, [f"w{i}" for i in range(15)], [f"w{i}" for i in range(797)])
    assert "size mismatch: 19 entries in training vs 801 now" in msg and "same size" not in msg


def test_same_size_names_the_first_differing_symbol_and_its_line(tmp_path):
    words = [f"w{i}" for i in range(30)]
    other = list(words)
    other[11], other[20] = "x11", "x20"
    msg = refusal(tmp_path, words, other)
    assert "same size (34 entries), different symbols: first at id 15 (dict.txt line 12), 'w11' in training vs 'x11' now" in msg


def test_the_same_dictionary_elsewhere_is_accepted(tmp_path):
    words = ["a", "b", "c"]
    a, b = write_dict(tmp_path / "a", words), write_dict(tmp_path / "b", words)
    compare_fingerprints(data_fingerprint(a), data_fingerprint(b), b, "the checkpoint")


def test_a_record_from_before_symbols_were_kept_compares_by_size():
    old = {"dictionary_sha256": "0" * 64, "dictionary_size": 9}
    assert dictionary_difference(old, {"dictionary_sha256": "1" * 64, "dictionary_size": 9,
                                       "dictionary_symbols": list("abcdefghi")}) == \
        "same size (9 entries), different symbols"
    assert dictionary_difference(old, {"dictionary_size": 10}) == "size mismatch: 9 entries in training vs 10 now"


def test_a_special_symbol_that_differs_is_named_as_one():
    a = {"dictionary_size": 5, "dictionary_symbols": ["<s>", "<pad>", "</s>", "<unk>", "x"], "nspecial": 4}
    b = {"dictionary_size": 5, "dictionary_symbols": ["<s>", "<pad>", "</s>", "<UNK>", "x"], "nspecial": 4}
    assert "first at id 3 (special symbol #3), '<unk>' in training vs '<UNK>' now" in dictionary_difference(a, b)


# ---- a damaged .idx / .bin is named, with the command that rebuilds it --------------------------
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from hgrn_fairseq.data_checks import check_split  # noqa: E402
from tests.lm_corpus import binarise, write_corpus  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    write_corpus(str(root / "text"), sizes={"train": 40, "valid": 10, "test": 10})
    return binarise(str(root / "text"), str(root / "bin"))


def damaged_copy(data, tmp_path, file, keep):
    """A copy of the data whose ``file`` keeps its first ``keep`` bytes (negative: all but the last -keep)."""
    out = tmp_path / "copy"
    shutil.copytree(data, out)
    blob = (out / file).read_bytes()
    (out / file).write_bytes(blob[:keep])
    return out


# 26 header bytes (magic, version, dtype code, count), then 4 bytes of size and 8 of offset per line:
# cut in the magic, in the header, in the sizes, in the offsets, one byte short
@pytest.mark.integration  # the module fixture binarises with fairseq-preprocess
@pytest.mark.parametrize("keep", [0, 5, 20, 40, -9, -1])
def test_a_truncated_index_names_the_file_and_the_fix(data, tmp_path, keep):
    out = damaged_copy(data, tmp_path, "valid.idx", keep)
    with pytest.raises(DataError) as e:
        check_split(str(out / "valid"), 10_000)
    msg = str(e.value)
    assert msg.startswith(f"{out}/valid.idx is truncated (") and "re-run fairseq-preprocess" in msg, msg


@pytest.mark.integration  # the module fixture binarises with fairseq-preprocess
def test_an_index_with_offsets_that_do_not_follow_the_sizes_is_damaged(data, tmp_path):
    out = damaged_copy(data, tmp_path, "valid.idx", None)
    blob = bytearray((out / "valid.idx").read_bytes())
    blob[-8:] = (10**9).to_bytes(8, "little")  # the last sequence's byte offset
    (out / "valid.idx").write_bytes(bytes(blob))
    with pytest.raises(DataError, match=r"valid.idx is damaged \(the byte offset of sequence 9 .*re-run fairseq-preprocess"):
        check_split(str(out / "valid"), 10_000)


@pytest.mark.integration  # the module fixture binarises with fairseq-preprocess
@pytest.mark.parametrize("keep,state", [(-2, "truncated"), (1, "truncated")])
def test_a_truncated_bin_names_the_file_and_the_fix(data, tmp_path, keep, state):
    out = damaged_copy(data, tmp_path, "valid.bin", keep)
    with pytest.raises(DataError, match=rf"^{out}/valid.bin is {state}: .*re-run fairseq-preprocess"):
        check_split(str(out / "valid"), 10_000)


@pytest.mark.integration  # the module fixture binarises with fairseq-preprocess
def test_the_intact_split_passes(data):
    tokens, max_id = check_split(os.path.join(data, "valid"), 10_000)
    assert tokens == os.path.getsize(os.path.join(data, "valid.bin")) // 2 and 4 <= max_id < 10_000


@pytest.mark.integration  # the module fixture binarises with fairseq-preprocess
def test_check_lm_data_reports_a_truncated_index_in_one_line(data, tmp_path):
    out = damaged_copy(data, tmp_path, "train.idx", 40)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "check_lm_data.py"), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert f"{out}/train.idx is truncated" in proc.stderr and "Traceback" not in proc.stderr
