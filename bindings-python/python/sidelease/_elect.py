"""Leader election: :class:`Elector` (threads), :func:`leadership` and
:func:`lead` (asyncio), all on the core's elector.

Every form campaigns (waits for the lease, woken by its release), runs the
leader's work with a cancellation that fires on loss or on stop, steps down
when the work ends (releasing the lease wakes the next campaigner at once)
and, unless stopped, campaigns again. Only errors back off (0.1 s doubling
to 10 s): a campaign that failed, work that raised, or work that returned
within 1 s. Events go to the ``sidelease`` logger (INFO; WARNING for a loss
or an error) and to ``on_event(kind, info)``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple, Union

from . import _native
from ._errors import InvalidArgument, LeaseLost
from ._native import Lease, Term

log = logging.getLogger("sidelease")
log.addHandler(logging.NullHandler())  # a library logs only where the application says

Target = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
OnEvent = Callable[[str, Dict[str, Any]], None]


def _log_event(target: str, kind: str, info: Dict[str, Any]) -> None:
    if kind == "waiting":
        log.info("waiting for %s: %s", target, info["message"])
    elif kind == "elected":
        log.info("elected: leading %s (generation %s)", target, info["generation"])
    elif kind == "lost":
        log.warning("lost %s: %s", target, info["reason"])
    elif kind == "stepped_down":
        detail = f": {info['detail']}" if info["detail"] else ""
        log.info("stepped down from %s (%s%s)", target, info["why"], detail)
    elif kind == "error":
        log.warning("campaigning for %s: %s; again in %.1fs", target, info["message"], info["retry_in"])
    elif kind == "stopped":
        log.info("stopped campaigning for %s", target)


def _info_logged() -> bool:
    return log.isEnabledFor(logging.INFO)


def _tell_lost(lease_path: str, reason: str) -> None:
    """Any lease of this process lost (told on the main thread, soon after)."""
    log.warning("lease lost: %s: %s", lease_path, reason)


def _tell_lease(kind: str, target: str, generation: Optional[int]) -> None:
    """A plain lease acquired or released (the logger at INFO is on)."""
    log.info("%s %s (generation %s)", kind, target, generation)


def _tell_waiting(target: str, info: Dict[str, Any], on_waiting: Optional[Callable[[Dict[str, Any]], Any]]) -> None:
    """A plain wait's holder, found changed: to the logger and the callback."""
    log.info("waiting for %s: %s", target, info["message"])
    if on_waiting is not None:
        on_waiting(info)


class Elector:
    """Campaigns for the lease of ``target`` again and again, until stopped.

    >>> elector = sidelease.Elector("app.db")
    >>> def work(term):           # runs while this process leads
    ...     scheduler.start()
    ...     term.wait()           # until the lease is lost or stop() is called
    ...     scheduler.shutdown()
    >>> elector.start(work)       # a thread of its own; or elector.run(work)

    Leadership is per process, like the lease. ``on_event(kind, info)`` is
    called on the elector's thread for "waiting" (info: holder, holders,
    message; once at the start and whenever the holder changes), "elected"
    (generation), "lost" (reason), "stepped_down" (why: lost, released,
    stopped or error; detail), "error" (message, retry_in) and "stopped".
    """

    def __init__(
        self,
        target: Target,
        *,
        on_event: Optional[OnEvent] = None,
        suffix: str = ".backend-lease",
        metadata: Optional[Dict[str, Any]] = None,
        allow_unsupported_fs: bool = False,
        split_guard: bool = True,
        watch: bool = True,
        timeout: None = None,
    ) -> None:
        if timeout is not None:
            # `acquire`'s options, all but this one: said as Node says it,
            # not as a bare unexpected keyword.
            raise InvalidArgument(
                "invalid argument `timeout`: an elector waits until it is elected or "
                "stopped (Elector.stop(), lead's stop=, or cancelling the task: "
                "asyncio.timeout bounds a wait)"
            )
        _check_callable("on_event", on_event, optional=True)
        # The native elector keeps its listener: one without a reference
        # back to this object, which could otherwise never be collected.
        self._event = _Events(on_event)
        self._native = _native.Elector(
            target,
            on_event=self._event,
            suffix=suffix,
            metadata=metadata,
            allow_unsupported_fs=allow_unsupported_fs,
            split_guard=split_guard,
            watch=watch,
        )
        self._target = self._native.target
        self._event.target = self._target
        self._thread: Optional[threading.Thread] = None

    @property
    def target(self) -> str:
        """The target, a PostgreSQL URL's password masked."""
        return self._target

    @property
    def snapshot(self) -> Dict[str, Any]:
        """leading, generation, leader_since (Unix seconds), elections,
        losses, failures: what a service exports (a Prometheus gauge)."""
        return self._native.snapshot

    @property
    def is_leader(self) -> bool:
        """True while this process leads (the snapshot's ``leading``)."""
        return bool(self._native.snapshot["leading"])

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called: no campaign starts again."""
        return self._native.stopped

    def campaign(self) -> Optional[Term]:
        """Wait until elected (a Term) or stopped (None)."""
        return self._native.campaign()

    def step_down(self, term: Term, error: Optional[BaseException] = None) -> Tuple[str, str]:
        """End ``term`` (see :meth:`Term.step_down`), telling "lost" first
        if that is why it ended."""
        why = term.cancelled
        if why is not None and why[0] == "lost":
            self._event("lost", {"reason": why[1]})
        return term.step_down(None if error is None else _describe(error))

    def run(self, work: Callable[[Term], Any]) -> None:
        """The loop, on this thread: campaign, call ``work(term)`` while
        leading, step down when it returns or raises, again until stopped.
        ``work`` must return once ``term.cancelled`` is set (``term.wait()``
        blocks until then). KeyboardInterrupt stops the elector and
        propagates."""
        _check_callable("work", work)
        while True:
            term = self.campaign()
            if term is None:
                return
            try:
                work(term)
            except Exception as e:
                log.exception("the leader's work for %s raised", self._target)
                self.step_down(term, e)
            except BaseException:
                self.stop()
                self.step_down(term)
                raise
            else:
                self.step_down(term)

    def start(self, work: Callable[[Term], Any]) -> "Elector":
        """:meth:`run` on a daemon thread; :meth:`stop` ends it."""
        _check_callable("work", work)
        if self._thread is not None:
            raise RuntimeError("this elector was started already")
        self._thread = threading.Thread(
            target=self.run, args=(work,), name="sidelease-elector", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop campaigning; the current term's cancellation fires. With
        :meth:`start`, wait up to ``timeout`` for the work to step down."""
        self._native.stop()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def __enter__(self) -> "Elector":
        """``with sidelease.Elector(db) as elector:`` gives the elector
        itself; leaving the block stops it."""
        return self

    def __exit__(self, *exc: object) -> None:
        """:meth:`stop`, with no timeout: after :meth:`start`, wait until
        the work has stepped down. Never swallows the block's exception."""
        self.stop()


class _Events:
    def __init__(self, on_event: Optional[OnEvent]) -> None:
        self.on_event = on_event
        self.target = ""

    def __call__(self, kind: str, info: Dict[str, Any]) -> None:
        _log_event(self.target, kind, info)
        if self.on_event is not None:
            try:
                self.on_event(kind, info)
            except Exception:
                log.exception("on_event(%r) raised", kind)


def _check_callable(name: str, f: Any, optional: bool = False) -> None:
    if (f is None and optional) or callable(f):
        return
    raise TypeError(f"{name}: must be callable{' or None' if optional else ''}, not {type(f).__name__}")


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# Tests only: called on the loop right after a campaign's term is handed
# to the waiting task, before the task resumes (the window a cancel can
# hit); see tests/test_cancel.py.
_after_grant: Optional[Callable[[], None]] = None


async def _campaign_async(elector: Elector) -> Optional[Term]:
    """Campaign on a thread of its own (the loop keeps running); cancelling
    the task stops the elector and leaves nothing held by the time the
    task's awaiter resumes: a term won meanwhile, or handed over but not yet
    taken by the task, is stepped down first."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Optional[Term]] = loop.create_future()
    ended: asyncio.Future[None] = loop.create_future()  # the thread has delivered

    def deliver(result: Optional[Term], error: Optional[BaseException]) -> None:
        if not ended.done():
            ended.set_result(None)
        if fut.done():
            if result is not None:
                result.step_down()
        elif error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
            if result is not None and _after_grant is not None:
                _after_grant()

    def campaign() -> None:
        try:
            r: Optional[Term] = elector.campaign()
        except BaseException as e:
            loop.call_soon_threadsafe(deliver, None, e)
        else:
            try:
                loop.call_soon_threadsafe(deliver, r, None)
            except RuntimeError:  # the loop is closed
                if r is not None:
                    r.step_down()

    threading.Thread(target=campaign, name="sidelease-campaign", daemon=True).start()
    try:
        return await fut
    except asyncio.CancelledError:
        elector.stop()
        # The campaign ends at once once stopped; until it has delivered, a
        # term may still come. Further cancels change nothing: this one is
        # raised once nothing is held.
        while not ended.done():
            try:
                await asyncio.shield(ended)
            except asyncio.CancelledError:
                pass
        # Cancelled after the term was handed over, before this task ran.
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            term = fut.result()
            if term is not None:
                term.step_down()
        raise


def _in_loop(loop: asyncio.AbstractEventLoop, on_event: Optional[OnEvent]) -> Optional[OnEvent]:
    """Call ``on_event`` on the loop's thread."""
    if on_event is None:
        return None
    handler = on_event

    def forward(kind: str, info: Dict[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(handler, kind, info)
        except RuntimeError:
            pass  # the loop is closed

    return forward


class _Watch:
    """Cancel ``task`` when ``term``'s cancellation fires."""

    def __init__(self, loop: asyncio.AbstractEventLoop, term: Term, task: "asyncio.Task[Any]") -> None:
        self.loop, self.term, self.task = loop, term, task
        self.fired = False
        self.lost: Optional[LeaseLost] = None
        self.fd = term._cancel_fd()
        loop.add_reader(self.fd, self._fire)

    def _fire(self) -> None:
        self.close()
        self.fired = True
        why = self.term.cancelled
        if why is not None and why[0] == "lost":
            try:
                self.term.lease.ensure_held()
            except LeaseLost as e:
                self.lost = e
            if self.lost is None:
                self.lost = LeaseLost(why[1], why[1], [], os.fsdecode(self.term.lease.lease_path))
        self.task.cancel()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            self.fd = -1


class leadership:
    """``async with sidelease.leadership("app.db") as term:`` waits until
    elected (the loop keeps running), then runs the body as leader. A loss
    cancels the body and ``async with`` raises :class:`LeaseLost` (as
    ``asyncio.timeout`` raises TimeoutError); leaving the body steps down.
    Cancelling the task while it waits leaves nothing held. One term: for
    the campaign-again loop use :func:`lead`."""

    def __init__(self, target: Target, *, on_event: Optional[OnEvent] = None, **options: Any) -> None:
        _check_callable("on_event", on_event, optional=True)
        self._target = target
        self._on_event = on_event
        self._options = options
        self._elector: Optional[Elector] = None
        self._term: Optional[Term] = None
        self._watch: Optional[_Watch] = None

    async def __aenter__(self) -> Term:
        """Campaign until elected, the loop running meanwhile, and return
        the :class:`Term`; from then on a loss cancels the task running the
        body. Cancelling the task while it waits leaves nothing held."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._elector = Elector(self._target, on_event=_in_loop(loop, self._on_event), **self._options)
        term = await _campaign_async(self._elector)
        if term is None:  # stopped: only by cancelling this task, which raised
            raise asyncio.CancelledError()
        self._term = term
        self._watch = _Watch(loop, term, task)
        return term

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> Optional[bool]:
        """Stop campaigning and step down, releasing the lease (the next
        campaigner is woken at once); an exception from the body, other
        than a cancellation, is told as the term's error. When the lease
        was lost, raise :class:`LeaseLost` in place of the cancellation the
        loss caused. Never swallows the body's exception."""
        watch, term, elector = self._watch, self._term, self._elector
        assert watch is not None and term is not None and elector is not None
        watch.close()
        elector.stop()
        failed = e if e is not None and not isinstance(e, asyncio.CancelledError) else None
        elector.step_down(term, failed)
        if watch.lost is not None:
            task = asyncio.current_task()
            uncancel = getattr(task, "uncancel", None)
            if watch.fired and uncancel is not None:
                uncancel()
            raise watch.lost
        return None


async def lead(
    target: Target,
    work: Callable[[Lease], Awaitable[Any]],
    *,
    stop: Optional[asyncio.Event] = None,
    on_event: Optional[OnEvent] = None,
    **options: Any,
) -> None:
    """Lead whenever elected, until stopped: ``await sidelease.lead(db,
    work)`` runs ``await work(lease)`` as a task each time this process is
    elected; a loss cancels it (``lease.lost_reason`` says why), and when
    it ends by itself, returning or raising, the process steps down and
    campaigns again. Returns once ``stop`` is set; cancelling the call
    cancels the work and steps down. ``on_event`` runs on the loop."""
    _check_callable("work", work)
    _check_callable("on_event", on_event, optional=True)
    if stop is not None and not isinstance(stop, asyncio.Event):
        raise TypeError(f"stop: must be an asyncio.Event or None, not {type(stop).__name__}")
    loop = asyncio.get_running_loop()
    elector = Elector(target, on_event=_in_loop(loop, on_event), **options)
    stopper: Optional[asyncio.Task[Any]] = None
    if stop is not None:
        stopper = loop.create_task(_stop_when(stop, elector))
    try:
        while not elector.stopped:
            term = await _campaign_async(elector)
            if term is None:
                return
            job = loop.create_task(_call(work, term.lease))
            watch = _Watch(loop, term, job)
            failed: Optional[BaseException] = None
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                if not job.done():  # this call was cancelled, not the work
                    elector.stop()
                    job.cancel()
                    await asyncio.gather(job, return_exceptions=True)
                    raise
            except Exception as e:
                failed = e
                log.warning("the leader's work for %s raised %s", elector.target, _describe(e))
            finally:
                watch.close()
                elector.step_down(term, failed)
    finally:
        elector.stop()
        if stopper is not None:
            stopper.cancel()


async def _call(work: Callable[[Lease], Awaitable[Any]], lease: Lease) -> Any:
    return await work(lease)


async def _stop_when(event: asyncio.Event, elector: Elector) -> None:
    await event.wait()
    elector.stop()
