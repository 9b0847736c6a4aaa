fn main() {
    napi_build::setup();
    // On macOS the linker would record the build directory as the addon's
    // install name; Node loads it by path, so name it by its file instead,
    // as napi-rs's own builds do, with no path of this machine in it.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/libsidelease_node.dylib");
    }
}
