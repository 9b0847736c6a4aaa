"""A Python campaigner for bench.py's failover: FORM is "elector" (the
thread form of sidelease.Elector) or "acquire" (a plain waiter,
acquire(timeout=None)); on leading it writes "PID PID" to FIFO (one short
write), then holds until killed."""

import os
import sys
import time

import sidelease

form, target, fifo = sys.argv[1:4]


def started() -> None:
    fd = os.open(fifo, os.O_WRONLY)
    os.write(fd, f"{os.getpid()} {os.getpid()}\n".encode())
    os.close(fd)


if form == "elector":
    def work(term: sidelease.Term) -> None:
        started()
        term.wait()

    sidelease.Elector(target).run(work)
else:
    lease = sidelease.acquire(target, timeout=None)
    started()
    while True:
        time.sleep(3600)
