"""A FastAPI backend that owns its SQLite database through sidelease.

    APP_DB=app.db uvicorn app:app --port 8000

The lifespan takes the lease before serving and releases it after; a second
instance on the same database refuses to start, naming the first. Crash
recovery (marking jobs left running as interrupted) runs only when the
previous holder did not release cleanly.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from typing import Any, AsyncIterator, Dict

from fastapi import FastAPI

import sidelease

DB = os.environ.get("APP_DB", "app.db")


def connect() -> sqlite3.Connection:
    conn = sqlite3.connect(DB)
    conn.execute("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
    return conn


def recover() -> int:
    """Jobs a crashed predecessor left running will never finish."""
    with contextlib.closing(connect()) as conn, conn:
        return conn.execute("UPDATE jobs SET state = 'interrupted' WHERE state = 'running'").rowcount


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        lease = await sidelease.acquire_async(DB, metadata={"app": "fastapi-example"})
    except sidelease.LeaseInUse as e:
        print(f"refusing to start: {e}", file=sys.stderr, flush=True)
        raise
    app.state.lease = lease
    app.state.recovered = 0 if lease.previous_released_cleanly else recover()
    try:
        yield
    finally:
        lease.release()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
def health() -> Dict[str, Any]:
    lease = app.state.lease
    return {
        "pid": os.getpid(),
        "generation": lease.generation,
        "previous_released_cleanly": lease.previous_released_cleanly,
        "recovered": app.state.recovered,
        "lease": lease.check(),
    }


@app.post("/jobs")
def start_job() -> Dict[str, Any]:
    with contextlib.closing(connect()) as conn, conn:
        job = conn.execute("INSERT INTO jobs (state) VALUES ('running')").lastrowid
    return {"id": job, "state": "running"}
