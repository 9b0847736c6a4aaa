"""What bench.py and syscalls.py share: where the measured programs are,
how to run them, and the processes that hold and wait."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
OUT = BENCH / "out"
PY = str(ROOT / ".venv/bin/python")
BUN = str(ROOT / "bindings-node/node_modules/@oven/bun-linux-x64/bin/bun")
RUST = str(ROOT / "target/release/sidelease-bench")
AGENT = str(ROOT / "target/release/sidelease-agent")
CAPI = str(OUT / "capi")
FLOOR = str(OUT / "floor")

LANG_CMD = {
    "rust": [RUST],
    "c-abi": [CAPI],
    "python": [PY, str(BENCH / "py/measure.py")],
    "node": ["node", str(BENCH / "js/measure.cjs")],
    "bun": [BUN, str(BENCH / "js/measure.cjs")],
}


def run_json(cmd: List[str], timeout: float = 600) -> Any:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout).stdout
    return json.loads(out.strip().splitlines()[-1])


def us(ns: float) -> float:
    return ns / 1000.0


class Holder:
    """A Rust agent holding `target` in another process."""

    def __init__(self, target: str) -> None:
        self.p = subprocess.Popen([AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.p.stdout and self.p.stdin
        self.p.stdout.readline()
        self.p.stdin.write(json.dumps({"cmd": "acquire", "target": target}) + "\n")
        self.p.stdin.flush()
        assert json.loads(self.p.stdout.readline())["ok"]

    def kill(self) -> None:
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()

    def close(self) -> None:
        if self.p.poll() is None:
            self.kill()
        for f in (self.p.stdin, self.p.stdout):
            if f:
                f.close()


class Waiter:
    def __init__(self, cmd: List[str]) -> None:
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def send(self, s: str) -> None:
        assert self.p.stdin
        self.p.stdin.write(s + "\n")
        self.p.stdin.flush()

    def recv(self) -> str:
        assert self.p.stdout
        return self.p.stdout.readline().strip()

    def cpu_ns(self) -> int:
        with open(f"/proc/{self.p.pid}/schedstat") as f:
            return int(f.read().split()[0])

    def close(self) -> None:
        try:
            self.send("quit")
            self.p.wait(5)
        except Exception:
            self.p.kill()
            self.p.wait()


def hold_release(kind: str, path: str) -> Tuple[Callable[[], None], Callable[[], None]]:
    """How the driver holds and releases what each waiter waits for."""
    import sidelease

    state: Dict[str, Any] = {}
    if kind == "sidelease":
        def hold() -> None:
            state["l"] = sidelease.acquire(path, timeout=30)

        def release() -> None:
            state["l"].release()
    elif kind == "flock":
        def hold() -> None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            state["fd"] = fd

        def release() -> None:
            os.close(state["fd"])
    else:  # proper-lockfile's lock directory
        def hold() -> None:
            while True:
                try:
                    os.mkdir(path + ".lock")
                    return
                except FileExistsError:
                    time.sleep(0.001)

        def release() -> None:
            os.rmdir(path + ".lock")
    return hold, release


Rows = Dict[str, Dict[str, Any]]


def gate_main(name: str, tool: str, executables: List[str], measure: Callable[[bool], Rows],
              table: Callable[[Rows], str], write_baseline: Callable[[Rows], None],
              failures: Callable[[Rows], List[str]], passed: str, check_help: str) -> int:
    """The command line of a count gate (bench/syscalls.py,
    bench/instructions.py): measure, print the table, and --json,
    --write-baseline and --check (exit 1 on a failure, said in words)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true", help=check_help)
    ap.add_argument("--json", help="write the counts here")
    ap.add_argument("--write-baseline", action="store_true", help="write the counts to bench/baseline.json")
    args = ap.parse_args()
    if not shutil.which(tool):
        print(f"{name}: {tool} is not installed", file=sys.stderr)
        return 2
    for exe in executables:
        if not os.access(exe, os.X_OK):
            print(f"{name}: {exe} is not built (bash bench/run builds it)", file=sys.stderr)
            return 2
    rows = measure(args.quick)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.write_baseline:
        write_baseline(rows)
        print(f"{name}: wrote bench/baseline.json")
    if args.check:
        bad = failures(rows)
        for line in bad:
            print(f"{name}: {line}", file=sys.stderr)
        if bad:
            return 1
        print(f"{name}: {passed}")
    return 0
