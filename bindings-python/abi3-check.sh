#!/usr/bin/env bash
# The one abi3 wheel imports and works on every other CPython found here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/.venv/bin/maturin" build --quiet --release -m "$root/bindings-python/Cargo.toml" -o "$work/wheels" 
wheel=$(ls "$work"/wheels/*.whl)
case "$wheel" in *-cp39-abi3-*) ;; *) echo "not an abi3 wheel: $wheel" >&2; exit 1 ;; esac
n=0
for py in "$HOME"/.pyenv/versions/3.9*/bin/python3 "$HOME"/.pyenv/versions/3.13*/bin/python3; do
  [ -x "$py" ] || continue
  v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  "$py" -m venv "$work/venv-$v"
  "$work/venv-$v/bin/pip" install --quiet --no-index "$wheel"
  "$work/venv-$v/bin/python" - "$work/app.db" <<'PY'
import sys, sidelease
with sidelease.acquire(sys.argv[1]) as lease:
    assert lease.record["runtime"].startswith("python %d.%d" % sys.version_info[:2]), lease.record
    assert sidelease.inspect(sys.argv[1])["record_status"] == "self"
PY
  echo "abi3 wheel works on CPython $v"
  n=$((n + 1))
done
echo "abi3: $n passed, 0 failed"
