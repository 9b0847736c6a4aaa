"""docs/howto/operating.md, as an operator does it: examples/operating/
check-lease.sh against a free, held, mistyped and lease-file path;
`status` and its exit codes and record states after a clean stop and a
SIGKILL, and of a hold killed alone (its command holds on); the live lease
file deleted under its holder (the holder puts it back and keeps the
lease; a newcomer is refused). Needs the CLI's release
build (tests/run builds it first). Every process is ended by its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLI = ROOT / "target/release/sidelease"
CHECK = HERE / "check-lease.sh"


def env() -> Dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{CLI.parent}:{e.get('PATH', '')}"
    return e


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*argv], capture_output=True, text=True, timeout=30, env=env())


def status(db: Path) -> dict:
    out = run(str(CLI), "status", "--json", str(db))
    return json.loads(out.stdout)


def eventually(what: str, cond, bound: float = 10.0) -> None:
    end = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < end, f"not within {bound}s: {what}"
        time.sleep(0.02)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    p = tmp_path / "app.db"
    p.touch()
    return p


@pytest.fixture
def procs() -> Iterator[List[subprocess.Popen]]:
    started: List[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def hold(db: Path, procs: List[subprocess.Popen], *opts: str) -> subprocess.Popen:
    """`sidelease hold DB -- sleep 600`, once it holds; its command's PID is
    the only child of the hold process."""
    p = subprocess.Popen([str(CLI), "hold", *opts, str(db), "--", "sleep", "600"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
    procs.append(p)
    eventually("the hold holds", lambda: status(db)["holders"] == [p.pid])
    return p


def children(pid: int) -> List[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(x) for x in f.read().split()]
    return kids


def test_the_check_tells_free_held_and_wrong_paths(db: Path, procs: List[subprocess.Popen]) -> None:
    free = run(str(CHECK), str(db))
    assert (free.returncode, free.stdout.strip()) == (1, f"WARNING: nobody holds {db}")

    h = hold(db, procs)
    # What the page shows: the lease file, its state, the holder's PID and
    # its record; exit 3.
    out = run(str(CLI), "status", str(db))
    assert out.returncode == 3
    lines = out.stdout.splitlines()
    assert lines[0] == f"{db}.backend-lease: held"
    assert lines[1].split() == ["holders:", str(h.pid)]
    assert lines[2].split()[:3] == ["record:", "live", "(pid"]
    held = run(str(CHECK), str(db))
    assert (held.returncode, held.stdout.strip()) == (0, f"OK: {db} is held")

    typo = run(str(CHECK), str(db.with_name("ap.db")))
    assert (typo.returncode, typo.stdout.strip()) == (2, f"CRITICAL: no such database: {db.with_name('ap.db')}")

    # The path every message prints, pasted back: refused, never "free".
    lease_file = run(str(CHECK), f"{db}.backend-lease")
    assert lease_file.returncode == 2
    assert lease_file.stdout.startswith("CRITICAL: sidelease status exited 71:"), lease_file.stdout
    assert f"did you mean {db}?" in lease_file.stdout


def test_status_after_a_clean_stop_and_after_a_sigkill(db: Path, procs: List[subprocess.Popen]) -> None:
    # SIGTERM: hold passes it to the command, releases, exits 128+15.
    h = hold(db, procs)
    h.send_signal(signal.SIGTERM)
    assert h.wait(timeout=10) == 143
    out = run(str(CLI), "status", str(db))
    assert out.returncode == 0
    s = status(db)
    assert (s["state"], s["record_status"], s["holders"]) == ("free", "released", [])

    # SIGKILL of hold and of its command: the lease is free at once, and the
    # record says its holder did not release (the next one recovers).
    h = hold(db, procs, "--no-inherit")
    (cmd,) = children(h.pid)
    os.kill(h.pid, signal.SIGKILL)
    os.kill(cmd, signal.SIGKILL)
    h.wait()
    eventually("the command is gone", lambda: not os.path.exists(f"/proc/{cmd}/stat")
               or open(f"/proc/{cmd}/stat").read().split(") ")[1].startswith("Z"))
    s = status(db)
    assert (s["state"], s["record_status"], s["holders"]) == ("free", "stale", [])
    nxt = run(str(CLI), "hold", "--timeout", "0", str(db), "--", "true")
    assert nxt.returncode == 0
    assert "did not release it cleanly" in nxt.stderr


def test_a_deleted_lease_file_is_put_back_and_the_holder_keeps_the_lease(db: Path, procs: List[subprocess.Popen]) -> None:
    h = hold(db, procs)
    lease_file = Path(f"{db}.backend-lease")
    lease_file.unlink()
    eventually("the holder put its file back", lease_file.exists)
    s = status(db)
    assert (s["state"], s["holders"]) == ("held", [h.pid])
    refused = run(str(CLI), "hold", "--timeout", "0", str(db), "--", "true")
    assert refused.returncode == 75, refused.stderr
    assert h.poll() is None, "the holder and its command run on"


def test_killing_hold_alone_leaves_its_command_holding(db: Path, procs: List[subprocess.Popen]) -> None:
    h = hold(db, procs)
    (cmd,) = children(h.pid)
    os.kill(h.pid, signal.SIGKILL)
    h.wait()
    s = status(db)
    assert (s["state"], s["holders"]) == ("held", [cmd])
    os.kill(cmd, signal.SIGKILL)
    eventually("the lease is free once the command is gone", lambda: status(db)["state"] == "free")
