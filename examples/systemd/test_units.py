"""The systemd units of docs/howto/systemd.md: checked by `systemd-analyze
verify`, then run as systemd runs them. Each unit's ExecStart runs as
written, its paths moved into a temporary directory; `systemctl stop` is
what KillMode=mixed makes it (SIGTERM to the main process alone, within
TimeoutStopSec); an exit status is a clean stop when SuccessExitStatus
says so. Needs the CLI's release build (tests/run builds it first).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Set

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLI = ROOT / "target/release/sidelease"
UNITS = ["app-backend.service", "app-scheduler.service"]


def moved(name: str, d: Path) -> Path:
    """The unit, its paths moved under `d`; the commands it runs are shell
    scripts that note their PID in `d/started` and sleep."""
    text = (HERE / name).read_text()
    for old, new in (("/usr/local/bin/sidelease", str(CLI)), ("/var/lib/app/", f"{d}/"),
                     ("/usr/local/bin/", f"{d}/")):
        text = text.replace(old, new)
    for cmd in ("app-server", "run-scheduler"):
        script = d / cmd
        script.write_text(f"#!/bin/sh\necho $$ >> '{d}/started'\nexec sleep 600\n")
        script.chmod(0o755)
    path = d / name
    path.write_text(text)
    return path


def service(path: Path) -> Dict[str, str]:
    keys: Dict[str, str] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            k, v = line.split("=", 1)
            keys[k] = v
    return keys


def seconds(v: str) -> float:
    assert v.endswith("s"), v
    return float(v[:-1])


def started(d: Path) -> List[int]:
    f = d / "started"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def until(what, limit: float, why: str) -> None:
    deadline = time.monotonic() + limit
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


class Instance:
    """One instance of the unit, as systemd would start it."""

    def __init__(self, argv: List[str], d: Path):
        self.p = subprocess.Popen(argv, cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)

    def stop(self, keys: Dict[str, str]) -> int:
        """systemctl stop with KillMode=mixed: SIGTERM to the main process."""
        assert keys["KillMode"] == "mixed"
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(seconds(keys["TimeoutStopSec"]))

    def end(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.communicate()


@pytest.fixture
def instances(tmp_path: Path):
    made: List[Instance] = []
    yield made
    # The commands first: one that outlived its instance holds the lease
    # (and the instance's stderr) by the descriptor it inherited.
    for pid in started(tmp_path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for i in made:
        i.end()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of a process that is not ours would read as alive; these are
    # the children of hold/lead, which reap them.
    return True


@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify_says_nothing(tmp_path: Path, name: str) -> None:
    unit = moved(name, tmp_path)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r


@pytest.mark.parametrize("name", UNITS)
def test_one_instance_runs_a_stop_is_clean_and_another_takes_over(
        tmp_path: Path, name: str, instances: List[Instance]) -> None:
    keys = service(moved(name, tmp_path))
    argv = shlex.split(keys["ExecStart"])
    # Clean to systemd: exit 0, what SuccessExitStatus adds, and an end by
    # SIGHUP, SIGINT, SIGTERM or SIGPIPE (systemd.service(5)).
    clean: Set[int] = {0} | {int(s) for s in keys["SuccessExitStatus"].split()} | {
        -signal.SIGHUP, -signal.SIGINT, -signal.SIGTERM, -signal.SIGPIPE}

    def start() -> Instance:
        i = Instance(argv, tmp_path)
        instances.append(i)
        return i

    first = start()
    until(lambda: len(started(tmp_path)) == 1, 10, "the first instance never ran its command")
    second = start()
    time.sleep(0.5)
    assert second.p.poll() is None and len(started(tmp_path)) == 1, "two instances ran the command"

    # A stop of the waiting (or campaigning) instance: clean and at once.
    t = time.monotonic()
    rc = second.stop(keys)
    assert rc in clean and time.monotonic() - t < 2, (rc, second.p.communicate()[1])
    second = start()
    time.sleep(0.3)

    # A stop of the running one: its command ends, the stop is clean, and
    # the other instance runs the command.
    command = started(tmp_path)[0]
    rc = first.stop(keys)
    assert rc in clean, (rc, first.p.communicate()[1])
    assert not alive(command), "the command outlived its stopped unit"
    until(lambda: len(started(tmp_path)) == 2, 10, "no other instance took over")
    rc = second.stop(keys)
    assert rc in clean, rc
    assert not any(alive(p) for p in started(tmp_path))
