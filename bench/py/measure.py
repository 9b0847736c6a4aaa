"""Python measurements for bench/: sidelease and the anchors users would
pick instead, in the same process and run.

    measure.py cycle|shared|refused|anchors TARGET ITERS
    measure.py waiter sidelease|filelock TARGET      (handoff waiter)
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


if __name__ == "__main__":
    main()
