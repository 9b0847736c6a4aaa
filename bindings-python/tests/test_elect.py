"""Leader election from Python: the thread form (Elector), the asyncio forms
(leadership, lead), against real campaigner processes (elect_campaigner.py)
with an overlap detector beside the lease: SIGKILLed leaders, a rival that
takes the lease file, a terminated PostgreSQL session; and in one process,
events, the snapshot, stop, back-off and cancellation."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

import sidelease

from conftest import RIVAL, Holder, pg_url, terminate_holder

HERE = os.path.dirname(__file__)
CAMPAIGNER = os.path.join(HERE, "elect_campaigner.py")


class Campaign:
    """Campaigner processes of one form on one target, their log and the
    overlap detector; every process is ended by its PID."""

    def __init__(self, tmp: Any, form: str, target: str) -> None:
        self.form, self.target = form, target
        self.detector = str(tmp / "detector")
        self.log = str(tmp / "events.log")
        self.procs: Dict[int, subprocess.Popen[bytes]] = {}
        self.seen = 0  # lines of the log read so far

    def spawn(self) -> int:
        p = subprocess.Popen([sys.executable, CAMPAIGNER, self.form, self.target, self.detector, self.log],
                             stdin=subprocess.DEVNULL)
        self.procs[p.pid] = p
        return p.pid

    def lines(self) -> List[Tuple[int, str]]:
        try:
            with open(self.log) as f:
                text = f.read()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            pid, _, what = line.partition(" ")
            out.append((int(pid), what))
        return out

    def next(self, pred: Any, within: float = 10.0) -> Tuple[int, str]:
        """The first line after those already read that `pred` accepts."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            lines = self.lines()
            for i in range(self.seen, len(lines)):
                if pred(*lines[i]):
                    self.seen = i + 1
                    return lines[i]
            time.sleep(0.002)
        pytest.fail(f"no such line within {within}s; the log: {self.lines()[-20:]}")

    def overlaps(self) -> List[Tuple[int, str]]:
        return [line for line in self.lines() if line[1] == "overlap"]

    def kill(self, pid: int) -> None:
        assert self.procs[pid].poll() is None, f"campaigner {pid} ended by itself"
        os.kill(pid, signal.SIGKILL)
        self.procs.pop(pid).wait(10)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
        self.procs.clear()


@pytest.fixture
def campaign(tmp_path: Any, request: Any) -> Any:
    made: List[Campaign] = []

    def make(form: str, target: Optional[str] = None) -> Campaign:
        c = Campaign(tmp_path, form, target or str(tmp_path / "app.db"))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def lease_path(db: str) -> str:
    return db + ".backend-lease"


def take_over(db: str, tmp: Any) -> Any:
    """A rival that is no sidelease holder locks a new file and renames it
    over the lease file (in this test's directory only)."""
    f = open(tmp / "rival", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    os.rename(tmp / "rival", lease_path(db))
    return f


# A SIGKILLed leader: 4 campaigners, the leader killed again and again, a
# new campaigner started for each one killed. 100 for the thread form (the
# gunicorn worker's), fewer for each asyncio form (same core loop).
@pytest.mark.parametrize("form,kills", [("sync", 100), ("lead", 25), ("leadership", 25)])
def test_a_killed_leader_is_succeeded_every_time_and_never_beside_another(campaign: Any, form: str,
                                                                          kills: int) -> None:
    c = campaign(form)
    for _ in range(4):
        c.spawn()
    killed: List[int] = []
    gaps: List[float] = []
    leader, _ = c.next(lambda pid, what: what == "leading")
    for _ in range(kills):
        t = time.monotonic()
        c.kill(leader)
        killed.append(leader)
        c.spawn()
        new, _ = c.next(lambda pid, what: what == "leading")
        gaps.append(time.monotonic() - t)
        assert new not in killed, f"a killed leader {new} led again"
        leader = new
    assert c.overlaps() == [], c.lines()
    gaps.sort()
    print(f"\n{form}: failover after SIGKILL (incl. the log poll) median {gaps[len(gaps) // 2] * 1000:.1f} ms, "
          f"max {gaps[-1] * 1000:.1f} ms over {kills}")


@pytest.mark.parametrize("form", ["sync", "lead", "leadership"])
def test_a_loss_cancels_the_work_and_it_campaigns_again(campaign: Any, tmp_path: Any, form: str) -> None:
    c = campaign(form)
    c.spawn()
    c.spawn()
    leader, _ = c.next(lambda pid, what: what == "leading")
    rival = take_over(c.target, tmp_path)
    t = time.monotonic()
    c.next(lambda pid, what: pid == leader and what == "cancelled lost", within=5)
    assert time.monotonic() - t < 2
    if form == "leadership":
        c.next(lambda pid, what: pid == leader and what.startswith("raised LeaseLost"))
    # While the rival holds the lease nobody leads; once it lets go one does.
    time.sleep(0.3)
    assert [line for line in c.lines()[c.seen:] if line[1] == "leading"] == []
    rival.close()
    c.next(lambda pid, what: what == "leading")
    assert c.overlaps() == []
    assert all(p.poll() is None for p in c.procs.values()), "every campaigner is still campaigning"


# The server frees the lock the moment the session is ended, and a waiter
# is granted it at once, while the old leader learns of it from its socket
# a moment later: the new term waits out the old one's bound
# (confirm_within) before its work starts, so the two never overlap.
@pytest.mark.parametrize("form", ["sync", "lead"])
def test_a_terminated_postgres_session_cancels_the_work_before_a_successor_starts(campaign: Any,
                                                                                  form: str) -> None:
    url = pg_url("elect") + "&confirm_within=300"
    c = campaign(form, url)
    for _ in range(3):
        c.spawn()
    leader, _ = c.next(lambda pid, what: what == "leading")
    gaps = []
    for _ in range(4):
        t = time.monotonic()
        assert terminate_holder(url) == 1
        c.next(lambda pid, what: pid == leader and what == "cancelled lost", within=5)
        leader, _ = c.next(lambda pid, what: what == "leading")
        gaps.append(time.monotonic() - t)
    kills = []
    for _ in range(4):
        # A successor campaigning already (not one still starting Python,
        # which on a loaded machine takes longer than the bound).
        fresh = c.spawn()
        c.next(lambda pid, what: pid == fresh and what == "waiting")
        t = time.monotonic()
        c.kill(leader)
        new, _ = c.next(lambda pid, what: what == "leading")
        kills.append(time.monotonic() - t)
        assert new != leader
        leader = new
    assert c.overlaps() == [], c.lines()
    # Each successor of a terminated leader waited out the bound, and not
    # much more; one of a killed leader on this host, provably gone, did
    # not wait it out.
    assert all(0.3 <= g < 3 for g in gaps), gaps
    assert all(g < 0.3 for g in kills), kills


# One process: events, snapshot, stop, back-off, cancellation.


def test_the_thread_form_tells_its_events_and_stop_ends_the_work(db: str, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="sidelease")
    events: List[Tuple[str, Dict[str, Any]]] = []
    elector = sidelease.Elector(db, on_event=lambda k, i: events.append((k, i)))
    began = threading.Event()
    ended: List[Any] = []

    def work(term: sidelease.Term) -> None:
        began.set()
        term.wait()
        ended.append(term.cancelled)

    elector.start(work)
    assert began.wait(5)
    snap = elector.snapshot
    assert snap["leading"] and snap["generation"] > 1_600_000_000_000_000 and snap["elections"] == 1
    assert snap["leader_since"] is not None and abs(snap["leader_since"] - time.time()) < 5
    assert elector.is_leader
    assert sidelease.inspect(db)["state"] == "held"
    elector.stop(timeout=5)
    assert ended == [("stopped", "")]
    assert [k for k, _ in events] == ["elected", "stepped_down", "stopped"]
    assert events[1][1] == {"why": "stopped", "detail": ""}
    assert not elector.is_leader and elector.snapshot["leader_since"] is None
    assert sidelease.inspect(db)["state"] == "free"
    text = caplog.text
    assert "elected: leading" in text and "stepped down" in text and "stopped campaigning" in text


def test_a_campaign_names_the_holder_once_and_is_elected_when_it_lets_go(db: str, holder: Holder) -> None:
    events: List[Tuple[str, Dict[str, Any]]] = []
    elector = sidelease.Elector(db, on_event=lambda k, i: events.append((k, i)))
    elected = threading.Event()
    elector.start(lambda term: (elected.set(), term.wait()))
    try:
        time.sleep(0.5)
        assert [k for k, _ in events] == ["waiting"], events
        info = events[0][1]
        assert info["holder"]["pid"] == holder.pid and info["holders"] == [holder.pid]
        assert f"leased by pid {holder.pid}" in info["message"]
        holder.release()
        assert elected.wait(2)
    finally:
        elector.stop(timeout=5)


def test_work_that_raises_steps_down_and_backs_off_before_campaigning_again(db: str) -> None:
    events: List[Tuple[str, Dict[str, Any]]] = []
    elector = sidelease.Elector(db, on_event=lambda k, i: events.append((k, i)))
    times: List[float] = []

    def work(term: sidelease.Term) -> None:
        times.append(time.monotonic())
        if len(times) == 3:
            elector.stop()
            return
        raise ValueError("boom")

    elector.run(work)
    assert len(times) == 3
    assert times[1] - times[0] >= 0.1 and times[2] - times[1] >= 0.2, times
    downs = [i for k, i in events if k == "stepped_down"]
    assert downs[0] == {"why": "error", "detail": "ValueError: boom"}
    assert downs[2] == {"why": "stopped", "detail": ""}
    assert elector.snapshot["failures"] == 2 and elector.snapshot["elections"] == 3


def test_lead_runs_the_work_again_after_it_returns_until_stopped(db: str) -> None:
    async def main() -> List[Optional[int]]:
        stop = asyncio.Event()
        gens: List[Optional[int]] = []

        async def work(lease: sidelease.Lease) -> None:
            gens.append(lease.generation)
            if len(gens) == 2:
                stop.set()
                await asyncio.sleep(10)  # cancelled by the stop

        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.ensure_future(ticker())
        await asyncio.wait_for(sidelease.lead(db, work, stop=stop), 10)
        t.cancel()
        assert ticks > 5, "the loop kept running through the back-off"
        return gens

    gens = asyncio.run(main())
    assert gens[0] is not None and gens[1] == gens[0] + 1, gens
    assert sidelease.inspect(db)["state"] == "free"


def test_cancelling_a_waiting_leadership_or_lead_leaves_nothing_held(db: str, holder: Holder) -> None:
    async def main() -> None:
        async def enter() -> None:
            async with sidelease.leadership(db):
                pytest.fail("elected while the holder holds it")

        async def work(lease: sidelease.Lease) -> None:
            pytest.fail("elected while the holder holds it")

        for coro in (enter(), sidelease.lead(db, work)):
            task = asyncio.ensure_future(coro)
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    holder.release()
    time.sleep(0.3)  # a campaign that was not stopped would take it now
    assert sidelease.inspect(db)["state"] == "free"


def test_cancelling_lead_while_leading_cancels_the_work_and_steps_down(db: str) -> None:
    async def main() -> str:
        running = asyncio.Event()
        seen: List[str] = []

        async def work(lease: sidelease.Lease) -> None:
            running.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append(lease.state)
                raise

        task = asyncio.ensure_future(sidelease.lead(db, work))
        await asyncio.wait_for(running.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen[0]

    assert asyncio.run(main()) == "held", "the work is cancelled before the lease is released"
    assert sidelease.inspect(db)["state"] == "free"


def test_bad_targets_are_errors_naming_them(tmp_path: Any) -> None:
    with pytest.raises(sidelease.InvalidArgument, match="target"):
        sidelease.Elector("")
    with pytest.raises(sidelease.InvalidArgument, match="postgresql://"):
        sidelease.Elector("postgres:/nohost")
    with pytest.raises(sidelease.InvalidArgument, match="suffix"):
        sidelease.Elector(str(tmp_path / "a.db"), suffix="")
    # A path that cannot name a lease file is refused at once, not retried.
    for bad in [tmp_path / "missing" / "app.db", tmp_path / ("x" * 300)]:
        events: List[str] = []
        e = sidelease.Elector(str(bad), on_event=lambda kind, info: events.append(kind))
        with pytest.raises(OSError, match=str(bad.parent)):
            e.run(lambda term: None)
        assert "error" not in events
    # A lease file named as the target (issue 39): refused, naming its database.
    db = str(tmp_path / "app.db")
    e = sidelease.Elector(db + ".backend-lease")
    with pytest.raises(sidelease.InvalidArgument, match="is a lease file") as ei:
        e.run(lambda term: None)
    assert f"did you mean {db}?" in str(ei.value)


def test_a_timeout_is_refused_saying_how_an_elector_stops(tmp_path: Any) -> None:
    db = str(tmp_path / "app.db")
    for make in (
        lambda: sidelease.Elector(db, timeout=1),  # type: ignore[arg-type]
        lambda: asyncio.run(sidelease.lead(db, _never, timeout=1)),
    ):
        with pytest.raises(sidelease.InvalidArgument, match="invalid argument `timeout`: .*stop") as ei:
            make()
        assert isinstance(ei.value, ValueError)
    assert sidelease.inspect(db)["state"] == "free", "nothing was taken"


async def _never(lease: Any) -> None:
    raise AssertionError("not elected with a refused argument")


def test_arguments_that_are_not_callables_or_events_are_type_errors(tmp_path: Any) -> None:
    db = str(tmp_path / "app.db")
    with pytest.raises(TypeError, match="on_event"):
        sidelease.Elector(db, on_event=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_event"):
        sidelease.leadership(db, on_event="x")  # type: ignore[arg-type]
    e = sidelease.Elector(db)
    with pytest.raises(TypeError, match="work"):
        e.run(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="work"):
        e.start(None)  # type: ignore[arg-type]
    assert not e.is_leader and sidelease.inspect(db)["state"] == "free"

    async def main() -> None:
        with pytest.raises(TypeError, match="work"):
            await sidelease.lead(db, 5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="stop"):
            await sidelease.lead(db, asyncio.sleep, stop=True)  # type: ignore[arg-type]

    asyncio.run(main())
    assert sidelease.inspect(db)["state"] == "free"


# A process started in the background (CI's job) inherits SIGINT ignored,
# and Python then installs no KeyboardInterrupt handler: install it, as an
# interactive interpreter has it.
SIGINT_RUN = """
import signal, sys, sidelease
signal.signal(signal.SIGINT, signal.default_int_handler)
def work(term):
    print("leading", flush=True)
    term.wait()
elector = sidelease.Elector(sys.argv[1])
print("campaigning", flush=True)
try:
    elector.run(work)
except KeyboardInterrupt:
    print("interrupted", elector.stopped, elector.is_leader, flush=True)
    raise
"""


@pytest.mark.parametrize("leading", [False, True])
def test_ctrl_c_in_the_main_thread_stops_the_elector_and_releases(db: str, leading: bool) -> None:
    holder = None if leading else Holder(db)
    try:
        p = subprocess.Popen([sys.executable, "-c", SIGINT_RUN, db], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "campaigning"
        if leading:
            assert p.stdout.readline().strip() == "leading"
        else:
            time.sleep(0.3)  # waiting for the holder
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)
        assert out.strip() == "interrupted True False", (out, err)
        assert p.returncode != 0 and "KeyboardInterrupt" in err
    finally:
        if holder is not None:
            holder.release()
            holder.close()
    assert sidelease.inspect(db)["state"] == "free"


def test_a_wait_longer_than_the_clock_holds_waits_until_cancelled(db: str) -> None:
    elector = sidelease.Elector(db)
    term = elector.campaign()
    assert term is not None
    assert term.wait(0) is False
    threading.Timer(0.1, elector.stop).start()
    assert term.wait(1e300) is True
    assert term.wait(1e19) is True
    assert term.step_down() == ("stopped", "")



def test_a_loss_and_a_failing_campaign_are_logged_at_warning(tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="sidelease")
    db = str(tmp_path / "app.db")
    elector = sidelease.Elector(db)
    elected = threading.Event()
    ended: List[Optional[Tuple[str, str]]] = []

    def work(term: sidelease.Term) -> None:
        elected.set()
        term.wait()
        ended.append(term.cancelled)
        elector.stop()

    elector.start(work)
    assert elected.wait(10)
    rival = subprocess.Popen([sys.executable, "-c", RIVAL, str(tmp_path / "rival"), lease_path(db)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rival.stdout is not None and rival.stdout.readline() == "renamed\n"
        deadline = time.monotonic() + 5
        while not ended and time.monotonic() < deadline:
            time.sleep(0.01)
        elector.stop(10)
        assert ended and ended[0] is not None and ended[0][0] == "lost", ended
    finally:
        rival.kill()
        rival.wait(10)
    lost = [r for r in caplog.records if r.name == "sidelease" and r.getMessage().startswith("lost ")]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING, caplog.text
    # A server that refuses connections: each failed campaign at WARNING,
    # with the back-off, and no password.
    caplog.clear()
    refused = sidelease.Elector("postgresql://app:app-secret@127.0.0.1:1/app?lease=refused")
    refused.start(lambda term: None)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(r.getMessage().startswith("campaigning for") for r in caplog.records):
        time.sleep(0.01)
    refused.stop(10)
    errors = [r for r in caplog.records if r.getMessage().startswith("campaigning for")]
    assert errors and all(r.levelno == logging.WARNING for r in errors), caplog.text
    assert "again in 0.1s" in errors[0].getMessage() and "app-secret" not in caplog.text
