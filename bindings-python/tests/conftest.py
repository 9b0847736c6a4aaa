"""Helpers: another real Python process that holds a lease on command."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import uuid
from typing import Any, Dict, Iterator, List

import pytest

STEP = 10.0  # seconds any handshake may take before the test fails loudly

HOLDER = textwrap.dedent(
    """
    import json, sys, sidelease
    lease = sidelease.acquire(sys.argv[1], metadata={"role": "holder"})
    print(json.dumps({"event": "ready", "record": lease.record}), flush=True)
    for line in sys.stdin:
        if line.strip() == "release":
            lease.release()
            print(json.dumps({"event": "released"}), flush=True)
    """
)


# A rival that is no sidelease holder: it locks a new file (argv[1]) and
# renames it over a lease file (argv[2]), says "renamed", and holds it until
# its stdin has a line.
RIVAL = """
import fcntl, os, sys
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
os.rename(sys.argv[1], sys.argv[2])
print("renamed", flush=True)
sys.stdin.readline()
"""


class Holder:
    """A holder process; `release()` and `kill()` by its PID only."""

    def __init__(self, target: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.transcript: List[str] = []
        ready = self.recv()
        assert ready["event"] == "ready", self.transcript
        self.record: Dict[str, Any] = ready["record"]
        self.pid = self.proc.pid

    def recv(self) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], STEP)
        assert r, f"holder {self.proc.pid} did not answer: {self.transcript}"
        line = self.proc.stdout.readline()
        assert line, f"holder {self.proc.pid} exited: {self.transcript}"
        self.transcript.append(line)
        return json.loads(line)

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()
        assert self.recv()["event"] == "released"

    def kill(self, sig: int = 9) -> None:
        os.kill(self.proc.pid, sig)
        self.proc.wait(STEP)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STEP)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def db(tmp_path: Any) -> str:
    return str(tmp_path / "app.db")


@pytest.fixture
def holder(db: str) -> Iterator[Holder]:
    h = Holder(db)
    try:
        yield h
    finally:
        h.close()


def pg_url(prefix: str = "py") -> str:
    """A PostgreSQL lease URL of its own on the cluster tests/run starts."""
    base = os.environ.get("SIDELEASE_TEST_PG")
    if not base:
        pytest.fail("SIDELEASE_TEST_PG is not set: eval \"$(bash tests/pg/cluster start)\" (tests/run does)")
    return f"{base}?lease={prefix}-{uuid.uuid4().hex[:12]}"


def lease_name(url: str) -> str:
    return url.rsplit("lease=", 1)[1].split("&", 1)[0]


def holder_backends(url: str) -> str:
    """SQL for the backend PIDs holding the lease `url`'s advisory lock,
    whichever session carries it (the process's shared one or its own):
    the key as the library computes it, from the name."""
    name = lease_name(url).replace("'", "''")
    key = ("('x' || left(encode(sha256('\\x736964656c65617365206c6561736500'::bytea || "
           f"convert_to('{name}', 'UTF8')), 'hex'), 16))::bit(64)::bigint")
    return ("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
            f"AND classid = (({key} >> 32) & 4294967295)::oid AND objid = ({key} & 4294967295)::oid")


def terminate_holder(url: str) -> int:
    """pg_terminate_backend of the session holding the lease `url`: how many."""
    return int(psql(f"SELECT count(pg_terminate_backend(pid)) FROM ({holder_backends(url)}) h"))


def psql(sql: str) -> str:
    """One statement as the superuser, its output."""
    cmd = [os.path.join(os.environ["SIDELEASE_TEST_PG_BIN"], "psql"), "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
           "-h", os.environ["SIDELEASE_TEST_PG_DIR"], "-p", os.environ["SIDELEASE_TEST_PG_PORT"], "-U", "postgres",
           "-d", "app", "-c", sql]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
