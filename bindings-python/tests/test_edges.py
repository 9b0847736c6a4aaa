"""The API edges users trip on: pickling errors, clean messages, paths that
are not UTF-8, bytes targets, timeouts and metadata that are not what they
seem, and the typing of ``async with``."""

from __future__ import annotations

import concurrent.futures
import math
import os
import pickle
import textwrap
from typing import Any

import pytest

import sidelease


def _raise_missing(path: str) -> None:
    sidelease.acquire(path)


def test_errors_pickle_and_cross_process_pools(tmp_path: Any) -> None:
    missing = str(tmp_path / "nope" / "app.db")
    not_dir = str(tmp_path / "file")
    open(not_dir, "w").close()
    errors = []
    for target in (missing, not_dir + "/app.db"):
        with pytest.raises(sidelease.LeaseOSError) as info:
            sidelease.acquire(target)
        errors.append(info.value)
    errors.append(sidelease.InvalidArgument("invalid argument `timeout`: x"))
    errors.append(sidelease.LeaseInUse("in use", {"pid": 1}, [1], "/a.backend-lease", "/a"))
    errors.append(sidelease.UnsupportedFilesystem("nfs", "nfs", "/mnt"))
    for e in errors:
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e)
        assert str(back) == str(e)
        assert back.__dict__ == e.__dict__
    assert isinstance(errors[0], FileNotFoundError) and errors[0].errno == 2
    assert isinstance(errors[1], NotADirectoryError)
    # What multiprocessing users see: the error itself, not MaybeEncodingError.
    with concurrent.futures.ProcessPoolExecutor(1) as pool:
        with pytest.raises(FileNotFoundError) as info:
            pool.submit(_raise_missing, missing).result()
    assert isinstance(info.value, sidelease.LeaseOSError)
    assert info.value.syscall == "open"


def test_an_os_error_reads_like_pythons_own(tmp_path: Any) -> None:
    missing = str(tmp_path / "nope" / "app.db")
    with pytest.raises(FileNotFoundError) as info:
        sidelease.acquire(missing)
    dir_ = str(tmp_path / "nope")
    assert str(info.value) == f"[Errno 2] No such file or directory (open): {dir_!r}"
    assert info.value.filename == dir_


def test_paths_that_are_not_utf8_come_back_as_real_paths(tmp_path: Any) -> None:
    raw = os.fsencode(str(tmp_path)) + b"/\xff\xfe.db"
    for target in (raw, os.fsdecode(raw)):
        lease = sidelease.acquire(target)
        assert lease.lease_path == os.fsdecode(raw) + ".backend-lease"
        assert os.path.exists(lease.lease_path)
        assert lease.target == os.fsdecode(raw)
        i = sidelease.inspect(target)
        assert i["lease_path"] == lease.lease_path
        assert i["state"] == "held"
        lease.release()


class _BytesPath:
    def __init__(self, p: bytes) -> None:
        self.p = p

    def __fspath__(self) -> bytes:
        return self.p


def test_bytes_and_bytes_pathlike_targets(tmp_path: Any) -> None:
    db = os.fsencode(str(tmp_path / "app.db"))
    with sidelease.acquire(_BytesPath(db)) as lease:
        assert lease.target == os.fsdecode(db)
    assert sidelease.inspect(_BytesPath(db))["state"] == "free"
    with pytest.raises(TypeError):
        sidelease.acquire(12)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [True, False, 10**400, -(10**400)])
def test_timeouts_that_are_not_seconds_are_refused(tmp_path: Any, timeout: Any) -> None:
    with pytest.raises(sidelease.InvalidArgument, match="timeout"):
        sidelease.acquire(str(tmp_path / "app.db"), timeout=timeout)
    assert sidelease.inspect(str(tmp_path / "app.db"))["state"] == "free"


@pytest.mark.parametrize(
    "metadata, where",
    [
        ({"x": math.nan}, "metadata.x is nan"),
        ({"a": [1, math.inf]}, r"metadata.a\[1\] is inf"),
        ({"n": 10**30}, "metadata.n is an integer outside 64 bits"),
        ({"d": {1: "x"}}, "metadata.d has the key 1"),
        ({"s": {1, 2}}, "metadata.s is a set"),
        ({"b": b"x"}, "metadata.b is a bytes"),
    ],
)
def test_metadata_json_cannot_hold_is_refused_naming_it(tmp_path: Any, metadata: Any, where: str) -> None:
    with pytest.raises(sidelease.InvalidArgument, match=where):
        sidelease.acquire(str(tmp_path / "app.db"), metadata=metadata)


def test_metadata_that_is_json_reads_back_the_same(tmp_path: Any) -> None:
    meta = {"a": [1, 2.5, None, True], "b": {"c": "é"}, "big": 2**64 - 1, "neg": -(2**63), "t": (1, 2)}
    with sidelease.acquire(str(tmp_path / "app.db"), metadata=meta) as lease:
        assert lease.record["metadata"] == {**meta, "t": [1, 2]}


def test_async_with_await_types_the_lease(tmp_path: Any) -> None:
    mypy_api = pytest.importorskip("mypy.api")
    src = tmp_path / "use.py"
    src.write_text(textwrap.dedent(
        """
        import sidelease

        async def main(db: str) -> int:
            async with await sidelease.acquire_async(db) as lease:
                n: int | None = lease.generation
                path: str = lease.lease_path
            with sidelease.acquire(b"/x.db") as l2:
                l2.release()
            return n or 0

        # A return inside the block is the function's end: the context
        # managers never swallow an exception (mypy: no "Missing return").
        def state(db: str) -> str:
            with sidelease.acquire(db) as lease:
                return lease.check()

        async def state_async(db: str) -> str:
            async with await sidelease.acquire_async(db) as lease:
                return lease.check()
        """
    ))
    out, err, status = mypy_api.run(["--strict", "--no-incremental", "--python-version", "3.11", str(src)])
    assert status == 0, out + err


def test_a_synchronous_wait_is_cancelled_from_another_thread(db: str, holder: Any) -> None:
    import threading
    import time

    token = sidelease.CancelToken()
    got: dict = {}

    def wait() -> None:
        try:
            got["lease"] = sidelease.acquire(db, timeout=None, cancel=token)
        except sidelease.LeaseCancelled as e:
            got["error"] = e

    # Not a daemon, like an application's worker: it must be possible to end.
    worker = threading.Thread(target=wait)
    worker.start()
    time.sleep(0.3)
    assert worker.is_alive(), got
    start = time.monotonic()
    token.cancel()
    worker.join(5)
    assert not worker.is_alive()
    assert time.monotonic() - start < 1.0
    e = got["error"]
    assert e.lease_path == db + ".backend-lease"
    assert type(pickle.loads(pickle.dumps(e))) is sidelease.LeaseCancelled
    assert token.cancelled
    # Permanent: the same token ends the next wait at once.
    with pytest.raises(sidelease.LeaseCancelled):
        sidelease.acquire(db, timeout=None, cancel=token)
    # It holds nothing: once the holder lets go, the lease is free.
    holder.release()
    assert sidelease.inspect(db)["state"] == "free"
    # An uncancelled token changes nothing.
    with sidelease.acquire(db, timeout=1, cancel=sidelease.CancelToken()) as lease:
        assert lease.generation == holder.record["generation"] + 1


def test_a_forked_child_dropping_an_inherited_handle_says_what_happened(db: str) -> None:
    import warnings

    lease = sidelease.acquire(db)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: collect the handle it inherited, report the warning
        code = 1
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                del lease
            os.write(w, "\n".join(str(c.message) for c in caught).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "came from the parent process through fork" in said, said
    assert "nothing was released" in said and "released it now" not in said, said
    i = sidelease.inspect(db)
    assert i["state"] == "held" and i["holders"] == [os.getpid()]
    lease.release()
