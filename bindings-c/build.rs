// The shared library names itself by its major ABI version, so programs
// linked against it find it again after an install: a SONAME on ELF
// systems, an `@rpath` install name on macOS (the program's rpath, or the
// directory beside it, says where).
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "macos" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/libsidelease.{major}.dylib");
    } else {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsidelease.so.{major}");
    }
}
