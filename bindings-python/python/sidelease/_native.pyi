"""Type stubs of the native module (checked by mypy.stubtest in CI)."""

import os
from types import TracebackType
from typing import Any, Awaitable, Callable, Coroutine, Dict, Generator, List, Literal, Optional, Type, Union, final

from ._errors import LeaseLost

__all__ = [
    "__version__",
    "acquire",
    "inspect",
    "CancelToken",
    "Elector",
    "Lease",
    "Pending",
    "Ready",
    "Term",
    "_watch_pause",
    "_watch_resume",
    "_watch_resume_soon",
    "_watch_running",
]
__version__: str

_Path = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]

def acquire(
    target: _Path,
    *,
    timeout: Optional[float] = ...,
    suffix: str = ".backend-lease",
    metadata: Optional[Dict[str, Any]] = None,
    allow_unsupported_fs: bool = False,
    split_guard: bool = True,
    watch: bool = True,
    cancel: Optional[CancelToken] = None,
    on_waiting: Optional[Callable[[Dict[str, Any]], Any]] = None,
) -> Lease:
    """Acquire the lease of ``target``: a ``str``, ``bytes`` or path-like
    object, as ``os.open`` takes (the lease file is ``target + suffix``,
    ``app.db.backend-lease`` by default), or a PostgreSQL URL with a lease
    name. Returns a :class:`Lease` whose holder record is written.

    ``timeout`` in seconds: 0 (the default) is one attempt, None waits
    forever. Another process holding the lease raises :class:`LeaseInUse`
    (one attempt) or :class:`LeaseTimeout` (the wait ran out). The GIL is
    released while trying (a first look at ``/proc/locks`` can take
    milliseconds) and while waiting; Ctrl-C ends a wait with
    KeyboardInterrupt, and ``cancel`` (a :class:`CancelToken`) from another
    thread with :class:`LeaseCancelled`. ``on_waiting(info)`` hears who
    holds the lease once a wait starts and whenever that changes (as the
    ``sidelease`` logger does at INFO); an exception it raises ends the
    wait.

    ``metadata`` is a dict of JSON values written into the record (at most
    16 KiB serialized); NaN, infinity, an integer outside 64 bits, a
    non-string key or a set is an :class:`InvalidArgument` naming where it
    is. ``allow_unsupported_fs=True`` accepts a lease directory on a
    filesystem where flock is not known to be reliable (NFS, SMB, ...)
    instead of raising :class:`UnsupportedFilesystem`. ``split_guard=False``
    and ``watch=False`` turn off the split guard and the holder's watch
    (both on by default; see docs/concepts.md).
    """

def inspect(target: _Path, *, suffix: str = ".backend-lease") -> Dict[str, Any]:
    """Inspect the lease of ``target`` without taking or disturbing it: a
    dict with ``target``, ``lease_path``, ``state`` ("free", "held",
    "split" or "unknown"), ``holders`` (PIDs), ``record`` (the holder
    record, or None), ``record_status`` (what the record is worth: "live",
    "self", "stale", "released", ...), ``orphans``, ``former``,
    ``unattributed``, ``server`` (for a PostgreSQL lease, the session
    holding it) and ``platform`` (the implementation that answered and
    what it could not ask the kernel). docs/concepts.md says what each
    value means.
    """

@final
class CancelToken:
    """Ends a synchronous wait from another thread. Pass it to
    ``acquire(..., cancel=token)``; ``token.cancel()`` from any thread ends
    that wait with :class:`LeaseCancelled`, holding nothing. Cancelling is
    permanent: make one token per wait you may cancel."""

    def __new__(cls) -> CancelToken: ...
    def cancel(self) -> None:
        """End the waits given this token (now and later). Safe from any
        thread, and from a signal handler."""

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called (it stays True)."""

@final
class Lease:
    """A handle on a held lease, from :func:`acquire`, :func:`acquire_async`
    or :attr:`Term.lease`: a context manager, sync and async, that releases
    it on the way out. :meth:`release` is idempotent; a handle collected
    without release releases and emits a ResourceWarning."""

    def release(self) -> None:
        """Release this handle's share (the last release of a lease records
        it and drops the lock). A second call does nothing."""

    def check(self) -> Literal["held", "unlinked", "replaced"]:
        """Does the lease path still name the locked file? "held",
        "unlinked" or "replaced". :class:`InvalidArgument` once this handle
        was released."""

    @property
    def lease_path(self) -> str:
        """The lease file's path (canonical), a real path in ``os.fsdecode``
        form even when it is not UTF-8; for a PostgreSQL lease, its URL with
        the password masked."""

    @property
    def target(self) -> str:
        """The path the caller protects, in ``os.fsdecode`` form; for a
        PostgreSQL lease, its URL with the password masked."""

    @property
    def record(self) -> Dict[str, Any]:
        """The holder record this process wrote in the lease file (or would
        have, when the file could only be opened read-only), as a dict."""

    @property
    def previous(self) -> Optional[Dict[str, Any]]:
        """The record the lease file held before this acquisition, every
        field as the previous holder wrote it; None when it held none (an
        empty file) or one that could not be read."""

    @property
    def previous_released_cleanly(self) -> Optional[bool]:
        """True only when the previous record says so; False when the last
        holder died holding the lease; None when no record tells (an empty
        lease file: a first lease, or one deleted or emptied) or the file
        could only be opened read-only. Recover unless it is True."""

    @property
    def generation(self) -> Optional[int]:
        """The fencing token, one more than the previous holder's and never
        repeated (a first lease starts at the clock, microseconds since
        1970); None for a read-only lease file."""

    @property
    def state(self) -> Literal["held", "lost", "released"]:
        """The handle's state: "held", "lost" or "released"."""

    @property
    def lost(self) -> bool:
        """True once the lease was lost while held (its file replaced or
        deleted and another process holding the new one, or it could not
        be put back); the same answer after :meth:`release` as before it."""

    @property
    def lost_reason(self) -> Optional[str]:
        """What happened, when the lease was lost (also after
        :meth:`release`); None otherwise."""

    def ensure_held(self) -> None:
        """Raise :class:`LeaseLost` if the lease was lost (call it before
        work that must only happen under the lease). For a lease file it
        looks at the path and puts back a file someone deleted or replaced,
        so it never passes while :meth:`check` says otherwise;
        :class:`LeaseOSError` when the file cannot be put back yet (its
        directory is gone)."""

    def ensure_held_now(self) -> None:
        """As :meth:`ensure_held`, and for a PostgreSQL lease ask the server
        now (one round trip within the lease's bound, the GIL released)
        rather than rely on the last heartbeat. :class:`LeaseOSError` when
        the answer did not come in time (not known yet)."""

    def _lost_fd(self) -> int: ...
    def wait_lost(self) -> Coroutine[Any, Any, Optional[LeaseLost]]:
        """Wait on the event loop until the lease is lost
        (``err = await lease.wait_lost()``): returns the :class:`LeaseLost`
        error, or None if the lease is released first. No thread: the loop
        watches the lease's descriptor."""

    @property
    def record_written(self) -> bool:
        """False when the lease file could only be opened read-only: the
        lock holds, but no record was written."""

    @property
    def released(self) -> bool:
        """True once this handle was released (:meth:`release`, or leaving
        its ``with`` or ``async with`` block)."""

    def __enter__(self) -> Lease:
        """``with sidelease.acquire(db) as lease:`` gives the lease itself."""

    def __exit__(
        self,
        *_exc: Union[Optional[Type[BaseException]], Optional[BaseException], Optional[TracebackType]],
    ) -> None:
        """Release the lease, as :meth:`release`. Never swallows the block's
        exception (returns None), so a type checker knows a ``return``
        inside the block is the function's end."""

    def __aenter__(self) -> Awaitable[Lease]:
        """``async with lease:`` gives the lease itself, at once (an
        awaitable already done: nothing waits)."""

    def __aexit__(
        self,
        *_exc: Union[Optional[Type[BaseException]], Optional[BaseException], Optional[TracebackType]],
    ) -> Awaitable[None]:
        """Release the lease, as :meth:`release`, at once (an awaitable
        already done); never swallows the block's exception."""

    def __class_getitem__(cls, _item: Any) -> Type[Lease]: ...

@final
class Ready:
    def __await__(self) -> Generator[Any, None, Any]: ...
    def __iter__(self) -> Ready: ...
    def __next__(self) -> None: ...

@final
class Pending:
    def __new__(
        cls,
        target: _Path,
        *,
        timeout: Optional[float] = ...,
        suffix: str = ".backend-lease",
        metadata: Optional[Dict[str, Any]] = None,
        allow_unsupported_fs: bool = False,
        split_guard: bool = True,
        watch: bool = True,
    ) -> Pending: ...
    def try_acquire(self) -> Optional[Lease]: ...
    def tell_waiting(self, on_waiting: Optional[Callable[[Dict[str, Any]], Any]] = None) -> None: ...
    def wait_fd(self) -> Optional[int]: ...
    def next_check(self) -> float: ...
    def remaining(self) -> Optional[float]: ...
    def woke(self) -> None: ...
    def error(self, timed_out: bool) -> BaseException: ...
    def close(self) -> None: ...

_Ended = tuple[Literal["lost", "released", "stopped", "error"], str]

@final
class Elector:
    def __new__(
        cls,
        target: _Path,
        *,
        on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None,
        suffix: str = ".backend-lease",
        metadata: Optional[Dict[str, Any]] = None,
        allow_unsupported_fs: bool = False,
        split_guard: bool = True,
        watch: bool = True,
    ) -> Elector: ...
    def campaign(self) -> Optional[Term]: ...
    def stop(self) -> None: ...
    @property
    def stopped(self) -> bool: ...
    @property
    def target(self) -> str: ...
    @property
    def snapshot(self) -> Dict[str, Any]: ...

@final
class Term:
    """One term of leadership, from :meth:`Elector.campaign` or
    :class:`leadership`: the work must end once :attr:`cancelled` is set;
    :meth:`step_down` ends the term. A term collected without step_down
    steps down as if the work had returned."""

    @property
    def lease(self) -> Lease:
        """The lease held for this term."""

    @property
    def generation(self) -> Optional[int]:
        """The term's fencing token: its lease's :attr:`Lease.generation`."""

    @property
    def cancelled(self) -> Optional[_Ended]:
        """Why the work must end: ("lost", reason) or ("stopped", ""); None
        while it may go on. After step_down, why the term ended."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the work must end (True) or ``timeout`` seconds pass
        (False), the GIL released; Ctrl-C raises KeyboardInterrupt."""

    def _cancel_fd(self) -> int: ...
    def step_down(self, error: Optional[str] = None) -> _Ended:
        """End the term: release the lease (the next campaigner is woken at
        once) and return why it ended: ("lost", reason), ("stopped", ""),
        ("released", "") or ("error", error). ``error`` is the work's
        failure, None when it returned. A second call returns the first's
        answer."""

def _watch_pause() -> None: ...
def _watch_resume() -> None: ...
def _watch_resume_soon(caller: object = None) -> None: ...
def _watch_running() -> bool: ...
