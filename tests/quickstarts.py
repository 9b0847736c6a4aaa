"""README.md's quickstarts, run as a user pastes them (tests/run).

Each block under README's "## Quickstart" is taken from README.md as it is
and run in a directory of its own, with the names a user supplies
(`recover`, `serve`, `./migrate`, a PostgreSQL server) filled in, and what
its comments and the text around it claim is checked: a first run recovers
nothing, a run after a SIGKILLed holder recovers, a second instance is
refused naming the holder, the CLI's exit codes. A quickstart without a
check here fails the run, and so does a block that no longer does what its
text says. The Rust block is compiled and run by core/tests/quickstart.rs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv/bin/python")
BUN = str(ROOT / "bindings-node/node_modules/@oven/bun-linux-x64/bin/bun")
CLI = str(ROOT / "target/release/sidelease")
STEP = 20.0  # seconds any one command may take
STARTED: List[subprocess.Popen] = []  # ended by main, whatever the outcome


def quickstarts() -> Dict[str, Tuple[str, str]]:
    """README's quickstarts: title -> (language, the first block's text)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for part in section.split("\n### ")[1:]:
        title, body = part.split("\n", 1)
        m = re.search(r"```(\w+)\n(.*?)```", body, re.S)
        assert m, f"README quickstart {title!r} has no code block"
        out[title.strip()] = (m.group(1), m.group(2))
    return out


def run(cmd: List[str], cwd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=STEP, **kw)


class Serving:
    """A process running a quickstart that reached `serve()`: it prints
    `serving` and waits for a line on its stdin."""

    def __init__(self, cmd: List[str], cwd: str, env: Optional[Dict[str, str]] = None):
        self.p = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        STARTED.append(self.p)
        self.lines: List[str] = []
        deadline = time.monotonic() + STEP
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if not line:
                raise AssertionError(f"{cmd} ended before serving: {self.p.wait()} {self.p.stderr.read()}")
            self.lines.append(line.strip())
            if line.strip() == "serving":
                return
        raise AssertionError(f"{cmd} did not serve within {STEP}s")

    def finish(self) -> int:
        out, err = self.p.communicate("\n", timeout=STEP)
        assert self.p.returncode == 0, f"exit {self.p.returncode}: {err}"
        return self.p.returncode

    def kill(self) -> None:
        self.p.kill()
        self.p.communicate(timeout=STEP)


def crash_a_holder(d: str) -> None:
    """A holder SIGKILLed while it holds app.db's lease (no release)."""
    code = "import sidelease, sys\nl = sidelease.acquire('app.db')\nprint('serving', flush=True)\nsys.stdin.readline()\n"
    Serving([PYTHON, "-c", code], d).kill()


def inspect_from_elsewhere(d: str) -> dict:
    r = run([PYTHON, "-c", "import json, sidelease; print(json.dumps(sidelease.inspect('app.db')))"], d)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def check_python(block: str, d: str) -> str:
    prog = Path(d, "quick.py")
    prog.write_text(
        "import sys\n"
        "def recover(): print('recover', flush=True)\n"
        "def serve(): print('serving', flush=True); sys.stdin.readline()\n" + block)
    cmd = [PYTHON, str(prog)]
    first = Serving(cmd, d)
    assert first.lines == ["serving"], f"a lease never held before was recovered: {first.lines}"
    info = inspect_from_elsewhere(d)
    # README: {"state": "held", "holders": [4242], "record_status": "live", ...}
    assert info["state"] == "held" and info["holders"] == [first.p.pid], info
    assert info["record_status"] == "live", info
    assert info["record"]["metadata"] == {"app": "api"}, info
    # A second instance waits its 2 s, then LeaseTimeout naming the holder.
    t = time.monotonic()
    second = run(cmd, d)
    took = time.monotonic() - t
    assert second.returncode != 0 and "sidelease._errors.LeaseTimeout" in second.stderr, second
    assert str(first.p.pid) in second.stderr, second.stderr
    assert 1.9 <= took < 10, f"timeout=2 gave up after {took:.2f}s"
    first.finish()
    crash_a_holder(d)
    after = Serving(cmd, d)
    assert after.lines == ["recover", "serving"], f"a crashed holder's lease was not recovered: {after.lines}"
    after.finish()
    again = Serving(cmd, d)
    assert again.lines == ["serving"], f"a clean release was recovered: {again.lines}"
    again.finish()
    return "first run, refused second instance (2 s), after a SIGKILLed holder, after a release"


def check_js(block: str, d: str) -> str:
    os.makedirs(Path(d, "node_modules"))
    os.symlink(ROOT / "bindings-node", Path(d, "node_modules/sidelease"))
    prog = Path(d, "quick.cjs")
    # The block's `await` needs an async function around it, as in a
    # CommonJS module it would have.
    prog.write_text(
        "const recover = () => console.log('recover');\n"
        "(async () => {\n" + block +
        "console.log('waited', l2.generation > lease.generation);\n"
        "l2.release();\n"
        "})().catch((e) => { console.error(e); process.exit(1); });\n")
    done = []
    for runtime in (["node"], [BUN]):
        crash_a_holder(d)  # not the first run: recovers
        r = run(runtime + [str(prog)], d)
        assert r.returncode == 0 and r.stdout.split() == ["recover", "waited", "true"], (runtime, r)
        r = run(runtime + [str(prog)], d)  # after a release: nothing to recover
        assert r.returncode == 0 and r.stdout.split() == ["waited", "true"], (runtime, r)
        done.append(Path(runtime[0]).name)
    fresh = tempfile.mkdtemp(dir=d)
    os.symlink(Path(d, "node_modules"), Path(fresh, "node_modules"))
    r = run(["node", str(prog)], fresh)
    assert r.returncode == 0 and r.stdout.split() == ["waited", "true"], ("never held", r)
    # Held elsewhere: the 2000 ms timeout ends in SIDELEASE_TIMEOUT naming it.
    holder = Serving([PYTHON, "-c", "import sidelease, sys\nl = sidelease.acquire('app.db')\n"
                      "print('serving', flush=True)\nsys.stdin.readline()\n"], d)
    t = time.monotonic()
    r = run(["node", str(prog)], d)
    took = time.monotonic() - t
    holder.finish()
    assert r.returncode == 1 and "code: 'SIDELEASE_TIMEOUT'" in r.stderr, r
    assert f"leased by pid {holder.p.pid}" in r.stderr, r.stderr
    assert 1.9 <= took < 10, f"timeout 2000 gave up after {took:.2f}s"
    return f"{' and '.join(done)}: after a SIGKILLed holder, after a release, never held; refused after 2 s"


def check_c(block: str, d: str) -> str:
    prefix = Path(d, "prefix")
    subprocess.run(["make", "-s", "-C", str(ROOT / "bindings-c"), "install", f"PREFIX={prefix}"],
                   check=True, stdout=subprocess.DEVNULL)
    Path(d, "prog.c").write_text(block)
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib/pkgconfig")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "sidelease"], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    # README: cc prog.c $(pkg-config --cflags --libs sidelease) and an -Wl,-rpath
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "prog.c", *flags,
                    f"-Wl,-rpath,{prefix}/lib", "-o", "prog"], cwd=d, check=True)
    r = run(["./prog"], d)
    assert r.returncode == 0, r
    holder = Serving([PYTHON, "-c", "import sidelease, sys\nl = sidelease.acquire('app.db')\n"
                      "print('serving', flush=True)\nsys.stdin.readline()\n"], d)
    r = run(["./prog"], d)
    holder.finish()
    assert r.returncode == 75 and f"pid {holder.p.pid}" in r.stderr, r
    return "built through pkg-config, free: 0, held: 75 naming the holder"


def check_cli(block: str, d: str) -> str:
    lines = [ln.split("#", 1)[0].strip() for ln in block.splitlines()]
    lines = [ln for ln in lines if ln]
    assert [ln.split()[:2] for ln in lines] == [["sidelease", "status"], ["sidelease", "hold"],
                                                 ["sidelease", "lead"], ["sidelease", "hold"]], lines
    status, hold, lead, hold_pg = lines
    assert status == "sidelease status app.db [--json]", status
    codes = dict((int(c), w) for c, w in re.findall(r"(\d+) ([a-z][a-z ]*?)(?:,|$)", block.splitlines()[0].split("#", 1)[1]))

    def cli(cmdline: str, cwd: str = d, **kw) -> subprocess.CompletedProcess:
        argv = cmdline.split()
        argv[0] = CLI
        return run(argv, cwd, **kw)

    empty = tempfile.mkdtemp(dir=d)
    assert codes[66].startswith("no such file"), codes
    assert cli("sidelease status app.db", empty).returncode == 66
    Path(d, "app.db").touch()
    r = cli("sidelease status app.db")
    assert r.returncode == 0 and codes[0] == "free", (r, codes)
    r = cli("sidelease status app.db --json")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "free", r
    for name, body in (("migrate", "echo migrated > migrated\n"),
                       ("run-scheduler", "echo led > led\nexec sleep 60\n")):
        Path(d, name).write_text("#!/bin/sh\n" + body)
        os.chmod(Path(d, name), 0o755)
    r = cli(hold)
    assert r.returncode == 0 and Path(d, "migrated").read_text() == "migrated\n", r
    holder = Serving([PYTHON, "-c", "import sidelease, sys\nl = sidelease.acquire('app.db')\n"
                      "print('serving', flush=True)\nsys.stdin.readline()\n"], d)
    r = cli("sidelease status app.db")
    assert r.returncode == 3 and codes[3] == "held", (r, codes)
    r = cli(hold)
    assert r.returncode == 75, r  # held elsewhere: exits 75
    holder.finish()
    # lead: the instance elected runs the command; SIGTERM goes to it.
    argv = lead.split()
    argv[0] = CLI
    p = subprocess.Popen(argv, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    STARTED.append(p)
    try:
        deadline = time.monotonic() + STEP
        while not Path(d, "led").exists():
            assert time.monotonic() < deadline and p.poll() is None, "lead never ran the command"
            time.sleep(0.02)
        assert cli("sidelease status app.db").returncode == 3
        p.send_signal(signal.SIGTERM)
        rc = p.wait(STEP)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == 128 + signal.SIGTERM, (rc, p.stderr.read())
    # Across hosts: README's URL, pointed at the test server.
    url = re.search(r"'(postgresql://[^']*)'", hold_pg).group(1)
    assert url == "postgresql://app@db-1/app?lease=scheduler", url
    base = os.environ["SIDELEASE_TEST_PG"]  # postgresql://app:SECRET@127.0.0.1:PORT/app
    m = re.fullmatch(r"postgresql://(\w+):([^@]+)@([^/]+)/(\w+)", base)
    assert m, "SIDELEASE_TEST_PG"
    here = url.replace("app@db-1/app", f"{m.group(1)}@{m.group(3)}/{m.group(4)}")
    env = {**os.environ, "PGPASSWORD": m.group(2)}
    r = run([CLI, "hold", here, "--", "./migrate"], d, env=env)
    assert r.returncode == 0, r
    blocker = Serving([PYTHON, "-c", f"import sidelease, sys\nl = sidelease.acquire({here!r})\n"
                       "print('serving', flush=True)\nsys.stdin.readline()\n"], d, env)
    r = run([CLI, "hold", here, "--", "./migrate"], d, env=env)
    blocker.finish()
    assert r.returncode == 75, r
    return "status 66/0/3 and --json, hold 0/75, lead runs and passes SIGTERM, hold over PostgreSQL 0/75"


CHECKS: Dict[str, Tuple[str, Callable[[str, str], str]]] = {
    "Python": ("python", check_python),
    "Node and Bun": ("js", check_js),
    "C": ("c", check_c),
    "Command line": ("sh", check_cli),
    "Rust": ("rust", lambda block, d: "by core/tests/quickstart.rs (cargo test)"),
}


def main() -> int:
    found = quickstarts()
    assert set(found) == set(CHECKS), f"README quickstarts {sorted(found)} vs checks {sorted(CHECKS)}"
    try:
        for title, (lang, check) in CHECKS.items():
            got_lang, block = found[title]
            assert got_lang == lang, f"{title}: a {got_lang} block, expected {lang}"
            with tempfile.TemporaryDirectory(prefix="sidelease-quickstart-") as d:
                t = time.monotonic()
                try:
                    print(f"quickstart {title}: ok ({check(block, d)}) in {time.monotonic() - t:.1f}s",
                          flush=True)
                finally:
                    end_started()
    finally:
        end_started()
    return 0


def end_started() -> None:
    """Every process this run started and did not see end: SIGKILLed."""
    for p in STARTED:
        if p.poll() is None:
            p.kill()
            p.wait()
    STARTED.clear()


if __name__ == "__main__":
    sys.exit(main())
