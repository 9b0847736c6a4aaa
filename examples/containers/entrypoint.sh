#!/bin/sh
# A backend container's entrypoint: the server runs under its database's
# lease, taken on the volume the database lives on (DATA, /data in the
# image), never in the image's own layers. exec makes `hold` the
# container's PID 1: `docker stop`'s SIGTERM reaches it, it passes the
# signal to the server and releases once the server has exited. A second
# replica started meanwhile waits up to LEASE_WAIT seconds (60) for the
# lease, then exits 75 and its restart policy tries again.
set -eu
exec sidelease hold --timeout "${LEASE_WAIT:-60}" "${DATA:-/data}/app.db" -- "$@"
