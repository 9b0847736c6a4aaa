"""PostgreSQL leases from Python: async waits woken by the server, task
cancellation that leaves no waiter on the server, and the lost signal when
the session is terminated. Needs the cluster tests/run starts
(SIDELEASE_TEST_PG*)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import sidelease

from conftest import STEP, holder_backends, pg_url, psql, terminate_holder

HERE = os.path.dirname(__file__)


HOLD = "import sidelease, sys, time; l = sidelease.acquire(sys.argv[1]); print('held', flush=True); time.sleep(600)"


def _holder(url: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, url], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _waiters(url: str) -> int:
    """Sessions of this process waiting for the lease `url`."""
    name = url.rsplit("lease=", 1)[1]
    return int(psql("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                     "WHERE l.locktype = 'advisory' AND NOT l.granted "
                     f"AND a.application_name = 'sidelease {os.getpid()}@' || split_part(a.application_name, '@', 2) "
                     f"AND a.application_name LIKE '% {name}'"))


def _sessions(url: str) -> str:
    """This process's sessions for the lease `url`, as the server sees them
    (for a failure's message: which statement is still running, since when)."""
    name = url.rsplit("lease=", 1)[1]
    return psql("SELECT string_agg(format('pid %s client port %s %s/%s since %s, query started %s: %s', "
                 "pid, client_port, state, wait_event, backend_start, query_start, left(query, 60)), E'\\n') "
                 f"FROM pg_stat_activity WHERE application_name LIKE 'sidelease {os.getpid()}@% {name}'")


def test_acquire_async_is_woken_by_the_server_and_the_loop_keeps_running() -> None:
    url = pg_url()
    holder = _holder(url)

    async def main() -> sidelease.Lease:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        waiting = asyncio.ensure_future(sidelease.acquire_async(url, timeout=20))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        holder.kill()
        lease = await asyncio.wait_for(waiting, 5)
        t.cancel()
        assert ticks > 20, f"the event loop stalled while waiting ({ticks} ticks)"
        return lease

    try:
        lease = asyncio.run(main())
        assert lease.generation == 2
        assert lease.previous_released_cleanly is False
        assert "app-secret" not in lease.lease_path
        lease.release()
    finally:
        holder.kill()
        holder.wait()


def test_cancelling_the_task_leaves_no_waiter_on_the_server() -> None:
    url = pg_url()
    holder = _holder(url)

    async def main() -> None:
        waiting = asyncio.ensure_future(sidelease.acquire_async(url, timeout=None))
        # Its session on the server (a first connection takes a while on a
        # loaded machine).
        deadline = time.monotonic() + STEP
        while _waiters(url) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert _waiters(url) >= 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    try:
        asyncio.run(main())
        deadline = time.monotonic() + 2
        while _waiters(url) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _waiters(url) == 0
        token = sidelease.CancelToken()

        async def sync_in_thread() -> None:
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(None, lambda: sidelease.acquire(url, timeout=None, cancel=token))
            await asyncio.sleep(0.3)
            token.cancel()
            with pytest.raises(sidelease.LeaseCancelled):
                await fut

        asyncio.run(sync_in_thread())
    finally:
        holder.kill()
        holder.wait()


def test_a_terminated_session_makes_the_lease_lost() -> None:
    url = pg_url()
    lease = sidelease.acquire(url)

    async def main() -> None:
        lost = asyncio.ensure_future(lease.wait_lost())
        await asyncio.sleep(0.1)
        assert terminate_holder(url) == 1
        t = time.monotonic()
        err = await asyncio.wait_for(lost, 2)
        assert time.monotonic() - t < 2
        assert isinstance(err, sidelease.LeaseLost)
        assert "terminating connection" in str(err)

    asyncio.run(main())
    assert lease.state == "lost"
    with pytest.raises(sidelease.LeaseLost):
        lease.ensure_held()
    lease.release()
    info = sidelease.inspect(url)
    assert info["state"] == "free" and info["record_status"] == "stale"


def test_many_cancelled_waits_leave_nothing_on_the_server() -> None:
    url = pg_url()
    holder = _holder(url)

    async def main() -> None:
        import random

        rnd = random.Random(5)
        for _ in range(60):
            t = asyncio.ensure_future(sidelease.acquire_async(url, timeout=None))
            await asyncio.sleep(rnd.uniform(0, 0.02))
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t

    def sessions() -> str:
        return psql("SELECT count(*) FROM pg_stat_activity "
                    f"WHERE application_name LIKE 'sidelease {os.getpid()}@% {url.rsplit('lease=', 1)[1]}'")

    try:
        asyncio.run(main())
        given_up = time.time()
        # A wait sent before its task was cancelled is cancelled on the
        # server (within 3 s), and a session still connecting when it was
        # closes once connected: none is left after the bound.
        deadline = time.monotonic() + 6
        while (_waiters(url) or sessions() != "0") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiters(url) == 0, f"{time.time() - given_up:.1f} s after the last cancel: {_sessions(url)}"
        assert sessions() == "0", _sessions(url)
    finally:
        holder.kill()
        holder.wait()


def test_ensure_held_now_asks_the_server_and_agrees_with_the_rest() -> None:
    url = pg_url()
    lease = sidelease.acquire(url + "&confirm_within=500")
    for _ in range(20):
        lease.ensure_held_now()
    backend = int(psql(holder_backends(url)))
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    th = threading.Thread(target=tick)
    th.start()
    # A stalled server answers nothing: ensure_held_now() says lost once the
    # bound passed, and holds no GIL meanwhile.
    os.kill(backend, signal.SIGSTOP)
    try:
        t = time.monotonic()
        with pytest.raises(sidelease.LeaseLost, match="did not confirm"):
            lease.ensure_held_now()
        took = time.monotonic() - t
    finally:
        os.kill(backend, signal.SIGCONT)
        done.set()
        th.join()
    assert 0.05 < took < 0.9, took
    assert len(gaps) > 10 and max(gaps) < 0.2, (len(gaps), max(gaps))
    assert lease.state == "lost"
    with pytest.raises(sidelease.LeaseLost):
        lease.ensure_held()
    lease.release()
    with pytest.raises(sidelease.InvalidArgument, match="released"):
        lease.ensure_held_now()


def test_confirm_within_out_of_range_names_the_parameter() -> None:
    with pytest.raises(sidelease.InvalidArgument, match="confirm_within=50: milliseconds, 100 to 4000"):
        sidelease.acquire(pg_url() + "&confirm_within=50")
