#!/usr/bin/env bash
# Installs the tools the test suites need, if missing. Idempotent; called by
# tests/run, so the README's test command works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
CBINDGEN_VERSION=0.29.2

have() { command -v "$1" >/dev/null 2>&1; }
apt_install() {
  if [ -z "${SIDELEASE_APT_UPDATED:-}" ]; then apt-get update -qq; export SIDELEASE_APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! have cbindgen || [ "$(cbindgen --version)" != "cbindgen $CBINDGEN_VERSION" ]; then
  echo "setup: installing cbindgen $CBINDGEN_VERSION"
  cargo install --quiet --locked cbindgen --version "$CBINDGEN_VERSION"
fi
have valgrind || { echo "setup: installing valgrind"; apt_install valgrind; }
have pkg-config || { echo "setup: installing pkg-config"; apt_install pkg-config; }
have cc || { echo "setup: installing gcc"; apt_install gcc; }
have make || { echo "setup: installing make"; apt_install make; }
have ip || { echo "setup: installing iproute2 (network namespaces for the partition checks)"; apt_install iproute2; }

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

# Node and Bun: napi-rs CLI and the Bun binary come from the lockfile.
if [ ! -x bindings-node/node_modules/.bin/napi ] || [ ! -x bindings-node/node_modules/@oven/bun-linux-x64/bin/bun ]; then
  echo "setup: npm ci in bindings-node"
  (cd bindings-node && npm ci --no-audit --no-fund --loglevel=error)
fi
# The node-cron example's pinned dependency, from its lockfile.
if [ ! -f examples/js-scheduler/node_modules/node-cron/package.json ]; then
  echo "setup: npm ci in examples/js-scheduler"
  (cd examples/js-scheduler && npm ci --no-audit --no-fund --loglevel=error)
fi
