"""The FastAPI example, served by real uvicorn on loopback ports."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, Iterator, List

import pytest

HERE = pathlib.Path(__file__).parent
STEP = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, db: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--app-dir", str(HERE)],
            env={**os.environ, "APP_DB": db},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid

    def request(self, method: str, path: str) -> Dict[str, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        with urllib.request.urlopen(req, timeout=STEP) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def wait_serving(self) -> Dict[str, Any]:
        deadline = time.monotonic() + STEP
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            try:
                return self.request("GET", "/health")
            except OSError:
                time.sleep(0.05)  # readiness poll of a server we started
        raise AssertionError("server never served")

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(STEP)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=STEP)


@pytest.fixture
def servers() -> Iterator[List[Server]]:
    started: List[Server] = []
    yield started
    for s in started:
        s.close()


def test_one_backend_per_database(tmp_path: pathlib.Path, servers: List[Server]) -> None:
    db = str(tmp_path / "app.db")
    a = Server(db)
    servers.append(a)
    health = a.wait_serving()
    assert health["pid"] == a.pid and health["lease"] == "held"
    # A first lease: nothing says how the last owner ended, so it recovers
    # (nothing to recover yet).
    assert health["previous_released_cleanly"] is None
    assert health["recovered"] == 0
    first = health["generation"]

    b = Server(db)
    servers.append(b)
    code = b.proc.wait(STEP)
    _, err = b.proc.communicate(timeout=STEP)
    assert code != 0
    assert f"is leased by pid {a.pid} (python" in err, err

    # uvicorn shuts down gracefully, then re-raises SIGTERM on itself.
    assert a.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    c = Server(db)
    servers.append(c)
    health = c.wait_serving()
    assert health["previous_released_cleanly"] is True
    assert health["recovered"] == 0
    c.request("POST", "/jobs")
    c.request("POST", "/jobs")

    assert c.stop(signal.SIGKILL) != 0
    d = Server(db)
    servers.append(d)
    health = d.wait_serving()
    assert health["previous_released_cleanly"] is False
    assert health["recovered"] == 2
    assert health["generation"] == first + 2
