"""sidelease: one exclusive lease per database on a machine.

>>> import sidelease
>>> with sidelease.acquire("app.db") as lease:
...     if not lease.previous_released_cleanly:
...         pass  # the previous holder died holding the lease: recover

The lease is an exclusive flock on ``app.db.backend-lease``, shared by every
handle of this process and judged from the kernel. The same core serves C,
Node and Bun, so all of them contend correctly with each other.
"""

from __future__ import annotations

import asyncio
import collections
import inspect as _inspect
import os
import sys
import time
import weakref
from typing import Any, Callable, Coroutine, Deque, Dict, Generator, Optional, Tuple, Union

from . import _native
from ._errors import (
    InvalidArgument,
    LeaseCancelled,
    LeaseError,
    LeaseInUse,
    LeaseLost,
    LeaseOSError,
    LeaseTimeout,
    UnsupportedFilesystem,
)
from ._elect import Elector, lead, leadership
from ._native import CancelToken, Lease, Term, acquire, inspect

#: The version of sidelease: the Rust core's, which the native module was built from.
__version__: str = _native.__version__

__all__ = [
    "CancelToken",
    "Elector",
    "InvalidArgument",
    "Lease",
    "LeaseCancelled",
    "LeaseError",
    "LeaseInUse",
    "LeaseLost",
    "LeaseOSError",
    "LeaseTimeout",
    "Term",
    "UnsupportedFilesystem",
    "__version__",
    "acquire",
    "acquire_async",
    "inspect",
    "lead",
    "leadership",
]


class _Acquiring(Coroutine[Any, Any, Lease]):
    """What :func:`acquire_async` returns: a coroutine to await for the
    lease, or to enter with ``async with`` (``filelock``'s ``async with
    AsyncFileLock(...)``), which releases it on the way out. A coroutine
    still, so ``asyncio.create_task`` and ``wait_for`` take it as before."""

    def __init__(self, coro: Coroutine[Any, Any, Lease]) -> None:
        self._coro = coro
        self._lease: Optional[Lease] = None
        # Instance attributes: a class's own __name__ is its type's.
        self.__name__ = self.__qualname__ = "acquire_async"

    def __await__(self) -> Generator[Any, None, Lease]:
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, *args: Any) -> Any:
        return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    # What asyncio and debuggers read off a coroutine (a task's repr and
    # stack): the coroutine's own.
    @property
    def cr_frame(self) -> Any:
        return getattr(self._coro, "cr_frame", None)

    @property
    def cr_await(self) -> Any:
        return getattr(self._coro, "cr_await", None)

    @property
    def cr_running(self) -> bool:
        return bool(getattr(self._coro, "cr_running", False))

    @property
    def cr_code(self) -> Any:
        return getattr(self._coro, "cr_code", None)

    async def __aenter__(self) -> Lease:
        self._lease = await self._coro
        return self._lease

    async def __aexit__(self, *exc: Any) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()


def acquire_async(
    target: Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"],
    *,
    timeout: Optional[float] = 0,
    suffix: str = ".backend-lease",
    metadata: Optional[Dict[str, Any]] = None,
    allow_unsupported_fs: bool = False,
    split_guard: bool = True,
    watch: bool = True,
    on_waiting: Optional[Callable[[Dict[str, Any]], Any]] = None,
) -> _Acquiring:
    """Acquire like :func:`acquire`, waiting without blocking the event loop.

    The wait needs no thread: the loop watches the kernel's notification
    descriptor for the lease file. Cancelling the task cancels the wait and
    leaves nothing held. ``on_waiting(info)`` is called on the loop, as with
    :func:`acquire`. Await it (``lease = await acquire_async(db)``) or enter
    it (``async with acquire_async(db) as lease:``, released on the way out).
    """
    options = dict(
        timeout=timeout,
        suffix=suffix,
        metadata=metadata,
        allow_unsupported_fs=allow_unsupported_fs,
        split_guard=split_guard,
        watch=watch,
    )
    return _Acquiring(_acquire_async(target, on_waiting, options))


async def _acquire_async(
    target: Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"],
    on_waiting: Optional[Callable[[Dict[str, Any]], Any]],
    options: Dict[str, Any],
) -> Lease:
    if on_waiting is not None and not callable(on_waiting):
        raise TypeError(f"on_waiting: must be callable or None, not {type(on_waiting).__name__}")
    timeout = options["timeout"]
    pending = _native.Pending(target, **options)
    loop = asyncio.get_running_loop()
    try:
        await _turn(loop)
        while True:
            lease = pending.try_acquire()
            if lease is not None:
                return lease
            pending.tell_waiting(on_waiting)
            remaining = pending.remaining()
            if remaining is not None and remaining <= 0:
                raise pending.error(timeout != 0)
            delay = pending.next_check()
            if remaining is not None:
                delay = min(delay, remaining)
            if await _wait_readable(loop, pending.wait_fd(), delay):
                pending.woke()
    finally:
        pending.close()


# Named as the call that made it (the never-awaited warning names it), and
# a coroutine function to those that ask (a framework deciding whether to
# await a hook).
_acquire_async.__name__ = _acquire_async.__qualname__ = "acquire_async"
if sys.version_info >= (3, 12):
    _inspect.markcoroutinefunction(acquire_async)


# Attempts run on the loop's thread. Hundreds of waits woken together (their
# holders let go at once) would otherwise all make theirs in one iteration
# of the loop and stall every other task for as long. Each iteration lets
# about _SLICE of attempts go (as many as the iterations before took per
# attempt); the rest queue, and are let go in order in the iterations
# after. A woken wait queues before its task is stepped, and its descriptor
# leaves the selector: waits that spun on asyncio.sleep(0) instead each
# stepped in every iteration, their descriptors reported by every select,
# which made 256 waits released together wake 36 ms late on median (18 ms
# queued, same machine and run of bench/bench.py's harness; issue 38).
_SLICE = 0.001


class _Slice:
    __slots__ = ("used", "queue", "planned", "cost", "since")

    def __init__(self) -> None:
        # Attempts let go since the slice began.
        self.used = 0
        # Weakly, like the loop: a loop closed with waits still queued (its
        # slice's end planned, never run) is freed with its slice.
        self.queue: Deque[Tuple["weakref.ReferenceType[asyncio.Future[Any]]", Any]] = collections.deque()
        self.planned = False
        # Seconds per attempt (with its task's step), as measured.
        self.cost = 50e-6
        self.since = time.monotonic()

    def room(self) -> bool:
        return not self.queue and self.used * self.cost < _SLICE


_slices: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slice]" = weakref.WeakKeyDictionary()


def _slice(loop: asyncio.AbstractEventLoop) -> _Slice:
    s = _slices.get(loop)
    if s is None:
        s = _slices[loop] = _Slice()
    return s


async def _turn(loop: asyncio.AbstractEventLoop) -> None:
    """Before an attempt: go now if the slice has room, else in order."""
    s = _slice(loop)
    if s.room():
        s.used += 1
        _plan(loop, s)
        return
    fut: asyncio.Future[None] = loop.create_future()
    s.queue.append((weakref.ref(fut), None))
    _plan(loop, s)
    # A cancelled wait's future is cancelled with it, and skipped.
    await fut


def _admit(loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[Any]", value: Any) -> None:
    """A wait woken: its task is stepped now if the slice has room, else in
    order (its attempt follows without another turn)."""
    s = _slice(loop)
    if s.room():
        s.used += 1
        fut.set_result(value)
    else:
        s.queue.append((weakref.ref(fut), value))
    _plan(loop, s)


def _plan(loop: asyncio.AbstractEventLoop, s: _Slice) -> None:
    """The slice ends at the start of the next iteration."""
    if not s.planned:
        s.planned = True
        loop.call_soon(_next_slice, loop, s)


def _next_slice(loop: asyncio.AbstractEventLoop, s: _Slice) -> None:
    # The steps of the attempts let go last time ran just before this (they
    # were scheduled first): what the iteration took is what they cost.
    now = time.monotonic()
    if s.used:
        s.cost = max(1e-6, (s.cost + (now - s.since) / s.used) / 2)
    s.planned, s.used, s.since = False, 0, now
    while s.queue and s.used * s.cost < _SLICE:
        ref, value = s.queue.popleft()
        fut = ref()
        if fut is not None and not fut.done():
            fut.set_result(value)
            s.used += 1
    if s.used or s.queue:
        _plan(loop, s)
    elif _slices.get(loop) is s:
        del _slices[loop]


async def _wait_readable(loop: asyncio.AbstractEventLoop, fd: Optional[int], delay: float) -> bool:
    """Wait until ``fd`` is readable (True) or ``delay`` seconds pass (False);
    either way it is then this wait's turn to attempt."""
    if fd is None:
        await asyncio.sleep(delay)
        await _turn(loop)
        return False
    fut: asyncio.Future[bool] = loop.create_future()
    fired = False

    def ready(value: bool) -> None:
        nonlocal fired
        # Not after the wait was cancelled (its future with it).
        if not fired and not fut.done():
            fired = True
            # The descriptor stays readable until the wait's turn: a queued
            # wait must not be reported by every iteration's select (256 of
            # them made 24,000 calls of this in 171 iterations).
            loop.remove_reader(fd)
            _admit(loop, fut, value)

    loop.add_reader(fd, ready, True)
    timer = loop.call_later(delay, ready, False)
    try:
        return await fut
    finally:
        timer.cancel()
        loop.remove_reader(fd)


_fork_caller: Any = None


def _before_fork() -> None:
    global _fork_caller
    # The frame that called os.fork() (this hook is called from C).
    _fork_caller = sys._getframe(1)
    _native._watch_pause()


def _after_fork_in_parent() -> None:
    global _fork_caller
    caller, _fork_caller = _fork_caller, None
    # 3.13 counts threads after the after_in_parent hooks: start the threads
    # again once os.fork() has returned to its caller instead.
    if sys.version_info >= (3, 13):
        _native._watch_resume_soon(caller)
    else:
        _native._watch_resume()


def _after_fork_in_child() -> None:
    global _fork_caller
    _fork_caller = None


# The holder's watcher and the wait hub are native threads; stop them around
# os.fork() so the fork does not count them (CPython 3.12+ warns about
# forking a threaded process). The child never has them: the library's fork
# handler resets them.
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
