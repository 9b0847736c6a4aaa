"""The cross-language suite: every scenario in tests/scenarios/ for every
ordered pair (holder runtime x contender runtime), then the stress, crash
injection and tampering runs. Ends with "N passed, N failed".

    python tests/cross/run.py [--only SCENARIO | --check NAME] [--pairs rust:c,...] [--soak]
                              [--platform portable] [--jobs N]

With --platform portable the Rust, C and Python agents built on the
portable platform run (tests/portable). A scenario or check whose
guarantee that platform does not give says why ("portable" in the
scenario, PORTABLE_GIVES_NOT below) and is counted apart, never skipped
silently.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).parent))

import agents  # noqa: E402
from agents import CAPABILITIES, RECORD_RUNTIME, ROOT, RUNTIMES, Agent, HandshakeError, kill_pid  # noqa: E402
import defence  # noqa: E402
import degraded  # noqa: E402
import faults  # noqa: E402
import partition  # noqa: E402
import pg  # noqa: E402

SCENARIOS = ROOT / "tests" / "scenarios"

# Checks whose guarantee the portable platform does not give, and why
# (docs/platforms.md).
PORTABLE_GIVES_NOT: Dict[str, str] = {
    "crowds": "contenders retrying without pause while the lease file is deleted outlast any grace: "
              "within the holder's 100 ms look one wins the file at the path and the holder is told it "
              "lost (on Linux the holder puts the file back within microseconds and the split guard "
              "refuses the rest)",
    "crowds and directories": "the same race, with the lease's directory swapped (the holder finds "
                              "the new path on its next look, 100 ms later)",
    "tampering": "the same race: the file is deleted or replaced every 1-10 ms while the other processes "
                 "wait for it, and within the holder's 100 ms look one of them wins the file at the path "
                 "(the in-place damage alone is checked by 'tampering in place')",
    "tampering, split guard off": "the same race as 'tampering' (on Linux the holder's watch alone "
                                  "usually puts the file back first; blind contenders are not "
                                  "always refused: docs/guarantees.md, Blind contenders)",
}
# Record judgements that need the kernel to name the lock's holders.
PORTABLE_UNSEEN = {"live", "image-replaced"}


class Context:
    """One scenario run: its directory, its agents, saved values."""

    def __init__(self, holder: str, contender: str, via: Optional[Tuple[str, str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="sidelease-cross-")
        self.runtimes = {"holder": holder, "contender": contender, "third": contender}
        self.agents: Dict[str, Agent] = {}
        self.pids: Dict[str, int] = {}
        self.saved: Dict[str, Any] = {}
        self.children: List[int] = []
        self.fds: List[int] = []
        self.db = os.path.join(self.dir, "app.db")
        # A database in a directory of its own, for the scenarios that
        # rename, replace or mount over the lease's directory.
        self.sub = os.path.join(self.dir, "d")
        os.mkdir(self.sub)
        self.subdb = os.path.join(self.sub, "app.db")
        self.cleanups: List[Any] = []
        self.pg = pg.lease_url(os.path.basename(self.dir), via)
        # A PostgreSQL scenario: the server names the holder on any platform.
        self.pg_lease = False
        # The lease file's generations: "$gen:new" is a first one (a file
        # with no record jumps to the clock, above every earlier one),
        # "$gen:+N" the one N acquisitions later.
        self.gen_base: Optional[int] = None
        self.gen_max = 0

    def agent(self, role: str) -> Agent:
        if role not in self.agents:
            a = Agent(self.runtimes[role], role)
            self.agents[role] = a
            self.pids[role] = a.pid
        return self.agents[role]

    def subst(self, v: Any) -> Any:
        if isinstance(v, str):
            if "$pg" in v:
                v = (v.replace("$pgshown", pg.shown(self.pg)).replace("$pgwrongpw", pg.wrong_password(self.pg))
                     .replace("$pgnolease", self.pg.split("?")[0]).replace("$pg", self.pg))
            v = (v.replace("$sublease", self.subdb + ".backend-lease").replace("$subdb", self.subdb)
                 .replace("$sub", self.sub))
            v = v.replace("$lease", self.db + ".backend-lease").replace("$db", self.db).replace("$dir", self.dir)
            if v.startswith("$pid:"):
                role = v[5:]
                # A process a step started (flock(1)), or an agent.
                return self.pids[role] if role not in self.runtimes and role in self.pids else self.agent(role).pid
            return v
        if isinstance(v, list):
            return [self.subst(x) for x in v]
        if isinstance(v, dict):
            return {k: self.subst(x) for k, x in v.items()}
        return v

    def generation(self, spec: str, got: Any, where: str) -> List[str]:
        if not isinstance(got, int) or isinstance(got, bool):
            return [f"{where}: expected a generation, got {got!r}"]
        if spec == "new":
            if got == self.gen_base:
                return []  # the same answer matched again
            # Microseconds since 1970: far above any counter from 1.
            if got <= 10**15 or got <= self.gen_max:
                return [f"{where}: expected a new clock-based generation above {self.gen_max}, got {got}"]
            self.gen_base = got
        else:
            if self.gen_base is None:
                return [f"{where}: $gen:{spec} before any $gen:new"]
            want = self.gen_base + int(spec)
            if got != want:
                return [f"{where}: expected generation {want} ($gen:{spec}), got {got}"]
        self.gen_max = max(self.gen_max, got)
        return []

    def close(self) -> None:
        for a in self.agents.values():
            a.close()
        for undo in reversed(self.cleanups):
            undo()
        for pid in self.children:
            kill_pid(pid)
        for fd in self.fds:
            os.close(fd)
        shutil.rmtree(self.dir, ignore_errors=True)

    def transcripts(self) -> str:
        return "\n".join(a.dump() for a in self.agents.values())


def match(ctx: Context, expected: Any, got: Any, where: str = "") -> List[str]:
    """Subset match; "$pid:ROLE", "$runtime:ROLE", "$saved:KEY", "$any",
    "$contains:TEXT" (with $pid: inside), "$in:A,B" (one of), "$gen:new" and
    "$gen:+N" (see Context.generation) are patterns."""
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return [f"{where}: expected an object, got {got!r}"]
        out: List[str] = []
        for k, v in expected.items():
            out += match(ctx, v, got.get(k), f"{where}.{k}")
        return out
    if isinstance(expected, list):
        if agents.PLATFORM == "portable" and where.endswith(".holders"):
            # The PIDs the kernel names as holders: the portable platform
            # names none, and never a wrong one (docs/platforms.md).
            expected = []
        if not isinstance(got, list) or len(got) != len(expected):
            return [f"{where}: expected {expected!r}, got {got!r}"]
        return [m for e, g in zip(expected, got) for m in match(ctx, e, g, f"{where}[]")]
    if (agents.PLATFORM == "portable" and not ctx.pg_lease and where.endswith(".record_status")
            and expected in PORTABLE_UNSEEN):
        # Whether a live process holds the lock is the kernel's to say: the
        # portable platform says unknown (docs/platforms.md).
        expected = "unknown"
    if isinstance(expected, str) and expected.startswith("$"):
        if expected == "$any":
            return [] if got is not None else [f"{where}: expected a value, got null"]
        if expected.startswith("$pid:"):
            want: Any = ctx.pids[expected[5:]]
            return [] if got == want else [f"{where}: expected pid {want} ({expected}), got {got!r}"]
        if expected.startswith("$runtime:"):
            prefix = RECORD_RUNTIME[ctx.runtimes[expected[9:]]]
            ok = isinstance(got, str) and (got == prefix or (prefix.endswith(" ") and got.startswith(prefix)))
            return [] if ok else [f"{where}: expected runtime {prefix!r}, got {got!r}"]
        if expected.startswith("$saved:"):
            want = ctx.saved[expected[7:]]
            return [] if got == want else [f"{where}: expected saved {want!r}, got {got!r}"]
        if expected.startswith("$gen:"):
            return ctx.generation(expected[5:], got, where)
        if expected.startswith("$in:"):
            options = expected[4:].split(",")
            return [] if got in options else [f"{where}: expected one of {options}, got {got!r}"]
        if expected.startswith("$contains:"):
            text = expected[10:]
            for role, pid in ctx.pids.items():
                text = text.replace(f"$pid:{role}", str(pid))
            return [] if isinstance(got, str) and text in got else [f"{where}: {got!r} lacks {text!r}"]
    return [] if got == expected else [f"{where}: expected {expected!r}, got {got!r}"]


def dig(v: Any, path: str) -> Any:
    for part in path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def run_step(ctx: Context, step: Dict[str, Any]) -> None:
    who = step.get("who")
    kind = step["do"]
    if kind == "call":
        a = ctx.agent(who)
        got = a.call(ctx.subst(step["cmd"]), step.get("within", 10.0))
    elif kind == "send":
        ctx.agent(who).send(ctx.subst(step["cmd"]))
        return
    elif kind == "recv":
        t = time.monotonic()
        got = ctx.agent(who).recv(step.get("within", 10.0))
        if "within" in step:
            assert time.monotonic() - t <= step["within"], "answer came too late"
    elif kind == "eventually":  # the same call until it answers as expected
        a = ctx.agent(who)
        deadline = time.monotonic() + step.get("within", 2.0)
        cmd = ctx.subst(step["cmd"])
        expected = ctx.subst(step.get("expect", {}))
        while True:
            got = a.call(cmd)
            if not match(ctx, expected, got, who or "") or time.monotonic() > deadline:
                break
            time.sleep(0.005)
    elif kind == "ready":  # after exec_self: the new image's ready line
        got = ctx.agent(who).recv()
    elif kind == "wait_blocked":  # the agent has the lease file open: it waits
        a = ctx.agent(who)
        deadline = time.monotonic() + 10
        while not a.has_open(ctx.db + ".backend-lease"):
            if time.monotonic() > deadline:
                raise HandshakeError(f"{who} never opened the lease file")
            time.sleep(0.002)
        return
    elif kind == "pg_blocked":  # someone waits for an advisory lock on the server
        pg.wait_blocked([a.pid for a in ctx.agents.values()])
        return
    elif kind == "pg_terminate":  # end the agent's lease sessions from the server
        n = pg.terminate(ctx.agent(who).pid)
        assert n >= 1, f"no session of {who} to terminate"
        return
    elif kind == "signal":
        ctx.agent(who).signal(getattr(signal, "SIG" + step["sig"]))
        return
    elif kind == "pause":  # SIGSTOP, and wait until every thread is stopped
        faults.pause(ctx.agent(who).pid)
        return
    elif kind == "resume":
        os.kill(ctx.agent(who).pid, signal.SIGCONT)
        return
    elif kind == "file":
        fd = faults.file_op(step["op"], ctx.subst(step.get("path", "$lease")),
                            ctx.subst(step.get("to", step.get("from", ""))))
        if fd is not None:
            ctx.fds.append(fd)
        return
    elif kind == "flock":  # util-linux flock(1) holds the lease file: no sidelease holder
        path = ctx.subst(step.get("path", "$lease"))
        proc = subprocess.Popen(["flock", "--no-fork", path, "sleep", "60"])
        ctx.children.append(proc.pid)
        ctx.pids["flock"] = proc.pid
        deadline = time.monotonic() + 10
        while not faults.locked_by(proc.pid, os.stat(path).st_ino):
            if time.monotonic() > deadline:
                raise HandshakeError("flock(1) never locked the lease file")
            time.sleep(0.002)
        return
    elif kind == "dir":
        undo = faults.dir_op(step["op"], ctx.subst(step.get("path", "$sub")))
        if undo is not None:
            ctx.cleanups.append(undo)
        return
    elif kind == "let_go":  # the rivals of "file" steps close their descriptors
        for fd in ctx.fds:
            os.close(fd)
        ctx.fds.clear()
        return
    elif kind == "sleep":
        time.sleep(step["seconds"])
        return
    else:
        raise ValueError(f"unknown step {kind!r}")
    if "child" in got:
        ctx.children.append(got["child"])
    for secret in pg.SECRETS:
        assert secret not in json.dumps(got), f"a password shows in {got}"
    problems = match(ctx, ctx.subst(step.get("expect", {})), got, who or "")
    if problems:
        raise AssertionError("; ".join(problems))
    for key, path in step.get("save", {}).items():
        ctx.saved[key] = dig(got, path)


def run_scenario(sc: Dict[str, Any], holder: str, contender: str,
                 via: Optional[Tuple[str, str]] = None) -> Tuple[str, str]:
    missing = set(sc.get("holder_needs", [])) - CAPABILITIES[holder]
    if missing:
        return "n/a", f"{holder} cannot {', '.join(sorted(missing))}"
    if "root" in sc.get("needs", []) and os.geteuid() != 0:
        return "n/a", "needs root (mount)"
    ctx = Context(holder, contender, via)
    ctx.pg_lease = sc["name"].startswith("pg-")
    try:
        for i, step in enumerate(sc["steps"]):
            try:
                run_step(ctx, step)
            except (AssertionError, HandshakeError) as e:
                return "fail", f"step {i} {json.dumps(step)}: {e}\n{ctx.transcripts()}"
        return "pass", ""
    except Exception:
        return "fail", traceback.format_exc() + ctx.transcripts()
    finally:
        ctx.close()


# Checks that bound no time and run their processes under SCHED_IDLE (the
# fork storm: 72 s of CPU-bound forking): they go beside the scenarios.
BESIDE = {"fork storm"}


def _timed(check: Callable[[bool], str], soak: bool) -> Tuple[str, float]:
    t = time.monotonic()
    return check(soak), time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run only this scenario")
    ap.add_argument("--pairs", help="holder:contender,... (default: all 25)")
    ap.add_argument("--soak", action="store_true", help="longer stress, crash and tamper runs")
    ap.add_argument("--no-faults", action="store_true", help="scenarios only")
    ap.add_argument("--checks-only", action="store_true", help="the stress and fault checks only")
    ap.add_argument("--check", help="only the stress/fault checks whose name contains this (or one of A,B,...)")
    ap.add_argument("--jobs", type=int, default=3, help="scenario runs on files side by side (default 3)")
    ap.add_argument("--platform", choices=["linux", "portable", *agents.CROSS], default="linux",
                    help="the agents' platform (portable: tests/portable builds them)")
    args = ap.parse_args()
    agents.use_platform(args.platform)
    portable = args.platform == "portable"
    not_given = 0

    scenarios = [json.loads(p.read_text()) for p in sorted(SCENARIOS.glob("*.json"))]
    if args.only:
        scenarios = [s for s in scenarios if s["name"] == args.only]
    if args.check or args.checks_only:
        scenarios = []
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")] if args.pairs else [
        (h, c) for h in RUNTIMES for c in RUNTIMES
    ]
    passed = failed = na = 0
    checks = [] if args.no_faults or args.only else [
        (name, check) for name, check in faults.CHECKS + defence.CHECKS + degraded.CHECKS + partition.CHECKS
        if not (args.check and not any(c in name for c in args.check.split(",")))
    ]
    # BESIDE's checks start now, beside the scenarios, which mostly wait;
    # each is reported in its place below.
    side = ThreadPoolExecutor(max_workers=1)
    beside = {name: side.submit(_timed, check, args.soak) for name, check in checks
              if name in BESIDE and not (portable and name in PORTABLE_GIVES_NOT)}
    start = time.monotonic()
    # The PostgreSQL scenarios (each holder's lease on its process's shared
    # session, the default) once more through a stock session-mode
    # PgBouncer (tests/pg/cluster runs one), once more on sessions of their
    # own (session=own), and once more over TLS with
    # sslmode=verify-full against the test CA, where they must pass
    # unchanged.
    runs = [(sc, None) for sc in scenarios]
    pg_scenarios = [sc for sc in scenarios if sc["name"].startswith("pg-")]
    bouncer = os.environ.get("SIDELEASE_TEST_PGBOUNCER")
    if bouncer:
        # Every holder runtime, one contender runtime: what the pooler
        # changes is the holder's session.
        runs += [({**sc, "contenders": ["rust"]}, ("PgBouncer", bouncer, "")) for sc in pg_scenarios]
    # Once more with every lease on a connection of its own (session=own).
    if pg_scenarios:
        own_base = os.environ["SIDELEASE_TEST_PG"]
        runs += [({**sc, "contenders": ["rust"]}, ("own session", own_base, "&session=own"))
                 for sc in pg_scenarios]
    pki = os.environ.get("SIDELEASE_TEST_PG_PKI")
    if pki:
        tls_base = os.environ["SIDELEASE_TEST_PG"].replace("@127.0.0.1:", "@localhost:")
        params = f"&sslmode=verify-full&sslrootcert={pki}/ca.crt"
        runs += [({**sc, "contenders": ["rust"]}, ("verify-full", tls_base, params)) for sc in pg_scenarios]
    # A scenario may name the contenders it needs (the holder's runtime is
    # what it tests; every contender runs the same core): fewer pairs,
    # every holder.
    def pairs_of(sc: Dict[str, Any]) -> List[Tuple[str, str]]:
        return [p for p in pairs if p[1] in sc.get("contenders", [p[1]])]

    # Scenario runs go side by side: each has a directory, a lease name and
    # agents of its own (a PostgreSQL one waits for its own agents'
    # sessions), and no bound in them is under a second.
    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    ahead = [None if portable and sc.get("portable") else
             [pool.submit(run_scenario, sc, h, c, via[1:] if via else None) for h, c in pairs_of(sc)]
             for sc, via in runs]
    for (sc, via), futures in zip(runs, ahead):
        tag = f" ({via[0]})" if via else ""
        if futures is None:
            not_given += 1
            print(f"{sc['name'] + tag:<32} not given on the portable platform: {sc['portable']}", flush=True)
            continue
        results = []
        outcomes = ((f.result(), hc) for f, hc in zip(futures, pairs_of(sc)))
        for (status, detail), (holder, contender) in outcomes:
            results.append(status)
            if status == "pass":
                passed += 1
            elif status == "n/a":
                na += 1
            else:
                failed += 1
                print(f"FAIL {sc['name']}{tag} holder={holder} "
                      f"contender={contender}\n{detail}\n", flush=True)
        label = sc["name"] + tag
        print(f"{label:<32} pass {results.count('pass'):>2}  fail {results.count('fail'):>2}  "
              f"n/a {results.count('n/a'):>2}", flush=True)
    pool.shutdown()
    print(f"scenarios x pairs: {passed} passed, {failed} failed, {na} not applicable "
          f"({agents.NOT_APPLICABLE}) in {time.monotonic() - start:.1f}s", flush=True)

    for name, check in checks:
        if portable and name in PORTABLE_GIVES_NOT:
            not_given += 1
            print(f"{name}: not given on the portable platform: {PORTABLE_GIVES_NOT[name]}", flush=True)
            continue
        t = time.monotonic()
        try:
            if name in beside:
                summary, took = beside[name].result()
                summary += ", beside the scenarios"
            else:
                summary, took = check(args.soak), time.monotonic() - t
            passed += 1
            print(f"{name}: ok ({summary}) in {took:.1f}s", flush=True)
        except (AssertionError, HandshakeError, subprocess.CalledProcessError) as e:
            failed += 1
            detail = getattr(e, "stderr", "") or ""
            print(f"FAIL {name}: {e} {detail}", flush=True)
    side.shutdown()
    if portable:
        print(f"{passed} passed, {failed} failed, {not_given} not given on the portable platform (reasons above)")
    else:
        print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
