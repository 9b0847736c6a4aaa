"""Stress, crash injection and tampering across all five runtimes, plus the
file operations scenarios ask for. Everything happens in temporary
directories this run made."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from typing import Callable, List, Tuple

from agents import RUNTIMES, Agent, HandshakeError


def file_op(op: str, path: str, to: str) -> None:
    """Deliberate damage to a lease file in a test directory."""
    if op == "unlink_recreate":
        os.unlink(path)
        open(path, "w").close()
    elif op == "unlink":
        os.unlink(path)
    elif op == "replace":
        tmp = path + ".replacement"
        with open(tmp, "w") as f:
            f.write("{}")
        os.replace(tmp, path)
    elif op == "corrupt":  # in place, same inode
        with open(path, "r+b") as f:
            f.write(b"\0\0garbage{{{")
    elif op == "symlink":
        open(path, "a").close()
        os.symlink(path, to)
    else:
        raise ValueError(op)


def _prepare(d: str) -> Tuple[str, str, str]:
    db, counter, owner = (os.path.join(d, n) for n in ("app.db", "counter", "owner"))
    with open(counter, "w") as f:
        f.write("0")
    with open(owner, "w") as f:
        f.write("-")
    return db, counter, owner


def _run_stress(per_process: int, copies: int, tamper: bool, split_guard: bool = True) -> str:
    d = tempfile.mkdtemp(prefix="sidelease-stress-")
    db, counter, owner = _prepare(d)
    agents: List[Agent] = []
    stop = threading.Event()
    tampered = [0]

    def tamperer() -> None:
        lease = db + ".backend-lease"
        rnd = random.Random(7)
        while not stop.is_set():
            op = rnd.choice(["unlink_recreate", "replace", "truncate", "garbage", "unlink"])
            try:
                if op == "truncate":
                    os.truncate(lease, 0)
                elif op == "garbage":
                    with open(lease, "r+b") as f:
                        f.write(os.urandom(64))
                else:
                    file_op(op, lease, "")
                tampered[0] += 1
            except FileNotFoundError:
                pass
            time.sleep(rnd.uniform(0.001, 0.01))

    try:
        agents = [Agent(rt, f"{rt}-{i}") for i in range(copies) for rt in RUNTIMES]
        cmd = {"cmd": "stress", "target": db, "counter": counter, "owner": owner,
               "iterations": per_process, "timeout": 60, "split_guard": split_guard}
        t = threading.Thread(target=tamperer) if tamper else None
        if t:
            t.start()
        for a in agents:
            a.send(cmd)
        results = [a.recv(600) for a in agents]
        stop.set()
        if t:
            t.join()
        for a, r in zip(agents, results):
            assert r.get("ok"), f"{a.role}: {r}"
        done = sum(r["done"] for r in results)
        overlaps = sum(r["overlaps"] for r in results)
        timeouts = sum(r["timeouts"] for r in results)
        with open(counter) as f:
            count = int(f.read())
        detail = {a.role: (r["overlaps"], r.get("lost")) for a, r in zip(agents, results) if r["overlaps"] or r.get("lost")}
        assert overlaps == 0, f"{overlaps} overlaps: two holders at once (overlaps, lost by agent: {detail})"
        assert count == done, f"counter {count} != {done} critical sections (lost updates)"
        per_rt = {rt: sum(r["done"] for a, r in zip(agents, results) if a.runtime == rt) for rt in RUNTIMES}
        extra = f", {tampered[0]} tamperings" if tamper else ""
        return (f"{len(agents)} processes, {done} critical sections {per_rt}, overlaps 0, "
                f"counter {count}, timeouts {timeouts}{extra}")
    finally:
        stop.set()
        for a in agents:
            a.close()
        shutil.rmtree(d, ignore_errors=True)


def mutual_exclusion(soak: bool) -> str:
    return _run_stress(10_000 if soak else 2_000, 2, tamper=False)


def tampering(soak: bool) -> str:
    return _run_stress(5_000 if soak else 1_000, 1, tamper=True)


REQUIRED = {"schema", "generation", "pid", "started_at", "target", "lease_path", "nonce", "runtime", "library"}


def crash_injection(soak: bool) -> str:
    """SIGKILL holders at random moments (the churn loop spends much of its
    time writing records); after each kill a contender must acquire within
    a bounded time and never take a torn record for a valid one."""
    kills = 2_500 if soak else 500
    d = tempfile.mkdtemp(prefix="sidelease-crash-")
    db, counter, owner = _prepare(d)
    rnd = random.Random(11)
    contender = Agent("rust", "contender")
    torn = valid = 0
    slowest = 0.0
    try:
        for i in range(kills):
            victim = Agent(RUNTIMES[i % len(RUNTIMES)], f"victim-{i}")
            try:
                victim.send({"cmd": "stress", "target": db, "counter": counter, "owner": owner,
                             "iterations": 10**9, "timeout": 60})
                time.sleep(rnd.uniform(0, 0.02))
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait_exit()
            finally:
                victim.close()
            # The victim may have died inside its critical section.
            with open(owner, "w") as f:
                f.write("-")
            t = time.monotonic()
            got = contender.call({"cmd": "acquire", "target": db, "timeout": 5})
            took = time.monotonic() - t
            slowest = max(slowest, took)
            assert got.get("ok"), f"kill {i}: contender could not acquire: {got}"
            prev = got["previous"]
            if prev is None:
                torn += 1  # empty or unreadable: reported as such, never as valid
                assert not got["previous_released_cleanly"] or got["generation"] == 1, got
            else:
                missing = REQUIRED - set(prev)
                assert not missing, f"kill {i}: a record missing {missing} was taken as valid: {prev}"
                assert re.fullmatch(r"[0-9a-f]{32}", prev["nonce"]), prev
                valid += 1
            contender.call({"cmd": "release", "handle": got["handle"]})
        return f"{kills} kills, contender always acquired (slowest {slowest * 1000:.1f} ms), " \
               f"{valid} previous records valid, {torn} empty/unreadable"
    except HandshakeError:
        raise
    finally:
        contender.close()
        shutil.rmtree(d, ignore_errors=True)


CHECKS: List[Tuple[str, Callable[[bool], str]]] = [
    ("mutual exclusion", mutual_exclusion),
    ("crash injection", crash_injection),
    ("tampering", tampering),
]
