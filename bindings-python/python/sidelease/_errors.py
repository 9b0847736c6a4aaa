"""The exceptions of sidelease. The native module raises these classes."""

from __future__ import annotations

import errno as _errno
from typing import Any, Dict, List, Optional, Tuple, Type


class LeaseError(Exception):
    """Base of every sidelease error."""


class LeaseInUse(LeaseError):
    """Another process holds the lease.

    ``holder`` is the holder record (a dict) or None when it is empty or
    unreadable (which never means the lease is free); ``holders`` are the
    PIDs the kernel reports as holding it.
    """

    holder: Optional[Dict[str, Any]]
    """The holder record read from the lease file (a dict); None when it is
    empty or unreadable (which never means the lease is free), or when it is
    not the record of the process holding the lock."""
    holders: List[int]
    """PIDs the kernel reports as holding the lock (this process's PID
    namespace)."""
    lease_path: str
    """The lease file that is locked."""
    target: str
    """The path the caller asked to protect."""

    def __init__(
        self,
        message: str,
        holder: Optional[Dict[str, Any]] = None,
        holders: Optional[List[int]] = None,
        lease_path: str = "",
        target: str = "",
    ) -> None:
        super().__init__(message)
        self.holder = holder
        self.holders = list(holders or [])
        self.lease_path = lease_path
        self.target = target

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (str(self), self.holder, self.holders, self.lease_path, self.target))


class LeaseTimeout(LeaseInUse):
    """The lease stayed held for the whole timeout."""


class LeaseLost(LeaseError):
    """A held lease was lost: its file was replaced or deleted and another
    process holds the file now at its path, or it could not be put back.

    ``reason`` says what happened; ``holders`` are the PIDs the kernel
    reports as holding the lease file now.
    """

    reason: str
    """What happened, naming the other holder when there is one."""
    holders: List[int]
    """PIDs the kernel reports as holding the lease file now."""
    lease_path: str
    """The lease file that was lost; for a PostgreSQL lease, its URL with
    the password masked."""

    def __init__(
        self,
        message: str,
        reason: str = "",
        holders: Optional[List[int]] = None,
        lease_path: str = "",
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.holders = list(holders or [])
        self.lease_path = lease_path

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (str(self), self.reason, self.holders, self.lease_path))


class LeaseCancelled(LeaseError):
    """A wait was ended through its :class:`CancelToken`; nothing is held."""

    lease_path: str
    """The lease file whose wait was cancelled."""

    def __init__(self, message: str, lease_path: str = "") -> None:
        super().__init__(message)
        self.lease_path = lease_path

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (str(self), self.lease_path))


class UnsupportedFilesystem(LeaseError):
    """The lease directory is on a filesystem where flock cannot be trusted
    (NFS, SMB, FUSE, ...). Pass ``allow_unsupported_fs=True`` to use it anyway."""

    fstype: str
    """The filesystem's name (``nfs``, ``cifs``, ...; "an unknown
    filesystem" when its magic number is not in the library's table)."""
    path: str
    """The directory whose filesystem was refused."""

    def __init__(self, message: str, fstype: str = "", path: str = "") -> None:
        super().__init__(message)
        self.fstype = fstype
        self.path = path


class InvalidArgument(LeaseError, ValueError):
    """An argument's value is not acceptable; the message names it."""


class LeaseOSError(LeaseError, OSError):
    """A system call failed. Instances are also the matching OSError subclass
    (FileNotFoundError, PermissionError, ...), with ``errno``, ``filename``
    and ``syscall``."""

    syscall: str
    """The system call that failed (``open``, ``flock``, ...), also shown in
    the message: ``[Errno 2] No such file or directory (open): '/srv/data'``."""


def _os_class(base: Type[OSError]) -> Type[LeaseOSError]:
    cls = type(base.__name__, (LeaseOSError, base), {
        "__module__": __name__,
        "__qualname__": f"Lease{base.__name__}",
        "__doc__": f"A sidelease I/O failure that is a {base.__name__}.",
    })
    # Reachable by its qualified name, so pickle (multiprocessing,
    # ProcessPoolExecutor) can carry it across processes.
    globals()[f"Lease{base.__name__}"] = cls
    return cls


# Every OSError subclass Python picks by errno, made once at import.
_OS_CLASSES: Dict[Type[OSError], Type[LeaseOSError]] = {
    base: _os_class(base)
    for base in (
        BlockingIOError, ChildProcessError, BrokenPipeError, ConnectionAbortedError,
        ConnectionRefusedError, ConnectionResetError, FileExistsError, FileNotFoundError,
        InterruptedError, IsADirectoryError, NotADirectoryError, PermissionError,
        ProcessLookupError, TimeoutError,
    )
}


def _os_error(code: int, strerror: str, filename: str, syscall: str) -> LeaseOSError:
    """Build the exception for an I/O failure: a LeaseError that is also the
    OSError subclass Python uses for ``code``."""
    base = type(OSError(code, "")) if code else OSError
    cls = _OS_CLASSES.get(base, LeaseOSError)
    exc = cls(code or _errno.EIO, strerror, filename)
    exc.syscall = syscall
    return exc
