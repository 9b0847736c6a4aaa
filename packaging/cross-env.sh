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

# cross_env TARGET: sets arch, triple (Rust's) and zig_triple (what
# cargo-zigbuild is given: glibc's version rides on it), and exports the
# target's flags.
cross_env() {
  local t=$1 var
  arch=${t%%-*}
  case "$t" in
    *-linux-gnu)   triple="$arch-unknown-linux-gnu"; zig_triple="$triple.2.17" ;;
    *-linux-musl)  triple="$arch-unknown-linux-musl"; zig_triple="$triple" ;;
    *-apple-darwin) triple="$arch-apple-darwin"; zig_triple="$triple" ;;
    *) echo "cross_env: unknown target $t" >&2; return 2 ;;
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
}
