"""The ``python`` / ``python3`` of tests.pyrun.script_env(): hands the command to the test process's warm
server (tests/pyrun.py) with this process's stdin, stdout and stderr, passes signals on, and exits as the
program did. Anything it cannot hand over (other interpreter options, an environment the server's
preloaded packages would have read differently, no server) runs a real interpreter instead, so a script
behaves as with ``PYTHON=sys.executable``. It runs with ``python -I -S``: the standard library and
tests/pyrun.py (which imports nothing else at the top) only."""
import os
import signal
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests import pyrun  # noqa: E402  (standard library only, like this file)


def real():
    python = os.environ["HGRN_PYRUN_REAL"]
    os.execv(python, [python, *sys.argv[1:]])


def main():
    sockdir = os.environ.get("HGRN_PYRUN_SOCKET")
    parsed = pyrun.parse_args(sys.argv[1:])
    if not sockdir or parsed is None:
        real()
    if not pyrun.accepts(sockdir, dict(os.environ)):
        real()
    conn = pyrun.send(sockdir, parsed, dict(os.environ), os.getcwd(), [0, 1, 2])
    if conn is None:
        real()

    def forward(signum, frame):
        try:
            conn.sendall(struct.pack("!I", signum))
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    reply = b""
    while len(reply) < 4:
        try:
            chunk = conn.recv(4 - len(reply))
        except InterruptedError:
            continue
        if not chunk:
            sys.exit(1)  # the server went away
        reply += chunk
    code = struct.unpack("!i", reply)[0]
    if code < 0:  # killed by a signal: die the same way
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # (those two keep their default action anyway)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
