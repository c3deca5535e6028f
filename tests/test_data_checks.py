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
