#!/usr/bin/env bash
# Installs libsidelease into a temporary prefix, builds the daemon through
# pkg-config against that install, and checks that a second instance is
# refused naming the first, and that SIGTERM releases. Extra compiler flags
# (for example sanitizers) come from SIDELEASE_CFLAGS. With SIDELEASE_PREFIX
# (an unpacked release tarball) it builds against that instead, links the
# static library too, and needs no Rust toolchain.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

if [ -n "${SIDELEASE_PREFIX:-}" ]; then
  prefix=$SIDELEASE_PREFIX
else
  make -s -C "$root/bindings-c" install PREFIX="$work/prefix" >/dev/null
  prefix=$work/prefix
fi
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
libdir=$(pkg-config --variable=libdir sidelease)
test "$(pkg-config --modversion sidelease)" = "$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror ${SIDELEASE_CFLAGS:-} "$here/daemon.c" $(pkg-config --cflags --libs sidelease) \
   -Wl,-rpath,"$libdir" -o "$work/daemon"
readelf -d "$work/daemon" | grep -q 'NEEDED.*libsidelease.so.0' || { echo "not linked to the SONAME" >&2; exit 1; }
# Without the rpath the loader does not look in this prefix: the program
# does not start, and says why (docs/c.md).
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$here/daemon.c" $(pkg-config --cflags --libs sidelease) -o "$work/daemon-no-rpath"
# (No argument: a daemon the loader did start, from a copy of the library
# it knows of, prints its usage and exits rather than running.)
if ldconfig -p 2>/dev/null | grep -q 'libsidelease\.so\.0'; then
  echo "examples/c: the loader knows a libsidelease.so.0 of its own: the no-rpath check is skipped"
elif out=$(env -u LD_LIBRARY_PATH timeout 10 "$work/daemon-no-rpath" 2>&1); then
  echo "the daemon ran without an rpath to its library" >&2; exit 1
else
  echo "$out" | grep -q "libsidelease.so.0" \
    || { echo "$out" >&2; echo "no loader error naming libsidelease.so.0" >&2; exit 1; }
fi

mkdir "$work/data"
"$work/daemon" "$work/data" >"$work/a.out" 2>&1 &
a=$!; pids+=("$a")
for _ in $(seq 1 500); do grep -q "owns" "$work/a.out" && break; sleep 0.01; done
grep -q "daemon: pid $a owns" "$work/a.out" || { cat "$work/a.out"; echo "first daemon did not start" >&2; exit 1; }

set +e
"$work/daemon" "$work/data" >"$work/b.out" 2>&1
b_status=$?
set -e
test "$b_status" = 75 || { cat "$work/b.out"; echo "second daemon exited $b_status, not 75" >&2; exit 1; }
# The holder by PID, runtime and the metadata the daemon gave.
grep -qF "is leased by pid $a (c, {\"app\":\"c-daemon\"})" "$work/b.out" || { cat "$work/b.out"; echo "refusal does not name pid $a and its metadata" >&2; exit 1; }

kill -TERM "$a"
wait "$a"
grep -q "daemon: released" "$work/a.out"
if [ -n "${SIDELEASE_PREFIX:-}" ]; then
  # The static library: no libsidelease at run time.
  # shellcheck disable=SC2046
  cc -std=c11 -Wall -Werror "$here/daemon.c" $(pkg-config --cflags sidelease) "$libdir/libsidelease.a" \
     $(pkg-config --libs-only-l --static sidelease | sed 's/-lsidelease//') -o "$work/daemon-static"
  if readelf -d "$work/daemon-static" | grep -q 'NEEDED.*libsidelease'; then echo "static build needs libsidelease" >&2; exit 1; fi
  "$work/daemon-static" "$work/data" >"$work/s.out" 2>&1 &
  s=$!; pids+=("$s")
  for _ in $(seq 1 500); do grep -q "owns" "$work/s.out" && break; sleep 0.01; done
  grep -q "daemon: pid $s owns" "$work/s.out" || { cat "$work/s.out"; echo "static daemon did not start" >&2; exit 1; }
  kill -TERM "$s"
  wait "$s"
  grep -q "daemon: released" "$work/s.out"
  echo "examples/c (from $prefix): 1 passed, 0 failed"
  exit 0
fi
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p sidelease-cli
"$root/target/release/sidelease" status "$work/data" >/dev/null   # exit 0: free
echo "examples/c: 1 passed, 0 failed"
