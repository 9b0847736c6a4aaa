"""The Python surface: acquire, Lease, inspect, every exception and its
attributes, threads, fork and bad input."""

from __future__ import annotations

import asyncio
import errno
import gc
import math
import multiprocessing
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from typing import Any

import pytest

import sidelease
from conftest import STEP, Holder


def test_version_is_the_workspace_version() -> None:
    cargo = pathlib.Path(__file__).parents[2] / "Cargo.toml"
    m = re.search(r'^version = "([^"]+)"', cargo.read_text(), re.M)
    assert m and sidelease.__version__ == m.group(1)
    from importlib.metadata import version

    assert version("sidelease") == sidelease.__version__


def test_signatures_carry_the_defaults_the_stubs_state() -> None:
    # The defaults in _native.pyi (which the API reference shows) are
    # checked against these by stubtest in tests/run; here, that the
    # runtime has real values, and the suffix is the one every lease
    # path in this suite ends with.
    import inspect as pyinspect

    from sidelease import _native

    checked: list[Any] = [_native.acquire, _native.inspect]
    # A class's text signature: CPython before 3.10 drops it from an abi3
    # heap type's doc (pyo3's create_type_object.rs says so), so there the
    # classes have none to check.
    if sys.version_info >= (3, 10):
        checked += [_native.Pending, _native.Elector]
    for fn in checked:
        params = pyinspect.signature(fn).parameters
        assert params["suffix"].default == ".backend-lease", fn
        for name, want in (("split_guard", True), ("watch", True), ("metadata", None)):
            if name in params:
                assert params[name].default is want, (fn, name)


def test_acquire_release_and_fields(db: str) -> None:
    lease = sidelease.acquire(db, metadata={"app": "t", "port": 8000})
    assert lease.lease_path == db + ".backend-lease"
    assert lease.target == db
    rec = lease.record
    assert rec["pid"] == os.getpid()
    assert rec["runtime"].startswith("python 3.")
    assert rec["metadata"] == {"app": "t", "port": 8000}
    # A first lease file: the generation starts at the clock, and no
    # record says how the last holder ended (issue 35).
    first = lease.generation
    assert rec["generation"] == first and first > 1_600_000_000_000_000
    assert lease.previous is None
    assert lease.previous_released_cleanly is None
    assert lease.record_written is True
    assert lease.check() == "held"
    assert repr(lease) == f'<sidelease.Lease "{db}" generation={first} held>'
    lease.release()
    lease.release()  # idempotent
    assert lease.released
    assert "released>" in repr(lease)
    with pytest.raises(sidelease.InvalidArgument, match="released"):
        lease.check()
    again = sidelease.acquire(pathlib.Path(db))
    assert again.generation == first + 1
    assert again.previous_released_cleanly is True
    assert again.previous is not None and "released_at" in again.previous
    again.release()


def test_context_managers(db: str) -> None:
    with sidelease.acquire(db) as lease:
        assert sidelease.inspect(db)["state"] == "held"
    assert lease.released
    assert sidelease.inspect(db)["state"] == "free"

    async def main() -> None:
        async with await sidelease.acquire_async(db) as l2:
            assert l2.check() == "held"
        assert l2.released

    import asyncio

    asyncio.run(main())


def test_handles_share_one_lease(db: str) -> None:
    a = sidelease.acquire(db)
    b = sidelease.acquire(db)
    assert a.record["nonce"] == b.record["nonce"]
    a.release()
    assert b.check() == "held"
    assert sidelease.inspect(db)["state"] == "held"
    b.release()
    assert sidelease.inspect(db)["state"] == "free"


def test_threads_share_one_lease(db: str) -> None:
    first = sidelease.acquire(db)
    barrier = threading.Barrier(8)
    nonces: list = []

    def worker() -> None:
        barrier.wait()
        with sidelease.acquire(db, timeout=5) as lease:
            nonces.append(lease.record["nonce"])
            barrier.wait()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(STEP)
    assert nonces == [first.record["nonce"]] * 8
    first.release()


def test_check_sees_unlink_and_replacement(db: str) -> None:
    # Without the holder's watch, which would put the file back at once.
    lease = sidelease.acquire(db, watch=False)
    lp = lease.lease_path
    tmp = db + ".replacement"
    open(tmp, "w").close()
    os.replace(tmp, lp)  # in this test's own temporary directory
    assert lease.check() == "replaced"
    os.unlink(lp)
    assert lease.check() == "unlinked"
    lease.release()


def test_in_use_carries_the_holder(db: str, holder: Holder) -> None:
    with pytest.raises(sidelease.LeaseInUse) as ei:
        sidelease.acquire(db)
    e = ei.value
    assert type(e) is sidelease.LeaseInUse
    assert e.holder is not None and e.holder["pid"] == holder.pid
    assert e.holder["metadata"] == {"role": "holder"}
    assert e.holders == [holder.pid]
    assert e.lease_path == db + ".backend-lease"
    assert e.target == db
    assert f"is leased by pid {holder.pid} (python 3." in str(e)
    i = sidelease.inspect(db)
    assert i["state"] == "held" and i["holders"] == [holder.pid]
    assert i["record_status"] == "live"


def test_timeout_is_an_in_use(db: str, holder: Holder) -> None:
    t = time.monotonic()
    with pytest.raises(sidelease.LeaseTimeout) as ei:
        sidelease.acquire(db, timeout=0.3)
    assert 0.3 <= time.monotonic() - t < 3
    assert isinstance(ei.value, sidelease.LeaseInUse)
    assert ei.value.holders == [holder.pid]
    assert str(ei.value).startswith("timed out after 0.3")


def test_waiter_acquires_after_release_and_after_kill(db: str, holder: Holder) -> None:
    result: dict = {}

    def wait() -> None:
        t = time.monotonic()
        result["lease"] = sidelease.acquire(db, timeout=STEP)
        result["took"] = time.monotonic() - t

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.1)
    holder.release()
    th.join(STEP)
    assert result["lease"].previous_released_cleanly is True
    result["lease"].release()

    h2 = Holder(db)
    try:
        th = threading.Thread(target=wait)
        th.start()
        time.sleep(0.1)
        t = time.monotonic()
        h2.kill()
        th.join(STEP)
        assert time.monotonic() - t < 1.0
        assert result["lease"].previous_released_cleanly is False
        assert result["lease"].previous["pid"] == h2.pid
        result["lease"].release()
    finally:
        h2.close()


def test_ctrl_c_interrupts_a_wait(db: str, holder: Holder) -> None:
    code = textwrap.dedent(
        """
        import sys, sidelease
        print("waiting", flush=True)
        try:
            sidelease.acquire(sys.argv[1], timeout=None)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(7)
        """
    )
    # SIGINT's default disposition in the child: a suite started from a
    # background job inherits SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler.
    p = subprocess.Popen(
        [sys.executable, "-c", code, db],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "waiting\n"
        time.sleep(0.2)  # let it enter the native wait
        t = time.monotonic()
        p.send_signal(signal.SIGINT)
        assert p.wait(STEP) == 7
        assert time.monotonic() - t < 1.0
        assert p.stdout.readline() == "interrupted\n"
    finally:
        if p.poll() is None:
            p.kill()
        p.stdout.close()  # type: ignore[union-attr]


def test_unsupported_filesystem() -> None:
    with pytest.raises(sidelease.UnsupportedFilesystem) as ei:
        sidelease.acquire("/proc/sidelease-py-test.db")
    assert ei.value.fstype == "proc"
    assert ei.value.path == "/proc"
    assert "allow_unsupported_fs" in str(ei.value)
    assert isinstance(ei.value, sidelease.LeaseError)


def test_os_errors_are_the_matching_oserror(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError) as ei:
        sidelease.acquire(str(tmp_path / "missing" / "app.db"))
    e = ei.value
    assert isinstance(e, sidelease.LeaseError) and isinstance(e, sidelease.LeaseOSError)
    assert e.errno == errno.ENOENT
    assert e.filename == str(tmp_path / "missing")
    assert e.syscall == "open"
    os.mkdir(tmp_path / "d.db.backend-lease")
    with pytest.raises(IsADirectoryError) as ei2:
        sidelease.acquire(str(tmp_path / "d.db"))
    assert ei2.value.filename == str(tmp_path / "d.db.backend-lease")


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"suffix": ""}, "suffix"),
        ({"suffix": "a/b"}, "suffix"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
        ({"metadata": {"x": object()}}, "metadata"),
        ({"metadata": {"big": "x" * 20000}}, "metadata"),
    ],
)
def test_bad_values_are_invalid_argument(db: str, kwargs: dict, argument: str) -> None:
    with pytest.raises(sidelease.InvalidArgument, match=f"`{argument}`") as ei:
        sidelease.acquire(db, **kwargs)
    assert isinstance(ei.value, ValueError)


def test_bad_targets(db: str) -> None:
    with pytest.raises(sidelease.InvalidArgument, match="`target`"):
        sidelease.acquire("")
    with pytest.raises(ValueError):
        sidelease.acquire("a\0b")


def test_a_lease_file_as_the_target_is_refused_naming_its_database(db: str) -> None:
    lease = db + ".backend-lease"
    for call in (sidelease.acquire, sidelease.inspect, _acquire_async):
        with pytest.raises(sidelease.InvalidArgument, match="is a lease file") as ei:
            call(lease)
        assert f"did you mean {db}?" in str(ei.value), call


def _acquire_async(target: str) -> Any:
    return asyncio.run(sidelease.acquire_async(target))


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((123,), {}),
        ((None,), {}),
        (("x.db",), {"timeout": "1"}),
        (("x.db",), {"metadata": [1, 2]}),
        (("x.db",), {"suffix": 5}),
        (("x.db",), {"split_guard": "yes"}),
        (("x.db",), {"nope": 1}),
    ],
)
def test_wrong_types_are_type_errors(args: tuple, kwargs: dict) -> None:
    with pytest.raises(TypeError):
        sidelease.acquire(*args, **kwargs)


def test_inspect_keys(db: str) -> None:
    i = sidelease.inspect(db)
    assert set(i) == {
        "target",
        "lease_path",
        "state",
        "holders",
        "record",
        "record_status",
        "orphans",
        "former",
        "unattributed",
        "server",
        "platform",
    }
    assert i["state"] == "free" and i["record_status"] == "empty" and i["record"] is None
    assert i["server"] is None
    with sidelease.acquire(db):
        i = sidelease.inspect(db, suffix=".backend-lease")
        assert i["record_status"] == "self" and i["holders"] == [os.getpid()]
    with pytest.raises(TypeError):
        sidelease.inspect(db, suffix=None)  # type: ignore[arg-type]


def test_collected_handle_releases_and_warns(db: str) -> None:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sidelease.acquire(db)  # dropped at once
        gc.collect()
    assert any(issubclass(x.category, ResourceWarning) for x in w), w
    assert sidelease.inspect(db)["state"] == "free"


def _other_process_can_acquire(db: str) -> bool:
    code = "import sys, sidelease\ntry:\n sidelease.acquire(sys.argv[1]).release()\nexcept sidelease.LeaseInUse:\n sys.exit(1)"
    return subprocess.run([sys.executable, "-c", code, db], timeout=STEP).returncode == 0


def test_os_fork_child_does_not_hold_the_lease(db: str) -> None:
    lease = sidelease.acquire(db)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: stays alive until the parent says so
        os.close(w)
        try:
            lease.check()
            code = 1
        except sidelease.InvalidArgument:
            lease.release()  # a no-op here
            code = 0
        os.read(r, 1)
        os._exit(code)
    os.close(r)
    try:
        assert not _other_process_can_acquire(db)
        lease.release()
        assert _other_process_can_acquire(db), "the forked child kept the lease"
    finally:
        os.write(w, b"x")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _mp_child(ready, done) -> None:  # type: ignore[no-untyped-def]
    ready.set()
    done.wait(STEP)


def test_multiprocessing_fork_child_does_not_hold_the_lease(db: str) -> None:
    ctx = multiprocessing.get_context("fork")
    lease = sidelease.acquire(db)
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_mp_child, args=(ready, done))
    child.start()
    try:
        assert ready.wait(STEP)
        lease.release()
        assert _other_process_can_acquire(db), "the multiprocessing child kept the lease"
    finally:
        done.set()
        child.join(STEP)
