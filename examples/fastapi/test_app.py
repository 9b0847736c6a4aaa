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


WAITING_LIFESPAN = '''
import contextlib, os
from fastapi import FastAPI
import sidelease

@contextlib.asynccontextmanager
async def lifespan(app):
    lease = await sidelease.acquire_async(os.environ["APP_DB"], timeout=None)
    print("started as the holder", flush=True)
    try:
        yield
    finally:
        lease.release()

app = FastAPI(lifespan=lifespan)
'''


def test_a_lifespan_waiting_for_the_lease_does_not_stop_on_sigterm(tmp_path: pathlib.Path) -> None:
    """What docs/howto/python-servers.md warns of: uvicorn hands SIGTERM and
    SIGINT to a lifespan only once its startup has finished, so a standby
    waiting there for the lease outlives both (under systemd, until
    TimeoutStopSec's SIGKILL), and when the lease comes it runs its startup
    as the holder before it shuts down."""
    import sidelease

    (tmp_path / "waiting.py").write_text(WAITING_LIFESPAN)
    db = str(tmp_path / "app.db")
    held = sidelease.acquire(db)
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "waiting:app", "--host", "127.0.0.1",
         "--port", str(free_port()), "--app-dir", str(tmp_path)],
        env={**os.environ, "APP_DB": db}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + STEP
        while not waiters(proc.pid, held):
            assert time.monotonic() < deadline and proc.poll() is None, "the standby never waited"
            time.sleep(0.05)
        for sig in (signal.SIGTERM, signal.SIGINT):
            proc.send_signal(sig)
            time.sleep(1.0)
            assert proc.poll() is None, f"{sig.name} stopped a lifespan waiting for the lease"
        held.release()
        code = proc.wait(STEP)
        out, err = proc.communicate(timeout=STEP)
        assert "started as the holder" in out and "Application startup complete" in err, (out, err)
        assert code in (0, -signal.SIGTERM, -signal.SIGINT), code
    finally:
        held.release()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=STEP)


def waiters(pid: int, lease: Any) -> List[str]:
    """The descriptors `pid` has open on the lease file: a waiter opened
    it, so it is past its startup's import and in the wait."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == lease.lease_path:
                out.append(fd)
        except OSError:
            pass
    return out
