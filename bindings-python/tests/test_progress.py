"""A wait that names who it waits for: `on_waiting` (acquire and
acquire_async) and the `sidelease` logger at INFO, once when the wait
starts and again whenever the holder changes, never per wake-up."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Dict, List

import pytest

import sidelease

from conftest import RIVAL, Holder, pg_url

# A holder that is no sidelease process: it locks the lease file and hands
# the lock on to a `sleep` it starts (the same open file), then exits when
# told: the holder changes without the lock ever being free.
HAND_ON = textwrap.dedent(
    """
    import fcntl, os, subprocess, sys
    f = open(sys.argv[1], "a")
    fcntl.flock(f, fcntl.LOCK_EX)
    child = subprocess.Popen(["sleep", "60"], pass_fds=[f.fileno()])
    print(child.pid, flush=True)
    sys.stdin.readline()
    """
)


def test_a_wait_names_its_holder_once_and_again_when_it_changes(tmp_path: Any) -> None:
    db = str(tmp_path / "app.db")
    a = subprocess.Popen([sys.executable, "-c", HAND_ON, db + ".backend-lease"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert a.stdout is not None and a.stdin is not None
    sleeper = int(a.stdout.readline())
    heard: List[Dict[str, Any]] = []
    got: List[Any] = []
    t0 = time.monotonic()
    waiter = threading.Thread(target=lambda: got.append(sidelease.acquire(db, timeout=20, on_waiting=heard.append)))
    waiter.start()
    try:
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.005)
        assert heard, "named the holder"
        assert time.monotonic() - t0 < 1, "within 1 s of starting to wait"
        assert a.pid in heard[0]["holders"], heard
        assert heard[0]["holder"] is None  # no record: a guess would be wrong
        assert str(a.pid) in heard[0]["message"]
        time.sleep(0.5)
        assert len(heard) == 1, "nothing more while the holder stays"
        a.stdin.write("\n")
        a.stdin.flush()
        a.wait(10)
        deadline = time.monotonic() + 5
        while len(heard) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(heard) == 2 and heard[1]["holders"] == [sleeper], heard
        time.sleep(0.3)
        assert len(heard) == 2, "once per holder"
    finally:
        os.kill(sleeper, 9)
        if a.poll() is None:
            a.kill()
        a.wait(10)
        waiter.join(20)
    assert got and got[0].state == "held"
    got[0].release()


# A holder caught between writing its release and dropping its lock (the
# moment a waiter woken by that write looks): it locks the lease file,
# writes a record of itself (argv[2], a holder's record as JSON), and on
# each line of stdin rewrites it with `released_at` set, still locked.
RELEASING = textwrap.dedent(
    """
    import fcntl, json, os, sys
    rec = json.loads(sys.argv[2])
    rec.update(pid=os.getpid(), nonce="0" * 32)
    rec.pop("proc_start", None)
    f = open(sys.argv[1], "r+")
    fcntl.flock(f, fcntl.LOCK_EX)
    def write():
        b = json.dumps(rec).encode()
        os.pwrite(f.fileno(), b, 0)
        os.ftruncate(f.fileno(), len(b))
    write()
    print("held", flush=True)
    sys.stdin.readline()
    rec["released_at"] = "2026-12-04T20:00:00.000Z"
    write()
    print("released", flush=True)
    sys.stdin.readline()
    """
)


def test_a_holder_writing_its_release_is_not_told_as_a_new_holder(tmp_path: Any) -> None:
    db = str(tmp_path / "app.db")
    h = Holder(db)
    template = json.dumps(h.record)
    h.release()
    h.close()
    a = subprocess.Popen([sys.executable, "-c", RELEASING, db + ".backend-lease", template],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert a.stdout is not None and a.stdin is not None
    heard: List[Dict[str, Any]] = []
    got: List[Any] = []
    try:
        assert a.stdout.readline() == "held\n"
        waiter = threading.Thread(target=lambda: got.append(sidelease.acquire(db, timeout=20, on_waiting=heard.append)))
        waiter.start()
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(heard) == 1 and heard[0]["holder"]["pid"] == a.pid, heard
        a.stdin.write("\n")
        a.stdin.flush()
        assert a.stdout.readline() == "released\n"
        time.sleep(0.5)  # the waiter wakes on the write and looks again
        assert len(heard) == 1, heard
        a.stdin.write("\n")
        a.stdin.flush()
        a.wait(10)
        waiter.join(20)
        assert len(heard) == 1, heard
        assert got and got[0].state == "held"
        got[0].release()
    finally:
        if a.poll() is None:
            a.kill()
        a.wait(10)


def test_the_callback_and_the_logger_hear_a_sidelease_holder(tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="sidelease")
    db = str(tmp_path / "app.db")
    h = Holder(db)
    try:
        heard: List[Dict[str, Any]] = []

        async def main() -> sidelease.Lease:
            task = asyncio.ensure_future(sidelease.acquire_async(db, timeout=10, on_waiting=heard.append))
            while not heard:
                await asyncio.sleep(0.005)
            h.release()
            return await task

        lease = asyncio.run(main())
        lease.release()
        assert len(heard) == 1 and heard[0]["holder"]["pid"] == h.pid, heard
        assert heard[0]["holder"]["metadata"] == {"role": "holder"}
        lines = [r.getMessage() for r in caplog.records if r.name == "sidelease"]
        assert len(lines) == 3 and lines[0].startswith(f"waiting for {db}: ") and str(h.pid) in lines[0], lines
        assert lines[1:] == [f"acquired {db} (generation {lease.generation})",
                             f"released {db} (generation {lease.generation})"], lines
    finally:
        h.close()


def test_nothing_is_told_without_a_wait_and_a_raising_callback_ends_the_wait(tmp_path: Any) -> None:
    db = str(tmp_path / "app.db")
    heard: List[Dict[str, Any]] = []
    sidelease.acquire(db, on_waiting=heard.append).release()  # free: no wait
    h = Holder(db)
    try:
        with pytest.raises(sidelease.LeaseInUse):
            sidelease.acquire(db, on_waiting=heard.append)  # one attempt: no wait either
        assert heard == []

        def boom(info: Dict[str, Any]) -> None:
            raise RuntimeError("from on_waiting")

        with pytest.raises(RuntimeError, match="from on_waiting"):
            sidelease.acquire(db, timeout=10, on_waiting=boom)
        with pytest.raises(RuntimeError, match="from on_waiting"):
            asyncio.run(sidelease.acquire_async(db, timeout=10, on_waiting=boom))
        with pytest.raises(TypeError, match="on_waiting"):
            sidelease.acquire(db, timeout=1, on_waiting=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="on_waiting"):
            asyncio.run(sidelease.acquire_async(db, timeout=1, on_waiting=5))  # type: ignore[arg-type]
        h.release()
        # Nothing was left held by the raised waits.
        sidelease.acquire(db).release()
    finally:
        h.close()


def test_a_postgresql_wait_names_the_holder_from_its_row(tmp_path: Any) -> None:
    url = pg_url("progress")
    h = Holder(url)
    try:
        heard: List[Dict[str, Any]] = []
        t0 = time.monotonic()
        with pytest.raises(sidelease.LeaseTimeout):
            sidelease.acquire(url, timeout=1.5, on_waiting=lambda i: heard.append(dict(i, at=time.monotonic() - t0)))
        assert len(heard) == 1, heard
        assert heard[0]["at"] < 1
        assert heard[0]["holder"]["pid"] == h.pid and heard[0]["holder"]["metadata"] == {"role": "holder"}
        assert "secret" not in heard[0]["message"]
    finally:
        h.close()


def test_a_plain_lease_is_logged_acquired_and_released_at_info(tmp_path: Any, caplog: Any) -> None:
    db = str(tmp_path / "app.db")
    sidelease.acquire(db).release()  # the logger is at WARNING: nothing
    assert [r for r in caplog.records if r.name == "sidelease"] == []
    caplog.set_level(logging.INFO, logger="sidelease")
    lease = sidelease.acquire(db)
    lease.release()
    lease.release()  # a second release is nothing, and says nothing

    async def main() -> None:
        async with await sidelease.acquire_async(db, timeout=1):
            pass

    asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if r.name == "sidelease"]
    g = lease.generation
    assert lines == [f"acquired {db} (generation {g})", f"released {db} (generation {g})",
                     f"acquired {db} (generation {g + 1})", f"released {db} (generation {g + 1})"], lines
    url = pg_url("logged")
    caplog.clear()
    sidelease.acquire(url).release()
    lines = [r.getMessage() for r in caplog.records if r.name == "sidelease"]
    assert len(lines) == 2 and lines[0].startswith("acquired postgresql://") and "secret" not in "".join(lines), lines



def test_a_plain_lease_lost_is_logged_at_warning_on_the_main_thread(tmp_path: Any, caplog: Any) -> None:
    db = str(tmp_path / "app.db")
    lease = sidelease.acquire(db)
    rival = subprocess.Popen([sys.executable, "-c", RIVAL, str(tmp_path / "rival"), lease.lease_path],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rival.stdout is not None and rival.stdout.readline() == "renamed\n"
        deadline = time.monotonic() + 5
        told: List[logging.LogRecord] = []
        while time.monotonic() < deadline and not told:
            time.sleep(0.01)  # Python code runs: the pending call with it
            told = [r for r in caplog.records if r.name == "sidelease" and r.getMessage().startswith("lease lost: ")]
        assert lease.lost
        assert len(told) == 1 and told[0].levelno == logging.WARNING, caplog.text
        assert told[0].threadName == threading.main_thread().name
        assert lease.lease_path in told[0].getMessage() and str(rival.pid) in told[0].getMessage()
        lease.release()
    finally:
        rival.kill()
        rival.wait(10)
