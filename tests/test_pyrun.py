"""tests/pyrun.py against a real interpreter: the warm server must give a command what a fresh
``python`` gives it (argv, sys.path, environment, working directory, streams, exit status, logging)."""
import os
import subprocess
import sys
import time

import pytest

from tests import pyrun

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not pyrun._enabled(), reason="tests/pyrun.py serves only the CPU suite "
                                 "(TRITON_INTERPRET=1, HGRN_TEST_REAL_PYTHON unset)")]

PROBE = r"""
import json, logging, os, sys
logging.getLogger("probe").info("info before fairseq")
import fairseq  # noqa: F401  (its import sets up logging in a fresh interpreter)
logging.getLogger("probe").info("info after fairseq")
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                  "env": os.environ.get("PYRUN_PROBE"), "stdin": sys.stdin.read(),
                  "root": [logging.getLogger().level, len(logging.getLogger().handlers)]}))
sys.stderr.write("to stderr\n")
sys.exit(int(sys.argv[-1]))
"""


def both(cmd, **kwargs):
    fast = pyrun.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    real = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    return fast, real


def last_line(text):
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.mark.parametrize("form", ["script", "module", "code"])
def test_a_command_gets_what_a_fresh_interpreter_gives_it(tmp_path, form):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "probe_main.py").write_text(PROBE)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = dict(os.environ, PYRUN_PROBE="yes", PYTHONPATH=str(tmp_path / "pkg"))
    target = {"script": [str(tmp_path / "pkg" / "probe_main.py")], "module": ["-m", "probe_main"],
              "code": ["-c", PROBE]}[form]
    fast, real = both([sys.executable, *target, "a b", "3"], env=env, cwd=cwd, input="from stdin")
    assert real.returncode == 3 and fast.returncode == 3
    assert last_line(fast.stdout) == last_line(real.stdout)  # argv, sys.path[0], cwd, env, stdin, root logger
    assert "to stderr" in fast.stderr and "info after fairseq" in fast.stderr and "info before" not in fast.stderr
    assert ("info after fairseq" in real.stderr) and "info before" not in real.stderr


def test_uncaught_exception_and_fairseq_cli_logging(tmp_path):
    code = "import logging; from fairseq_cli import train; logging.getLogger('x').info('hello'); raise KeyError('boom')"
    fast, real = both([sys.executable, "-c", code], cwd=tmp_path)
    assert fast.returncode == real.returncode == 1
    assert last_line(fast.stderr) == last_line(real.stderr) == "KeyError: 'boom'"
    # fairseq_cli.train sets up logging (stdout, its format) before it imports fairseq, in both
    assert "| INFO | x | hello" in fast.stdout and "| INFO | x | hello" in real.stdout


def test_timeout_kills_the_command():
    start = time.time()
    with pytest.raises(subprocess.TimeoutExpired):
        pyrun.run([sys.executable, "-c", "import time; time.sleep(60)"], capture_output=True, timeout=2)
    assert time.time() - start < 30


def test_environment_read_at_import_falls_back_to_a_real_interpreter():
    code = "import sys; print('pyrun' in sys.modules or 'tests.pyrun' in sys.modules)"
    # the server has imported this module; a real interpreter has not
    assert pyrun.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"
    env = dict(os.environ, OMP_NUM_THREADS="7")
    assert pyrun.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip() == "False"


def test_scripts_python_goes_through_the_server_with_their_streams_and_signals(tmp_path):
    env = pyrun.script_env(dict(os.environ, PYRUN_PROBE="yes"))
    script = (
        '"$PYTHON" -c "import sys, os; print(sys.argv[1:], os.environ[\'PYRUN_PROBE\'], \'tests.pyrun\' in sys.modules); '
        'sys.exit(4)" a "b c"; echo "rc=$?"\n'
        'echo "piped in" | python3 -c "import sys; print(sys.stdin.read().strip()); sys.stderr.write(\'err\\n\')"\n'
        'timeout -s TERM 1 python3 -c "import time; time.sleep(60)"; echo "term rc=$?"\n'
        'python3 -c "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"; echo "kill rc=$?"\n'
        'python3 -X utf8 -c "import sys; print(\'tests.pyrun\' in sys.modules)"\n'
    )
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "['a', 'b c'] yes True" and lines[1] == "rc=4"  # through the server
    assert lines[2] == "piped in" and "err" in r.stderr
    assert lines[3] == "term rc=124" and lines[4] == "kill rc=137"
    assert lines[5] == "False"  # an interpreter option it does not hand over: a real interpreter
