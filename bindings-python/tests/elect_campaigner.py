"""A campaigner process for test_elect.py: campaigns for TARGET with the
form named (sync: Elector.run; lead: sidelease.lead; leadership: async with
in a loop) and, while leading, holds an exclusive flock on DETECTOR: a
second leader at the same moment fails to take it and logs "overlap". One
line per event goes to LOG (O_APPEND, so lines of several processes never
mix)."""

import asyncio
import fcntl
import os
import sys

import sidelease

form, target, detector, log = sys.argv[1:5]


def note(*words: object) -> None:
    line = " ".join([str(os.getpid()), *map(str, words)]) + "\n"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, line.encode())
    os.close(fd)


def event(kind: str, info: object) -> None:
    # Campaigning, and another holds the lease: ready to succeed it.
    if kind == "waiting":
        note("waiting")


def begin() -> int:
    fd = os.open(detector, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        note("overlap")
    note("leading")
    return fd


def end(fd: int, why: str) -> None:
    os.close(fd)  # unlocks the detector before the lease is released
    note("cancelled", why)


if form == "sync":

    def work(term: sidelease.Term) -> None:
        fd = begin()
        term.wait()
        why = term.cancelled
        end(fd, why[0] if why else "?")

    sidelease.Elector(target, on_event=event).run(work)
elif form == "lead":

    async def lead_work(lease: sidelease.Lease) -> None:
        fd = begin()
        try:
            await asyncio.Event().wait()
        finally:
            end(fd, "lost" if lease.lost else "stopped")

    asyncio.run(sidelease.lead(target, lead_work, on_event=event))
elif form == "leadership":

    async def main() -> None:
        while True:
            try:
                async with sidelease.leadership(target, on_event=event):
                    fd = begin()
                    try:
                        await asyncio.Event().wait()
                    finally:
                        end(fd, "lost")
            except sidelease.LeaseLost as e:
                note("raised LeaseLost", e.reason.split(":")[0])

    asyncio.run(main())
else:
    sys.exit(f"unknown form {form!r}")
