//! `acquireAsync`: a wait on tokio (no libuv pool thread), woken by the
//! inotify descriptor, and cancellable from JS.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use napi_derive::napi;
use sidelease::Pending;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use napi::threadsafe_function::ThreadsafeFunctionCallMode;

use crate::elector::{waiting_json, EventCallback};
use crate::error::to_js_async;
use crate::handles;
use crate::lease::{keep, options, NativeOptions};

/// Cancels one `acquireAsync` (index.js wires it to an AbortSignal).
#[napi]
pub struct CancelHandle {
    state: Arc<CancelState>,
}

#[derive(Default)]
pub struct CancelState {
    cancelled: AtomicBool,
    notify: Notify,
}

impl CancelState {
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

#[napi]
impl CancelHandle {
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> CancelHandle {
        CancelHandle {
            state: Arc::new(CancelState::default()),
        }
    }

    #[napi]
    pub fn cancel(&self) {
        self.state.cancel();
    }
}

/// The inotify descriptor, borrowed for tokio's reactor; `Pending` owns it
/// and outlives this registration.
struct WatchFd(RawFd);

impl AsRawFd for WatchFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The handle's number, once acquired. A wait of an environment that is
/// torn down (a terminated worker) is cancelled. `onWaiting(json)` hears
/// who holds the lease: once the wait starts and whenever that changes.
#[napi]
pub async fn acquire_async(
    env: u32,
    target: String,
    options: Option<NativeOptions>,
    cancel: &CancelHandle,
    on_waiting: Option<EventCallback>,
) -> napi::Result<f64> {
    let opts = self::options(options)
        .map_err(|e| napi::Error::new(napi::Status::GenericFailure, e.reason))?;
    let cancel = Some(cancel.state.clone());
    let mut p = Pending::new(target.as_ref(), &opts).map_err(to_js_async)?;
    if !cancel.as_ref().is_some_and(|c| handles::add_wait(env, c)) {
        return Err(to_js_async(sidelease::Error::Cancelled {
            lease_path: p.lease_path().to_path_buf(),
        }));
    }
    let deadline = p.deadline();
    let mut watch: Option<AsyncFd<WatchFd>> = None;
    let mut told = None;
    loop {
        if let Some(lease) = p.try_acquire().map_err(to_js_async)? {
            return keep(env, lease)
                .map_err(|e| napi::Error::new(napi::Status::GenericFailure, e.reason));
        }
        if let Some(tell) = on_waiting.as_ref().filter(|_| p.waits()) {
            if let Some(c) = p.holder_changed(&mut told) {
                // A closed callback (its environment torn down) is told nothing.
                let _ = tell.call(waiting_json(c), ThreadsafeFunctionCallMode::NonBlocking);
            }
        }
        let now = Instant::now();
        let remaining = match deadline {
            Some(d) if now >= d => return Err(to_js_async(p.contention_error(p.waits()))),
            Some(d) => d - now,
            None => Duration::MAX,
        };
        if watch.is_none() {
            if let Some(fd) = p.wait_fd() {
                // SAFETY: the descriptor belongs to `p`, which outlives
                // `watch` (declared after it, dropped before it).
                watch = unsafe { AsyncFd::register(WatchFd(fd.as_raw_fd())) }.ok();
            }
        }
        let sleep =
            tokio::time::sleep(p.next_check().min(remaining).min(Duration::from_secs(3600)));
        let cancelled = async {
            match &cancel {
                Some(c) => loop {
                    if c.cancelled.load(Ordering::Acquire) {
                        break;
                    }
                    c.notify.notified().await;
                },
                None => std::future::pending::<()>().await,
            }
        };
        let woke = tokio::select! {
            r = async { watch.as_ref().unwrap().readable().await }, if watch.is_some() => {
                if let Ok(mut guard) = r {
                    guard.clear_ready();
                }
                true
            }
            _ = sleep => false,
            _ = cancelled => {
                return Err(to_js_async(sidelease::Error::Cancelled { lease_path: p.lease_path().to_path_buf() }));
            }
        };
        if woke {
            p.woke();
        }
    }
}
