#!/usr/bin/env bash
# Installs the tools the test suites need, if missing. Idempotent; called by
# tests/run, so the README's test command works on a fresh machine.
set -euo pipefail
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
