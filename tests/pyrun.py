"""``python ARGS`` for the tests, started from a warm interpreter instead of a cold one.

On the 2-core CPU machine a command such as ``python -m fairseq_cli.train ...`` spends 8-12 s importing
torch, fairseq (every task and model it ships, scikit-learn among them) and triton before its first
line runs, and the integration set (pytest -m integration) starts well over a hundred of them; the fast set
starts none (tests/conftest.py). ``run()`` starts such a command from a
fork server that has imported those third-party packages once per test process, so the command's own
work starts within a second; ``script_env()`` does the same for the python commands of the shell scripts
the tests run. Nothing of this repository is imported in the server: the
command imports ``hgrn_fairseq`` (and registers it with fairseq through ``--user-dir``) itself, as a
fresh interpreter would, so a missing import or registration still fails.

What the command gets, as from a fresh ``python ARGS``: ``sys.argv``; ``sys.path`` (the script's folder,
or the working directory for ``-m`` / ``''`` for ``-c``, then PYTHONPATH, then the interpreter's own);
``os.environ``; the working directory; stdout and stderr (captured, or stderr merged into stdout); stdin
(``input``, else nothing); non-daemon threads joined and atexit handlers run at exit; the exit status (SystemExit's
code; 1 and the traceback on stderr after an uncaught exception; minus the signal number when killed).

It falls back to ``subprocess.run`` (a real interpreter) when it cannot give that: a program other than
``sys.executable``, interpreter options other than ``-m`` / ``-c`` / ``-u``, output not captured, other
``subprocess.run`` arguments, or an environment whose settings the preloaded packages read when imported (``PYTHON*`` other
than PYTHON, PYTHONPATH, PYTHONUNBUFFERED and PYTHONWARNINGS, ``TORCH*``, ``CUDA*``, ``OMP_*``, ``MKL*``, ``KMP*``,
``FAIRSEQ*``, ``HYDRA*``, ``LD_*``, ``LOGLEVEL``) that differ from the server's. It is used only in the CPU
suite (TRITON_INTERPRET=1); ``HGRN_TEST_REAL_PYTHON=1`` always falls back (e.g. to time the suite without it).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

# Third-party packages only (see the module docstring). Library modules, not fairseq_cli.*: those set up
# logging when imported, which a fresh interpreter does only for the tool it runs.
PRELOAD = [
    "numpy", "torch", "torch._dynamo", "torch.optim", "torch.utils.data", "triton", "triton.language",
    "fairseq", "fairseq.checkpoint_utils", "fairseq.trainer", "fairseq.distributed.utils",
    "fairseq.sequence_generator", "fairseq.data.indexed_dataset", "hydra", "omegaconf",
]
# (TRITON_* are not among them: triton reads its settings, TRITON_INTERPRET too, when used, not when imported)
IMPORT_TIME_ENV = ("PYTHON", "TORCH", "CUDA", "OMP_", "MKL", "KMP", "FAIRSEQ", "HYDRA", "LD_", "LOGLEVEL")
RUNTIME_PYTHON_ENV = ("PYTHON", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONWARNINGS")  # (the last: see _execute)

_state: Dict[str, object] = {}


def _enabled() -> bool:
    """Only for the CPU suite (tests/conftest.py sets TRITON_INTERPRET=1 where there is no GPU): with a GPU,
    a server that had touched the CUDA driver before forking would hand its children a broken one."""
    return os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("HGRN_TEST_REAL_PYTHON") != "1"


# The environment before the server's preloading: importing torch sets a few variables of its own
# (KMP_INIT_AT_FORK, KMP_DUPLICATE_LIB_OK, TORCHINDUCTOR_CACHE_DIR), which a program's environment gets back.
_BEFORE_PRELOAD = dict(os.environ)


def _import_time_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_ENV) and k not in RUNTIME_PYTHON_ENV}


def _parse(cmd: Sequence[str]) -> Optional[Tuple[str, str, List[str], bool]]:
    """(kind, target, argv, unbuffered) for ``[sys.executable, ...]``, else None."""
    if not cmd or cmd[0] != sys.executable:
        return None
    return parse_args(cmd[1:])


def parse_args(args: Sequence[str]) -> Optional[Tuple[str, str, List[str], bool]]:
    """(kind, target, argv, unbuffered) for the arguments ``[-u] (-m MOD | -c CODE | SCRIPT) ARGS`` of an
    interpreter, else None (other interpreter options)."""
    args, unbuffered = list(args), False
    while args and args[0] == "-u":
        args, unbuffered = args[1:], True
    if len(args) >= 2 and args[0] == "-m":
        return "module", args[1], [args[1], *args[2:]], unbuffered
    if len(args) >= 2 and args[0] == "-c":
        return "code", args[1], ["-c", *args[2:]], unbuffered
    if args and not args[0].startswith("-"):
        return "script", args[0], list(args), unbuffered
    return None


def _fresh_logging() -> None:
    """The root logger as a fresh interpreter has it, and fairseq's import-time logging set-up (its
    wav2vec2_classification module calls ``logging.basicConfig(level=DEBUG)``, later basicConfig calls
    of other modules change nothing) done again when the program first imports from fairseq, where a
    fresh interpreter would import it: so a program that configures logging before it imports fairseq
    (the fairseq_cli tools, scripts/fairseq_train.py) keeps its own set-up, and one that imports fairseq
    first gets fairseq's, as without the server."""
    import builtins
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    original = builtins.__import__

    def first_fairseq_import(name, *args, **kwargs):
        if name == "fairseq" or name.startswith("fairseq."):
            builtins.__import__ = original
            logging.basicConfig(level=logging.DEBUG)
        return original(name, *args, **kwargs)

    builtins.__import__ = first_fairseq_import


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _execute(kind: str, target: str, argv: List[str], env: Dict[str, str], cwd: str, unbuffered: bool,
             base: List[str]) -> None:
    """With fds 0-2 in place: set up what a fresh interpreter would have, run the program, exit."""
    import atexit
    import runpy
    import threading
    import traceback

    added = {k: v for k, v in os.environ.items() if k not in _BEFORE_PRELOAD}
    os.environ.clear()
    os.environ.update(added)
    os.environ.update(env)
    os.chdir(cwd)
    old = (sys.stdout, sys.stderr)
    unbuffered = unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), line_buffering=True,
                                  errors="backslashreplace", write_through=unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    _fresh_logging()
    first = {"module": cwd, "code": "", "script": os.path.dirname(os.path.realpath(target))}[kind]
    sys.path[:] = [first, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p], *base]
    sys.argv = list(argv)
    if env.get("PYTHONWARNINGS"):  # (the server started without any: checked before) as the interpreter does
        import warnings

        sys.warnoptions[:] = [w for w in env["PYTHONWARNINGS"].split(",") if w]
        warnings._processoptions(sys.warnoptions)
    code = 0
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "script":
            runpy.run_path(target, run_name="__main__")
        else:
            import types

            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: B902 (as the interpreter: print it, status 1)
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # (what the interpreter does before atexit: join non-daemon threads)
        atexit._run_exitfuncs()
    finally:
        for stream in (*old, sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def accepts(sockdir: str, env: Dict[str, str]) -> bool:
    """Whether the server can run a command with this environment as a fresh interpreter would (module
    docstring): the import-time settings it started with, and no PYTHONWARNINGS of its own."""
    try:
        with open(os.path.join(sockdir, "env.json")) as f:
            server = json.load(f)
    except OSError:
        return False
    return _import_time_env(env) == server["env"] and not server["warnings"]


def send(sockdir: str, parsed: Tuple[str, str, List[str], bool], env: Dict[str, str], cwd: str, fds: Sequence[int]):
    """Hand a parsed command and its stdin, stdout and stderr to the server: the connection on which its
    exit status comes back (4 bytes; minus the signal number when killed), or None without a server."""
    import socket
    import struct

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.path.join(sockdir, "sock"))
    except OSError:
        conn.close()
        return None
    kind, target, argv, unbuffered = parsed
    body = json.dumps({"kind": kind, "target": target, "argv": argv, "env": env, "cwd": cwd,
                       "unbuffered": unbuffered}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(body))], list(fds))
    conn.sendall(body)
    return conn


def run(cmd: Sequence[str], *, env: Optional[Dict[str, str]] = None, cwd=None, timeout: Optional[float] = None,
        input=None, capture_output: bool = False, stdout=None, stderr=None, text: bool = False,
        check: bool = False, **other) -> subprocess.CompletedProcess:
    """``subprocess.run`` for ``[sys.executable, ...]`` commands, from the warm server when it can
    (module docstring); the same arguments and result."""
    import socket
    import struct

    cmd = [str(c) for c in cmd]
    merge = stderr == subprocess.STDOUT
    captured = capture_output or (stdout == subprocess.PIPE and stderr in (subprocess.PIPE, subprocess.STDOUT))
    parsed = _parse(cmd)
    full_env = dict(os.environ if env is None else env)
    sockdir = _socket_server() if parsed is not None and captured and not other and _enabled() else None
    with tempfile.TemporaryDirectory(prefix="pyrun_") as tmp:
        conn = None
        if sockdir is not None and accepts(sockdir, full_env):
            paths = [os.path.join(tmp, name) for name in ("in", "out", "err")]
            with open(paths[0], "wb") as f:
                f.write(b"" if input is None else input.encode() if isinstance(input, str) else input)
            files = [open(paths[0], "rb"), open(paths[1], "wb")]
            files.append(files[1] if merge else open(paths[2], "wb"))
            try:
                conn = send(sockdir, parsed, full_env, os.path.abspath(cwd or os.getcwd()),
                            [f.fileno() for f in files])
            finally:
                for f in files:
                    f.close()
        if conn is None:
            return subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, input=input, capture_output=capture_output,
                                  stdout=stdout, stderr=stderr, text=text, check=check, **other)
        conn.settimeout(timeout)
        reply, timed_out = b"", False
        try:
            while len(reply) < 4:
                chunk = conn.recv(4 - len(reply))
                if not chunk:
                    raise RuntimeError("tests.pyrun: the server went away")
                reply += chunk
        except socket.timeout:
            timed_out = True
        finally:
            conn.close()  # (on a timeout, this makes the server kill the program)

        def read(path):
            with open(path, "rb") as f:
                data = f.read()
            return data.decode("utf-8", errors="replace").replace("\r\n", "\n") if text else data

        output, errors = read(paths[1]), (None if merge else read(paths[2]))
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=output, stderr=errors)
    result = subprocess.CompletedProcess(cmd, struct.unpack("!i", reply)[0], output, errors)
    if check:
        result.check_returncode()
    return result


# --------------------------------------------------------------------------------------------------------
# The server: one per test process, on a UNIX socket; a command comes with its stdin, stdout and stderr
# (run() passes files, a script's python3 / $PYTHON its own, through tests/pyrun_client.py, which runs a
# real interpreter for anything it cannot hand over). Signals a client gets are passed on to the program;
# a client gone (killed, or run()'s timeout) takes the program with it.

def _session(conn, base: List[str]) -> None:
    """A forked server process serving one client: receive the command and its fds, run the program in
    a child, pass signals on, report the exit status."""
    import select
    import signal
    import socket
    import struct

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    size = struct.unpack("!I", head)[0]
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            os._exit(0)
        body += chunk
    req = json.loads(body)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        _execute(req["kind"], req["target"], req["argv"], req["env"], req["cwd"], req["unbuffered"], base)
    for fd in fds:
        os.close(fd)
    pending = b""
    while True:
        ready, _, _ = select.select([conn], [], [], 0.05)
        if ready:
            data = conn.recv(64)
            if not data:  # the client is gone
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os._exit(0)
            pending += data
            while len(pending) >= 4:
                os.kill(pid, struct.unpack("!I", pending[:4])[0])
                pending = pending[4:]
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            os._exit(0)


def serve(sockdir: str, base: List[str], parent: int) -> None:
    """The server (``python -c`` from _socket_server): preload, then fork a session per client;
    ends when the test process that started it is gone."""
    import select
    import signal
    import socket

    with open(os.path.join(sockdir, "env.json"), "w") as f:
        json.dump({"env": _import_time_env(_BEFORE_PRELOAD), "warnings": _BEFORE_PRELOAD.get("PYTHONWARNINGS", "")}, f)
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(sockdir, "sock"))
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # sessions are reaped by the kernel
    open(os.path.join(sockdir, "ready"), "w").close()
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 1.0)
        if not ready:
            continue
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _session(conn, base)
        conn.close()


def _socket_server() -> str:
    """The folder of this test process's server (started on first use)."""
    if "sockdir" not in _state:
        import atexit
        import shutil
        import time

        clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the interpreter's own sys.path
        base = json.loads(subprocess.check_output(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"], env=clean, text=True))
        # (/tmp: a UNIX socket's path must stay under ~108 bytes, which a long TMPDIR could exceed)
        sockdir = tempfile.mkdtemp(prefix="pyrun_sock_", dir="/tmp" if os.path.isdir("/tmp") else None)
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = (f"import sys; sys.path.insert(0, {repo!r}); from tests import pyrun; "
                f"pyrun.serve({sockdir!r}, {base!r}, {os.getpid()})")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        atexit.register(shutil.rmtree, sockdir, True)  # (atexit runs it last: after the kill below)
        atexit.register(proc.kill)
        bindir = os.path.join(sockdir, "bin")
        os.mkdir(bindir)
        client = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyrun_client.py")
        for name in ("python", "python3"):
            path = os.path.join(bindir, name)
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\nexec "{sys.executable}" -I -S "{client}" "$@"\n')
            os.chmod(path, 0o755)
        end = time.time() + 300
        while not os.path.exists(os.path.join(sockdir, "ready")):
            if proc.poll() is not None or time.time() > end:
                raise RuntimeError(f"tests.pyrun: the warm server did not start (exit status {proc.poll()})")
            time.sleep(0.05)
        _state["sockdir"] = sockdir
    return _state["sockdir"]  # type: ignore[return-value]


def script_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``env`` (default os.environ) for a shell script whose ``$PYTHON`` / ``python3`` commands should
    start from the warm server; where it is not used (_enabled), PYTHON=sys.executable only."""
    env = dict(os.environ if env is None else env)
    if not _enabled():
        env["PYTHON"] = sys.executable
        return env
    sockdir = _socket_server()
    bindir = os.path.join(sockdir, "bin")
    env.update(PYTHON=os.path.join(bindir, "python3"), PATH=bindir + os.pathsep + env.get("PATH", ""),
               HGRN_PYRUN_SOCKET=sockdir, HGRN_PYRUN_REAL=sys.executable)
    return env
