"""`Lease.wait_lost()`: wait on the event loop for a lease to be lost."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Optional

from ._errors import LeaseLost

if TYPE_CHECKING:
    from ._native import Lease


async def wait_lost(lease: "Lease") -> Optional[LeaseLost]:
    """Return the LeaseLost error once the lease is lost, or None if it is
    released first. No thread: the loop watches the lease's descriptor."""
    loop = asyncio.get_running_loop()
    fd = lease._lost_fd()
    while lease.state == "held":
        fut: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        loop.add_reader(fd, ready)
        try:
            if lease.state == "held":
                await fut
        finally:
            loop.remove_reader(fd)
    if lease.lost:
        try:
            lease.ensure_held()
        except LeaseLost as e:
            return e
    return None
