"""Stress, crash injection and tampering across all five runtimes, plus the
file operations scenarios ask for. Everything happens in temporary
directories this run made."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Tuple

import agents as agents_mod
from agents import RUNTIMES, Agent, HandshakeError


def file_op(op: str, path: str, to: str) -> Optional[int]:
    """Deliberate damage to a lease file in a test directory. "rival" locks
    a new file first, writes its own record there (as a sidelease process
    that won it would) and renames it over the lease file; "plain_rival"
    does the same without a record (as `flock(1)` would). Their descriptor
    is returned (the caller closes it when done)."""
    if op == "move":
        os.rename(path, path + ".old")
    elif op in ("rival", "plain_rival"):
        tmp = path + ".rival"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if op == "rival":
            st = os.fstat(fd)
            record = {"schema": 1, "generation": 7, "pid": os.getpid(), "nonce": os.urandom(16).hex(),
                      "device": st.st_dev, "inode": st.st_ino, "runtime": "rival"}
            os.write(fd, json.dumps(record).encode() + b"\n")
        os.rename(tmp, path)
        return fd
    elif op == "unlink_recreate":
        os.unlink(path)
        open(path, "w").close()
    elif op == "unlink":
        os.unlink(path)
    elif op == "replace":
        tmp = path + ".replacement"
        with open(tmp, "w") as f:
            f.write("{}")
        os.replace(tmp, path)
    elif op == "truncate":  # a log rotation's copytruncate, `: > file`
        with open(path, "r+b") as f:
            f.truncate(0)
    elif op == "corrupt":  # in place, same inode
        with open(path, "r+b") as f:
            f.write(b"\0\0garbage{{{")
    elif op == "symlink":
        open(path, "a").close()
        os.symlink(path, to)
    elif op == "rename_over":  # another file (`to`: where from) renamed over the lease file
        os.rename(to, path)
    else:
        raise ValueError(op)
    return None


def dir_op(op: str, path: str) -> Optional[Callable[[], None]]:
    """Deliberate damage to a lease's directory (in a test directory): what
    a deploy script, an operator or a container runtime does to it. Returns
    how to undo what outlives the scenario (a mount)."""
    if op == "move_recreate":  # mv dir dir2; mkdir dir; touch dir/app.db
        os.rename(path, path + ".moved")
        os.mkdir(path)
        open(os.path.join(path, "app.db"), "w").close()
    elif op == "rmtree_recreate":  # rm -rf dir; mkdir dir
        # The holder may put its file back between rm's unlink and its
        # rmdir (then rmdir fails, as `rm -rf` would): do it again, as an
        # operator would, until the directory is gone.
        for _ in range(1000):
            try:
                shutil.rmtree(path)
                break
            except OSError as e:
                if e.errno != errno.ENOTEMPTY:
                    raise
        os.mkdir(path)
    elif op == "swap_symlink":  # mv dir dir.moved-N; ln -s dir.target-N dir
        n = 0
        while os.path.lexists(f"{path}.target-{n}"):
            n += 1
        os.mkdir(f"{path}.target-{n}")
        os.rename(path, f"{path}.moved-{n}")
        os.symlink(f"{path}.target-{n}", path)
    elif op == "make_current":  # a release directory and `current` pointing at it
        os.mkdir(os.path.join(path, "r1"))
        os.symlink(os.path.join(path, "r1"), os.path.join(path, "current"))
    elif op == "flip_current":  # a deploy: current -> r2, atomically (ln -sfn r2 tmp; mv -T tmp current)
        os.mkdir(os.path.join(path, "r2"))
        os.symlink(os.path.join(path, "r2"), os.path.join(path, "current.tmp"))
        os.rename(os.path.join(path, "current.tmp"), os.path.join(path, "current"))
    elif op == "mount_tmpfs":  # mount -t tmpfs tmpfs dir
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", path], check=True)
        return lambda: subprocess.run(["umount", "-l", path], check=False)
    else:
        raise ValueError(op)
    return None


def pause(pid: int) -> None:
    """SIGSTOP a process and wait until every thread of it is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while True:
        states = []
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    states.append(f.read().rsplit(") ", 1)[1][0])
            except OSError:
                pass
        if states and all(s == "T" for s in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} did not stop")
        time.sleep(0.001)


def _prepare(d: str) -> Tuple[str, str, str]:
    db, counter, owner = (os.path.join(d, n) for n in ("app.db", "counter", "owner"))
    with open(counter, "w") as f:
        f.write("0")
    with open(owner, "w") as f:
        f.write("-")
    return db, counter, owner


# Damage that replaces the file at the path, and damage in place (same inode).
PATH_DAMAGE = ("unlink_recreate", "replace", "unlink")
IN_PLACE_DAMAGE = ("truncate", "garbage")


def _run_stress(per_process: int, copies: int, tamper: bool, split_guard: bool = True,
                target: Optional[str] = None,
                damage: Tuple[str, ...] = IN_PLACE_DAMAGE + PATH_DAMAGE) -> str:
    if agents_mod.PLATFORM == "portable" and target is None:
        # Waits poll there (a hand-off takes up to 50 ms, not microseconds):
        # a tenth of the critical sections, the same checks on each.
        per_process = max(50, per_process // 10)
    d = tempfile.mkdtemp(prefix="sidelease-stress-")
    db, counter, owner = _prepare(d)
    lease_target = target or db
    agents: List[Agent] = []
    stop = threading.Event()
    tampered = [0]

    def tamperer() -> None:
        lease = db + ".backend-lease"
        rnd = random.Random(7)
        while not stop.is_set():
            op = rnd.choice(damage)
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
        cmd = {"cmd": "stress", "target": lease_target, "counter": counter, "owner": owner,
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


def tampering_in_place(soak: bool) -> str:
    """Truncation and garbage written over the live record (a log rotation's
    copytruncate, a stray write): the file keeps its inode, so the kernel
    refuses every contender on both platforms and the holder writes its
    record back."""
    return _run_stress(2_000 if soak else 300, 1, tamper=True, damage=IN_PLACE_DAMAGE)


def tampering_guard_off(soak: bool) -> str:
    """The holder's watch alone (every contender's split guard off), while
    the lease file is deleted, replaced and recreated every 1-10 ms: one
    holder at this rate on an idle machine. Not a proof: under sustained
    faster replacement a blind contender can win beside a holder that is
    never told (docs/guarantees.md, Blind contenders; the soak's
    `--split-guard off`)."""
    return _run_stress(2_000 if soak else 300, 1, tamper=True, split_guard=False)


def locked_by(pid: int, ino: int) -> bool:
    with open("/proc/locks") as f:
        return any(f" {pid} " in line and f":{ino} " in line for line in f)


_locked_by = locked_by


def reanchor(soak: bool) -> str:
    """After rm, mv aside or rename-over of a held lease file, the holder
    puts a locked file back: a contender started 10 ms later, split guard
    off, is refused by the kernel. Latency: operation to the new file being
    locked by the holder in /proc/locks."""
    trials = 1_000 if soak else 200
    d = tempfile.mkdtemp(prefix="sidelease-reanchor-")
    db = os.path.join(d, "app.db")
    lease = db + ".backend-lease"
    contender = Agent("rust", "contender")
    latencies: List[float] = []
    per_rt = {}
    try:
        for rt in RUNTIMES:
            holder = Agent(rt, f"holder-{rt}")
            try:
                got = holder.call({"cmd": "acquire", "target": db})
                assert got.get("ok"), f"{rt}: {got}"
                refused = 0
                for i in range(trials):
                    op = ("unlink", "move", "replace")[i % 3]
                    t0 = time.monotonic()
                    if op == "move":
                        os.rename(lease, f"{lease}.old-{rt}-{i}")
                    else:
                        file_op(op, lease, "")
                    while True:
                        try:
                            ino = os.stat(lease).st_ino
                            if _locked_by(holder.pid, ino):
                                break
                        except FileNotFoundError:
                            pass
                        assert time.monotonic() - t0 < 2, f"{rt} trial {i} ({op}): not re-anchored within 2 s"
                    latencies.append(time.monotonic() - t0)
                    time.sleep(max(0.0, t0 + 0.010 - time.monotonic()))
                    c = contender.call({"cmd": "acquire", "target": db, "split_guard": False})
                    assert not c.get("ok"), f"{rt} trial {i} ({op}): the contender acquired: {c}"
                    assert c["error"]["kind"] == "in_use", f"{rt} trial {i} ({op}): {c}"
                    refused += 1
                state = holder.call({"cmd": "state", "handle": got["handle"]})
                assert state.get("state") == "held", f"{rt}: {state}"
                per_rt[rt] = refused
                holder.call({"cmd": "release", "handle": got["handle"]})
            finally:
                holder.close()
        latencies.sort()
        med = latencies[len(latencies) // 2] * 1e3
        p99 = latencies[int(len(latencies) * 0.99)] * 1e3
        return (f"contender refused in {sum(per_rt.values())}/{trials * len(RUNTIMES)} trials {per_rt}; "
                f"operation to re-anchor median {med:.2f} ms, p99 {p99:.2f} ms, max {latencies[-1] * 1e3:.2f} ms")
    finally:
        contender.close()
        shutil.rmtree(d, ignore_errors=True)


def lost_signal(soak: bool) -> str:
    """A rival that wins the re-anchor race (a new file, locked first, renamed
    over the lease file) makes the holder's lost signal fire within 50 ms."""
    trials = 50 if soak else 10
    d = tempfile.mkdtemp(prefix="sidelease-lost-")
    worst = {}
    try:
        for rt in RUNTIMES:
            worst[rt] = 0.0
            for i in range(trials):
                db = os.path.join(d, f"{rt}-{i}.db")
                holder = Agent(rt, f"holder-{rt}")
                fd: Optional[int] = None
                try:
                    got = holder.call({"cmd": "acquire", "target": db})
                    assert got.get("ok"), f"{rt}: {got}"
                    holder.send({"cmd": "wait_lost", "handle": got["handle"], "timeout": 5})
                    time.sleep(0.05)  # the agent is waiting
                    t0 = time.monotonic()
                    fd = file_op("rival", db + ".backend-lease", "")
                    r = holder.recv()
                    took = time.monotonic() - t0
                    assert r.get("lost") and r.get("state") == "lost", f"{rt} trial {i}: {r}"
                    if agents_mod.PLATFORM == "portable":
                        # No /proc/locks to name the rival; the holder looks
                        # every 100 ms instead of hearing an event.
                        assert r.get("reason"), f"{rt}: a reason: {r}"
                        bound = 0.150
                    else:
                        assert str(os.getpid()) in (r.get("reason") or ""), f"{rt}: reason names the rival: {r}"
                        bound = 0.050
                    assert took < bound, f"{rt} trial {i}: lost signal after {took * 1e3:.1f} ms"
                    worst[rt] = max(worst[rt], took)
                finally:
                    holder.close()
                    if fd is not None:
                        os.close(fd)
        return f"{trials} rivals per runtime, slowest signal (ms) " + \
            ", ".join(f"{rt} {t * 1e3:.1f}" for rt, t in worst.items())
    finally:
        shutil.rmtree(d, ignore_errors=True)


IN_PROCESS = ["rust", "c", "python"]  # Node and Bun have no threads or fork here


def threads(soak: bool) -> str:
    """8 threads x 1,000 rounds acquiring one new lease at once: every
    acquisition gets a handle on the one lease, none is refused by its own
    process."""
    # Each round is a new lease file, which the portable platform's blind
    # acquirer gives a 250 ms grace: a tenth of the rounds there.
    rounds = 100 if agents_mod.PLATFORM == "portable" else 1_000

    def one(rt: str) -> str:
        d = tempfile.mkdtemp(prefix="sidelease-threads-")
        a = Agent(rt, f"threads-{rt}")
        try:
            r = a.call({"cmd": "threads", "dir": d, "threads": 8, "rounds": rounds}, 300)
            assert r.get("ok"), f"{rt}: {r}"
            assert r["refused_by_self"] == 0 and not r["other_errors"], f"{rt}: {r}"
            assert r["acquired"] == 8 * rounds, f"{rt}: {r}"
            return f"{rt} {r['acquired']}"
        finally:
            a.close()
            shutil.rmtree(d, ignore_errors=True)

    return "acquisitions, 0 refused by their own process: " + ", ".join(_each_runtime_at_once(one))


def _each_runtime_at_once(one: Callable[[str], str]) -> List[str]:
    """`one` for each in-process runtime, side by side: each agent has a
    directory of its own and the check bounds no time (the portable
    platform's runs are mostly waits), so nothing but the wall clock
    changes. Results in IN_PROCESS's order; the first failure raises."""
    with ThreadPoolExecutor(max_workers=len(IN_PROCESS)) as pool:
        futures = [pool.submit(one, rt) for rt in IN_PROCESS]
        return [f.result() for f in futures]


def fork_storm(soak: bool) -> str:
    """Forks while another thread acquires and releases: no child may keep
    a descriptor of the lease file, and the parent acquires afterwards.

    The agents run under SCHED_IDLE (their threads and children inherit
    it): the check bounds no time, so tests/cross/run.py runs it beside the
    scenarios, in the cores' idle time, where it preempts nothing."""
    forks = 20_000 if soak else 2_000

    def one(rt: str) -> str:
        d = tempfile.mkdtemp(prefix="sidelease-forks-")
        a = Agent(rt, f"forks-{rt}", wrap=["chrt", "--idle", "0"])
        try:
            r = a.call({"cmd": "fork_storm", "target": os.path.join(d, "app.db"), "forks": forks}, 600)
            assert r.get("ok"), f"{rt}: {r}"
            assert r["children_with_lease_fd"] == 0, f"{rt}: {r}"
            assert r["final_acquire"] == "ok", f"{rt}: {r}"
            return f"{rt} {r['forks']} forks / {r['cycles']} cycles"
        finally:
            a.close()
            shutil.rmtree(d, ignore_errors=True)

    # One at a time: forking is CPU-bound (the sanitized C agent's page
    # tables above all), so side by side takes as long on two cores.
    return "0 children with a lease descriptor: " + ", ".join(one(rt) for rt in IN_PROCESS)


REQUIRED = {"schema", "generation", "pid", "started_at", "target", "lease_path", "nonce", "runtime", "library"}


def crash_injection(soak: bool) -> str:
    """SIGKILL holders at random moments (the churn loop spends much of its
    time writing records); after each kill a contender must acquire within
    a bounded time and never take a torn record for a valid one."""
    kills = 2_500 if soak else 300
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
                assert not got["previous_released_cleanly"], got
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


def pg_mutual_exclusion(soak: bool) -> str:
    """Ten processes, two of each runtime, each 1000 critical sections (3000
    with --soak) under one PostgreSQL lease, each try on its process's
    shared session (the default) and each wait on a connection of its own."""
    import pg
    return _run_stress(3000 if soak else 1000, 2, tamper=False, target=pg.lease_url("stress"))


def pg_mutual_exclusion_own(soak: bool) -> str:
    """As above, 100 critical sections each (1000 with --soak), every
    agent's lease on a connection of its own (session=own)."""
    import pg
    return _run_stress(1000 if soak else 100, 2, tamper=False,
                       target=pg.lease_url("stress", (pg.base(), "&session=own")))


def pg_first_use(soak: bool) -> str:
    """Ten processes, two of each runtime, start using a database that has
    no lease table yet, thirty names each, all at once: every concurrent
    creation of the table is harmless (issue 22)."""
    import pg
    import uuid
    db = f"race_{uuid.uuid4().hex[:10]}"
    pg.psql(f"CREATE DATABASE {db} OWNER app")
    agents: List[Agent] = []
    try:
        base = pg.base().rsplit("/", 1)[0] + "/" + db
        agents = [Agent(rt, f"{rt}-{i}") for i in range(2) for rt in RUNTIMES]
        failures = []
        for n in range(30):
            for a in agents:
                a.send({"cmd": "acquire", "target": f"{base}?lease=race-{a.role}-{n}"})
            for a in agents:
                r = a.recv(30)
                if not r.get("ok"):
                    failures.append((a.role, n, r.get("error", {}).get("message")))
                else:
                    a.call({"cmd": "release", "handle": r["handle"]})
        assert not failures, f"{len(failures)} acquisitions failed on first use: {failures[:3]}"
        rows = pg.psql_db(db, "SELECT count(*) FROM sidelease_leases")
        assert rows == str(30 * len(agents)), f"{rows} rows"
        return f"{len(agents)} processes x 30 names on a new database, 0 failed, {rows} rows"
    finally:
        for a in agents:
            a.close()
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


CHECKS: List[Tuple[str, Callable[[bool], str]]] = [
    ("PostgreSQL first use", pg_first_use),
    ("PostgreSQL mutual exclusion", pg_mutual_exclusion),
    ("PostgreSQL mutual exclusion, sessions of their own", pg_mutual_exclusion_own),
    ("mutual exclusion", mutual_exclusion),
    ("crash injection", crash_injection),
    ("tampering", tampering),
    ("tampering, split guard off", tampering_guard_off),
    ("tampering in place", tampering_in_place),
    ("re-anchor", reanchor),
    ("lost signal", lost_signal),
    ("threads", threads),
    ("fork storm", fork_storm),
]
