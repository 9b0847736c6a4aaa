"""docs/howto/celery-beat.md: two instances of a service each run
`sidelease lead DB -- celery -A tasks beat` (examples/celery-beat). At
every look (each 50 ms) at most one beat process exists, found by its
environment across the whole machine, orphans included; the leader's beat
sends the due task; SIGKILL of the leading `lead` ends its beat with it and
the other instance's beat takes over; SIGTERM stops the last one cleanly.
Needs the CLI's release build (tests/run builds it first) and Celery in the
venv (tests/setup.sh). Every process is ended by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLI = ROOT / "target/release/sidelease"
CELERY = Path(sys.executable).parent / "celery"


def beats(spool: Path) -> List[int]:
    """Every `celery beat` process of this test on the machine."""
    mark = f"APP_SPOOL={spool}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"beat" not in argv or not any(a.endswith(b"celery") for a in argv[:2]):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue  # gone meanwhile
    return found


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen]]:
    started: List[subprocess.Popen] = []
    db = tmp_path / "app.db"
    db.touch()
    (tmp_path / "spool").mkdir()
    env = dict(os.environ, APP_SPOOL=str(tmp_path / "spool"), APP_BEAT_STATE=str(tmp_path / "beat-state"),
               PATH=f"{CELERY.parent}:{os.environ.get('PATH', '')}")

    def start(name: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "w")
        p = subprocess.Popen([str(CLI), "lead", str(db), "--", str(CELERY), "-A", "tasks", "beat", "--loglevel=INFO"],
                             cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()
    for pid in beats(tmp_path / "spool"):
        os.kill(pid, signal.SIGKILL)


def sent(spool: Path) -> int:
    return len(os.listdir(spool))


def watch(spool: Path, seconds: float, until: Callable[[], bool] = lambda: False) -> List[int]:
    """Look every 50 ms for `seconds` (or until `until()`): never two beats."""
    end = time.monotonic() + seconds
    seen: List[int] = []
    while time.monotonic() < end:
        now = beats(spool)
        assert len(now) <= 1, f"two beats at once: {now}"
        seen = now
        if until():
            break
        time.sleep(0.05)
    return seen


def test_one_beat_across_instances_and_it_moves_on_a_kill(service: Callable[[str], subprocess.Popen],
                                                           tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    a, b = service("a"), service("b")
    watch(spool, 30, until=lambda: sent(spool) >= 2)
    assert sent(spool) >= 2, "the leader's beat sends the task every second"
    (beat,) = watch(spool, 2)

    # The beat belongs to the leading instance: kill that `lead` outright.
    leader = next(p for p in (a, b) if _parent(beat) == p.pid)
    other = b if leader is a else a
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait()
    before = sent(spool)
    watch(spool, 30, until=lambda: bool(beats(spool)) and beats(spool) != [beat] and sent(spool) >= before + 2)
    (new,) = beats(spool)
    assert new != beat and _parent(new) == other.pid, "the other instance's beat took over"
    assert sent(spool) >= before + 2

    other.send_signal(signal.SIGTERM)
    assert other.wait(timeout=20) == 0  # beat's own status on SIGTERM, passed on by lead
    assert beats(spool) == []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1
