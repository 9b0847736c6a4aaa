"""What operators, supervisors and busy hosts do to a held lease, with the
holder in every runtime: its directory renamed, replaced or mounted over;
inotify spent before and after acquiring; a crowd of contenders while the
file is deleted again and again; the record emptied or overwritten, then a
crash. Each check measures what docs/guarantees.md promises. Everything
happens in temporary directories this run made; every sysctl is changed
only inside a user namespace the check made (so nothing needs restoring).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

import agents
from agents import ROOT, RUNTIMES, Agent
from faults import dir_op, file_op

ROOT_USER = os.geteuid() == 0


def _locked_by(pid: int, ino: int) -> bool:
    with open("/proc/locks") as f:
        return any(f" {pid} " in line and f":{ino} " in line for line in f)


def _warm() -> float:
    """Read /proc/locks once, then return the time: its first read after a
    quiet moment waits for an RCU grace period (10-20 ms here), which would
    count in a latency measured right after."""
    with open("/proc/locks") as f:
        f.read()
    return time.monotonic()


def _until_held(pid: int, lease: str, bound: float, since: Optional[float] = None) -> float:
    """Seconds from `since` (now) until `pid` holds the file now at `lease`
    (by /proc/locks)."""
    t0 = time.monotonic() if since is None else since
    while True:
        try:
            if _locked_by(pid, os.stat(lease).st_ino):
                return time.monotonic() - t0
        except FileNotFoundError:
            pass
        if time.monotonic() - t0 > bound:
            raise AssertionError(f"pid {pid} did not put {lease} back within {bound}s")
        time.sleep(0.0005)


def _stats(xs: List[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "none"
    return (f"median {xs[len(xs) // 2] * 1e3:.1f} ms, p99 {xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3:.1f} ms, "
            f"max {xs[-1] * 1e3:.1f} ms")


def _whole(holder: Agent, handle: int, where: str) -> None:
    """ensure_held() passes and check() says held: they agree."""
    e = holder.call({"cmd": "ensure", "handle": handle})
    c = holder.call({"cmd": "check", "handle": handle})
    assert e.get("ok") and c.get("check") == "held", f"{where}: ensure {e}, check {c}"


def directory_swaps(soak: bool) -> str:
    """The lease's directory renamed away and re-created, removed and
    re-created, or mounted over: a contender at once is refused, inspect
    never says free, and the holder puts its file back in the directory the
    path leads to now. Latency: the operation to the new file being locked
    by the holder."""
    trials = 10 if soak else 3
    ops = ["move_recreate", "rmtree_recreate"] + (["mount_tmpfs"] if ROOT_USER else [])
    lat: Dict[str, List[float]] = {op: [] for op in ops}
    contender = Agent("rust", "contender")
    try:
        for rt in RUNTIMES:
            for op in ops:
                for i in range(trials):
                    d = tempfile.mkdtemp(prefix="sidelease-dirs-")
                    sub = os.path.join(d, "d")
                    os.mkdir(sub)
                    db = os.path.join(sub, "app.db")
                    lease = db + ".backend-lease"
                    holder = Agent(rt, f"holder-{rt}")
                    undo = None
                    try:
                        got = holder.call({"cmd": "acquire", "target": db})
                        assert got.get("ok"), f"{rt}: {got}"
                        h = got["handle"]
                        t0 = _warm()
                        undo = dir_op(op, sub)
                        if i % 2:
                            # Race the holder: at once, before it can have
                            # put its file back.
                            c = contender.call({"cmd": "acquire", "target": db})
                            assert c.get("error", {}).get("kind") == "in_use", f"{rt} {op}: {c}"
                            # (The portable platform names no holder.)
                            named = [] if agents.PLATFORM == "portable" else [holder.pid]
                            assert c["error"]["holders"] == named, f"{rt} {op}: {c}"
                            s = contender.call({"cmd": "inspect", "target": db})["inspect"]["state"]
                            assert s in ("held", "split"), f"{rt} {op}: inspect says {s}"
                            _until_held(holder.pid, lease, 2.0)
                        else:
                            lat[op].append(_until_held(holder.pid, lease, 2.0, since=t0))
                        _whole(holder, h, f"{rt} {op}")
                        c = contender.call({"cmd": "acquire", "target": db, "split_guard": False})
                        assert c.get("error", {}).get("kind") == "in_use", f"{rt} {op}: {c}"
                        st = holder.call({"cmd": "state", "handle": h})
                        assert st.get("state") == "held", f"{rt} {op}: {st}"
                        holder.call({"cmd": "release", "handle": h})
                    finally:
                        holder.close()
                        if undo:
                            undo()
                        shutil.rmtree(d, ignore_errors=True)
        return "; ".join(f"{op}: {_stats(v)}" for op, v in lat.items()) + \
            ("" if ROOT_USER else " (tmpfs mount skipped: needs root)")
    finally:
        contender.close()


def _inotify_count(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify":
                n += 1
        except OSError:
            pass
    return n


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _in_user_ns(limits: str) -> List[str]:
    """Run the agent in a user namespace of its own (root mapped to root),
    where `limits` (shell) sets that namespace's inotify limits only."""
    return ["unshare", "--user", "--map-root-user", "sh", "-c", f'{limits}exec "$@"', "sh"]


def inotify_spent(soak: bool) -> str:
    """No inotify instance to be had when acquiring (the user's limit is
    spent): the holder looks at its path on a timer and puts a deleted file
    back within that period, ensure_held() and check() agree throughout,
    and a rival in a child PID namespace racing it either is refused or
    makes the holder be told it lost. Then watches spent after acquiring:
    a file put back without a watch is still looked after."""
    if not ROOT_USER or subprocess.run(["unshare", "--user", "--map-root-user", "true"]).returncode:
        return "skipped: user namespaces are not available here"
    trials = 10 if soak else 3
    no_instances = _in_user_ns("echo 0 > /proc/sys/user/max_inotify_instances && ")
    timer: List[float] = []
    heard: List[float] = []
    after: List[float] = []
    races = {"refused": 0, "won, holder told": 0}
    for rt in RUNTIMES:
        d = tempfile.mkdtemp(prefix="sidelease-inotify-")
        db = os.path.join(d, "app.db")
        lease = db + ".backend-lease"
        holder = Agent(rt, f"holder-{rt}", wrap=no_instances)
        rival: Optional[Agent] = None
        try:
            got = holder.call({"cmd": "acquire", "target": db})
            assert got.get("ok"), f"{rt}: {got}"
            h = got["handle"]
            assert _inotify_count(holder.pid) == 0, f"{rt}: the setup left it an inotify instance"
            # And it says so.
            i = holder.call({"cmd": "inspect", "target": db})
            assert "file-events" in i["inspect"]["platform"]["unavailable"], f"{rt}: {i}"
            # Looking at the path every 100 ms costs next to nothing.
            cpu0 = _cpu_seconds(holder.pid)
            time.sleep(1.5)
            idle_cpu = _cpu_seconds(holder.pid) - cpu0
            assert idle_cpu < 0.1, f"{rt}: {idle_cpu:.2f} s of CPU in 1.5 s idle without inotify"
            for _ in range(trials):
                t0 = _warm()
                os.unlink(lease)
                timer.append(_until_held(holder.pid, lease, 1.0, since=t0))
                _whole(holder, h, rt)
            # A blind rival (PID 1 of its own namespace) races the timer.
            rival = Agent("rust", "rival", wrap=["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"])
            os.unlink(lease)
            r = rival.call({"cmd": "acquire", "target": db})
            if r.get("ok"):
                w = holder.call({"cmd": "wait_lost", "handle": h, "timeout": 1.0})
                assert w.get("lost"), f"{rt}: a rival holds the file at the path, the holder was not told: {w}"
                e = holder.call({"cmd": "ensure", "handle": h})
                assert e.get("error", {}).get("kind") == "lost", f"{rt}: ensure after the loss: {e}"
                races["won, holder told"] += 1
            else:
                assert r["error"]["kind"] == "in_use", f"{rt}: {r}"
                _until_held(holder.pid, lease, 1.0)
                _whole(holder, h, rt)
                races["refused"] += 1
        finally:
            holder.close()
            if rival:
                rival.close()
            shutil.rmtree(d, ignore_errors=True)
        # Watches spent after acquiring: the first deletion is heard (the
        # file's watch exists), the file put back gets none, the second
        # deletion is found by the timer.
        d = tempfile.mkdtemp(prefix="sidelease-inotify-")
        db = os.path.join(d, "app.db")
        lease = db + ".backend-lease"
        holder = Agent(rt, f"holder-{rt}", wrap=_in_user_ns(""))
        try:
            got = holder.call({"cmd": "acquire", "target": db})
            assert got.get("ok"), f"{rt}: {got}"
            h = got["handle"]
            time.sleep(0.3)  # its directories are watched by now
            subprocess.run(["nsenter", "--user", "-t", str(holder.pid), "sh", "-c",
                            "echo 0 > /proc/sys/user/max_inotify_watches"], check=True)
            for out in (heard, after):
                t0 = _warm()
                os.unlink(lease)
                out.append(_until_held(holder.pid, lease, 1.0, since=t0))
                _whole(holder, h, rt)
        finally:
            holder.close()
            shutil.rmtree(d, ignore_errors=True)
    return (f"no instance: deleted file put back {_stats(timer)}; rival in a child PID namespace {races}; "
            f"watches spent after acquiring: put back {_stats(heard)} (the file's watch), "
            f"then {_stats(after)} (the timer)")


def _spinners(n: int, db: str, owner: str, seconds: float) -> List[Agent]:
    crowd = [Agent("rust", f"spinner-{i}") for i in range(n)]
    for a in crowd:
        a.send({"cmd": "spin", "target": db, "owner": owner, "seconds": seconds})
    return crowd


def _collect(crowd: List[Agent], seconds: float) -> Dict[str, int]:
    out = {"refused": 0, "won": 0, "overlaps": 0}
    for a in crowd:
        r = a.recv(seconds + 30)
        assert r.get("ok"), f"{a.role}: {r}"
        for k in out:
            out[k] += r[k]
    return out


def _delete_every(lease: str, period: float, seconds: float) -> int:
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.unlink(lease)
            n += 1
        except FileNotFoundError:
            pass
        time.sleep(period)
    return n


def _swap_every(sub: str, how: str, period: float, seconds: float) -> int:
    """Rename the lease's directory away and put a new one (or a symlink to
    a new one) in its place, again and again."""
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        os.rename(sub, f"{sub}.old-{n}")
        if how == "symlink":
            os.mkdir(f"{sub}.new-{n}")
            os.symlink(f"{sub}.new-{n}", sub)
        else:
            os.mkdir(sub)
        n += 1
        time.sleep(period)
    return n


def crowds_and_directories(soak: bool) -> str:
    """Contenders attempting without pause while the lease's directory is
    renamed away and replaced — by a new directory, or by a symlink to one —
    every 50 ms: no contender ever wins while the holder lives, and the
    holder is never told it lost."""
    seconds = 6.0 if soak else 2.0
    out = []
    for rt in ("rust", "python", "node"):
        for how in ("mkdir", "symlink"):
            d = tempfile.mkdtemp(prefix="sidelease-crowd-dirs-")
            sub = os.path.join(d, "d")
            os.mkdir(sub)
            db = os.path.join(sub, "app.db")
            owner = os.path.join(d, "owner")
            with open(owner, "w") as f:
                f.write("-")
            holder = Agent(rt, f"holder-{rt}")
            crowd: List[Agent] = []
            try:
                got = holder.call({"cmd": "acquire", "target": db})
                assert got.get("ok"), f"{rt}: {got}"
                crowd = _spinners(20, db, owner, seconds + 0.5)
                time.sleep(0.3)
                swaps = _swap_every(sub, how, 0.05, seconds)
                c = _collect(crowd, seconds)
                st = holder.call({"cmd": "state", "handle": got["handle"]})
                assert st.get("state") == "held", f"{rt} {how}, {swaps} swaps: {st}"
                assert c["won"] == 0, f"{rt} {how}, {swaps} swaps: a contender won: {c}"
                _whole(holder, got["handle"], f"{rt} {how}")
                out.append(f"{rt}/{how}: {swaps} swaps, {c['refused']} refused")
            finally:
                holder.close()
                for a in crowd:
                    a.close()
                shutil.rmtree(d, ignore_errors=True)
    return "0 won, 0 told lost; " + "; ".join(out)


def crowds(soak: bool) -> str:
    """Contenders attempting as fast as they can (10 of them, then 50)
    while the live lease file is deleted once, then every 5 ms: refused
    contenders only ever look, so the holder is never told it lost the
    lease, no contender wins while it lives, and `sidelease hold`'s command
    keeps running."""
    seconds = 10.0 if soak else 2.0
    out = []
    d = tempfile.mkdtemp(prefix="sidelease-crowd-")
    try:
        for rt in RUNTIMES:
            for n, period in ((10, None), (50, 0.005)):
                db = os.path.join(d, f"{rt}-{n}.db")
                lease = db + ".backend-lease"
                owner = os.path.join(d, f"{rt}-{n}.owner")
                with open(owner, "w") as f:
                    f.write("-")
                holder = Agent(rt, f"holder-{rt}")
                crowd: List[Agent] = []
                try:
                    got = holder.call({"cmd": "acquire", "target": db})
                    assert got.get("ok"), f"{rt}: {got}"
                    crowd = _spinners(n, db, owner, seconds)
                    time.sleep(0.3)
                    if period is None:
                        os.unlink(lease)
                        deleted = 1
                        time.sleep(seconds)
                    else:
                        deleted = _delete_every(lease, period, seconds - 0.5)
                    c = _collect(crowd, seconds)
                    st = holder.call({"cmd": "state", "handle": got["handle"]})
                    assert st.get("state") == "held", f"{rt}, {n} contenders, {deleted} deletions: {st}"
                    assert c["won"] == 0 and c["overlaps"] == 0, f"{rt}, {n} contenders: {c}"
                    out.append(f"{rt}/{n}: {deleted} deletions, {c['refused']} refused")
                finally:
                    holder.close()
                    for a in crowd:
                        a.close()
        # The CLI: its command must keep running through the storm.
        cli = ROOT / "target/release/sidelease"
        db = os.path.join(d, "cli.db")
        lease = db + ".backend-lease"
        owner = os.path.join(d, "cli.owner")
        with open(owner, "w") as f:
            f.write("-")
        hold = subprocess.Popen([str(cli), "hold", db, "--", "sleep", "600"], stderr=subprocess.PIPE)
        crowd = []
        try:
            t0 = time.monotonic()
            while not os.path.exists(lease) or not _locked_by(hold.pid, os.stat(lease).st_ino):
                assert time.monotonic() - t0 < 10, "sidelease hold did not acquire"
                time.sleep(0.01)
            storm = 10.0  # the whole storm: a deletion every 5 ms for 10 s
            crowd = _spinners(50, db, owner, storm + 0.5)
            time.sleep(0.3)
            deleted = _delete_every(lease, 0.005, storm)
            c = _collect(crowd, storm)
            assert hold.poll() is None, f"sidelease hold ended: {hold.stderr.read().decode() if hold.stderr else ''}"
            assert c["won"] == 0 and c["overlaps"] == 0, f"cli: {c}"
            out.append(f"cli hold/50: {deleted} deletions in 10 s, command still running")
        finally:
            for a in crowd:
                a.close()
            hold.send_signal(signal.SIGTERM)
            hold.wait(10)
        return "0 told lost; " + "; ".join(out)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _restored(lease: str, nonce: str, bound: float) -> float:
    t0 = time.monotonic()
    while True:
        try:
            with open(lease, "rb") as f:
                rec = json.loads(f.read(1 << 20))
            if rec.get("nonce") == nonce:
                return time.monotonic() - t0
        except (ValueError, OSError):
            pass
        if time.monotonic() - t0 > bound:
            raise AssertionError(f"{lease}: the holder's record was not written back within {bound}s")
        time.sleep(0.0005)


def _tamper(lease: str, how: str) -> None:
    if how == "truncate":
        os.truncate(lease, 0)
    elif how == "garbage":
        file_op("corrupt", lease, "")
    elif how == "50MB":
        with open(lease, "r+b") as f:
            f.write(b"x" * (50 << 20))


def tampered_then_crashed(soak: bool) -> str:
    """The live record truncated, overwritten with garbage or with 50 MB:
    the holder writes it back (latency measured), and after a SIGKILL the
    next holder gets a larger generation and is never told the release was
    clean. Then the same with the kill right after the damage, before any
    write-back could happen: still a larger generation, still not clean."""
    lat: Dict[str, List[float]] = {"truncate": [], "garbage": [], "50MB": []}
    jumps = 0
    contender = Agent("rust", "contender")
    d = tempfile.mkdtemp(prefix="sidelease-tamper-")
    try:
        for rt in RUNTIMES:
            for how in lat:
                for kill_at_once in (False, True):
                    db = os.path.join(d, f"{rt}-{how}-{int(kill_at_once)}.db")
                    lease = db + ".backend-lease"
                    holder = Agent(rt, f"holder-{rt}")
                    try:
                        got = holder.call({"cmd": "acquire", "target": db})
                        assert got.get("ok"), f"{rt}: {got}"
                        gen, nonce = got["generation"], got["record"]["nonce"]
                        if not kill_at_once:
                            time.sleep(0.15)  # held a while: its writes are watched
                        _tamper(lease, how)
                        if not kill_at_once:
                            lat[how].append(_restored(lease, nonce, 2.0))
                        os.kill(holder.pid, signal.SIGKILL)
                        holder.wait_exit()
                    finally:
                        holder.close()
                    c = contender.call({"cmd": "acquire", "target": db})
                    assert c.get("ok"), f"{rt} {how}: {c}"
                    assert c["generation"] > gen, f"{rt} {how}: generation {c['generation']} after {gen}"
                    assert c["previous_released_cleanly"] is not True, f"{rt} {how}: told clean: {c}"
                    jumps += c["generation"] > 10**15
                    contender.call({"cmd": "release", "handle": c["handle"]})
        return "written back: " + "; ".join(f"{k} {_stats(v)}" for k, v in lat.items()) + \
            f"; next generation always larger, never clean ({jumps} jumped to the clock)"
    finally:
        contender.close()
        shutil.rmtree(d, ignore_errors=True)


CHECKS = [
    ("directory swaps", directory_swaps),
    ("inotify spent", inotify_spent),
    ("crowds", crowds),
    ("crowds and directories", crowds_and_directories),
    ("tampered, then crashed", tampered_then_crashed),
]
