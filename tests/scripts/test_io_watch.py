"""bench/io_watch.sh: the sampler stops with the process it watches, and its summary names the hot samples."""
import os
import subprocess
import time
from tests import pyrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "io_watch.sh")


def test_sampler_writes_lines_and_stops_with_its_parent(tmp_path):
    log = tmp_path / "io.log"
    parent = subprocess.Popen(["sleep", "2"])
    sampler = subprocess.Popen(["bash", SCRIPT, str(log), str(parent.pid)], env=dict(os.environ, IO_WATCH_S="0.5"))
    parent.wait()  # (reaped: a zombie would still answer kill -0)
    t0 = time.monotonic()
    try:
        rc = sampler.wait(timeout=15)  # ends by itself once the parent has
    finally:
        sampler.kill()
    assert rc == 0 and time.monotonic() - t0 < 15
    lines = log.read_text().splitlines()
    assert lines[0].split() == ["time", "dirty_kB", "writeback_kB", "io_some_avg10", "io_full_avg10", "gpu_util"]
    assert len(lines) >= 2 and all(len(line.split()) == 6 for line in lines[1:])
    assert all(line.split()[1].isdigit() and line.split()[2].isdigit() for line in lines[1:])


def test_summary_flags_pressure_and_writeback(tmp_path):
    log = tmp_path / "io.log"
    log.write_text("time dirty_kB writeback_kB io_some_avg10 io_full_avg10 gpu_util\n"
                   "21:48:00 100 0 0.00 0.00 99\n"
                   "21:48:10 5000 204800 80.5 75.25 0\n"  # writeback 200 MiB, I/O stalled
                   "21:48:20 100 10 12.00 11.00 0\n"      # pressure only
                   "21:48:30 100 0 0.00 0.00 98\n")
    out = pyrun.run(["bash", SCRIPT, "--summary", str(log)], capture_output=True, text=True,
                    timeout=30).stdout
    assert "io_watch: 4 samples, max writeback 204800 kB, max I/O pressure full avg10 75.2%" in out
    flagged = out.split("samples with full avg10 >= 10% or writeback >= 100 MiB:")[1].split("\n")
    assert [line.split()[0] for line in flagged if line.strip()] == ["21:48:10", "21:48:20"]
    empty = tmp_path / "none.log"
    assert "io_watch: no samples" in pyrun.run(["bash", SCRIPT, "--summary", str(empty)],
                                               capture_output=True, text=True, timeout=30).stdout
