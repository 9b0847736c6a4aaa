//! The Tokio runtime `acquireAsync`'s waits run on (napi-rs's, configured).
//!
//! A wait's acquisition runs on a runtime worker, not on the event loop.
//! napi-rs's default runtime has a worker per core, so when many waits are
//! released together (a deployment's leases, one per tenant), every core
//! runs acquisitions and the event loop waits for a core: 256 waits released
//! together stalled a 1 ms ticker by 6-8 ms on 2 cores, against 4.1-4.6 ms
//! with one worker fewer (bench/: "256 waits released together"). One core
//! is left to the event loop; `TOKIO_WORKER_THREADS`, when set, decides.

use std::sync::Once;

static BUILT: Once = Once::new();

/// Runs as each environment (the main thread, every worker thread) loads the
/// addon; the runtime is one per process, made by the first.
#[napi_derive::module_init]
fn init() {
    BUILT.call_once(|| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all();
        if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            builder.worker_threads(cores.saturating_sub(1).max(1));
        }
        // A runtime that cannot be made here (no threads to be had) leaves
        // napi-rs to make its default one at the first wait, as before.
        if let Ok(rt) = builder.build() {
            napi::bindgen_prelude::create_custom_tokio_runtime(rt);
        }
    });
}
