"""docs/howto/containers.md: examples/containers/entrypoint.sh run as
container runtimes run an entrypoint, as PID 1 of a new PID namespace with
its own /proc (`unshare --pid --fork --mount-proc`), the database on a
shared directory (the volume). Two replicas on one volume: one holds, the
other waits, `docker stop` (SIGTERM to PID 1) hands the lease over; a
replica that waits past LEASE_WAIT exits 75. A read-only volume, and the
image's layers (two overlay mounts over one lower layer: two leases, the
reason the page says never to lease there). Needs root for unshare and
mount (skipped without it) and the CLI's release build (tests/run builds it
first). Every process is ended by its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLI = ROOT / "target/release/sidelease"
ENTRYPOINT = HERE / "entrypoint.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (unshare, mount)")


def env(**extra: str) -> Dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{CLI.parent}:{e.get('PATH', '')}"
    e.update(extra)
    return e


def status(db: Path) -> dict:
    out = subprocess.run([str(CLI), "status", "--json", str(db)], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)


def eventually(what: str, cond: Callable[[], bool], bound: float = 10.0) -> None:
    end = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < end, f"not within {bound}s: {what}"
        time.sleep(0.02)


class Container:
    """The entrypoint as PID 1 of a new PID namespace; the server it runs
    notes its start in `started` and sleeps."""

    def __init__(self, volume: Path, name: str, started: Path, wait: str = "60") -> None:
        server = f"echo {name} >> '{started}'; exec sleep 600"
        self.unshare = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", str(ENTRYPOINT), "sh", "-c", server],
            env=env(DATA=str(volume), LEASE_WAIT=wait), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # unshare forks the entrypoint: its only child, PID 1 inside.
        eventually("the container's PID 1 started", lambda: self._init() is not None)
        self.pid1 = self._init()

    def _init(self) -> int | None:
        try:
            with open(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children") as f:
                kids = f.read().split()
        except FileNotFoundError:
            return None
        return int(kids[0]) if kids else None

    def stop(self) -> int:
        """`docker stop`: SIGTERM to the container's PID 1, then its status."""
        assert self.pid1 is not None
        os.kill(self.pid1, signal.SIGTERM)
        return self.unshare.wait(timeout=20)


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    v = tmp_path / "volume"
    v.mkdir()
    (v / "app.db").touch()
    return v


@pytest.fixture
def containers() -> Iterator[List[Container]]:
    made: List[Container] = []
    yield made
    for c in made:
        if c.unshare.poll() is None:
            # SIGKILL to a namespace's PID 1 ends every process in it.
            if c.pid1 is not None:
                os.kill(c.pid1, signal.SIGKILL)
            c.unshare.wait()


def test_replicas_on_one_volume_hold_it_one_at_a_time(volume: Path, tmp_path: Path,
                                                      containers: List[Container]) -> None:
    started = tmp_path / "started"
    db = volume / "app.db"
    a = Container(volume, "a", started)
    containers.append(a)
    eventually("replica a holds", lambda: status(db)["holders"] == [a.pid1])
    # From the host: held, by the host's PID of a's PID 1; its record says
    # pid 1 in another PID namespace, so it is not judged from here.
    s = status(db)
    assert (s["state"], s["record_status"], s["record"]["pid"]) == ("held", "foreign", 1)

    b = Container(volume, "b", started)
    containers.append(b)
    time.sleep(0.5)
    assert status(db)["holders"] == [a.pid1], "b waits"
    assert b.unshare.poll() is None
    assert started.read_text().split() == ["a"]

    assert a.stop() == 143  # the server's status: SIGTERM, passed on
    eventually("replica b holds", lambda: status(db)["holders"] == [b.pid1])
    eventually("b's server started", lambda: started.read_text().split() == ["a", "b"])
    s = status(db)
    assert s["record"]["pid"] == 1 and s["record_status"] == "foreign"


def test_a_replica_that_waits_too_long_exits_75(volume: Path, tmp_path: Path, containers: List[Container]) -> None:
    started = tmp_path / "started"
    a = Container(volume, "a", started)
    containers.append(a)
    eventually("replica a holds", lambda: status(volume / "app.db")["holders"] == [a.pid1])
    b = Container(volume, "b", started, wait="0.3")
    containers.append(b)
    assert b.unshare.wait(timeout=20) == 75
    err = b.unshare.stderr.read() if b.unshare.stderr else ""
    # Inside b, a's PID 1 is not b's own PID 1: said so.
    assert "timed out after" in err and "is leased by pid 1 of another PID namespace" in err, err


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


def test_a_read_only_volume(volume: Path, tmp_path: Path) -> None:
    db = volume / "app.db"
    ro = tmp_path / "ro"
    ro.mkdir()
    mount("--bind", "-o", "ro", str(volume), str(ro))
    try:
        # No lease file yet, and none can be made there: an error naming it.
        out = subprocess.run([str(CLI), "hold", str(ro / "app.db"), "--", "true"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 71
        assert f"{ro}/app.db.backend-lease" in out.stderr and "Read-only file system" in out.stderr
        # A lease file made before (by a writable mount, or in the image):
        # locked all the same, the record left as it was.
        subprocess.run([str(CLI), "hold", str(db), "--", "true"], check=True, timeout=30)
        before = status(db)["record"]
        script = f"'{CLI}' status --json '{db}'"
        out = subprocess.run([str(CLI), "hold", str(ro / "app.db"), "--", "sh", "-c", script],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 3, out.stderr  # status's: held
        during = json.loads(out.stdout)
        assert during["state"] == "held" and len(during["holders"]) == 1
        assert during["record"] == before, "no record written on a read-only volume"
        assert during["record_status"] == "released"
    finally:
        subprocess.run(["umount", "-l", str(ro)], timeout=30)


def test_the_images_layers_are_one_lease_per_container(tmp_path: Path) -> None:
    # Two containers from one image: each its own overlay (its own upper
    # layer) over the same lower layer, which holds the database and its
    # lease file. Each locks its own copy: two holders, nothing shared.
    lower = tmp_path / "lower"
    lower.mkdir()
    (lower / "app.db").touch()
    (lower / "app.db.backend-lease").touch()
    merged = []
    for n in ("one", "two"):
        for d in ("upper", "work", "merged"):
            (tmp_path / n / d).mkdir(parents=True)
        m = tmp_path / n / "merged"
        mount("-t", "overlay", "overlay", "-o",
              f"lowerdir={lower},upperdir={tmp_path / n / 'upper'},workdir={tmp_path / n / 'work'}", str(m))
        merged.append(m)
    try:
        script = f"'{CLI}' hold --timeout 0 '{merged[1]}/app.db' -- true"
        out = subprocess.run([str(CLI), "hold", "--timeout", "0", str(merged[0] / "app.db"), "--", "sh", "-c", script],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"both containers held 'the' lease at once: {out.stderr}"
    finally:
        for m in merged:
            subprocess.run(["umount", "-l", str(m)], timeout=30)
