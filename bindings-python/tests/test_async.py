"""acquire_async: waits on the event loop, cancels cleanly, needs no thread
per wait."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

from typing import Any

import pytest

import sidelease
from conftest import STEP, Holder


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, STEP * 2))


def test_acquire_async_when_free(db: str) -> None:
    async def main() -> None:
        lease = await sidelease.acquire_async(db, metadata={"a": 1})
        assert lease.record["metadata"] == {"a": 1}
        lease.release()

    run(main())


def test_async_with_acquire_async_releases_on_the_way_out(db: str) -> None:
    """``async with sidelease.acquire_async(db) as lease:`` as filelock's
    ``async with AsyncFileLock(...)`` (issue 39: it raised, and warned of a
    coroutine never awaited)."""

    async def main() -> None:
        async with sidelease.acquire_async(db, metadata={"a": 1}) as lease:
            assert lease.state == "held" and lease.record["metadata"] == {"a": 1}
            assert sidelease.inspect(db)["state"] == "held"
        assert lease.state == "released"
        assert sidelease.inspect(db)["state"] == "free"
        with pytest.raises(KeyError):
            async with sidelease.acquire_async(db) as lease:
                raise KeyError("work failed")
        assert lease.state == "released", "released when the work raised too"
        # Still a coroutine: a task, wait_for.
        task = asyncio.create_task(sidelease.acquire_async(db))
        assert "acquire_async" in repr(task), repr(task)
        (await task).release()
        (await asyncio.wait_for(sidelease.acquire_async(db), 5)).release()

    run(main())


@pytest.mark.skipif(sys.version_info < (3, 12), reason="inspect.markcoroutinefunction is 3.12's")
def test_acquire_async_reads_as_a_coroutine_function() -> None:
    # What a framework asks before it awaits a hook (Starlette's
    # is_async_callable): False would have it called and never awaited.
    import inspect

    assert inspect.iscoroutinefunction(sidelease.acquire_async)


def test_acquire_async_in_use_and_timeout(db: str, holder: Holder) -> None:
    async def main() -> None:
        with pytest.raises(sidelease.LeaseInUse) as ei:
            await sidelease.acquire_async(db)
        assert type(ei.value) is sidelease.LeaseInUse
        assert ei.value.holders == [holder.pid]
        t = time.monotonic()
        with pytest.raises(sidelease.LeaseTimeout):
            await sidelease.acquire_async(db, timeout=0.3)
        assert time.monotonic() - t >= 0.3

    run(main())


def test_wait_does_not_block_the_loop_and_wakes_on_release(db: str, holder: Holder) -> None:
    async def main() -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        waiter = asyncio.create_task(sidelease.acquire_async(db, timeout=STEP))
        await asyncio.sleep(0.3)
        assert ticks >= 10, "the event loop was blocked during the wait"
        assert not waiter.done()
        t = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, holder.release)
        lease = await waiter
        assert time.monotonic() - t < 1.0
        assert lease.previous_released_cleanly
        lease.release()
        tick.cancel()

    run(main())


def test_cancelling_the_task_leaves_nothing_held(db: str, holder: Holder) -> None:
    lease_path = os.path.realpath(db) + ".backend-lease"

    def lease_fds() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") == lease_path
            except OSError:
                pass  # the listing's own descriptor, closed by now
        return n

    async def main() -> None:
        assert lease_fds() == 0
        task = asyncio.create_task(sidelease.acquire_async(db, timeout=None))
        await asyncio.sleep(0.2)
        assert lease_fds() == 1, "the wait has the lease file open"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The wait's descriptor is closed (the instances it used linger a
        # while, as test_150_waits... counts).
        assert lease_fds() == 0

    run(main())
    holder.release()
    assert sidelease.inspect(db)["state"] == "free"


def test_a_hundred_waits_need_no_threads(db: str, holder: Holder) -> None:
    async def main() -> None:
        threads_before = threading.active_count()
        tasks = [asyncio.create_task(sidelease.acquire_async(db, timeout=STEP)) for _ in range(100)]
        await asyncio.sleep(0.3)
        assert threading.active_count() == threads_before
        assert not any(t.done() for t in tasks)
        await asyncio.get_running_loop().run_in_executor(None, holder.release)
        leases = await asyncio.gather(*tasks)
        assert len({lease.record["nonce"] for lease in leases}) == 1, "all share one lease"
        for lease in leases:
            lease.release()
        assert sidelease.inspect(db)["state"] == "free"

    run(main())


INSTANCES = textwrap.dedent(
    """
    import asyncio, json, os, subprocess, sys, time
    import sidelease

    WAITS = 150
    d = sys.argv[1]

    def instances():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
            except OSError:
                pass
        return n

    def idle():
        end = time.monotonic() + 10
        while instances() and time.monotonic() < end:
            time.sleep(0.05)
        return instances()

    out = {"start": instances()}
    lease = sidelease.acquire(f"{d}/held.db")
    out["holding"] = instances()
    lease.release()
    out["idle_after_holding"] = idle()

    hold = "import sidelease, sys; held = [sidelease.acquire(p) for p in sys.argv[1:]]; print('held', flush=True); sys.stdin.readline()"
    targets = [f"{d}/w{i}.db" for i in range(WAITS)]
    holder = subprocess.Popen([sys.executable, "-c", hold, *targets], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()

    async def main():
        tasks = [asyncio.create_task(sidelease.acquire_async(t, timeout=30)) for t in targets]
        await asyncio.sleep(0.3)
        out["waiting"] = instances()
        holder.stdin.write("go\\n")
        holder.stdin.flush()
        leases = await asyncio.gather(*tasks)
        out["acquired"] = len(leases)
        for l in leases:
            l.release()

    asyncio.run(main())
    holder.wait()
    out["idle_after_waits"] = idle()
    print(json.dumps(out))
    """
)


def test_150_waits_share_two_inotify_instances_beside_the_watch_and_an_idle_process_keeps_none(tmp_path: Any) -> None:
    # In a fresh interpreter: the count is per process.
    out = subprocess.run([sys.executable, "-c", INSTANCES, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "start": 0,
        "holding": 1,
        "idle_after_holding": 0,
        # One for the first wait, one for all the others, and the watch's,
        # made at the first attempt (docs/algorithm.md, "A killed holder's lock").
        "waiting": 3,
        "acquired": 150,
        "idle_after_waits": 0,
    }


SLICED = textwrap.dedent(
    """
    import asyncio, collections, json, subprocess, sys
    import sidelease

    WAITS = 200
    d = sys.argv[1]
    hold = "import sidelease, sys; held = [sidelease.acquire(p) for p in sys.argv[1:]]; print('held', flush=True); sys.stdin.readline()"
    targets = [f"{d}/w{i}.db" for i in range(WAITS)]
    holder = subprocess.Popen([sys.executable, "-c", hold, *targets], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()
    out = {}

    async def main():
        iteration = 0

        async def ticker():
            nonlocal iteration
            while True:
                iteration += 1
                await asyncio.sleep(0)

        at = {}

        async def one(i):
            lease = await sidelease.acquire_async(targets[i], timeout=30)
            at[i] = iteration
            return lease

        tick = asyncio.create_task(ticker())
        tasks = [asyncio.create_task(one(i)) for i in range(WAITS)]
        await asyncio.sleep(0.3)
        # Every wait is woken before the loop runs again (the holder has
        # exited), and every fourth is given up before it is stepped.
        holder.stdin.write("go\\n")
        holder.stdin.flush()
        holder.wait()
        given_up = tasks[3::4]
        for t in given_up:
            t.cancel()
        kept = [t for t in tasks if t not in given_up]
        leases = await asyncio.wait_for(asyncio.gather(*kept), 30)
        await asyncio.gather(*given_up, return_exceptions=True)
        out["acquired"] = len(leases)
        out["cancelled"] = sum(t.cancelled() for t in given_up)
        out["per_iteration"] = sorted(collections.Counter(at.values()).values())
        for lease in leases:
            lease.release()
        tick.cancel()

    asyncio.run(main())
    out["free"] = sum(sidelease.inspect(t)["state"] == "free" for t in targets)
    print(json.dumps(out))
    """
)


def test_waits_woken_together_take_turns_across_iterations_and_a_given_up_one_costs_none(tmp_path: Any) -> None:
    # 200 waits woken in one iteration: their attempts are spread over
    # iterations of about a millisecond each (a ticker task runs between
    # them), none is lost when a fourth of them are cancelled before their
    # turn, and nothing stays held.
    out = subprocess.run([sys.executable, "-c", SLICED, str(tmp_path)], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    # The loop logs an exception in a callback and goes on: none may.
    assert "Exception in callback" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    got = json.loads(out.stdout)
    assert got["acquired"] == 150 and got["cancelled"] == 50, got
    assert sum(got["per_iteration"]) == 150, got
    # All in one iteration is what slicing prevents; 150 acquisitions take
    # well over a millisecond on any machine.
    assert len(got["per_iteration"]) >= 2 and got["per_iteration"][-1] < 150, got
    assert got["free"] == 200, got


def test_a_loop_closed_with_its_slice_planned_is_freed_with_it(db: str) -> None:
    # A loop closed before the end of its attempt slice ran (planned, with
    # its budget spent) must hold nothing a later loop could meet: no entry
    # outlives it, and the next loop's waits go at once.
    import gc
    import weakref

    loop = asyncio.new_event_loop()
    s = sidelease._slice(loop)  # type: ignore[attr-defined]
    s.planned, s.used = True, 10**6
    closed = weakref.ref(loop)
    loop.close()
    del loop, s
    gc.collect()
    assert closed() is None, "the closed loop was kept alive"
    assert len(sidelease._slices) == 0  # type: ignore[attr-defined]

    async def main() -> None:
        lease = await sidelease.acquire_async(db, timeout=STEP)
        lease.release()

    run(main())
