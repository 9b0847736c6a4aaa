"""What the platform costs, measured side by side for the Linux and the
portable build of the Python package (docs/platforms.md):

- wake latency: a waiter blocked in acquire() in this process, from the
  holder's release in another process (its CLOCK_MONOTONIC, shared by the
  machine) to the waiter's acquire returning;
- re-anchor window: the live lease file moved aside by an operator, until
  the file at the path is locked again by its holder (a contender that
  opened the new file in that window and could not tell would win it);
- idle CPU: what a holder's process spends while it holds and nothing
  happens (its watch's timer, on the portable platform).

    .venv/bin/python bench/platforms.py [--runs N]

The portable build is the one tests/portable installs into
target/portable/python; the report goes to bench/out/platforms.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv/bin/python")
BUILDS = {"linux": None, "portable": str(ROOT / "target/portable/python")}

# The measuring side: one process per build, driving holders it starts.
MEASURE = textwrap.dedent(r'''
    import fcntl, json, os, shutil, subprocess, sys, tempfile, threading, time
    import sidelease
    runs = int(sys.argv[1])
    HOLDER = """
    import resource, sys, time, sidelease
    lease = sidelease.acquire(sys.argv[1])
    print("held", flush=True)
    cmd = sys.stdin.readline().strip()
    if cmd == "idle":
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(float(sys.argv[2]))
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        print((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), flush=True)
        sys.stdin.readline()
    lease.release()
    print(time.monotonic(), flush=True)
    """
    def holder(db, *extra):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, db, *extra],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        return p
    d = tempfile.mkdtemp(prefix="sidelease-platforms-")
    db = os.path.join(d, "app.db")
    platform = sidelease.inspect(db)["platform"]["implementation"]
    wake = []
    for _ in range(runs):
        h = holder(db)
        got = {}
        def wait():
            with sidelease.acquire(db, timeout=10):
                got["t"] = time.monotonic()
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)  # the waiter is asleep by now (its back-off at its longest)
        h.stdin.write("release\n"); h.stdin.flush()
        released = float(h.stdout.readline())
        h.wait()
        t.join()
        wake.append((got["t"] - released) * 1000)
    window = []
    lp = db + ".backend-lease"
    for _ in range(runs):
        h = holder(db)
        time.sleep(0.2)
        moved = time.monotonic()
        os.rename(lp, lp + ".aside")
        while True:
            try:
                fd = os.open(lp, os.O_RDONLY | os.O_NONBLOCK)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                window.append((time.monotonic() - moved) * 1000)
                break
            finally:
                os.close(fd)
            if time.monotonic() - moved > 5:
                raise SystemExit("the holder never put the lease file back")
        h.stdin.write("release\n"); h.stdin.flush()
        h.stdout.readline(); h.wait()
        os.unlink(lp + ".aside")
    h = holder(db, "3")
    h.stdin.write("idle\n"); h.stdin.flush()
    idle = float(h.stdout.readline()) / 3.0
    h.stdin.write("done\n"); h.stdin.flush()
    h.stdout.readline(); h.wait()
    shutil.rmtree(d)
    print(json.dumps({"platform": platform, "wake_ms": wake, "window_ms": window,
                      "idle_cpu_per_s": idle}))
''')


def measure(build: str, runs: int) -> Dict[str, object]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if BUILDS[build]:
        env["PYTHONPATH"] = BUILDS[build]
    out = subprocess.run([PY, "-c", MEASURE, str(runs)], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["platform"] == build, f"{build}: the package says {r['platform']}"
    return r


def row(values: List[float]) -> str:
    v = sorted(values)
    p99 = v[min(len(v) - 1, int(len(v) * 0.99))]
    return f"{statistics.median(v):.2f} | {p99:.2f} | {v[-1]:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    results = {b: measure(b, args.runs) for b in BUILDS}
    lines = [
        "# The platforms, measured side by side (bench/platforms.py)",
        "",
        f"{args.runs} runs each, on this machine; milliseconds (median | p99 | max).",
        "",
        "| | wake: median | p99 | max | re-anchor window: median | p99 | max | idle CPU of a holder |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b, r in results.items():
        lines.append(f"| {b} | {row(r['wake_ms'])} | {row(r['window_ms'])} | "
                     f"{r['idle_cpu_per_s'] * 100:.3f}% of a core |")
    text = "\n".join(lines) + "\n"
    out = ROOT / "bench/out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "platforms.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
