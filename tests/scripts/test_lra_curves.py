"""bench/lra_curves.py: validation curves of runs trained in slices, compared at the same update counts."""
import importlib
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
curves = importlib.import_module("bench.lra_curves")


def valid_line(acc, upd):
    return (f"1970-01-01 05:26:24 | INFO | valid | epoch 048 | valid on 'valid' subset | loss 2.2352 | examples 2000 | "
            f"accuracy {acc} | wps 1.03e+07 | wpb 127869 | bsz 125 | num_updates {upd} | best_accuracy {acc}\n")


def write(path, lines):
    with open(path, "w") as f:
        f.write("1970-01-01 | INFO | train_inner | epoch 001: 100 / 750 loss=2.1, accuracy=40.0, num_updates=100\n")
        f.writelines(lines)


def test_slices_merge_and_compare_at_the_same_updates(tmp_path, capsys):
    # run a: two slices; the first was cut after validating at 3000 without saving, the second
    # redid 2500-3000 and validated 3000 again (its value wins). slice10 must sort after slice9.
    write(tmp_path / "a_slice9_x.log", [valid_line(30, 1000), valid_line(35, 2500), valid_line(50, 3000)])
    write(tmp_path / "a_slice10_y.log", [valid_line(34, 3000), valid_line(33, 4000), valid_line(38, 5000)])
    write(tmp_path / "b_slice1.log", [valid_line(20, 1500), valid_line(45, 2600)])
    assert curves.main([str(tmp_path), "run a=a_slice*.log", "b=b_slice*.log", "--every", "2000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| best valid up to update | run a | b |"
    assert out[2] == "| 2,000 | 30.00 | 20.00 |"
    assert out[3] == "| 4,000 | 35.00 | - |"  # 3000 is 34 (the later slice), not the cut slice's 50
    assert out[4] == "| run's last update: best | 5,000: 38.00 | 2,600: 45.00 |"
    assert len(out) == 5


def test_bad_arguments_name_the_problem(tmp_path, capsys):
    write(tmp_path / "empty.log", [])
    for argv, message in (([str(tmp_path), "nothing"], "give each run as NAME=GLOB"),
                          ([str(tmp_path), "x=missing*.log"], "x: no log matches"),
                          ([str(tmp_path), "e=empty.log"], "have no validation line")):
        with pytest.raises(SystemExit):
            curves.main(argv)
        assert message in capsys.readouterr().err


def train_line(loss, acc, upd):
    return (f"1970-01-01 03:30:23 | INFO | train_inner | epoch 016:    550 / 750 loss={loss}, examples=12800, "
            f"accuracy={acc}, wps=1.39e+06, ups=10.49, wpb=132926, bsz=128, num_updates={upd}, lr=0.0004, gnorm=1.1\n")


def test_fit_gap_averages_the_last_window_of_training_lines(tmp_path, capsys):
    # run a: two slices; its last update is 1,000. The window of 300 holds the lines at 800, 900 and 1,000
    # (700 is outside: 1000 - 300 < u), and the second slice's 900 replaces the first's.
    with open(tmp_path / "a_slice1.log", "w") as f:
        f.writelines([train_line(2.0, 40.0, 700), train_line(1.9, 99.0, 900), valid_line(41, 900)])
    with open(tmp_path / "a_slice2.log", "w") as f:
        f.writelines([train_line(1.8, 50.0, 800), train_line(1.6, 53.0, 900), train_line(1.7, 56.0, 1000),
                      valid_line(45, 1000)])
    # run b: validation only, no training line in the window
    with open(tmp_path / "b_slice1.log", "w") as f:
        f.writelines([valid_line(30, 500)])
    assert curves.main([str(tmp_path), "a=a_slice*.log", "b=b_slice*.log", "--fit-gap", "300"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| run | last update | training lines in the last 300 |")
    # (50 + 53 + 56) / 3 = 53.0; (1.8 + 1.6 + 1.7) / 3 = 1.7; best valid 45: gap +8.0
    assert out[2] == "| a | 1,000 | 3 | 53.0 | 1.700 | 45.00 | +8.0 |"
    assert out[3] == "| b | 500 | 0 | - | - | 30.00 | - |"
    assert len(out) == 4
    with pytest.raises(SystemExit):
        curves.main([str(tmp_path), "a=a_slice*.log", "--fit-gap", "0"])
    assert "--fit-gap must be at least 1" in capsys.readouterr().err
