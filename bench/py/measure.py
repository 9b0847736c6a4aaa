"""Python measurements for bench/: sidelease and the anchors users would
pick instead, in the same process and run.

    measure.py cycle|shared|refused|anchors TARGET ITERS
    measure.py waiter sidelease|filelock TARGET      (handoff waiter)
    measure.py hold-many DIR N                       (many-waits holder)
    measure.py many-waits DIR N asyncio|uvloop       (many-waits waiter)
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from typing import Callable, Dict, List


def stats(ns: List[int]) -> Dict[str, int]:
    ns.sort()
    return {"n": len(ns), "median_ns": ns[len(ns) // 2], "p99_ns": ns[int((len(ns) - 1) * 0.99)]}


def measure(iters: int, f: Callable[[], None]) -> Dict[str, int]:
    for _ in range(iters // 10 + 1):
        f()
    ns = []
    clock = time.perf_counter_ns
    for _ in range(iters):
        t = clock()
        f()
        ns.append(clock() - t)
    return stats(ns)


def anchors(target: str) -> Dict[str, Callable[[], None]]:
    """One uncontended cycle of each library users would pick instead."""
    import fasteners
    import filelock
    import portalocker

    def bare() -> None:
        fd = os.open(target + ".bare", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)

    fl = filelock.FileLock(target + ".filelock")

    def filelock_cycle() -> None:
        fl.acquire(timeout=0)
        fl.release()

    def portalocker_cycle() -> None:
        with portalocker.Lock(target + ".portalocker", timeout=0, fail_when_locked=True):
            pass

    fa = fasteners.InterProcessLock(target + ".fasteners")

    def fasteners_cycle() -> None:
        fa.acquire(blocking=False)
        fa.release()

    return {
        "python_bare_flock": bare,
        "python_filelock": filelock_cycle,
        "python_portalocker": portalocker_cycle,
        "python_fasteners": fasteners_cycle,
    }


def main() -> None:
    mode, target = sys.argv[1], sys.argv[2]
    if mode == "waiter":
        return waiter(target, sys.argv[3])
    if mode == "hold-many":
        return hold_many(target, int(sys.argv[3]))
    if mode == "many-waits":
        return many_waits(target, int(sys.argv[3]), sys.argv[4])
    iters = int(sys.argv[3])
    import sidelease

    if mode == "cycle":
        out = measure(iters, lambda: sidelease.acquire(target).release())
    elif mode == "shared":
        held = sidelease.acquire(target)
        out = measure(iters, lambda: sidelease.acquire(target).release())
        held.release()
    elif mode == "refused":
        def refused() -> None:
            try:
                sidelease.acquire(target)
            except sidelease.LeaseInUse:
                return
            raise AssertionError("the lease should be held elsewhere")
        out = measure(iters, refused)
    elif mode == "anchors" or mode.startswith("anchor:"):
        cycles = anchors(target)
        if mode == "anchors":
            out = {name: measure(iters, f) for name, f in cycles.items()}
        else:
            out = measure(iters, cycles[mode.split(":", 1)[1]])
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


def waiter(kind: str, target: str) -> None:
    if kind == "sidelease":
        import sidelease
        lease = None
        for line in sys.stdin:
            if line.startswith("wait"):
                lease = sidelease.acquire(target, timeout=30)
                print(time.monotonic_ns(), flush=True)
            elif line.startswith("release"):
                lease.release()  # type: ignore[union-attr]
                print("ok", flush=True)
            else:
                break
    else:
        import filelock
        fl = filelock.FileLock(target)  # default poll interval
        for line in sys.stdin:
            if line.startswith("wait"):
                fl.acquire(timeout=30)
                print(time.monotonic_ns(), flush=True)
            elif line.startswith("release"):
                fl.release()
                print("ok", flush=True)
            else:
                break


def hold_many(d: str, n: int) -> None:
    """Hold N leases; on "release", let them all go at once and print when
    each was let go (CLOCK_MONOTONIC, as the waiters print it)."""
    import sidelease
    leases = [sidelease.acquire(f"{d}/t{i}.db") for i in range(n)]
    print("held", flush=True)
    sys.stdin.readline()
    at = []
    for lease in leases:
        at.append(time.monotonic_ns())
        lease.release()
    print(json.dumps(at), flush=True)


def many_waits(d: str, n: int, loop_kind: str) -> None:
    """N acquire_async waits on N targets in one event loop, and a 1 ms
    ticker whose gaps show how long the loop was stalled."""
    import asyncio

    import sidelease

    acquired = [0] * n
    ticks: List[int] = []

    async def one(i: int, all_done: asyncio.Event) -> None:
        lease = await sidelease.acquire_async(f"{d}/t{i}.db", timeout=60)
        acquired[i] = time.monotonic_ns()
        held.append(lease)
        if len(held) == n:
            all_done.set()

    held: List[object] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic_ns())
            await asyncio.sleep(0.001)

    async def run() -> None:
        all_done = asyncio.Event()
        tasks = [asyncio.create_task(one(i, all_done)) for i in range(n)]
        await asyncio.sleep(0.5)  # every task reaches its wait
        tick = asyncio.create_task(ticker(all_done))
        print("ready", flush=True)
        await asyncio.wait_for(all_done.wait(), 60)
        await tick
        await asyncio.gather(*tasks)
        for lease in held:
            lease.release()  # type: ignore[attr-defined]

    if loop_kind == "uvloop":
        import uvloop
        uvloop.run(run())
    else:
        asyncio.run(run())
    print(json.dumps({"acquired_ns": acquired, "ticks_ns": ticks}), flush=True)


if __name__ == "__main__":
    main()
