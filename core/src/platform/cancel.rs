//! Cancelling waits from another thread, on either implementation's
//! [`WakeFd`](super::wakefd::WakeFd).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use super::wakefd::WakeFd;

/// Cancels waits from another thread. Cancelling is permanent: a token that
/// was cancelled cancels every wait it is given afterwards.
#[derive(Clone)]
pub struct CancelToken {
    fd: Arc<WakeFd>,
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl CancelToken {
    /// A token not yet cancelled. Fails when no descriptor can be had for
    /// it (an eventfd on Linux, a pipe elsewhere).
    pub fn new() -> std::io::Result<CancelToken> {
        Ok(CancelToken {
            fd: Arc::new(WakeFd::new()?),
        })
    }

    /// Cancel every wait given this token (or a clone of it), now and
    /// later. Nothing drains it, so the descriptor stays readable.
    pub fn cancel(&self) {
        self.fd.ring();
    }

    /// Whether [`CancelToken::cancel`] was called on it (or a clone).
    pub fn is_cancelled(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &*self.fd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// Readable once cancelled (for event loops that wait on descriptors).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_is_sticky() {
        let t = CancelToken::new().unwrap();
        assert!(!t.is_cancelled());
        t.clone().cancel();
        assert!(t.is_cancelled());
        assert!(t.is_cancelled());
    }
}
