# Sourced by packaging/cross and tests/cross-targets: the toolchain and, per
# target, the settings every build for it shares (the same flags, so the
# target's standard library is built once). Expects $root.
# Debian's cargo and rustc (the toolchain whose sysroot has the library
# sources) before rustup's; the venv's python first, for `python -m ziglang`.
mkdir -p "$root/target/cross-bin"
for t in cargo rustc rustdoc; do ln -sf "/usr/bin/$t" "$root/target/cross-bin/$t"; done
export PATH="$root/target/cross-bin:$root/.venv/bin:$PATH"
export RUSTC_BOOTSTRAP=1 CARGO_UNSTABLE_BUILD_STD=std,panic_abort CARGO_TARGET_DIR="$root/target/cross"
unset RUSTFLAGS
# A cargo that only prints its environment, for zig_env below (for a macOS
# target cargo-zigbuild reads the workspace's metadata first: the real one).
printf '#!/bin/sh\n[ "$1" = metadata ] && exec "%s/target/cross-bin/cargo" "$@"\nexec env -0\n' "$root" > "$root/target/cross-bin/env-dump"
chmod +x "$root/target/cross-bin/env-dump"

# cross_env TARGET: sets arch, triple (Rust's), zig_triple (what
# cargo-zigbuild is given: glibc's version rides on it) and npm_platform,
# and exports the target's flags and linker.
cross_env() {
  local t=$1 var
  arch=${t%%-*}
  case "$t" in
    *-linux-gnu)   triple="$arch-unknown-linux-gnu"; zig_triple="$triple.2.17" ;;
    *-linux-musl)  triple="$arch-unknown-linux-musl"; zig_triple="$triple" ;;
    *-apple-darwin) triple="$arch-apple-darwin"; zig_triple="$triple" ;;
    *) echo "cross_env: unknown target $t" >&2; return 2 ;;
  esac
  # The name npm and napi-rs give the platform: @sidelease/$npm_platform.
  local cpu=${arch/aarch64/arm64}; cpu=${cpu/x86_64/x64}
  case "$t" in
    *-linux-gnu) npm_platform=linux-$cpu-gnu ;;
    *-linux-musl) npm_platform=linux-$cpu-musl ;;
    *-apple-darwin) npm_platform=darwin-$cpu ;;
  esac
  var=CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS
  # Left from a macOS target before it, it would only rebuild C code.
  unset MACOSX_DEPLOYMENT_TARGET
  case "$t" in
    # build-std brings no self-contained crt objects: zig's are used. A
    # shared library cannot carry the static C runtime (cargo refuses a
    # cdylib otherwise); packaging/cross links the CLI static on its own.
    *-linux-musl) export "$var=-C link-self-contained=no -C target-feature=-crt-static" ;;
    # The framework stubs for the linker; the oldest macOS each
    # architecture's Rust supports.
    *-apple-darwin)
      export "$var=-C link-arg=-F$root/packaging/macos"
      if [ "$arch" = aarch64 ]; then export MACOSX_DEPLOYMENT_TARGET=11.0; else export MACOSX_DEPLOYMENT_TARGET=10.12; fi ;;
  esac
  zig_env
}

# zig_env: exports what cargo-zigbuild sets for $zig_triple (the target's
# linker, C compiler, archiver: its zig wrappers), learned by running it with
# a cargo that prints its environment. Every build for the target, cargo's
# and maturin's, then links through the same wrapper. Cargo's fingerprints
# hash the linker's path, and maturin --zig brings wrappers of its own: with
# two linkers, each build threw away the other's standard library and
# dependencies and built them again (2.5 minutes a target).
zig_env() {
  local kv var
  var=CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_LINKER
  # Only what cargo-zigbuild says now counts, not one the caller had.
  unset "$var"
  while IFS= read -r -d '' kv; do
    case "$kv" in
      AR_*=*|CC_*=*|CXX_*=*|RANLIB_*=*|CARGO_TARGET_*_LINKER=*|CARGO_ZIGBUILD_*=*|CMAKE_TOOLCHAIN_FILE_*=*|BINDGEN_EXTRA_CLANG_ARGS_*=*)
        export "${kv?}" ;;
    esac
  done < <(CARGO="$root/target/cross-bin/env-dump" cargo-zigbuild build --target "$zig_triple")
  [ -n "${!var:-}" ] || { echo "cross_env: cargo-zigbuild set no linker for $triple" >&2; return 1; }
}
