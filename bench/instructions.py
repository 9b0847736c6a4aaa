#!/usr/bin/env python3
"""Instructions per operation, counted under callgrind: what an operation
costs in user space, where bench/syscalls.py counts what it asks of the
kernel. How busy the machine is does not move the gated counts, so CI can
fail on them (a timed check on these shared 2-core machines could not).

Each measure loop (the Rust bench's and the C bench's) runs every operation
through a function of its own (`one`); callgrind counts only inside it
(`--toggle-collect`), on that thread, so start-up, the timing and the
library's own threads are left out, and the count divided by the number of
operations is the operation's cost: the library's work and the allocator's
and libc's under it.

    bench/instructions.py [--check] [--write-baseline] [--json FILE]

--check fails when an operation bench/baseline.json lists ("instructions":
the cycle, the shared re-acquire, a refused attempt) costs more than its
count there plus a tenth (at least 1,000: the allocator's state moves the
small counts by up to 6%). A refused attempt reads the kernel's lock table,
so its count grows a little with the locks on the machine (200 more: +1%);
`inspect` judges each of them, so it is reported and not gated (GATED).
Each row that reads the table says the most locks it listed during the
run, and so does a failure. The lease files are in /tmp, whatever TMPDIR
says: the count grows with the length of the path (about 70 instructions
a character). (A PID namespace of its own would hide the others' locks, but it
also changes what the library does: it can no longer see every lock.)
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

import common as B  # bench/common.py

BASELINE = B.BENCH / "baseline.json"
MARGIN = 0.10
MARGIN_MIN = 1_000
# The rows the baseline holds and --check holds to it. `inspect` is counted
# and reported, not gated: it judges every other lock on the machine (the
# split guard's scan), and one lock whose listed holder is gone (a child
# still holding what its dead parent locked) makes it read every process's
# descriptors: 57,000 instructions became 1,355,000 in one bench run here.
GATED = ("cycle: sidelease", "shared re-acquire: sidelease", "refused attempt: sidelease")
# The function each measure loop runs an operation through.
TOGGLE = {B.RUST: "sidelease_bench::one*", B.CAPI: "one"}


def lock_table_lines() -> int:
    """How many locks the kernel's table lists now."""
    try:
        with open("/proc/locks") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def counted(cmd: List[str], n: int) -> Dict[str, Any]:
    """Instructions per operation of one measure loop of `n` (its warm-up,
    which makes the lease file, is not counted)."""
    with tempfile.NamedTemporaryFile("r", suffix=".callgrind") as out:
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}",
                            f"--toggle-collect={TOGGLE[cmd[0]]}", "--"] + cmd + [str(n)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"instructions: {' '.join(cmd)} under callgrind failed "
                               f"({r.returncode}): {r.stderr[-2000:]}")
        totals = [ln for ln in out.read().splitlines() if ln.startswith("totals:")]
    if not totals:
        raise RuntimeError(f"instructions: callgrind wrote no totals for {' '.join(cmd)}")
    ops = n
    total = int(totals[0].split()[1])
    if total < ops:
        raise RuntimeError(f"instructions: {total} instructions for {ops} operations of {' '.join(cmd)}: "
                           f"the measure loop no longer runs them through `{TOGGLE[cmd[0]]}`")
    return {"instructions": round(total / ops), "ops": ops}


def measure(quick: bool) -> Dict[str, Dict[str, Any]]:
    n = 200  # the same in --quick: cheap (a few seconds), and one baseline serves both
    d = tempfile.mkdtemp(prefix="sidelease-instructions-", dir="/tmp")
    rows: Dict[str, Dict[str, Any]] = {}
    try:
        for lang, exe in (("rust", B.RUST), ("c-abi", B.CAPI)):
            rows[f"cycle: sidelease {lang}"] = counted([exe, "cycle", f"{d}/c-{lang}.db"], n)
            rows[f"shared re-acquire: sidelease {lang}"] = counted([exe, "shared", f"{d}/s-{lang}.db"], n)
        target = f"{d}/refused.db"
        h = B.Holder(target)

        def with_locks(cmd: List[str]) -> Dict[str, Any]:
            before = lock_table_lines()
            row = counted(cmd, n)
            row["lock_table_lines"] = max(before, lock_table_lines())
            return row
        try:
            for lang, exe in (("rust", B.RUST), ("c-abi", B.CAPI)):
                rows[f"refused attempt: sidelease {lang}"] = with_locks([exe, "refused", target])
            rows["inspect, held elsewhere: sidelease rust"] = with_locks([B.RUST, "inspect", target])
        finally:
            h.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return rows


def allowed(base: float) -> float:
    return base + max(base * MARGIN, MARGIN_MIN)


def regressions(rows: Dict[str, Dict[str, Any]]) -> List[str]:
    """Each operation of the committed baseline that now costs more than its
    count plus the margin, or was not measured, said in words."""
    base: Dict[str, float] = json.loads(BASELINE.read_text()).get("instructions", {})
    out = []
    for k, b in base.items():
        if k not in rows:
            out.append(f"{k}: not measured (bench/baseline.json lists it)")
        elif rows[k]["instructions"] > allowed(b):
            locks = rows[k].get("lock_table_lines")
            why = (f"; it reads the kernel's lock table, which listed {locks} locks (the baseline was "
                   f"counted with 1: the holder's)" if locks and locks > 1 else "")
            out.append(f"{k}: {rows[k]['instructions']} instructions per operation, baseline {b:g} "
                       f"(at most {allowed(b):.0f}){why}")
    return out


def write_baseline(rows: Dict[str, Dict[str, Any]]) -> None:
    doc = json.loads(BASELINE.read_text())
    doc["instructions"] = {k: v["instructions"] for k, v in rows.items() if k.startswith(GATED)}
    doc["about_instructions"] = ("Instructions per operation under callgrind that bench/instructions.py "
                                 "--check allows (plus a tenth, at least 1,000). Change only in a commit that says why "
                                 "the count moved.")
    BASELINE.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def table(rows: Dict[str, Dict[str, Any]]) -> str:
    lines = ["| operation | instructions | lock table lines |", "|---|---:|---:|"]
    for k, v in rows.items():
        lines.append(f"| {k} | {v['instructions']:,} | {v.get('lock_table_lines', '')} |")
    return "\n".join(lines)


def main() -> int:
    return B.gate_main("instructions", "valgrind", list(TOGGLE), measure, table, write_baseline, regressions,
                       "every count within bench/baseline.json (plus a tenth, at least 1,000)",
                       "fail above the baseline plus a tenth")


if __name__ == "__main__":
    sys.exit(main())
