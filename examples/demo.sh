#!/usr/bin/env bash
# The sidelease demo: one holder, a refused contender that names it, the
# kernel's view, a crash, and a takeover that reports the unclean release.
# Builds what it needs; finishes on its own in a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet --release -p sidelease-cli
bin=target/release/sidelease

work=$(mktemp -d)
hold_pid=
cleanup() {
  [ -n "$hold_pid" ] && kill "$hold_pid" 2>/dev/null || true
  exec 3>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
db=$work/app.db
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "a holder takes the lease of $db and runs a command"
mkfifo "$work/in"
exec 3<>"$work/in"
"$bin" hold --metadata '{"app":"demo","role":"primary"}' "$db" -- \
  sh -c 'echo READY; read line' <&3 >"$work/out" &
hold_pid=$!
for _ in $(seq 1 500); do grep -q READY "$work/out" 2>/dev/null && break; sleep 0.01; done
grep -q READY "$work/out" || { echo "holder never started" >&2; exit 1; }
echo "holder: sidelease hold, pid $hold_pid"

step "a second process asks for the same database"
set +e
"$bin" hold "$db" -- true
echo "contender exit status: $? (75 = held elsewhere)"
set -e

step "who holds it, from the kernel"
set +e
"$bin" status "$db"
echo "status exit: $? (3 = held)"
set -e

step "the holder is SIGKILLed; its command inherited the lease and keeps it"
kill -KILL "$hold_pid"; wait "$hold_pid" 2>/dev/null || true; hold_pid=
set +e; "$bin" status "$db"; set -e

step "the command exits: the kernel drops the lock, the record stays"
echo > "$work/in"
for _ in $(seq 1 500); do "$bin" status "$db" >/dev/null && break; sleep 0.01; done
"$bin" status "$db"

step "a new holder takes over at once and learns the last one did not release"
"$bin" hold "$db" -- sh -c 'echo "new holder running with the lease"'
"$bin" status "$db"
