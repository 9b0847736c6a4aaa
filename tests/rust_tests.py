"""Every Rust test binary of a run, the PostgreSQL ones two at a time.

`cargo test` runs one test binary after another, and the PostgreSQL
binaries spend their time waiting on the server, on a session's end, on
a lease's deadline: run one by one they took 150 s of a tests/run at a
fifth of two cores. Here the other binaries run first, one at a time as
before (their checks of wake-ups, descriptors and the machine's lock
table are the ones a busy machine disturbs: side by side with the rest,
a holder's watch missed its 10 ms), then the PostgreSQL ones two at a
time. Nothing else changes: cargo builds and lists them (`--no-run
--message-format=json`), each runs from its package's directory as cargo
runs it, its output is printed whole once it ends, and any failure fails
the run once every binary has ended.

Three PostgreSQL binaries get a cluster of their own (tests/pg/cluster),
because what they do to a server would reach every other binary's
sessions:
- postgres.rs restarts its server;
- poolers.rs fills PgBouncer's one-connection pools and counts the
  server's sessions of them;
- shared.rs keeps a thousand leases at once and ends its sessions.
Two binaries run alone once the others have ended, because they judge
every lock on the machine (a lock another binary's test leaves with no
process holding it counts there):
- guard_scale.rs needs every lock on the machine attributed;
- dying_holders.rs leaves such a lock (a descriptor in flight) on purpose.

usage: rust_tests.py PLAN   (PLAN: main | portable)
The PostgreSQL variables of the run's cluster come from the environment
(`eval "$(bash tests/pg/cluster start)"`, as tests/run does).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "tests", "pg", "cluster")
OWN_SERVER = ("postgres", "poolers", "shared")
# The PostgreSQL binaries, the longest first (46, 34, 32, 17, 12 s ...).
PG = ("shared", "postgres", "poolers", "kept_sessions", "given_up_waits", "lead", "elector_pg", "containment", "tls")
ALONE = ("guard_scale", "dying_holders")
# PostgreSQL binaries at once. Four missed bounds that a busy server or
# machine misses (lead.rs's 1 s confirmation of its session, elector_pg.rs's
# fences); two on two cores leave them the margins one by one gave.
JOBS = 2
# Far past the slowest binary (46 s); a hang is ended and reported.
LIMIT_S = 600


@dataclass
class Build:
    """One `cargo test` invocation's binaries: cargo arguments, the one
    test target to take (or every one), the environment it runs in and the
    arguments each binary gets (a test-name filter)."""

    cargo: list
    test: str = ""
    env: dict = field(default_factory=dict)
    args: list = field(default_factory=list)


FAULTS = ["-p", "sidelease", "--features", "postgres,fault-injection"]
PLANS = {
    "main": [
        Build(["--workspace"]),
        # An acquisition handed to a session the server ended as it was
        # kept, under seeded delays.
        Build(FAULTS, "kept_sessions", {"SIDELEASE_FAULTS": "1:30000"}),
        # Delays up to 2 s before a wait's lock request, longer than the
        # test's margin for a request sent just before its caller gave up
        # (0.75 s).
        Build(FAULTS, "given_up_waits", {"SIDELEASE_FAULTS": "1:2000000"}),
        # The bound on an attempt's replaced rounds lowered to 1, so that
        # every attempt under a tight rename loop reaches it: a wait backs
        # off and takes the lease once the loop stops, never failing
        # before its deadline.
        Build(FAULTS, "replaced_while_waiting", {"SIDELEASE_FAULT_ROUNDS": "1"}, ["a_waiter_outlasts"]),
    ],
    "portable": [
        Build(["-p", "sidelease", "--features", "portable,postgres"]),
        Build(["-p", "sidelease-cli", "--features", "portable"]),
    ],
}


@dataclass
class Binary:
    name: str  # the source from the workspace root: "core/tests/shared.rs"
    stem: str  # the test target's name: "shared"
    exe: str
    cwd: str
    env: dict
    args: list


def binaries(build: Build) -> list:
    """Build a `cargo test` invocation's binaries and list them."""
    cmd = ["cargo", "test", "--locked", "--no-run", "--message-format=json-render-diagnostics", *build.cargo]
    if build.test:
        cmd += ["--test", build.test]
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, check=True, text=True).stdout
    found = []
    for line in out.splitlines():
        m = json.loads(line)
        if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
            continue
        t = m["target"]
        pkg = os.path.dirname(m["manifest_path"])
        src = os.path.relpath(t["src_path"], pkg)
        found.append(Binary(f"{os.path.relpath(pkg, ROOT)}/{src}", t["name"],
                            m["executable"], pkg, {**build.env, "CARGO_MANIFEST_DIR": pkg}, build.args))
    if not found:
        sys.exit(f"rust_tests.py: `{' '.join(cmd)}` listed no test binary")
    return found


def start_cluster() -> dict:
    out = subprocess.run(["bash", CLUSTER, "start"], stdout=subprocess.PIPE, check=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        k, _, v = line.removeprefix("export ").partition("=")
        env[k] = v
    return env


print_lock = threading.Lock()


def run(b: Binary, extra_env: dict) -> bool:
    began = time.monotonic()
    p = subprocess.Popen([b.exe, *b.args], cwd=b.cwd, env={**os.environ, **b.env, **extra_env},
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: p.stdout.read1(65536), b"")))
    reader.start()
    try:
        p.wait(timeout=LIMIT_S)
        verdict = "ok" if p.returncode == 0 else f"FAILED (exit {p.returncode})"
    except subprocess.TimeoutExpired:
        verdict = f"FAILED (still running after {LIMIT_S} s, killed)"
    # What is left of its session: the binary on a timeout, and children a
    # failed test left running (they would keep its output open). The
    # group is this binary's own (start_new_session), by its PID.
    reader.join(timeout=2)
    if p.returncode is None or reader.is_alive():
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    reader.join()
    took = time.monotonic() - began
    with print_lock:
        print(f"     Running {b.name} ({os.path.relpath(b.exe, ROOT)})", flush=True)
        sys.stdout.write(b"".join(chunks).decode(errors="replace"))
        print(f"  -> {b.name}: {verdict} in {took:.1f}s\n", flush=True)
    return verdict == "ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", choices=sorted(PLANS))
    a = ap.parse_args()
    began = time.monotonic()
    found = [b for build in PLANS[a.plan] for b in binaries(build)]
    own = [b for b in found if b.stem in OWN_SERVER]
    pg = [b for b in found if b.stem in PG and b not in own]
    rest = [b for b in found if b.stem not in PG and b.stem not in ALONE]
    clusters = []
    results = []
    try:
        # One after another: each takes the free ports it finds.
        envs = []
        for _ in own:
            envs.append(start_cluster())
            clusters.append(envs[-1]["SIDELEASE_TEST_PG_DIR"])
        side_by_side = list(zip(own, envs)) + [(b, {}) for b in pg]
        side_by_side.sort(key=lambda be: PG.index(be[0].stem))
        results = [(b.name, run(b, {})) for b in rest]
        with ThreadPoolExecutor(max_workers=JOBS) as pool:
            results += list(pool.map(lambda be: (be[0].name, run(*be)), side_by_side))
        results += [(b.name, run(b, {})) for b in found if b.stem in ALONE]
    finally:
        for d in clusters:
            subprocess.run(["bash", CLUSTER, "stop", d], check=False)
    failed = [n for n, ok in results if not ok]
    took = time.monotonic() - began
    if failed:
        sys.exit(f"rust_tests.py: {len(failed)} of {len(results)} test binaries failed: {', '.join(failed)}")
    print(f"rust_tests.py: {len(results)} test binaries passed in {took:.1f}s")


if __name__ == "__main__":
    main()
