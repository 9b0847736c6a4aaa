"""The gunicorn + APScheduler example, served by real gunicorn workers on
loopback: the scheduler's ticks come from one worker at a time, across
SIGKILLed leaders and gunicorn's replacements; /metrics is scraped; and
with a PostgreSQL target two gunicorn masters stand for two hosts."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any, Iterator, List, Tuple

import pytest

import sidelease

HERE = pathlib.Path(__file__).parent
STEP = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children(pid: int) -> List[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


class Gunicorn:
    def __init__(self, db: str, ticks: str, workers: int) -> None:
        self.port = free_port()
        self.workers = workers
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-w", str(workers), "-k", "uvicorn.workers.UvicornWorker",
             "--bind", f"127.0.0.1:{self.port}", "--chdir", str(HERE), "--graceful-timeout", "10", "app:app"],
            env={**os.environ, "APP_DB": db, "APP_TICKS": ticks},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own: "a host"
        )

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=STEP) as r:
            return str(r.read().decode())

    def wait_workers(self) -> List[int]:
        deadline = time.monotonic() + STEP
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            w = children(self.proc.pid)
            if len(w) == self.workers:
                try:
                    self.get("/health")
                    return w
                except OSError:
                    pass
            time.sleep(0.05)  # readiness poll of a server we started
        raise AssertionError(f"gunicorn never had {self.workers} workers serving")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=STEP)
        self.stderr = err
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STEP)


class Ticks:
    def __init__(self, path: str) -> None:
        self.path = path

    def all(self) -> List[Tuple[int, float]]:
        try:
            with open(self.path) as f:
                return [(int(p), float(t)) for p, t in (line.split() for line in f if line.endswith("\n"))]
        except FileNotFoundError:
            return []

    def wait_from(self, ok: Any, n: int = 3) -> int:
        """Until `n` ticks in a row came from one pid that `ok` accepts: that pid."""
        deadline = time.monotonic() + STEP
        while time.monotonic() < deadline:
            t = self.all()
            last = [p for p, _ in t[-n:]]
            if len(last) == n and len(set(last)) == 1 and ok(last[0]):
                return last[0]
            time.sleep(0.05)
        raise AssertionError(f"no {n} ticks in a row from one accepted worker: {self.all()[-10:]}")

    def runs(self) -> List[int]:
        """The pids in tick order, each run of one pid once."""
        out: List[int] = []
        for p, _ in self.all():
            if not out or out[-1] != p:
                out.append(p)
        return out


@pytest.fixture
def files(tmp_path: Any) -> Iterator[Tuple[str, str]]:
    yield str(tmp_path / "app.db"), str(tmp_path / "ticks.log")


def test_one_worker_runs_the_scheduler_across_sigkilled_leaders(files: Tuple[str, str]) -> None:
    db, ticks_path = files
    ticks = Ticks(ticks_path)
    g = Gunicorn(db, ticks_path, workers=4)
    try:
        workers = g.wait_workers()
        leader = ticks.wait_from(lambda p: p in workers)
        killed: List[int] = []
        for _ in range(3):
            os.kill(leader, signal.SIGKILL)
            killed.append(leader)
            t = time.monotonic()
            leader = ticks.wait_from(lambda p: p not in killed, n=1)
            took = time.monotonic() - t
            assert took < 2, f"the next tick came {took:.2f}s after the kill"
            workers = g.wait_workers()  # gunicorn replaced the killed worker
        replacements = [w for w in workers if w not in killed and w != leader]
        time.sleep(1)
        # Each killed leader led one run of ticks, then never again; the
        # replacements follow.
        runs = ticks.runs()
        assert runs == killed + [leader], runs
        assert not set(replacements) & set(runs)
        # Prometheus: every worker answers with its own gauge.
        scraped = [g.get("/metrics") for _ in range(12)]
        assert all("sidelease_leader " in m and "sidelease_elections_total " in m for m in scraped), scraped[0]
        values = {line.split()[1] for m in scraped for line in m.splitlines() if line.startswith("sidelease_leader ")}
        assert values <= {"0.0", "1.0"}, values
        assert g.stop() == 0, g.stderr
    finally:
        g.close()
    assert sidelease.inspect(db)["state"] == "free"
    # No tick after the stop: the scheduler stopped with its worker.
    n = len(ticks.all())
    time.sleep(0.5)
    assert len(ticks.all()) == n


def test_two_hosts_share_one_scheduler_through_postgresql(files: Tuple[str, str]) -> None:
    base = os.environ.get("SIDELEASE_TEST_PG")
    if not base:
        pytest.fail("SIDELEASE_TEST_PG is not set: eval \"$(bash tests/pg/cluster start)\" (tests/run does)")
    url = f"{base}?lease=sched-{uuid.uuid4().hex[:12]}"
    _, ticks_path = files
    ticks = Ticks(ticks_path)
    a = Gunicorn(url, ticks_path, workers=2)
    b = Gunicorn(url, ticks_path, workers=2)
    try:
        wa, wb = a.wait_workers(), b.wait_workers()
        leader = ticks.wait_from(lambda p: p in wa + wb)
        host, other = (a, b) if leader in wa else (b, a)
        # The leading "host" goes away at once, every process of it.
        os.killpg(host.proc.pid, signal.SIGKILL)
        host.proc.wait(STEP)
        others = other.wait_workers()
        t = time.monotonic()
        successor = ticks.wait_from(lambda p: p in others, n=1)
        assert time.monotonic() - t < 5
        assert ticks.runs() == [leader, successor], ticks.runs()
        assert other.stop() == 0, other.stderr
    finally:
        a.close()
        b.close()
