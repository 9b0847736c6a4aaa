// The shared library carries a SONAME of its major ABI version, so programs
// linked against it find it again after an install.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsidelease.so.{major}");
}
