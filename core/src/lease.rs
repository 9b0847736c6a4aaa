//! A held lease and the handles that share it.

use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::acquire::Pending;
use crate::error::{Error, Result};
use crate::options::Options;
use crate::platform::notify::CancelToken;
use crate::record::{self, Content, Record};
use crate::registry::{self, Key};

/// One lease held by this process: the locked descriptor and what was
/// written. Shared by every handle of the lease; closed by the last release.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) fd: RawFd,
    pub(crate) slot: u32,
    pub(crate) key: Key,
    pub(crate) epoch: u64,
    pub(crate) writable: bool,
    pub(crate) target: PathBuf,
    pub(crate) lease_path: PathBuf,
    pub(crate) record: Record,
    /// The record as written, so the release only appends `released_at`.
    pub(crate) line: Vec<u8>,
    pub(crate) previous: Content,
}

/// Does the lease path still name the locked file?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The path names the locked inode.
    Held,
    /// The locked file was unlinked and nothing replaced it.
    Unlinked,
    /// The path now names another file.
    Replaced,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Held => "held",
            Check::Unlinked => "unlinked",
            Check::Replaced => "replaced",
        }
    }
}

/// A handle on a lease. Dropping it releases it; several handles of one
/// process may share one lease, which ends with the last release.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    released: AtomicBool,
}

impl Lease {
    /// Acquire the lease of `target` (see DESIGN §3), waiting as
    /// `options.wait` says.
    pub fn acquire(target: impl AsRef<Path>, options: &Options) -> Result<Lease> {
        Pending::new(target.as_ref(), options)?.wait(None)
    }

    /// As [`Lease::acquire`], and a `cancel` from another thread ends the
    /// wait with [`Error::Cancelled`].
    pub fn acquire_cancellable(
        target: impl AsRef<Path>,
        options: &Options,
        cancel: &CancelToken,
    ) -> Result<Lease> {
        Pending::new(target.as_ref(), options)?.wait(Some(cancel))
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Lease {
        Lease {
            shared,
            released: AtomicBool::new(false),
        }
    }

    /// Release this handle's share. The last release of a lease records
    /// `released_at` and closes the descriptor, which drops the lock; the
    /// file stays. A second call is a no-op. In a forked child the handle is
    /// already dead (the fork handler closed the child's copy) and this is a
    /// no-op too. An error means the lock was dropped but the release could
    /// not be recorded.
    pub fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) || !self.is_current() {
            return Ok(());
        }
        let s = &self.shared;
        let mut reg = registry::get().lock();
        let Some(last) = reg.unshare(s.key, s) else {
            return Ok(());
        };
        let recorded = if last.writable {
            let line = Record::released_line(&last.line, &record::now_rfc3339());
            write_line(last.fd, &last.lease_path, &line)
        } else {
            Ok(())
        };
        if reg.release_slot(last.slot, last.fd) {
            // SAFETY: the descriptor was ours and is closed exactly once.
            unsafe { libc::close(last.fd) };
        }
        recorded
    }

    /// Whether this handle was released.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    fn is_current(&self) -> bool {
        self.shared.epoch == registry::epoch()
    }

    fn live(&self) -> Result<&Shared> {
        if self.is_released() {
            return Err(Error::invalid("lease", "this lease handle was released"));
        }
        if !self.is_current() {
            return Err(Error::invalid(
                "lease",
                "this lease handle belongs to the parent process; a forked child does not hold it",
            ));
        }
        Ok(&self.shared)
    }

    /// Does the lease path still name the locked inode?
    pub fn check(&self) -> Result<Check> {
        let s = self.live()?;
        let path = &s.lease_path;
        match rustix::fs::lstat(path) {
            Ok(st) if (st.st_dev, st.st_ino) == s.key => Ok(Check::Held),
            Ok(_) => Ok(Check::Replaced),
            Err(rustix::io::Errno::NOENT) => Ok(Check::Unlinked),
            Err(e) => Err(Error::io("lstat", path, e)),
        }
    }

    pub fn lease_path(&self) -> &Path {
        &self.shared.lease_path
    }

    pub fn target(&self) -> &Path {
        &self.shared.target
    }

    /// The record this process wrote (or would have, on a read-only file).
    pub fn record(&self) -> &Record {
        &self.shared.record
    }

    /// The record found in the lease file before this acquisition.
    pub fn previous(&self) -> Option<&Record> {
        self.shared.previous.record()
    }

    /// What the lease file held before: empty, a record, or unreadable.
    pub fn previous_content(&self) -> &Content {
        &self.shared.previous
    }

    /// False when the previous holder died holding the lease (its record has
    /// no `released_at`) or left a record that cannot be read: the
    /// application should run its crash recovery. True for a new lease file.
    pub fn previous_released_cleanly(&self) -> bool {
        match &self.shared.previous {
            Content::Empty => true,
            Content::Record(r) => r.released_at.is_some(),
            Content::Unreadable => false,
        }
    }

    /// The fencing token: one more than the previous holder's.
    pub fn generation(&self) -> u64 {
        self.shared.record.generation.unwrap_or(0)
    }

    /// False when the lease file could only be opened read-only: the lock
    /// holds, but no record was written.
    pub fn record_written(&self) -> bool {
        self.shared.writable
    }

    /// A new descriptor of the lease, outside the registry and without
    /// close-on-exec, for a command that should keep the lease alive as long
    /// as it runs (what `sidelease hold` gives its command, as `flock(1)`
    /// does). The caller owns it; never `LOCK_UN` it.
    pub fn inheritable_fd(&self) -> Result<OwnedFd> {
        let s = self.live()?;
        // SAFETY: the descriptor stays open while this live handle exists.
        let fd = unsafe { BorrowedFd::borrow_raw(s.fd) };
        rustix::io::dup(fd).map_err(|e| Error::io("dup", &s.lease_path, e))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Write a record line in place: all of it at offset 0, then cut the file to
/// its length. Never a temporary file renamed over the lease file.
pub(crate) fn write_line(fd: RawFd, path: &Path, line: &[u8]) -> Result<()> {
    // SAFETY: callers pass a descriptor they keep open for this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut done = 0;
    while done < line.len() {
        match rustix::io::pwrite(fd, &line[done..], done as u64) {
            Ok(0) => return Err(Error::io("pwrite", path, rustix::io::Errno::NOSPC)),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(Error::io("pwrite", path, e)),
        }
    }
    rustix::fs::ftruncate(fd, line.len() as u64).map_err(|e| Error::io("ftruncate", path, e))
}
