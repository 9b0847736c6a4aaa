//! The Tokio runtime `acquireAsync`'s waits run on (napi-rs's, configured).
//!
//! A wait's acquisition runs on a runtime worker, not on the event loop.
//! napi-rs's default runtime has a worker per core, so when many waits are
//! released together (a deployment's leases, one per tenant), every core
//! runs acquisitions and the event loop waits for a core: 256 waits released
//! together stalled a 1 ms ticker by 4.6-7.5 ms on 2 cores, against 4.3-5.1
//! ms with one worker fewer (bench/: "256 waits released together"). One core
//! is left to the event loop; `TOKIO_WORKER_THREADS`, when set to a positive
//! number, decides (any other value is not one, and is passed over).

use std::sync::Once;

static BUILT: Once = Once::new();

/// Runs once per process, as the library is loaded (a constructor). napi-rs
/// keeps the runtime while any environment has the addon loaded and shuts it
/// down with the last; one loaded after that (only worker threads ever
/// loading it, each in turn) gets napi-rs's default runtime, a worker per
/// core, which reads `TOKIO_WORKER_THREADS` as tokio does.
#[napi_derive::module_init]
fn init() {
    BUILT.call_once(|| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        // Always set: left unset, tokio reads TOKIO_WORKER_THREADS itself
        // and panics on a value that is not a positive number, which here
        // would end the process as it loads the addon.
        builder.enable_all().worker_threads(workers(
            std::env::var("TOKIO_WORKER_THREADS").ok().as_deref(),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ));
        // A runtime whose I/O driver cannot be made here leaves napi-rs to
        // make its default one as the addon registers, as before.
        if let Ok(rt) = builder.build() {
            napi::bindgen_prelude::create_custom_tokio_runtime(rt);
        }
    });
}

/// How many workers: `TOKIO_WORKER_THREADS` when it is a positive number,
/// else one fewer than the cores, at least one.
fn workers(env: Option<&str>, cores: usize) -> usize {
    match env.and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(n) if n > 0 => n,
        _ => cores.saturating_sub(1).max(1),
    }
}
