#!/usr/bin/env bash
# Installs the tools the test suites need, if missing. Idempotent; called by
# tests/run, so the README's test command works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
CBINDGEN_VERSION=0.29.2
# The linker of the wheel and of every target packaging/cross builds.
ZIG_VERSION=0.14.1
ZIGBUILD_VERSION=0.24.1
# The documentation site's builder (tests/docs).
MKDOCS_VERSION=1.6.1
# Its snippets extension: how-to pages show the tested examples' own files.
PYMDOWN_VERSION=13.1.2

have() { command -v "$1" >/dev/null 2>&1; }
apt_install() {
  if [ -z "${SIDELEASE_APT_UPDATED:-}" ]; then apt-get update -qq; export SIDELEASE_APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# cbindgen compiles (2.5 minutes optimized, under one unoptimized: it only
# reads bindings-c/src, in well under a second either way) while the
# installs below wait on the network; the script waits for it at the end.
cbindgen_pid=
if ! have cbindgen || [ "$(cbindgen --version)" != "cbindgen $CBINDGEN_VERSION" ]; then
  echo "setup: installing cbindgen $CBINDGEN_VERSION"
  cargo install --quiet --locked --debug cbindgen --version "$CBINDGEN_VERSION" &
  cbindgen_pid=$!
  # A failure below ends the script: the build goes with it.
  trap '[ -z "$cbindgen_pid" ] || kill "$cbindgen_pid" 2>/dev/null || true' EXIT
fi
have valgrind || { echo "setup: installing valgrind"; apt_install valgrind; }
have pkg-config || { echo "setup: installing pkg-config"; apt_install pkg-config; }
have cc || { echo "setup: installing gcc"; apt_install gcc; }
have make || { echo "setup: installing make"; apt_install make; }
have ip || { echo "setup: installing iproute2 (network namespaces for the partition checks)"; apt_install iproute2; }

# --cross: what packaging/cross builds other targets with and what runs
# them here (docs/platforms.md): Debian's rustc-web 1.96, whose sysroot has
# the standard library's sources (for -Zbuild-std); zig and cargo-zigbuild,
# pinned, from PyPI, as the linker of every target; qemu-user and an arm64
# glibc to run arm64 Linux programs; musl's loader and musl-gcc.
cross=
[ "${1:-}" = --cross ] && cross=1
if [ -n "$cross" ]; then
  # Debian's plain rustc is older and has no library sources: rustc-web's.
  /usr/bin/rustc --version 2>/dev/null | grep -q '^rustc 1\.9[6-9]' && [ -d /usr/lib/rustlib/src/rust/library ] \
    || { echo "setup: installing rustc-web, cargo-web, rust-web-src"; apt_install rustc-web cargo-web rust-web-src; }
  have qemu-aarch64-static || { echo "setup: installing qemu-user-static"; apt_install qemu-user-static; }
  [ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || { echo "setup: installing libc6-arm64-cross"; apt_install libc6-arm64-cross; }
  have musl-gcc || { echo "setup: installing musl-tools"; apt_install musl musl-tools musl-dev; }
  # Bun's arm64 build, the version bindings-node/package.json pins for x64, to
  # run the Node suite's Bun part under qemu (tests/cross-targets). Not a
  # dependency: npm installs a package only on the CPU it names.
  bun_version=$(sed -n 's/.*"@oven\/bun-linux-x64": "\(.*\)".*/\1/p' bindings-node/package.json)
  if [ ! -x "target/cross-tools/bun-linux-aarch64-$bun_version/bin/bun" ]; then
    echo "setup: fetching @oven/bun-linux-aarch64@$bun_version"
    t=$(mktemp -d)
    (cd "$t" && npm pack --silent "@oven/bun-linux-aarch64@$bun_version" >/dev/null && tar -xzf ./*.tgz)
    mkdir -p target/cross-tools
    rm -rf "target/cross-tools/bun-linux-aarch64-$bun_version"
    mv "$t/package" "target/cross-tools/bun-linux-aarch64-$bun_version"
    rm -rf "$t"
  fi
fi

# Python: a virtualenv with the build and test tools (FastAPI and uvicorn
# are example/test dependencies only).
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import maturin, pytest, mypy, fastapi, uvicorn, typing_extensions" 2>/dev/null; then
  echo "setup: installing Python test tools into .venv"
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet "maturin==1.16.0" "pytest>=8" "mypy>=1.18" fastapi uvicorn typing_extensions
fi
# The gunicorn + APScheduler example's pinned dependencies.
if ! .venv/bin/python -c "import gunicorn, apscheduler, prometheus_client" 2>/dev/null; then
  echo "setup: installing the gunicorn example's dependencies into .venv"
  .venv/bin/pip install --quiet -r examples/gunicorn-scheduler/requirements.txt
fi
# The Celery beat example's pinned dependency.
if ! .venv/bin/python -c "import celery" 2>/dev/null; then
  echo "setup: installing the Celery beat example's dependencies into .venv"
  .venv/bin/pip install --quiet -r examples/celery-beat/requirements.txt
fi

# MkDocs, pinned, for the documentation site (tests/docs).
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('mkdocs') != '$MKDOCS_VERSION')" 2>/dev/null; then
  echo "setup: installing mkdocs $MKDOCS_VERSION into .venv"
  .venv/bin/pip install --quiet "mkdocs==$MKDOCS_VERSION"
fi
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('pymdown-extensions') != '$PYMDOWN_VERSION')" 2>/dev/null; then
  echo "setup: installing pymdown-extensions $PYMDOWN_VERSION into .venv"
  .venv/bin/pip install --quiet "pymdown-extensions==$PYMDOWN_VERSION"
fi
# systemd-analyze, for the systemd units' test (examples/systemd).
have systemd-analyze || { echo "setup: installing systemd (systemd-analyze)"; apt_install systemd; }

# Node and Bun: napi-rs CLI and the Bun binary come from the lockfile.
if [ ! -x bindings-node/node_modules/.bin/napi ] || [ ! -x bindings-node/node_modules/@oven/bun-linux-x64/bin/bun ]; then
  echo "setup: npm ci in bindings-node"
  (cd bindings-node && npm ci --no-audit --no-fund --loglevel=error)
fi
# The node-cron example's pinned dependencies (node-cron, PM2), from its
# lockfile.
if [ ! -f examples/js-scheduler/node_modules/node-cron/package.json ] ||
   [ ! -f examples/js-scheduler/node_modules/pm2/package.json ]; then
  echo "setup: npm ci in examples/js-scheduler"
  (cd examples/js-scheduler && npm ci --no-audit --no-fund --loglevel=error)
fi
# zig links the manylinux wheel (packaging/build) and every other target
# (packaging/cross); the same pinned zig for both.
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('ziglang') != '$ZIG_VERSION')" 2>/dev/null \
   || [ "$(.venv/bin/cargo-zigbuild --version 2>/dev/null)" != "cargo-zigbuild $ZIGBUILD_VERSION" ]; then
  echo "setup: installing zig $ZIG_VERSION and cargo-zigbuild $ZIGBUILD_VERSION into .venv"
  .venv/bin/pip install --quiet "ziglang==$ZIG_VERSION" "cargo-zigbuild==$ZIGBUILD_VERSION"
fi

if [ -n "$cbindgen_pid" ]; then
  status=0
  wait "$cbindgen_pid" || status=$?
  cbindgen_pid=
  [ "$status" = 0 ] || { echo "setup: installing cbindgen $CBINDGEN_VERSION failed" >&2; exit 1; }
fi
