"""Entry-script runs that end in their checks, from a Python that imported the libraries once.

A run refused in its checks spends most of its seconds importing torch, Lightning and Hydra (5-7
s of a ~7 s refusal on these machines, ~70 such runs in the suites). `preloaded_python()` is a
server process that imported them once, at its start, and forks a fresh child per run:
the child sets the script's argv, working folder, environment and standard streams, runs the
script as `python script ...` would (`__main__`, its exit code, a `SystemExit` message on stderr,
the exit handlers), and exits. The server holds no state between runs but the imports, so each
run sees a fresh process as a user's command does. It forks only while it is one thread (with
`OMP_NUM_THREADS=1`, as conftest sets it); otherwise, or where there is no fork, a plain
subprocess runs the script. Used through `tests.helpers.run_entry(..., preloaded=True)`.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.helpers import ROOT

SERVER = r"""
import atexit, json, logging, os, runpy, sys, traceback

import torch, lightning, hydra, omegaconf  # what the entry scripts import before their checks
import lipt.run.cli

def threads():
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0

def run(req):
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = [req["script"], *req["args"]]
    sys.path[0] = os.path.dirname(os.path.abspath(req["script"]))
    code = 0
    try:
        runpy.run_path(req["script"], run_name="__main__")
    except SystemExit as e:  # as the interpreter treats it at the top level
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)

print(json.dumps({"ready": threads() == 1}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run(req)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class PreloadedPython:
    """The server: started on first use, one per test process, stopped at its exit."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a timed-out run is killed with its server, by group
        )
        self.ready = bool(self._reply(timeout=300).get("ready"))
        if not self.ready:
            self.close()

    def _reply(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.close()
                raise subprocess.TimeoutExpired("preloaded python", timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the preloaded python ended")
        return json.loads(line)

    def run(
        self, script: str, args: Sequence[str], cwd: Path, timeout: float, env: dict
    ) -> subprocess.CompletedProcess:
        """`script` with `args` in `cwd` under exactly `env`, as subprocess.run reports it."""
        assert self.proc.stdin is not None
        with tempfile.TemporaryDirectory() as scratch:
            out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
            request = {
                "script": script,
                "args": list(args),
                "cwd": str(cwd),
                "env": env,
                "stdout": str(out),
                "stderr": str(err),
            }
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            code = self._reply(timeout)["returncode"]
            return subprocess.CompletedProcess(
                [sys.executable, script, *args], code, out.read_text(), err.read_text()
            )

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


_server: PreloadedPython | None = None


def preloaded_python() -> PreloadedPython | None:
    """This test process's server, started on first use (again if it died); None where it
    cannot fork."""
    global _server
    if not hasattr(os, "fork"):
        return None
    if _server is None or (_server.ready and _server.proc.poll() is not None):
        _server = PreloadedPython()
        atexit.register(_server.close)
    return _server if _server.ready else None
