"""A /proc without its table of locks, by experiment: the agent runs in a
mount namespace of its own where /proc/locks is unreadable (a file of mode
000 bound over it, and the agent without the capabilities that read it
anyway) or empty (/dev/null bound over it: a table that lists nothing, as a
sandbox's may). The Linux implementation must fall back to asking the lock
itself, say so in inspect ("platform"), and never answer "free" while the
lease is held."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Dict, List

from agents import RUNTIMES, Agent

ROOT_USER = os.geteuid() == 0


def _without_lock_table(source: str) -> List[str]:
    """Run the agent (exec'd in place: its PID is the one started) with
    `source` bound over /proc/locks, and no capabilities."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind {source} /proc/locks && '
            'exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- "$@"', "sh"]


def _inspect(a: Agent, db: str) -> Dict:
    r = a.call({"cmd": "inspect", "target": db})
    assert r.get("ok"), f"{a.role}: inspect failed: {r}"
    return r["inspect"]


def lock_table_missing(soak: bool) -> str:
    if not ROOT_USER or subprocess.run(["unshare", "--mount", "true"]).returncode:
        return "skipped: mount namespaces are not available here"
    if shutil.which("setpriv") is None:
        return "skipped: setpriv (util-linux) is not installed"
    d = tempfile.mkdtemp(prefix="sidelease-nolocks-")
    unreadable = os.path.join(d, "locks-unreadable")
    open(unreadable, "w").close()
    os.chmod(unreadable, 0)
    seen: List[str] = []
    try:
        for kind, source in (("unreadable", unreadable), ("empty", "/dev/null")):
            for rt in RUNTIMES:
                db = os.path.join(d, f"{kind}-{rt}.db")
                blind = Agent(rt, f"{kind}-{rt}", wrap=_without_lock_table(source))
                holder = Agent("rust", "holder")
                try:
                    i = _inspect(blind, db)
                    assert i["state"] == "free", f"{kind}/{rt}: no file yet: {i}"
                    assert holder.call({"cmd": "acquire", "target": db}).get("ok")
                    # Held by another process: the blind one must not say free.
                    i = _inspect(blind, db)
                    assert i["state"] == "held", f"{kind}/{rt}: held, and it says {i['state']}: {i}"
                    assert i["holders"] == [], f"{kind}/{rt}: it cannot name holders: {i}"
                    assert "lock-table" in i["platform"]["unavailable"], f"{kind}/{rt}: {i}"
                    r = blind.call({"cmd": "acquire", "target": db})
                    assert not r.get("ok") and r["error"]["kind"] == "in_use", f"{kind}/{rt}: {r}"
                    assert r["error"]["holder"]["pid"] == holder.pid, f"{kind}/{rt}: the record names it: {r}"
                    assert holder.call({"cmd": "release", "handle": 1}).get("ok")
                    i = _inspect(blind, db)
                    assert i["state"] == "free", f"{kind}/{rt}: released, and it says {i['state']}: {i}"
                    got = blind.call({"cmd": "acquire", "target": db})
                    assert got.get("ok"), f"{kind}/{rt}: {got}"
                    i = _inspect(blind, db)
                    assert i["state"] == "held" and i["record_status"] == "self", f"{kind}/{rt}: {i}"
                    r = holder.call({"cmd": "acquire", "target": db})
                    assert not r.get("ok") and r["error"]["kind"] == "in_use", f"{kind}/{rt}: {r}"
                    seen.append(f"{kind}/{rt}")
                finally:
                    blind.close()
                    holder.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return f"held, free and self told without the lock table ({', '.join(seen)})"


CHECKS = [
    ("lock table missing", lock_table_missing),
]
