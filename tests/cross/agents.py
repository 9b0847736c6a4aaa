"""Starting and driving the agents of every runtime (tests/PROTOCOL.md)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
STEP = 10.0  # seconds any single answer may take

RUNTIMES = ["rust", "c", "python", "node", "bun"]
BUN = ROOT / "bindings-node/node_modules/@oven/bun-linux-x64/bin/bun"
COMMANDS = {
    "rust": [str(ROOT / "target/release/sidelease-agent")],
    "c": [str(ROOT / "target/agents/c-agent")],
    "python": [str(ROOT / ".venv/bin/python"), str(ROOT / "tests/agents/agent.py")],
    "node": ["node", str(ROOT / "tests/agents/agent.cjs")],
    "bun": [str(BUN), str(ROOT / "tests/agents/agent.cjs")],
}
PLATFORM = "linux"
# Why a scenario may not apply to a pair, said with the totals.
NOT_APPLICABLE = "Node and Bun cannot exec or fork themselves"
# Other targets' agents, and what runs them here.
CROSS = {
    "aarch64-linux-gnu": ["qemu-aarch64-static", "-L", "/usr/aarch64-linux-gnu"],
    "x86_64-linux-musl": [],
}


def use_platform(name: str) -> None:
    """Drive the agents built on the portable platform (the core's
    `portable` feature: tests/portable builds them under target/portable):
    the Rust, C and Python agents; Node and Bun run the same core and are
    left to the Linux run."""
    global PLATFORM
    if name == "linux":
        return
    if name in CROSS:
        # The Rust and C agents built for another target (tests/cross-targets
        # builds them): arm64 under qemu-user, musl natively. qemu-user runs
        # the program in its own process (the agent's PID is the one
        # started) but cannot start another arm64 program: no exec.
        PLATFORM = name
        out = ROOT / "target/cross-agents" / name
        RUNTIMES[:] = ["rust", "c"]
        COMMANDS["rust"] = CROSS[name] + [str(out / "sidelease-agent")]
        COMMANDS["c"] = CROSS[name] + [str(out / "c-agent")]
        if CROSS[name]:
            global NOT_APPLICABLE
            NOT_APPLICABLE = "under qemu-user a program cannot exec another of its architecture"
            for r in RUNTIMES:
                CAPABILITIES[r] = CAPABILITIES[r] - {"exec"}
        return
    assert name == "portable", name
    PLATFORM = name
    out = ROOT / "target/portable"
    RUNTIMES[:] = ["rust", "c", "python"]
    COMMANDS["rust"] = [str(out / "release/sidelease-agent")]
    COMMANDS["c"] = [str(out / "agents/c-agent")]
    os.environ["PYTHONPATH"] = str(out / "python")


# What a runtime can do to itself (Node and Bun have no exec or fork).
CAPABILITIES = {
    "rust": {"exec", "fork"},
    "c": {"exec", "fork"},
    "python": {"exec", "fork"},
    "node": set(),
    "bun": set(),
}
# How each runtime names itself in the holder record.
RECORD_RUNTIME = {"rust": "rust", "c": "c", "python": "python ", "node": "node ", "bun": "bun "}


class HandshakeError(AssertionError):
    pass


class Agent:
    """`wrap`: a command the agent runs under (`unshare ...`), which must
    exec it in place (the agent's PID is the process started)."""

    def __init__(self, runtime: str, role: str = "", wrap: Optional[List[str]] = None,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.runtime = runtime
        self.role = role or runtime
        self.transcript: List[str] = []
        self.proc = subprocess.Popen(
            (wrap or []) + COMMANDS[runtime],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=dict(os.environ, **env) if env else None,
        )
        self.buf = b""
        ready = self.recv()
        if ready.get("event") != "ready":
            raise HandshakeError(f"{self.role}: no ready line\n{self.dump()}")
        self.pid: int = ready["pid"]

    def dump(self) -> str:
        return f"--- {self.role} ({self.runtime}) transcript ---\n  " + "\n  ".join(self.transcript)

    def send(self, cmd: Dict[str, Any]) -> None:
        line = json.dumps(cmd)
        self.transcript.append(f"> {line}")
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise HandshakeError(f"{self.role} is gone\n{self.dump()}") from None

    def recv(self, timeout: float = STEP) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise HandshakeError(f"{self.role}: no answer within {timeout}s\n{self.dump()}")
            chunk = os.read(fd, 65536)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise HandshakeError(f"{self.role}: exited\n{self.dump()}\nstderr: {err}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        self.transcript.append(f"< {line.decode(errors='replace')}")
        return json.loads(line)  # type: ignore[no-any-return]

    def call(self, cmd: Dict[str, Any], timeout: float = STEP) -> Dict[str, Any]:
        self.send(cmd)
        return self.recv(timeout)

    def signal(self, sig: int) -> int:
        os.kill(self.pid, sig)
        return self.wait_exit()

    def wait_exit(self) -> int:
        try:
            return self.proc.wait(STEP)
        except subprocess.TimeoutExpired:
            raise HandshakeError(f"{self.role} did not exit\n{self.dump()}") from None

    def has_open(self, path: str) -> bool:
        try:
            fds = os.listdir(f"/proc/{self.pid}/fd")
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink(f"/proc/{self.pid}/fd/{fd}") == path:
                    return True
            except OSError:
                pass
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STEP)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def kill_pid(pid: Optional[int]) -> None:
    """End a process this run started (an agent's forked child), by PID."""
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
