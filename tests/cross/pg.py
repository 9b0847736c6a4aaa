"""The PostgreSQL side of the cross-language suite: lease URLs on the
throwaway cluster tests/run started (SIDELEASE_TEST_PG*), and psql as the
server's superuser for what a test does to the server."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

SECRETS = ("app-secret", "WRONGPW", "S3KRTw", "HUNTER2")


def base() -> str:
    url = os.environ.get("SIDELEASE_TEST_PG")
    if not url:
        raise RuntimeError("SIDELEASE_TEST_PG is not set: run eval \"$(bash tests/pg/cluster start)\" first "
                           "(tests/run does)")
    return url


def lease_url(tag: str, via: "tuple[str, str] | None" = None) -> str:
    """A new lease name on the server, or on `via` (a base URL and the
    parameters after the lease name) when given."""
    b, params = via if via else (base(), "")
    return f"{b}?lease=cross-{tag}-{uuid.uuid4().hex[:8]}{params}"


def shown(url: str) -> str:
    return url.replace(":app-secret@", ":***@")


def wrong_password(url: str) -> str:
    return url.replace(":app-secret@", ":WRONGPW@")


def psql(sql: str) -> str:
    return psql_db("app", sql)


def psql_db(db: str, sql: str) -> str:
    cmd = [os.path.join(os.environ["SIDELEASE_TEST_PG_BIN"], "psql"), "-X", "-q", "-t", "-A",
           "-v", "ON_ERROR_STOP=1", "-h", os.environ["SIDELEASE_TEST_PG_DIR"],
           "-p", os.environ["SIDELEASE_TEST_PG_PORT"], "-U", "postgres", "-d", db, "-c", sql]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def wait_blocked(pids: "list[int]", within: float = 10.0) -> None:
    """Until a session of one of the client processes `pids` waits for an
    advisory lock."""
    names = " OR ".join(f"a.application_name LIKE 'sidelease {int(p)}@%'" for p in pids) or "false"
    deadline = time.monotonic() + within
    while psql("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
               f"WHERE l.locktype = 'advisory' AND NOT l.granted AND ({names})") == "0":
        if time.monotonic() > deadline:
            raise AssertionError("nobody ever waited for the advisory lock")
        time.sleep(0.02)


def terminate(pid: int) -> int:
    """pg_terminate_backend on every lease session (not a waiter's) of the
    client process `pid`; how many."""
    return int(psql(
        "SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a "
        f"WHERE a.application_name LIKE 'sidelease {pid}@%' "
        "AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted)"))
