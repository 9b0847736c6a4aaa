"""System calls per operation, counted with `strace -f -c`: each measurement
runs twice, with N and 2N operations, and the difference divided by N is
the count per operation (start-up and exit cancel out). A count is stable
on a noisy machine where a time is not, so this is what CI checks.

    .venv/bin/python bench/syscalls.py [--quick] [--check] [--json OUT]

--check fails (exit 1) when an uncontended sidelease acquire+release of an
existing lease file makes more than BUDGET system calls in any language, at
any path depth, with the split guard and the holder's watch on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import common as B  # bench/common.py

BUDGET = 12
# What the runtimes do on their own threads in proportion to work (garbage
# collection, allocator, timers), not what sidelease asks of the kernel.
RUNTIME_ONLY = {"futex", "madvise", "mmap", "munmap", "mprotect", "brk", "epoll_wait", "epoll_pwait",
                "epoll_pwait2", "sched_yield", "rt_sigprocmask", "getrusage", "clock_gettime", "gettid"}


def strace_counts(cmd: List[str], stdin: Optional[str] = None) -> Dict[str, int]:
    """Run `cmd` under strace -f -c; calls by system call name."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        subprocess.run(["strace", "-f", "-c", "-U", "calls,name", "-o", out.name, "--"] + cmd,
                       check=True, capture_output=True, text=True, input=stdin, timeout=600)
        counts: Dict[str, int] = {}
        for line in out.read().splitlines():
            f = line.split()
            if len(f) == 2 and f[0].isdigit() and f[1] != "total":
                counts[f[1]] = counts.get(f[1], 0) + int(f[0])
        return counts


def loop_ops(n: int) -> int:
    """Operations a measure loop of n makes: n timed after n // 10 + 1
    warm-up rounds (bench/*/measure*)."""
    return n + n // 10 + 1


def per_op(run, n: int, ops=lambda n: n) -> Dict[str, float]:  # type: ignore[no-untyped-def]
    """Per-operation counts from runs of n and 2n operations."""
    a, b = run(n), run(2 * n)
    names = set(a) | set(b)
    made = ops(2 * n) - ops(n)
    return {k: (b.get(k, 0) - a.get(k, 0)) / made for k in names}


def summary(by_name: Dict[str, float], interpreter: bool = True) -> Dict[str, Any]:
    """`interpreter`: set aside what an interpreter's own threads do (for
    Rust and C nothing is set aside)."""
    aside = RUNTIME_ONLY if interpreter else set()
    lib = {k: v for k, v in by_name.items() if k not in aside and v >= 0.05}
    runtime = sum(v for k, v in by_name.items() if k in aside)
    return {"calls": round(sum(lib.values()), 1), "runtime_threads": round(runtime, 1),
            "by_name": {k: round(v, 1) for k, v in sorted(lib.items(), key=lambda kv: -kv[1])}}


def loop_op(cmd: List[str]):  # type: ignore[no-untyped-def]
    return lambda n: strace_counts(cmd + [str(n)])


def counted(cmd: List[str], n: int) -> Dict[str, Any]:
    """A measure loop's counts per operation."""
    native = cmd[0] in (B.RUST, B.CAPI)
    return summary(per_op(loop_op(cmd), n, loop_ops), interpreter=not native)


def handoff_op(d: str, cmd: List[str], path: str):  # type: ignore[no-untyped-def]
    """The waiter's system calls per handoff (the harness's own line read and
    write on each side included: 2 reads, 2 writes)."""
    def run(n: int) -> Dict[str, int]:
        hold, release = B.hold_release("sidelease", path)
        out = tempfile.NamedTemporaryFile("r", suffix=".strace")
        w = B.Waiter(["strace", "-f", "-c", "-U", "calls,name", "-o", out.name, "--"] + cmd)
        try:
            for _ in range(n):
                hold()
                w.send("wait")
                time.sleep(0.003)
                release()
                w.recv()
                w.send("release")
                assert w.recv() == "ok"
        finally:
            w.close()
        counts: Dict[str, int] = {}
        for line in out.read().splitlines():
            f = line.split()
            if len(f) == 2 and f[0].isdigit() and f[1] != "total":
                counts[f[1]] = counts.get(f[1], 0) + int(f[0])
        out.close()
        return counts
    return run


def measure(quick: bool) -> Dict[str, Dict[str, Any]]:
    n = 300 if quick else 2000
    d = tempfile.mkdtemp(prefix="sidelease-syscalls-")
    deep = os.path.join(d, "a", "b", "c", "d", "e")
    os.makedirs(deep)
    rows: Dict[str, Dict[str, Any]] = {}
    try:
        for lang, cmd in B.LANG_CMD.items():
            rows[f"cycle: sidelease {lang}"] = counted(cmd + ["cycle", f"{d}/c-{lang}.db"], n)
        rows["cycle: sidelease rust, 5 directories deep"] = counted([B.RUST, "cycle", f"{deep}/app.db"], n)
        existing = f"{d}/existing.db"
        open(existing, "w").close()
        rows["cycle: sidelease rust, target file exists"] = counted([B.RUST, "cycle", existing], n)
        for lang, cmd in B.LANG_CMD.items():
            rows[f"shared re-acquire: sidelease {lang}"] = counted(cmd + ["shared", f"{d}/s-{lang}.db"], n)
        target = f"{d}/refused.db"
        h = B.Holder(target)
        try:
            for lang, cmd in B.LANG_CMD.items():
                rows[f"refused attempt: sidelease {lang}"] = counted(cmd + ["refused", target], max(n // 2, 100))
        finally:
            h.close()
        py = [B.PY, str(B.BENCH / "py/measure.py")]
        for name in ("python_bare_flock", "python_filelock", "python_portalocker", "python_fasteners"):
            rows[f"cycle: {name.replace('python_', 'python ').replace('_', ' ')}"] = counted(
                py + [f"anchor:{name}", f"{d}/anchor"], n)
        for rt, node in (("node", "node"), ("bun", B.BUN)):
            rows[f"cycle: {rt} proper-lockfile lockSync"] = counted(
                [node, str(B.BENCH / "js/measure.cjs"), "anchor:proper_lockfile_sync", f"{d}/proper-{rt}"], min(n, 300))
        hn = 20 if quick else 100
        js, pym = str(B.BENCH / "js/measure.cjs"), str(B.BENCH / "py/measure.py")
        for name, cmd, path in (
            ("rust", [B.RUST, "waiter", f"{d}/h-rust.db"], f"{d}/h-rust.db"),
            ("c-abi", [B.CAPI, "waiter", f"{d}/h-c.db"], f"{d}/h-c.db"),
            ("python", [B.PY, pym, "waiter", "sidelease", f"{d}/h-py.db"], f"{d}/h-py.db"),
            ("node", ["node", js, "waiter", "sidelease", f"{d}/h-node.db"], f"{d}/h-node.db"),
            ("node acquireAsync", ["node", js, "waiter", "sidelease-async", f"{d}/h-na.db"], f"{d}/h-na.db"),
            ("bun", [B.BUN, js, "waiter", "sidelease", f"{d}/h-bun.db"], f"{d}/h-bun.db"),
        ):
            native = cmd[0] in (B.RUST, B.CAPI)
            rows[f"handoff waiter: sidelease {name}"] = summary(per_op(handoff_op(d, cmd, path), hn),
                                                                interpreter=not native)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return rows


def over_budget(rows: Dict[str, Dict[str, Any]]) -> List[Tuple[str, float]]:
    return [(k, v["calls"]) for k, v in rows.items()
            if k.startswith("cycle: sidelease") and v["calls"] > BUDGET + 0.05]


def table(rows: Dict[str, Dict[str, Any]]) -> str:
    lines = ["| operation | system calls | which (per operation) | runtime threads |", "|---|---:|---|---:|"]
    for k, v in rows.items():
        which = ", ".join(f"{name} {c:g}" for name, c in v["by_name"].items())
        lines.append(f"| {k} | {v['calls']:g} | {which} | {v['runtime_threads']:g} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true", help=f"fail above {BUDGET} calls per cycle")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args()
    if not shutil.which("strace"):
        print("syscalls: strace is not installed", file=sys.stderr)
        return 2
    rows = measure(args.quick)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = over_budget(rows)
    if args.check:
        if bad:
            for k, c in bad:
                print(f"syscalls: {k}: {c:g} system calls per cycle, budget {BUDGET}", file=sys.stderr)
            return 1
        print(f"syscalls: every sidelease cycle within {BUDGET} system calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
