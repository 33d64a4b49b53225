"""Entry-script runs from a Python that imported the libraries once.

A run spends 5-7 s of CPU importing torch, Lightning and Hydra before its first line of lipt
(all of a refusal's seconds, on these machines; the suites start over a hundred runs).
`preloaded_python()` is a server process that imported them once, at its start, and forks a
fresh child per run: the child sets the script's argv, working folder, environment and standard
streams, runs the script as `python script ...` would (`__main__`, its exit code, a `SystemExit`
message on stderr, the exit handlers), and exits. The server holds no state between runs but
the imports, so each run sees a fresh process as a user's command does: a run that trains, a
DDP run whose launcher starts its other ranks, a run a test kills. It forks only while it is one
thread (with `OMP_NUM_THREADS=1`, as conftest sets it); otherwise, or where there is no fork, a
plain subprocess runs the script. Used through `tests.helpers.run_entry`, by default.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.helpers import ROOT

SERVER = r"""
import atexit, json, logging, os, runpy, sys, threading, traceback

import torch, lightning, hydra, omegaconf  # what the entry scripts import before their checks
import lipt.run.cli
from tests.parsed_configs import keep_parsed_configs
keep_parsed_configs(parse_now=os.path.join(os.getcwd(), "configs"))  # for every fork

def threads():
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0

def run(req):
    os.setsid()  # its own process group, as a new process started with start_new_session
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    # stderr onto stdout's file (its offset shared), as subprocess's stderr=STDOUT
    err = out
    if req["stderr"] is not None:
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    module = req["args"][0] if req["script"] == "-m" else None  # python -m MODULE ARGS
    sys.argv = [req["script"], *req["args"]] if module is None else list(req["args"])
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(req["script"]))
    # PYTHONPATH's folders come next, as the interpreter puts them at its start
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [os.path.abspath(p) for p in extra]
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
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
        # the interpreter's own order at exit: threads, then their exit hooks (loky's executors
        # stop their workers there), then atexit (multiprocessing joins its children there)
        threading._shutdown()
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
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class PreloadedPython:
    """The server: started on first use, one per test process, stopped at its exit."""

    def __init__(self, at_import: dict[str, str]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **at_import}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a timed-out run is killed with its server, by group
        )
        self.pending = b""
        self.ready = bool(self._reply(timeout=300).get("ready"))
        if not self.ready:
            self.close()

    def _reply(self, timeout: float, keep: bool = False) -> dict:
        """The server's next line (read from its pipe unbuffered: a run's two lines, its pid and
        its exit, can come together). On a timeout the server is stopped, unless `keep`."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    if not keep:
                        self.close()
                    raise subprocess.TimeoutExpired("preloaded python", timeout)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the preloaded python ended")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def start(
        self, script: str, args: Sequence[str], cwd: Path, env: dict, stderr_to_stdout: bool = False
    ) -> PreloadedRun:
        """`script` with `args` in `cwd` under exactly `env`, started: the run, in a process
        group of its own (the server serves no other run until it ends); with
        `stderr_to_stdout`, both in one stream, in the order written."""
        assert self.proc.stdin is not None
        scratch = tempfile.TemporaryDirectory()
        out, err = Path(scratch.name) / "stdout", Path(scratch.name) / "stderr"
        request = {
            "script": script,
            "args": list(args),
            "cwd": str(cwd),
            "env": env,
            "stdout": str(out),
            "stderr": None if stderr_to_stdout else str(err),
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = int(self._reply(timeout=60)["pid"])
        return PreloadedRun(self, pid, [sys.executable, script, *args], scratch)

    def run(
        self,
        script: str,
        args: Sequence[str],
        cwd: Path,
        timeout: float,
        env: dict,
        stderr_to_stdout: bool = False,
    ) -> subprocess.CompletedProcess:
        """`script` with `args` in `cwd` under exactly `env`, as subprocess.run reports it."""
        started = self.start(script, args, cwd, env, stderr_to_stdout)
        started.wait(timeout)
        return started.output()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


class PreloadedRun:
    """A run the server forked, as a subprocess.Popen started with start_new_session shows it:
    its pid (its process group's), poll() and wait(); and output() once it ended."""

    def __init__(
        self,
        server: PreloadedPython,
        pid: int,
        args: list[str],
        scratch: tempfile.TemporaryDirectory,
    ) -> None:
        self.server, self.pid, self.args, self.scratch = server, pid, args, scratch
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.returncode = int(self.server._reply(0.0, keep=True)["returncode"])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                reply = self.server._reply(3600.0 if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, 9)
                raise
            self.returncode = int(reply["returncode"])
        return self.returncode

    def output(self) -> subprocess.CompletedProcess:
        """What it wrote, as subprocess.run(capture_output=True, text=True) reports it."""
        folder = Path(self.scratch.name)
        try:
            out = (folder / "stdout").read_text()
            err = (folder / "stderr").read_text() if (folder / "stderr").exists() else None
        finally:
            self.scratch.cleanup()
        return subprocess.CompletedProcess(self.args, self.wait(), out, err)


_servers: dict[tuple[tuple[str, str], ...], PreloadedPython] = {}


def preloaded_python(env: dict[str, str] | None = None, slot: str = "") -> PreloadedPython | None:
    """This test process's server for the settings `env` gives what is read at import
    (tests.helpers.READ_AT_IMPORT), started on first use (again if it died); None where it
    cannot fork. A server runs one run at a time: a run that goes on in the background while
    the test runs others takes a `slot` of its own."""
    from tests.helpers import READ_AT_IMPORT

    if not hasattr(os, "fork"):
        return None
    at_import = {k: (env or os.environ)[k] for k in READ_AT_IMPORT if k in (env or os.environ)}
    key = (*sorted(at_import.items()), ("slot", slot))
    server = _servers.get(key)
    if server is None or (server.ready and server.proc.poll() is not None):
        server = _servers[key] = PreloadedPython(at_import)
        atexit.register(server.close)
    return server if server.ready else None
