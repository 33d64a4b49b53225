"""Two runs started at once on an empty dataset.data_dir: one downloads Fashion-MNIST, the other
waits for it and reads its files; neither reads a half-written file nor fails a checksum the
other's writes broke (each had truncated the other's files: "the download failed")."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lipt.data.sources import FASHION_MNIST_SYSTEM_DIR

FILES = sorted(FASHION_MNIST_SYSTEM_DIR.glob("*.gz"))
pytestmark = pytest.mark.skipif(len(FILES) != 4, reason="needs Debian's dataset-fashion-mnist")

# A run's reader, its download taken from the local server (this machine has no network): the
# mirror and the checksums of these files, as torchvision's FashionMNIST names them.
LOADER = """
import sys
from torchvision.datasets import FashionMNIST
from lipt.data.sources import load_fashion_mnist
FashionMNIST.mirrors = [sys.argv[2]]
FashionMNIST.resources = [tuple(pair.split("=")) for pair in sys.argv[3:]]
splits = load_fashion_mnist(sys.argv[1])
print(len(splits.train), len(splits.test), int(splits.train.labels.sum()), flush=True)
"""


class Mirror(SimpleHTTPRequestHandler):
    """Serves the Debian package's files; the first GET waits for `release`, so that the first
    process is still downloading while the second starts."""

    gets: Counter[str]
    first: threading.Event
    release: threading.Event

    def do_GET(self) -> None:
        # torchvision probes for redirects with a GET whose header says HEAD: not a download
        if self.headers.get("Method") != "HEAD":
            self.gets[self.path] += 1
        if not self.first.is_set():
            self.first.set()
            assert self.release.wait(300)
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


def _waiting_for_a_lock_on(folder: Path) -> bool:
    """Whether some process waits for an flock on `folder` (the kernel's table of locks)."""
    st = os.stat(folder)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any("->" in line and inode in line.split() for line in open("/proc/locks"))


def test_two_runs_on_an_empty_data_dir_download_once_and_both_read_it(tmp_path):
    handler = type("Handler", (Mirror,), {"gets": Counter(), "first": threading.Event()})
    handler.release = threading.Event()
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(handler, directory=str(FASHION_MNIST_SYSTEM_DIR))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sums = [f"{f.name}={hashlib.md5(f.read_bytes()).hexdigest()}" for f in FILES]
    data = tmp_path / "data"
    command = [sys.executable, "-c", LOADER, str(data), f"http://127.0.0.1:{server.server_port}/"]

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([*command, *sums], stdout=subprocess.PIPE, text=True)

    runs = [start()]
    try:
        assert handler.first.wait(120), "the first run never started its download"
        runs.append(start())
        deadline = time.monotonic() + 120  # a bound on the wait, not a measurement
        while not _waiting_for_a_lock_on(data / "FashionMNIST"):
            assert runs[1].poll() is None, "the second run did not wait for the first's download"
            assert time.monotonic() < deadline, "the second run never waited for the download"
            time.sleep(0.05)
    finally:
        handler.release.set()
        outputs = [run.communicate(timeout=300)[0] for run in runs]
        server.shutdown()
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert outputs[0] == outputs[1] and outputs[0].split()[:2] == ["60000", "10000"]
    assert handler.gets == Counter({f"/{f.name}": 1 for f in FILES})  # downloaded once
    assert sorted(p.name for p in (data / "FashionMNIST").iterdir()) == ["raw"]  # no staging
