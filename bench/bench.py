"""Runs every sidelease measurement beside its floor and its anchors in one
run, and writes bench/REPORT.md with plots (bench/plots/). Ratios measured
in the same run are what count; absolute times are context.

    .venv/bin/python bench/bench.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

import instructions as I  # bench/instructions.py
import syscalls as S  # bench/syscalls.py

from common import BENCH, BUN, CAPI, FLOOR, LANG_CMD, OUT, PY, ROOT, RUST, Holder, Waiter, hold_release, run_json, us

# ---------------------------------------------------------------- cycles

def cycles(d: str, iters: int) -> Dict[str, Any]:
    r: Dict[str, Any] = {}
    floor = run_json([FLOOR, d, str(iters)])
    r["C floor (same syscalls, /proc/locks read)"] = floor["c_floor_cycle"]
    r["C floor without the /proc/locks read"] = floor["c_floor_cycle_no_split_guard"]
    r["C bare open+flock+close"] = floor["c_bare_flock"]
    for lang in LANG_CMD:
        r[f"sidelease {lang}"] = run_json(LANG_CMD[lang] + ["cycle", f"{d}/cycle-{lang}.db", str(iters)])
    r["sidelease rust, split guard off"] = run_json([RUST, "cycle-no-guard", f"{d}/noguard.db", str(iters)])
    anchors = run_json([PY, str(BENCH / "py/measure.py"), "anchors", f"{d}/anchor", str(min(iters, 5000))])
    r["python bare fcntl.flock"] = anchors["python_bare_flock"]
    r["python filelock"] = anchors["python_filelock"]
    r["python portalocker"] = anchors["python_portalocker"]
    r["python fasteners"] = anchors["python_fasteners"]
    for rt, cmd in (("node", ["node"]), ("bun", [BUN])):
        a = run_json(cmd + [str(BENCH / "js/measure.cjs"), "anchors", f"{d}/anchor-{rt}", str(min(iters, 2000))])
        r[f"{rt} proper-lockfile lockSync/unlockSync"] = a["proper_lockfile_sync"]
        r[f"{rt} proper-lockfile lock/unlock (async)"] = a["proper_lockfile_async"]
    return r


def shared_and_refused(d: str, iters: int) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    shared = {lang: run_json(cmd + ["shared", f"{d}/shared-{lang}.db", str(iters)]) for lang, cmd in LANG_CMD.items()}
    target = f"{d}/refused.db"
    h = Holder(target)
    try:
        refused = {lang: run_json(cmd + ["refused", target, str(max(iters // 4, 500))]) for lang, cmd in LANG_CMD.items()}
    finally:
        h.close()
    return shared, refused


# ---------------------------------------------------------------- handoff

def handoff(d: str, name: str, cmd: List[str], kind: str, path: str, n: int, cpu_wait: float = 0.0) -> Dict[str, Any]:
    if kind == "mkdir":
        open(path, "a").close()
    hold, release = hold_release(kind, path)
    w = Waiter(cmd)
    lat: List[int] = []
    cpu = None
    try:
        for i in range(n + 2):
            hold()
            w.send("wait")
            if i == 2 and cpu_wait:
                time.sleep(0.05)
                c0, t0w = w.cpu_ns(), time.monotonic_ns()
                time.sleep(cpu_wait)
                cpu = (w.cpu_ns() - c0) / (time.monotonic_ns() - t0w)
            else:
                time.sleep(0.005)  # let the waiter reach its wait
            t0 = time.monotonic_ns()
            release()
            t1 = int(w.recv())
            if i >= 2:  # warm-up
                lat.append(t1 - t0)
            w.send("release")
            assert w.recv() == "ok"
    finally:
        w.close()
    lat.sort()
    out: Dict[str, Any] = {"n": len(lat), "median_ns": lat[len(lat) // 2], "p99_ns": lat[int((len(lat) - 1) * 0.99)],
                           "samples_ns": lat}
    if cpu is not None:
        out["cpu_fraction_during_wait"] = cpu
    return out


def takeover(d: str, n: int) -> Dict[str, Any]:
    """Holder SIGKILLed -> a blocked sidelease waiter (Rust) holds."""
    target = f"{d}/takeover.db"
    w = Waiter([RUST, "waiter", target])
    lat = []
    try:
        for _ in range(n):
            h = Holder(target)
            w.send("wait")
            time.sleep(0.005)
            t0 = time.monotonic_ns()
            os.kill(h.p.pid, signal.SIGKILL)
            t1 = int(w.recv())
            lat.append(t1 - t0)
            h.close()
            w.send("release")
            assert w.recv() == "ok"
    finally:
        w.close()
    lat.sort()
    return {"n": n, "median_ns": lat[n // 2], "p99_ns": lat[int((n - 1) * 0.99)], "samples_ns": lat}


# ---------------------------------------------------------------- failover

CLI = str(ROOT / "target/release/sidelease")
# The leader's work starting: its command writes "LEAD-PID CMD-PID" to a FIFO
# the bench keeps open (one short write: atomic), then sleeps.
WORK = 'echo "$PPID $$" > "$1"; exec sleep 600'


def failover_of(d: str, target: str, how: str, n: int) -> Dict[str, Any]:
    """SIGKILL the process leading `target`, n times: nanoseconds until the
    next one's command runs. how="lead": `sidelease lead` campaigners (the
    command dies with its lead); how="hold": plain waiters,
    `sidelease hold --timeout inf --no-inherit` (the same processes and
    command, no elector); how="flock -o": util-linux flock(1) blocking in
    flock(2) on the lease file, the command started without the lock's
    descriptor (the floor: a C waiter the kernel wakes as the killed
    holder's descriptors close, then the same command)."""
    fifo = os.path.join(d, f"failover-{how}-{os.getpid()}-{time.monotonic_ns()}")
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDWR)  # never EOF, never blocks a writer's open
    reader = os.fdopen(rfd, "r", buffering=1)
    if how == "rust elector":
        argv = [RUST, "campaign", target, fifo]
    elif how in ("python elector", "python acquire"):
        # The Python forms: one process is leader and work (no command).
        argv = [sys.executable, str(BENCH / "py/failover.py"), how.split()[1], target, fifo]
    elif how == "flock -o":
        argv = ["flock", "-o", f"{target}.backend-lease", "sh", "-c", WORK, "sh", fifo]
    else:
        args = ["lead", target] if how == "lead" else ["hold", "--timeout", "inf", "--no-inherit", target]
        argv = [CLI, *args, "--", "sh", "-c", WORK, "sh", fifo]

    def campaigner() -> subprocess.Popen:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    crowd = [campaigner() for _ in range(3)]
    lat: List[int] = []
    commands: List[int] = []
    try:
        leader, cmd = map(int, reader.readline().split())
        for _ in range(n):
            commands.append(cmd)
            victim = next(p for p in crowd if p.pid == leader)
            crowd.remove(victim)
            # The replacement started last round has settled (a Python one
            # takes tens of ms of CPU to start, on the waiter's cores).
            time.sleep(0.3 if how.startswith("python") else 0.005)
            t0 = time.monotonic_ns()
            os.kill(leader, signal.SIGKILL)
            leader, cmd = map(int, reader.readline().split())
            lat.append(time.monotonic_ns() - t0)
            victim.wait()
            if how in ("hold", "flock -o"):  # its command outlives it (nothing ends it)
                os.kill(commands[-1], signal.SIGKILL)
            else:
                commands.pop()  # ended with its leader
            crowd.append(campaigner())
        commands.append(cmd)
    finally:
        for p in crowd:
            p.kill()
            p.wait()
        for c in commands:
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reader.close()
        os.unlink(fifo)
    lat.sort()
    return {"n": n, "median_ns": lat[n // 2], "p99_ns": lat[int((n - 1) * 0.99)], "samples_ns": lat}


def failovers(d: str, n: int) -> Dict[str, Any]:
    pg = os.environ["SIDELEASE_TEST_PG"] + f"?lease=bench-failover-{os.getpid()}"
    out: Dict[str, Any] = {}
    # A PostgreSQL successor waits out the bound (confirm_within) after a
    # predecessor that did not release: once with the default, once short.
    for kind, target, count in (("file", f"{d}/failover.db", n), ("PostgreSQL", pg, max(5, n // 3)),
                                ("PostgreSQL, confirm_within=300", pg + "&confirm_within=300", max(5, n // 3))):
        for how in ("lead", "hold", "rust elector", "python elector", "python acquire"):
            out[f"{kind}: sidelease {how}"] = failover_of(d, target, how, count)
    # The floor of the file rows, in the same run (issue 38): a plain
    # flock(1) waiter, woken by the kernel as the killed holder's lock goes.
    out["file: flock -o"] = failover_of(d, f"{d}/failover.db", "flock -o", n)
    return out


# How long the waiter's CPU is measured in a full run (see main).
CPU_WAIT_S = 3.0


def handoffs(d: str, n: int, cpu_wait: float) -> Dict[str, Any]:
    js = str(BENCH / "js/measure.cjs")
    py = str(BENCH / "py/measure.py")
    cases = [
        ("raw blocking flock (C)", [CAPI, "raw-waiter", f"{d}/raw.lock"], "flock", f"{d}/raw.lock", n),
        ("inotify wake + LOCK_NB, no sidelease (C)", [CAPI, "inotify-waiter", f"{d}/ino.lock"], "flock", f"{d}/ino.lock", n),
        ("sidelease rust", [RUST, "waiter", f"{d}/h-rust.db"], "sidelease", f"{d}/h-rust.db", n),
        ("sidelease c-abi", [CAPI, "waiter", f"{d}/h-c.db"], "sidelease", f"{d}/h-c.db", n),
        ("sidelease python", [PY, py, "waiter", "sidelease", f"{d}/h-py.db"], "sidelease", f"{d}/h-py.db", n),
        ("sidelease node", ["node", js, "waiter", "sidelease", f"{d}/h-node.db"], "sidelease", f"{d}/h-node.db", n),
        ("sidelease node acquireAsync", ["node", js, "waiter", "sidelease-async", f"{d}/h-nodea.db"], "sidelease", f"{d}/h-nodea.db", n),
        ("sidelease bun", [BUN, js, "waiter", "sidelease", f"{d}/h-bun.db"], "sidelease", f"{d}/h-bun.db", n),
        ("python filelock (default poll)", [PY, py, "waiter", "filelock", f"{d}/h.filelock"], "flock", f"{d}/h.filelock", max(n // 5, 10)),
        ("node proper-lockfile (retry defaults)", ["node", js, "waiter", "proper-lockfile", f"{d}/h-proper"], "mkdir", f"{d}/h-proper", max(n // 40, 5)),
    ]
    out = {}
    for name, cmd, kind, path, count in cases:
        cw = cpu_wait if name.startswith("sidelease") or name.startswith("raw") else 0.0
        out[name] = handoff(d, name, cmd, kind, path, count, cw)
    return out


# ---------------------------------------------------------------- inspect, scale

# ---------------------------------------------------------------- many waits

MANY_WAITERS = {
    "python asyncio": [PY, str(BENCH / "py/measure.py"), "many-waits", "{d}", "{n}", "asyncio"],
    "python uvloop": [PY, str(BENCH / "py/measure.py"), "many-waits", "{d}", "{n}", "uvloop"],
    "node": ["node", str(BENCH / "js/measure.cjs"), "many-waits", "{d}", "{n}"],
    "bun": [BUN, str(BENCH / "js/measure.cjs"), "many-waits", "{d}", "{n}"],
}


def many_waits(d: str, n: int, rounds: int) -> Dict[str, Any]:
    """N async waits on N targets in one process, their N holders (one other
    process) releasing together: each waiter's latency from its holder's
    release, and the longest stall of the waiting event loop (the gap of a
    1 ms ticker beyond its period, from the first release to the last
    acquisition)."""
    out: Dict[str, Any] = {}
    for name, tmpl in MANY_WAITERS.items():
        lat: List[int] = []
        stall = 0
        for r in range(rounds):
            sub = os.path.join(d, f"many-{name.replace(' ', '-')}-{r}")
            os.mkdir(sub)
            holder = subprocess.Popen([PY, str(BENCH / "py/measure.py"), "hold-many", sub, str(n)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert holder.stdin and holder.stdout
            assert holder.stdout.readline().strip() == "held"
            cmd = [a.format(d=sub, n=n) for a in tmpl]
            w = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            assert w.stdout
            assert w.stdout.readline().strip() == "ready", f"{name}: waiter did not start"
            time.sleep(0.05)
            holder.stdin.write("release\n")
            holder.stdin.flush()
            released = json.loads(holder.stdout.readline())
            got = json.loads(w.stdout.readline())
            holder.wait(30)
            w.wait(30)
            acq = got["acquired_ns"]
            lat += [a - b for a, b in zip(acq, released)]
            t0, t1 = released[0], max(acq)
            ticks = got["ticks_ns"]
            gaps = [b - a for a, b in zip(ticks, ticks[1:]) if b >= t0 and a <= t1]
            stall = max([stall] + [g - 1_000_000 for g in gaps])
        lat.sort()
        out[name] = {
            "n": len(lat), "median_ns": lat[len(lat) // 2], "p99_ns": lat[int((len(lat) - 1) * 0.99)],
            "max_ns": lat[-1], "max_loop_stall_ns": stall,
        }
    return out


def inspect_with_locks(d: str, iters: int, counts: Tuple[int, ...] = (1, 200, 2000)) -> Dict[str, Any]:
    out = {}
    target = f"{d}/inspect.db"
    h = Holder(target)
    try:
        for k in counts:
            ld = tempfile.mkdtemp(prefix="sidelease-unrelated-", dir=d)
            code = ("import fcntl,os,sys\nfds=[]\nfor i in range(int(sys.argv[2])):\n"
                    " fd=os.open(os.path.join(sys.argv[1],str(i)),os.O_RDWR|os.O_CREAT,0o644)\n"
                    " fcntl.flock(fd,fcntl.LOCK_EX); fds.append(fd)\nprint('ready',flush=True)\nsys.stdin.read()")
            p = subprocess.Popen([sys.executable, "-c", code, ld, str(k)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                assert p.stdout and p.stdout.readline().strip() == "ready"
                out[f"{k} unrelated locks"] = run_json([RUST, "inspect", target, str(iters)])
            finally:
                p.kill()
                p.wait()
    finally:
        h.close()
    return out


def scale(d: str, count: int) -> Dict[str, Any]:
    sd = f"{d}/scale"
    os.mkdir(sd)

    def run(guard: bool, dirs: bool = False) -> Any:
        env = {**os.environ, "SCALE_SPLIT_GUARD": "1" if guard else "0", "SCALE_DIRS": "1" if dirs else "0"}
        where = f"{d}/scale-dirs" if dirs else sd
        out = subprocess.run([RUST, "scale", where, str(count)], env=env, check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    os.mkdir(f"{d}/scale-dirs")
    return {
        "new lease files (split guard reads /proc/locks each time)": run(True),
        "lease files acquired before (records vouch: no /proc/locks)": run(True),
        "split guard off": run(False),
        # A database per tenant: each acquisition has the holder's watch
        # watch one more directory (a wake-up of its thread per lease).
        "each in a directory of its own, split guard off": run(False, dirs=True),
    }


# ---------------------------------------------------------------- report

def postgres(iters: int) -> Dict[str, Any]:
    """PostgreSQL leases on the cluster bench/run started, beside bare
    advisory locks on the same server (see bench/rust/src/pg.rs)."""
    url = os.environ["SIDELEASE_TEST_PG"] + f"?lease=bench-{os.getpid()}"
    out = subprocess.run([RUST, "pg", url, str(iters)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def targets(r: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    c = r["cycle"]
    med = {k: v["median_ns"] for k, v in c.items()}
    core = med["sidelease rust"]
    rows = []
    floor = med["C floor (same syscalls, /proc/locks read)"]
    rows.append(("Rust core cycle ≤ 1.5× the C floor", f"{core / floor:.2f}× ({us(core):.1f} vs {us(floor):.1f} µs)", verdict(core <= 1.5 * floor)))
    floor2 = med["C floor without the /proc/locks read"]
    rows.append(("(context) Rust core vs the C floor without /proc/locks", f"{core / floor2:.2f}× ({us(floor2):.1f} µs)", "—"))
    sh = r["shared"]["rust"]["median_ns"]
    rows.append(("shared re-acquire ≤ 1 µs", f"{us(sh):.2f} µs", verdict(sh <= 1000)))
    for lang in ("python", "node", "bun"):
        m = med[f"sidelease {lang}"]
        rows.append((f"{lang} cycle ≤ core + 2 µs", f"+{us(m - core):.1f} µs ({us(m):.1f} µs)", verdict(m <= core + 2000)))
    py = med["sidelease python"]
    fl, pl, fa = med["python filelock"], med["python portalocker"], med["python fasteners"]
    rows.append(("python ≥ 5× faster than filelock", f"{fl / py:.1f}×", verdict(fl >= 5 * py)))
    rows.append(("python faster than portalocker", f"{pl / py:.2f}× ({us(py):.1f} vs {us(pl):.1f} µs)", verdict(py < pl)))
    rows.append(("python faster than fasteners", f"{fa / py:.2f}× ({us(py):.1f} vs {us(fa):.1f} µs)", verdict(py < fa)))
    nd, pls = med["sidelease node"], med["node proper-lockfile lockSync/unlockSync"]
    rows.append(("node ≥ 20× faster than proper-lockfile lockSync", f"{pls / nd:.1f}×", verdict(pls >= 20 * nd)))
    h = r["handoff"]
    raw = h["raw blocking flock (C)"]["median_ns"]
    for name, v in h.items():
        if not name.startswith("sidelease"):
            continue
        rows.append((f"handoff median ≤ 3× raw flock: {name}", f"{v['median_ns'] / raw:.1f}× ({us(v['median_ns']):.1f} vs {us(raw):.1f} µs)", verdict(v["median_ns"] <= 3 * raw)))
        rows.append((f"handoff p99 ≤ 1 ms: {name}", f"{us(v['p99_ns']):.0f} µs", verdict(v["p99_ns"] <= 1_000_000)))
        if "cpu_fraction_during_wait" in v:
            cpu = v["cpu_fraction_during_wait"]
            rows.append((f"waiter CPU < 1% of a core during a wait: {name}", f"{cpu * 100:.3f}%", verdict(cpu < 0.01)))
    sync, asy = h["sidelease node"]["median_ns"], h["sidelease node acquireAsync"]["median_ns"]
    rows.append(("node acquireAsync handoff median ≤ 2× the sync waiter's", f"{asy / sync:.2f}× ({us(asy):.0f} vs {us(sync):.0f} µs)",
                 verdict(asy <= 2 * sync)))
    for k, v in r["syscalls"].items():
        if k.startswith("cycle: sidelease"):
            rows.append((f"≤ {S.BUDGET} system calls per uncontended {k}", f"{v['calls']:g}", verdict(v["calls"] <= S.BUDGET + 0.05)))
    for name, v in r["many waits"].items():
        rows.append((f"256 waits released together, wake latency ≤ 10 ms median / 50 ms p99: {name}",
                     f"{v['median_ns'] / 1e6:.1f} / {v['p99_ns'] / 1e6:.1f} ms", verdict(v["median_ns"] <= 10e6 and v["p99_ns"] <= 50e6)))
        rows.append((f"256 waits released together, event loop stall ≤ 5 ms: {name}",
                     f"{v['max_loop_stall_ns'] / 1e6:.1f} ms", verdict(v["max_loop_stall_ns"] <= 5e6)))
    t = r["takeover"]["median_ns"]
    rows.append(("takeover from a SIGKILLed holder ≤ 5 ms median", f"{t / 1e6:.2f} ms", verdict(t <= 5_000_000)))
    f = r["failover"]
    # A file target's failover is the kernel letting the killed leader's
    # lock go, then the next one's wake and start: its target is a ratio to
    # a plain flock(1) waiter's failover in the same run (issue 38), not a
    # time (this machine's teardown varies with its load): at most 1.2× it.
    floor = f["file: flock -o"]["median_ns"]
    flock_said = f"`flock -o` {floor / 1e6:.1f} ms"
    for kind, bound, shown in (("file", None, "1.2× `flock -o`'s"), ("PostgreSQL", 1e9, "1 s"),
                               ("PostgreSQL, confirm_within=300", 1e9, "1 s")):
        def within(ns: float) -> bool:
            return ns <= 1.2 * floor if bound is None else ns <= bound

        def to_floor(ns: float) -> str:
            return f"; {ns / floor:.2f}× {flock_said}" if bound is None else ""

        lead, hold = f[f"{kind}: sidelease lead"], f[f"{kind}: sidelease hold"]
        ratio = lead["median_ns"] / hold["median_ns"]
        # On PostgreSQL the killed leader on this host is provably gone, so
        # no fence is waited out: the target is a ratio to a plain waiter
        # in the same run (issue 37), not the bound.
        target = f"median ≤ {shown}" if kind == "file" else "median ≤ 3× a plain `hold` waiter's"
        rows.append((f"failover, SIGKILL of the leader → the next one's command runs, {kind} target: {target}",
                     f"{lead['median_ns'] / 1e6:.1f} ms (p99 {lead['p99_ns'] / 1e6:.1f} ms; a plain `hold` waiter "
                     f"{hold['median_ns'] / 1e6:.1f} ms, {ratio:.2f}×{to_floor(lead['median_ns'])})",
                     verdict(within(lead["median_ns"]) if kind == "file" else ratio <= 3)))
        re_ = f[f"{kind}: sidelease rust elector"]
        rows.append((f"failover, SIGKILL of the leader → the next one's work runs, the core's Elector (Rust), {kind} target: "
                     f"median ≤ {shown}", f"{re_['median_ns'] / 1e6:.2f} ms (p99 {re_['p99_ns'] / 1e6:.2f} ms"
                     f"{to_floor(re_['median_ns'])})",
                     verdict(within(re_["median_ns"]))))
        pe, pa = f[f"{kind}: sidelease python elector"], f[f"{kind}: sidelease python acquire"]
        rows.append((f"failover, SIGKILL of the leader → the next one's work runs, Python Elector, {kind} target: median ≤ {shown}",
                     f"{pe['median_ns'] / 1e6:.1f} ms (p99 {pe['p99_ns'] / 1e6:.1f} ms; a plain `acquire(timeout=None)` "
                     f"waiter {pa['median_ns'] / 1e6:.1f} ms, {pe['median_ns'] / pa['median_ns']:.2f}×{to_floor(pe['median_ns'])})",
                     verdict(within(pe["median_ns"]))))
    ins = r["inspect"]["200 unrelated locks"]["median_ns"]
    rows.append(("inspect ≤ 100 µs with 200 unrelated locks", f"{us(ins):.1f} µs", verdict(ins <= 100_000)))
    for name, v in r["scale"].items():
        a, b = v["first_thousand"]["median_ns"], v["last_thousand"]["median_ns"]
        rows.append((f"acquire flat to 10,000 held leases (last ≤ 1.2× first): {name}", f"{b / a:.2f}× ({us(a):.1f} → {us(b):.1f} µs)", verdict(b <= 1.2 * a)))
    pg = r["postgres"]
    c, bc, b = pg["cycle"]["median_ns"], pg["bare_connect_round_trip"]["median_ns"], pg["bare_round_trip"]["median_ns"]
    sc = pg["shared_cycle"]["median_ns"]
    rows.append(("PostgreSQL acquire + release on the process's shared session (the default) ≤ 2× a bare try-lock + "
                 "unlock on an open connection", f"{sc / b:.2f}× ({us(sc):.0f} vs {us(b):.0f} µs)", verdict(sc <= 2 * b)))
    rows.append(("PostgreSQL acquire + release on a connection of its own (session=own) ≤ 1.5× a bare connect + "
                 "try-lock + unlock", f"{c / bc:.2f}× ({us(c):.0f} vs {us(bc):.0f} µs)", verdict(c <= 1.5 * bc)))
    h, bh = pg["handoff"]["median_ns"], pg["bare_handoff"]["median_ns"]
    rows.append(("PostgreSQL handoff median ≤ 3× a bare pg_advisory_lock waiter's", f"{h / bh:.2f}× ({us(h):.0f} vs {us(bh):.0f} µs)", verdict(h <= 3 * bh)))
    many = pg["thousand_leases"]
    rows.append(("PostgreSQL: 1,000 leases of one process on one server hold ≤ 2 server sessions",
                 f"{many['sessions']} session(s), {many['descriptors']} descriptors", verdict(many["sessions"] <= 2)))
    return rows


def plots(r: Dict[str, Any], quick: bool) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pdir = BENCH / ("out/plots" if quick else "plots")
    pdir.mkdir(parents=True, exist_ok=True)
    c = r["cycle"]
    names = sorted(c, key=lambda k: c[k]["median_ns"])
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(names) + 1.5))
    colors = ["tab:green" if n.startswith("sidelease") else ("tab:gray" if n.startswith("C ") else "tab:orange") for n in names]
    ax.barh(names, [us(c[n]["median_ns"]) for n in names], color=colors)
    ax.set_xscale("log")
    ax.set_xlabel("median µs per uncontended acquire + release (log scale)")
    ax.set_title("Cycle cost: sidelease (green), floor (gray), anchors (orange)")
    fig.tight_layout()
    f1 = pdir / "cycle.png"
    fig.savefig(f1, dpi=110)
    plt.close(fig)

    h = r["handoff"]
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, v in h.items():
        xs = sorted(us(x) for x in v["samples_ns"])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name)
    xs = sorted(us(x) for x in r["takeover"]["samples_ns"])
    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label="takeover after SIGKILL (rust)", linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("handoff latency, µs (holder releases → waiter in another process holds), log scale")
    ax.set_ylabel("fraction of handoffs")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    f2 = pdir / "handoff.png"
    fig.savefig(f2, dpi=110)
    plt.close(fig)
    return [str(f1.relative_to(BENCH)), str(f2.relative_to(BENCH))]


def table(d: Dict[str, Any]) -> str:
    lines = ["| what | median µs | p99 µs | n |", "|---|---:|---:|---:|"]
    for k, v in sorted(d.items(), key=lambda kv: kv[1]["median_ns"]):
        lines.append(f"| {k} | {us(v['median_ns']):.1f} | {us(v['p99_ns']):.1f} | {v['n']} |")
    return "\n".join(lines)


def report(r: Dict[str, Any], quick: bool, pngs: List[str], elapsed: float) -> str:
    rows = targets(r)
    met = sum(1 for *_, v in rows if v == "**met**")
    missed = sum(1 for *_, v in rows if v == "**missed**")
    env = r["env"]
    out = [
        "# sidelease benchmarks",
        "",
        f"Generated by `bash bench/run{' --quick' if quick else ''}` on {env['date']} ({env['machine']}; "
        f"{env['cpus']} CPUs; kernel {env['kernel']}; Node {env['node']}, Bun {env['bun']}, Python {env['python']}) "
        f"in {elapsed:.0f} s. Every number below comes from this one run; ratios between rows are what count on a "
        "shared, noisy 2-core machine, absolute times are context.",
        "",
        f"**This machine's bare open+flock+close (C): {us(r['cycle']['C bare open+flock+close']['median_ns']):.2f} µs** "
        "(compare machines by this: a system call's cost sets every time below).",
        "",
        f"**Targets: {met} met, {missed} missed.**",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
    ]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    out += ["", "## 1. Uncontended acquire + release", "", f"![cycle cost]({pngs[0]})", "", table(r["cycle"]), ""]
    out += ["## 2. Shared re-acquire (the lease is already held by this process)", "", table({f"sidelease {k}": v for k, v in r["shared"].items()}), ""]
    out += ["## 3. Refused attempt (held by another process; holder record read and returned)", "", table({f"sidelease {k}": v for k, v in r["refused"].items()}), ""]
    out += ["## 4. Handoff latency", "", f"![handoff latency]({pngs[1]})", "",
            table({k: v for k, v in r["handoff"].items()}), "",
            f"Waiter CPU during a {CPU_WAIT_S:g}-second wait (share of one core): " + ", ".join(
                f"{k}: {v['cpu_fraction_during_wait'] * 100:.3f}%" for k, v in r["handoff"].items() if "cpu_fraction_during_wait" in v), "",
            f"Takeover from a SIGKILLed holder (Rust waiter): median {us(r['takeover']['median_ns']):.0f} µs, "
            f"p99 {us(r['takeover']['p99_ns']):.0f} µs over {r['takeover']['n']}.", ""]
    out += ["## 4b. Failover: the leader SIGKILLed, the next one's command running", "",
            "`sidelease lead` campaigners (3 at a time) beside plain waiters (`sidelease hold --timeout inf "
            "--no-inherit`), the same processes and command (`sh` writing to a FIFO); the time includes starting "
            "`sh`. Anchors, as documented defaults, not measured: Kubernetes components elect with a 15 s lease, "
            "etcd's concurrency sessions take a 60 s TTL. The Python rows are the same measure for the thread form of "
            "`sidelease.Elector` beside plain `acquire(timeout=None)` waiters (a Python process, no command). A "
            "PostgreSQL successor waits out the bound (`confirm_within`) after a predecessor that did not release.",
            "", table(r["failover"]), ""]
    out += ["## 5. System calls per operation (`strace -f -c`)", "",
            "Counted by `bench/syscalls.py` (runs of N and 2N operations, the difference divided by N, so start-up "
            "cancels out). \"Runtime threads\" sets aside what an interpreter's own threads did meanwhile (futex, "
            "mmap, epoll_wait, ...: garbage collection, tokio workers); for Rust and C nothing is set aside. Handoff "
            "waiter rows include the harness's own line reads and writes (2 `read`s, 2 `write`s per handoff); their "
            "\"wake spins\" (a `sched_yield` and the `flock` it retries, when woken by the holder's close just "
            "before the kernel lets go of its lock) are counted apart: how many depends on when the processes run.", "",
            S.table(r["syscalls"]), ""]
    out += ["## 5b. Instructions per operation (callgrind)", "",
            "Counted by `bench/instructions.py`: user-space instructions inside each timed operation of the Rust "
            "and C measure loops (callgrind's `--toggle-collect` on the loop's `one`), the library's own threads "
            "and the warm-up left out. A refused attempt and `inspect` read the kernel's lock table; the column "
            "says how many locks it listed.", "", I.table(r["instructions"]), ""]
    out += ["## 6. inspect() with unrelated flock locks on the machine", "", table(r["inspect"]), ""]
    out += ["## 7. Scale: 10,000 distinct leases held by one process", "",
            "| run | first 1,000 median µs | last 1,000 median µs | last/first | RSS per held lease |", "|---|---:|---:|---:|---:|"]
    for name, v in r["scale"].items():
        a, b = v["first_thousand"]["median_ns"], v["last_thousand"]["median_ns"]
        out.append(f"| {name} | {us(a):.1f} | {us(b):.1f} | {b / a:.2f} | {v['rss_per_lease_bytes']:.0f} B |")
    pgt = {k: v for k, v in r["postgres"].items() if k != "thousand_leases"}
    many = r["postgres"]["thousand_leases"]
    out += ["", "## 8. PostgreSQL leases (local server, loopback TCP, scram-sha-256, sslmode=disable on both sides)", "",
            "A lease lives on its process's shared session by default (`shared cycle`: another lease holds the "
            "session open; the lock and the holder row in one round trip, the release in another), so its floor is "
            "a bare `pg_try_advisory_lock` + `pg_advisory_unlock` on an open connection (`bare round trip`). A lease "
            "with a connection of its own (`session=own`, `cycle`) had a bare connect + try-lock + unlock as its "
            "floor; its released connection is now kept 2 s for the next lease that goes alone to the server, so "
            "the cycle pays no connect, and the bare connect is its ceiling. Handoff: from the holder's release call to the waiter (another process, waiting on a "
            "connection of its own) holding, beside a bare `pg_advisory_lock` waiter woken by "
            "`pg_advisory_unlock`.", "",
            table({k.replace("_", " "): v for k, v in pgt.items()}), "",
            f"{many['leases']:,} leases held by one process on one server: {many['sessions']} server session(s) "
            f"(`pg_stat_activity`), {many['descriptors']} more descriptors than before (`/proc/self/fd`)."]
    out += ["", "## Notes", "", NOTES]
    return "\n".join(out) + "\n"


NOTES = """\
- **The /proc/locks read is not a few microseconds in general.** Reading it
  takes the kernel's global file-lock rwsem (`file_rwsem`) for writing, and a
  per-CPU rwsem's writer waits for an RCU grace period unless one passed
  moments ago: the first read in a quiet moment costs 10–20 ms here, then
  tight loops of reads are cheap. That is why the split guard skips the read
  when the previous record was written by a split-checked holder of the same
  inode (see docs/decisions.md), why the core's steady-state cycle sits below
  the "C floor with /proc/locks", and why inspect() (which must read it) is
  measured in a loop here but can cost milliseconds cold.
- **Scale with new lease files**: each first acquisition of a new lease file
  reads /proc/locks, which lists every lock this process already holds, so
  its cost grows with the number held. Lease files acquired before (the
  ordinary case for a database) skip the read and stay flat.
- **Handoff** runs through inotify: the holder's close wakes the waiter, which
  retries `LOCK_NB` (the kernel sends the event before it drops the lock, so
  a few `sched_yield` retries, then retries at 50 µs, 200 µs, 1 ms, 4 ms). A
  raw blocking `flock(2)` waiter is woken by the unlock itself, which is the
  floor. The row "inotify wake + LOCK_NB, no sidelease (C)" is the mechanism
  alone: on these VMs an inotify wake-up through `poll` costs several times a
  blocking flock's, and that, plus the holder's release record and the
  waiter's own record write (a few syscalls each side), is where the
  handoff's median goes. The 3× target is out of reach for any waiter that
  must not block in `flock` (DESIGN §5 rules out helper threads and signals);
  closing it would take a kernel-side wake on unlock, which Linux does not
  offer for flock.
- **Anchors** are the libraries users would pick instead: Python `filelock`,
  `portalocker`, `fasteners`; Node `proper-lockfile` (a lock directory with
  mtime refreshes). None of them notices a deleted or replaced lock file.
- Waiters report CLOCK_MONOTONIC (Bun's own hrtime counts from process
  start, so the Bun waiter reads the clock through `bun:ffi`).
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few seconds per item; CI checks that it runs")
    args = ap.parse_args()
    q = args.quick
    iters = 2_000 if q else 20_000
    OUT.mkdir(exist_ok=True)
    d = tempfile.mkdtemp(prefix="sidelease-bench-")
    start = time.monotonic()
    r: Dict[str, Any] = {}
    try:
        r["env"] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
            "bun": subprocess.run([BUN, "--version"], capture_output=True, text=True).stdout.strip(),
            "python": platform.python_version(),
        }
        steps = [
            ("cycle", lambda: cycles(d, iters)),
            ("shared+refused", lambda: shared_and_refused(d, iters)),
            # A wait longer than the holder's watch lingers once nothing is
            # held (2 s): a spin that started there went unseen in 2 s.
            ("handoff", lambda: handoffs(d, 20 if q else 300, 0.5 if q else CPU_WAIT_S)),
            ("takeover", lambda: takeover(d, 10 if q else 100)),
            ("failover", lambda: failovers(d, 10 if q else 100)),
            ("many waits", lambda: many_waits(d, 256, 2 if q else 10)),
            ("inspect", lambda: inspect_with_locks(d, 20 if q else 200)),
            ("scale", lambda: scale(d, 2_000 if q else 10_000)),
            ("syscalls", lambda: S.measure(q)),
            ("instructions", lambda: I.measure(q)),
            ("postgres", lambda: postgres(50 if q else 500)),
        ]
        for name, f in steps:
            t = time.monotonic()
            v = f()
            if name == "shared+refused":
                r["shared"], r["refused"] = v
            else:
                r[name] = v
            print(f"bench: {name} done in {time.monotonic() - t:.1f}s", flush=True)
        pngs = plots(r, q)
        text = report(r, q, pngs, time.monotonic() - start)
        (OUT / "results.json").write_text(json.dumps(r, indent=1))
        dest = OUT / "REPORT.md" if q else BENCH / "REPORT.md"
        dest.write_text(text)
        print(f"bench: wrote {dest.relative_to(ROOT)}")
        rows = targets(r)
        met = sum(1 for *_, v in rows if v == "**met**")
        print(f"bench targets: {met} met, {sum(1 for *_, v in rows if v == '**missed**')} missed")
        # What CI enforces: counts, stable where times are not; the cycle's
        # budget, and every gated count within its committed baseline.
        bad = [f"{k}: {c:g} system calls per cycle, budget {S.BUDGET}" for k, c in S.over_budget(r["syscalls"])]
        bad += S.regressions(r["syscalls"])
        bad += I.regressions(r["instructions"])
        for line in bad:
            print(f"bench: {line}", file=sys.stderr)
        if not bad:
            print(f"bench: every sidelease cycle within {S.BUDGET} system calls, every count within "
                  f"bench/baseline.json (system calls plus a tenth, at least one call; instructions plus a tenth)")
        return 1 if bad else 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
