"""The holder's watch from Python: a deleted or replaced lease file is put
back; a rival that takes the new file makes the lease lost (`lost`,
`ensure_held()`, `await wait_lost()`); forks do not warn about the
watcher thread."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import textwrap
import time
from typing import Iterator, Tuple

import pytest

import sidelease

STEP = 10.0


def _wait(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + STEP
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def _locked_by_me(path: str) -> bool:
    ino = os.stat(path).st_ino
    with open("/proc/locks") as f:
        return any(f" {os.getpid()} " in line and f":{ino} " in line for line in f)


@pytest.fixture
def rival(db: str) -> Iterator[Tuple[str, int]]:
    """A file locked by another process, ready to be renamed over the
    lease file: (its path, the PID holding it)."""
    tmp = db + ".rival"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import fcntl, os, sys
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("locked", flush=True)
            sys.stdin.read()
            """
        ), tmp],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        yield tmp, child.pid
    finally:
        child.kill()
        child.wait(STEP)
        for f in (child.stdin, child.stdout):
            if f is not None:
                f.close()


def test_deleted_lease_file_is_put_back_and_stays_held(db: str) -> None:
    lease = sidelease.acquire(db)
    try:
        assert lease.state == "held" and not lease.lost and lease.lost_reason is None
        os.unlink(lease.lease_path)
        _wait(lambda: os.path.exists(lease.lease_path) and _locked_by_me(lease.lease_path), "the re-anchor")
        lease.ensure_held()
        assert lease.state == "held"
        # Another process, split guard off, cannot take the put-back file.
        r = subprocess.run(
            [sys.executable, "-c", f"import sidelease; sidelease.acquire({db!r}, split_guard=False)"],
            capture_output=True, text=True, timeout=STEP,
        )
        assert r.returncode != 0 and "LeaseInUse" in r.stderr, r.stderr
    finally:
        lease.release()
    assert lease.state == "released"


def test_rival_makes_the_lease_lost(db: str, rival: Tuple[str, int]) -> None:
    tmp, rival_pid = rival
    lease = sidelease.acquire(db)
    os.rename(tmp, lease.lease_path)
    _wait(lambda: lease.lost, "the lost signal")
    assert lease.state == "lost"
    assert str(rival_pid) in (lease.lost_reason or "")
    with pytest.raises(sidelease.LeaseLost) as ei:
        lease.ensure_held()
    e = ei.value
    assert isinstance(e, sidelease.LeaseError)
    assert rival_pid in e.holders and e.lease_path == lease.lease_path and e.reason
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is sidelease.LeaseLost
    assert (str(again), again.reason, again.holders, again.lease_path) == (str(e), e.reason, e.holders, e.lease_path)
    lease.release()
    assert lease.state == "released"


def test_wait_lost_returns_the_error_or_none(db: str, rival: Tuple[str, int]) -> None:
    tmp, rival_pid = rival

    async def main() -> None:
        lease = sidelease.acquire(db)
        waiter = asyncio.ensure_future(lease.wait_lost())
        await asyncio.sleep(0.05)
        assert not waiter.done()
        t = time.monotonic()
        os.rename(tmp, lease.lease_path)
        e = await asyncio.wait_for(waiter, STEP)
        # A rival without a record is a loss once it kept the file 100 ms
        # and 20 looks in a row (1 ms apart): what the loop must hear is
        # that, not a hang until the timeout; 20 wake-ups on a loaded
        # machine take more than their 20 ms.
        assert time.monotonic() - t < 2
        assert isinstance(e, sidelease.LeaseLost) and rival_pid in e.holders
        lease.release()

        other = sidelease.acquire(db + "-2")
        waiter = asyncio.ensure_future(other.wait_lost())
        await asyncio.sleep(0.02)
        other.release()
        assert await asyncio.wait_for(waiter, STEP) is None

    asyncio.run(main())


def test_watch_off_leaves_a_deleted_file_alone(db: str) -> None:
    lease = sidelease.acquire(db, watch=False)
    try:
        os.unlink(lease.lease_path)
        time.sleep(0.1)
        assert not os.path.exists(lease.lease_path)
        assert lease.state == "held"
        assert lease.check() == "unlinked"
    finally:
        lease.release()


def test_watch_must_be_a_bool(db: str) -> None:
    with pytest.raises(TypeError):
        sidelease.acquire(db, watch="yes")  # type: ignore[arg-type]


FORK_CHILD = textwrap.dedent(
    """
    import os, sys, warnings, sidelease
    lease = sidelease.acquire(sys.argv[1])
    assert sidelease._native._watch_running()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    bad = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert not bad, bad
    # The watcher is back after the fork and still defends the lease.
    import time
    deadline = time.monotonic() + 5
    while not sidelease._native._watch_running():
        assert time.monotonic() < deadline, "the watcher did not come back"
        time.sleep(0.001)
    os.unlink(lease.lease_path)
    while not os.path.exists(lease.lease_path):
        assert time.monotonic() < deadline, "not re-anchored after the fork"
        time.sleep(0.001)
    print("ok", flush=True)
    """
)


def test_os_fork_emits_no_deprecation_warning_for_the_watcher(db: str) -> None:
    r = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", FORK_CHILD, db],
        capture_output=True, text=True, timeout=STEP * 3,
    )
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
