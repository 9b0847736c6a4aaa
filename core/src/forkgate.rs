//! Fork safety. A child must never keep a lease alive unknowingly, so the
//! child handler closes every lease descriptor it inherited. That only works
//! if no descriptor is ever open without being listed where the handler can
//! find it: opening-and-listing and unlisting-and-closing are *windows*, and
//! the prepare handler (run in the forking thread just before `fork`) waits
//! until no window is open, while new windows wait for the fork to finish.
//!
//! The handlers take no lock and allocate nothing: atomics, `close`, and
//! `sched_yield`.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Once;
use std::time::{Duration, Instant};

static WINDOWS: AtomicUsize = AtomicUsize::new(0);
static FORKING: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

/// How long a fork waits for open windows before going ahead. Windows last
/// microseconds; the bound only matters if a signal handler forks while its
/// own thread is inside a window, which must not deadlock.
const PREPARE_BOUND: Duration = Duration::from_millis(200);

/// Register the fork handlers (once per process).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: the three handlers are async-signal-safe (atomics, close,
        // sched_yield), which is what pthread_atfork handlers must be.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// Run `f` (which opens and lists, or unlists and closes, a descriptor) so
/// that no fork can split it.
pub(crate) fn window<T>(f: impl FnOnce() -> T) -> T {
    loop {
        while FORKING.load(SeqCst) != 0 {
            rustix::thread::sched_yield();
        }
        WINDOWS.fetch_add(1, SeqCst);
        if FORKING.load(SeqCst) == 0 {
            break;
        }
        WINDOWS.fetch_sub(1, SeqCst);
    }
    struct Exit;
    impl Drop for Exit {
        fn drop(&mut self) {
            WINDOWS.fetch_sub(1, SeqCst);
        }
    }
    let _exit = Exit;
    f()
}

extern "C" fn prepare() {
    FORKING.fetch_add(1, SeqCst);
    if WINDOWS.load(SeqCst) == 0 {
        return;
    }
    let start = Instant::now();
    while WINDOWS.load(SeqCst) != 0 && start.elapsed() < PREPARE_BOUND {
        rustix::thread::sched_yield();
    }
}

extern "C" fn parent() {
    FORKING.fetch_sub(1, SeqCst);
}

extern "C" fn child() {
    // Only the forking thread exists here: no window is open, no fork runs.
    WINDOWS.store(0, SeqCst);
    FORKING.store(0, SeqCst);
    crate::registry::after_fork_in_child();
    crate::backend::after_fork_in_child();
    crate::platform::process::forget_pid_after_fork();
}
