#!/usr/bin/env bash
# The sidelease demo: a Python backend holds the lease of its database; a
# Bun server, a Node server and a C daemon are each refused, naming it; the
# kernel's view; the Python holder is SIGKILLed; a Node process takes over at
# once and learns that the previous holder did not release cleanly.
#
# Sets everything up first (tools, the Rust build, the Python package, the
# Node addon); the demo itself then runs in a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH="$HOME/.cargo/bin:$PATH"

echo "== setting up (first run builds everything; later runs are quick)"
bash tests/setup.sh
cargo build --quiet --release --locked -p sidelease-cli -p sidelease-c
make -s -C bindings-c all >/dev/null
.venv/bin/pip install --quiet --force-reinstall --no-deps ./bindings-python
(cd bindings-node && npx napi build --platform --release --dts native.d.ts --no-js >/dev/null)
mkdir -p target/demo
cc -std=c11 -Wall -Werror -Iinclude examples/c/daemon.c -Ltarget/release -lsidelease \
   -Wl,-rpath,"$root/target/release" -o target/demo/c-daemon

sidelease=target/release/sidelease
bun=bindings-node/node_modules/@oven/bun-linux-x64/bin/bun
work=$(mktemp -d)
holder=
cleanup() {
  [ -n "$holder" ] && kill -KILL "$holder" 2>/dev/null || true
  exec 3>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
db=$work/app.db
# Bold headings on a terminal only.
if [ -t 1 ]; then
  step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  step() { printf '\n== %s\n' "$*"; }
fi

step "a Python backend takes the lease of $db"
mkfifo "$work/in"
exec 3<>"$work/in"
.venv/bin/python -c '
import sys, sidelease
lease = sidelease.acquire(sys.argv[1], metadata={"app": "fastapi-backend"})
print("python: pid", lease.record["pid"], "holds", lease.lease_path, "generation", lease.generation, flush=True)
sys.stdin.read()
' "$db" <&3 >"$work/holder.out" &
holder=$!
for _ in $(seq 1 500); do grep -q holds "$work/holder.out" 2>/dev/null && break; sleep 0.01; done
cat "$work/holder.out"

step "a Bun server, a Node server and a C daemon ask for the same database"
export SIDELEASE_INDEX=$root/bindings-node/index.js SIDELEASE_DB=$db
contend='
const { acquire } = require(process.env.SIDELEASE_INDEX);
const who = process.versions.bun ? "bun" : "node";
try { acquire(process.env.SIDELEASE_DB); console.log(`${who}: acquired?!`); process.exit(1); }
catch (e) { console.log(`${who}: refused (${e.code}): ${e.message}`); }
'
"$bun" -e "$contend"
node -e "$contend"
set +e
target/demo/c-daemon "$db"
echo "c: daemon exited with status $? (75 = another instance owns it)"
set -e

step "who holds it, from the kernel (sidelease status)"
set +e; "$sidelease" status "$db"; echo "(exit status $?: 3 = held)"; set -e

step "an operator moves the live lease file aside (mv): the holder puts a locked one back at once"
mv "$db.backend-lease" "$db.backend-lease.old"
for _ in $(seq 1 500); do [ -e "$db.backend-lease" ] && break; sleep 0.01; done
ls "$work" | grep backend-lease | sed 's/^/  /'
"$bun" -e "$contend"

step "someone deletes it (rm): still exactly one holder"
rm "$db.backend-lease"
for _ in $(seq 1 500); do [ -e "$db.backend-lease" ] && break; sleep 0.01; done
node -e "$contend"
set +e; "$sidelease" status "$db"; echo "(exit status $?: 3 = held, by the same Python process)"; set -e

step "the Python backend is SIGKILLed: no cleanup, the kernel drops the lock"
kill -KILL "$holder"; wait "$holder" 2>/dev/null || true; holder=
set +e; "$sidelease" status "$db"; set -e

step "a Node server takes over at once and learns the last holder did not release"
node -e '
const { acquire } = require(process.env.SIDELEASE_INDEX);
const t = Date.now();
const lease = acquire(process.env.SIDELEASE_DB, { timeout: 5000, metadata: { app: "node-backend" } });
const p = lease.previous;
console.log(`node: acquired in ${Date.now() - t} ms, generation ${lease.generation}`);
console.log(`node: previous holder pid ${p.pid} (${p.runtime}) released cleanly: ${lease.previousReleasedCleanly}`);
if (lease.previousReleasedCleanly === false) console.log("node: running crash recovery before serving");
lease.release();
'
"$sidelease" status "$db"
