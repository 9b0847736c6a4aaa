"""The Python agent (see tests/PROTOCOL.md)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any, Dict, Optional

import sidelease

KINDS = [
    (sidelease.LeaseTimeout, "timeout"),
    (sidelease.LeaseInUse, "in_use"),
    (sidelease.UnsupportedFilesystem, "unsupported_fs"),
    (sidelease.InvalidArgument, "invalid_argument"),
    (sidelease.LeaseLost, "lost"),
    (OSError, "io"),
]


def error(e: BaseException) -> Dict[str, Any]:
    kind = next((k for cls, k in KINDS if isinstance(e, cls)), "other")
    err: Dict[str, Any] = {"kind": kind, "message": str(e)}
    if isinstance(e, sidelease.LeaseInUse):
        err["holder"] = e.holder
        err["holders"] = e.holders
    if isinstance(e, OSError) and e.errno:
        err["errno"] = e.errno
    return {"ok": False, "error": err}


def options(cmd: Dict[str, Any]) -> Dict[str, Any]:
    o: Dict[str, Any] = {"timeout": cmd["timeout"] if "timeout" in cmd else 0}
    for k in ("suffix", "metadata", "split_guard", "watch"):
        if k in cmd:
            o[k] = cmd[k]
    return o


def stress(cmd: Dict[str, Any]) -> Dict[str, Any]:
    me = str(os.getpid())
    done = overlaps = timeouts = lost = 0
    for _ in range(cmd["iterations"]):
        try:
            lease = sidelease.acquire(cmd["target"], timeout=cmd["timeout"], split_guard=cmd.get("split_guard", True))
        except sidelease.LeaseTimeout:
            timeouts += 1
            continue
        with open(cmd["owner"], "r+") as f:
            if f.read().strip() != "-":
                overlaps += 1
            f.seek(0)
            f.write(me)
            f.truncate()
        with open(cmd["counter"], "r+") as f:
            n = int(f.read() or 0)
            f.seek(0)
            f.write(str(n + 1))
            f.truncate()
        with open(cmd["owner"], "r+") as f:
            if f.read().strip() != me:
                overlaps += 1
            f.seek(0)
            f.write("-")
            f.truncate()
        lost += lease.lost
        lease.release()
        done += 1
    return {"ok": True, "done": done, "overlaps": overlaps, "timeouts": timeouts, "lost": lost}


def state(lease: sidelease.Lease) -> Dict[str, Any]:
    return {"ok": True, "state": lease.state, "reason": lease.lost_reason}


def wait_lost(lease: sidelease.Lease, timeout: float) -> Dict[str, Any]:
    """`await lease.wait_lost()` on an event loop, for up to `timeout`."""
    start = time.monotonic()

    async def wait() -> bool:
        try:
            err = await asyncio.wait_for(lease.wait_lost(), timeout)
        except asyncio.TimeoutError:
            return False
        return isinstance(err, sidelease.LeaseLost)

    lost = asyncio.run(wait())
    out = state(lease)
    out.update(lost=lost, elapsed_ms=(time.monotonic() - start) * 1000)
    return out


def threads(cmd: Dict[str, Any]) -> Dict[str, Any]:
    """Threads acquiring one new lease at the same moment, round after round:
    every one must get a handle, none be refused by its own process."""
    import threading

    n, rounds = cmd.get("threads", 8), cmd.get("rounds", 1000)
    barrier = threading.Barrier(n)
    counts = {"acquired": 0, "refused_by_self": 0, "other_errors": 0}
    lock = threading.Lock()

    def worker() -> None:
        for r in range(rounds):
            target = f"{cmd['dir']}/round-{r}.db"
            barrier.wait()
            try:
                lease: Optional[sidelease.Lease] = sidelease.acquire(target)
                key = "acquired"
            except sidelease.LeaseInUse as e:
                lease = None
                key = "refused_by_self" if (not e.holders or os.getpid() in e.holders) else "other_errors"
            except Exception:  # noqa: BLE001 - counted
                lease, key = None, "other_errors"
            barrier.wait()
            if lease is not None:
                lease.release()
            with lock:
                counts[key] += 1

    ts = [threading.Thread(target=worker) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"ok": True, **counts}


def fork_storm(cmd: Dict[str, Any]) -> Dict[str, Any]:
    """os.fork() again and again while another thread acquires and releases:
    no child may keep a descriptor of the lease file."""
    import threading

    first = sidelease.acquire(cmd["target"])
    st = os.stat(first.lease_path)
    first.release()
    stop = threading.Event()
    cycles = [0]

    def worker() -> None:
        while not stop.is_set():
            try:
                sidelease.acquire(cmd["target"]).release()
            except sidelease.LeaseError:
                pass
            cycles[0] += 1

    w = threading.Thread(target=worker)
    w.start()
    bad = 0
    for _ in range(cmd.get("forks", 5000)):
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(wfd, b"x")
            while True:
                signal.pause()
        os.read(r, 1)
        os.close(r)
        os.close(wfd)
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                s = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
                bad += 1
                break
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    stop.set()
    w.join()
    try:
        sidelease.acquire(cmd["target"]).release()
        final = "ok"
    except sidelease.LeaseError as e:
        final = str(e)
    return {"ok": True, "forks": cmd.get("forks", 5000), "children_with_lease_fd": bad,
            "cycles": cycles[0], "final_acquire": final}


def main() -> None:
    handles: Dict[int, sidelease.Lease] = {}
    say({"event": "ready", "pid": os.getpid(), "runtime": "python", "execs": int(os.environ.get("SIDELEASE_AGENT_EXECS", "0"))})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        name = cmd.get("cmd")
        try:
            if name == "ping":
                say({"ok": True, "pid": os.getpid()})
            elif name == "acquire":
                lease = sidelease.acquire(cmd.get("target", ""), **options(cmd))
                h = len(handles) + 1
                handles[h] = lease
                say({
                    "ok": True, "handle": h, "lease_path": lease.lease_path, "target": lease.target,
                    "generation": lease.generation, "record": lease.record, "previous": lease.previous,
                    "previous_released_cleanly": lease.previous_released_cleanly,
                    "record_written": lease.record_written,
                })
            elif name == "release":
                handles[cmd["handle"]].release()
                say({"ok": True})
            elif name == "state":
                say(state(handles[cmd["handle"]]))
            elif name == "wait_lost":
                say(wait_lost(handles[cmd["handle"]], cmd.get("timeout", 5.0)))
            elif name == "check":
                say({"ok": True, "check": handles[cmd["handle"]].check()})
            elif name == "ensure":
                handles[cmd["handle"]].ensure_held()
                say({"ok": True})
            elif name == "ensure_now":
                handles[cmd["handle"]].ensure_held_now()
                say({"ok": True})
            elif name == "inspect":
                say({"ok": True, "inspect": sidelease.inspect(cmd["target"], **({"suffix": cmd["suffix"]} if "suffix" in cmd else {}))})
            elif name == "exec_self":
                sys.stdout.flush()
                env = dict(os.environ, SIDELEASE_AGENT_EXECS=str(int(os.environ.get("SIDELEASE_AGENT_EXECS", "0")) + 1))
                os.execve(sys.executable, [sys.executable] + sys.argv, env)
            elif name == "fork_child":
                pid = os.fork()
                if pid == 0:
                    while True:
                        signal.pause()
                say({"ok": True, "child": pid})
            elif name == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            elif name == "exit":
                sys.stdout.flush()
                os._exit(cmd.get("code", 0))
            elif name == "stress":
                say(stress(cmd))
            elif name == "threads":
                say(threads(cmd))
            elif name == "fork_storm":
                say(fork_storm(cmd))
            else:
                say({"ok": False, "error": {"kind": "protocol", "message": f"unknown command {name!r}"}})
        except Exception as e:  # noqa: BLE001 - every failure is an answer
            say(error(e))


def say(v: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(v) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
