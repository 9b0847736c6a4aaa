"""A FastAPI app under `gunicorn -w 4 -k uvicorn.workers.UvicornWorker` whose
APScheduler jobs run in exactly one worker: every worker campaigns, and only
the elected one starts the scheduler. Kill it and another worker takes over
within milliseconds; gunicorn's replacement joins as a follower.

APP_DB names the database (or a postgresql://…?lease=NAME URL for workers on
several hosts); the job appends one line per tick to APP_TICKS. /metrics is
the elector's snapshot for Prometheus.
"""

from __future__ import annotations

import os
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict, Iterator

from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import sidelease

DB = os.environ["APP_DB"]
TICKS = os.environ["APP_TICKS"]
EVERY = float(os.environ.get("APP_TICK_SECONDS", "0.2"))


def tick() -> None:
    # O_APPEND: the lines of several processes never mix.
    fd = os.open(TICKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def lead(term: sidelease.Term) -> None:
    """While this worker leads: the scheduler runs, until the lease is lost
    or the worker stops; a tick in progress ends before the lease is let go."""
    scheduler = BackgroundScheduler()
    scheduler.add_job(tick, "interval", seconds=EVERY, max_instances=1, coalesce=True)
    scheduler.start()
    try:
        term.wait()
    finally:
        scheduler.shutdown(wait=True)


class ElectorMetrics:
    """The elector's snapshot at each scrape."""

    def __init__(self, elector: sidelease.Elector) -> None:
        self.elector = elector

    def collect(self) -> Iterator[Metric]:
        s = self.elector.snapshot
        yield GaugeMetricFamily("sidelease_leader", "1 while this worker leads", value=1 if s["leading"] else 0)
        yield GaugeMetricFamily("sidelease_generation", "the lease generation of the current or last term",
                                value=s["generation"] or 0)
        yield CounterMetricFamily("sidelease_elections", "terms this worker won", value=s["elections"])
        yield CounterMetricFamily("sidelease_losses", "terms that ended with the lease lost", value=s["losses"])


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    elector = sidelease.Elector(DB, metadata={"app": "scheduler"})
    registry = CollectorRegistry()
    registry.register(ElectorMetrics(elector))  # type: ignore[arg-type]
    app.state.elector, app.state.registry = elector, registry
    elector.start(lead)
    try:
        yield
    finally:
        elector.stop(timeout=10)


app = FastAPI(lifespan=lifespan)


@app.get("/health")
def health() -> Dict[str, Any]:
    return {"pid": os.getpid(), "leader": app.state.elector.is_leader}


@app.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(app.state.registry), media_type=CONTENT_TYPE_LATEST)
