//! What a held lease file does on release, check and loss.

use std::any::Any;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use rustix::fs::FlockOperation;

use crate::backend::{Engine, Held};
use crate::error::{Error, Result};
use crate::lease::{Anchor, Check, Lease, Phase, Shared};
use crate::platform::process;
use crate::record::{self, Content, Record};
use crate::registry;

/// The lease-file half of a held lease: everything it holds (its anchors)
/// lives in the lease's state, so this carries nothing.
pub(crate) struct FileHold;

impl Held for FileHold {
    fn engine(&self) -> Engine {
        Engine::File
    }

    fn release(&self, s: &Arc<Shared>) -> Result<()> {
        let reg = registry::get();
        let mut g = reg.lock();
        if !s.drop_handle() {
            return Ok(());
        }
        let (anchors, inherited, lost) = {
            let mut st = s.state();
            let lost = matches!(st.phase, Phase::Lost(_));
            st.phase = match std::mem::replace(&mut st.phase, Phase::Released) {
                Phase::Lost(l) => Phase::Lost(l),
                _ => Phase::Released,
            };
            (std::mem::take(&mut st.anchors), st.inherited, lost)
        };
        g.forget(s, anchors.iter().map(|a| a.key));
        // Wake whoever waits on the lost descriptor: the wait is over.
        s.ring_lost_fd();
        crate::file::watch::forget(s);
        let stamp = record::now_rfc3339();
        let mut probe = None;
        for a in anchors {
            if Some(a.key) == inherited {
                // Another process holds this descriptor on purpose: the lock
                // must stay while it does. Record the release only if nobody
                // holds it once ours is closed.
                registry::close_listed(a.fd, a.slot);
                probe = Some(a);
                continue;
            }
            // A holder that lost its lease never records a clean release:
            // its work may have been cut short.
            crate::faults::step("release.anchor");
            if a.writable && !lost {
                let line = Record::released_line(&a.line, &stamp);
                // Not written: the record says unreleased, the safe side.
                let _ = write_padded(a.fd(), &s.lease_path, &line, a.len);
            }
            crate::faults::step("release.written");
            // Unlock before closing: a child forked a moment ago that has not
            // run its fork handler yet shares this open file description.
            let _ = rustix::fs::flock(a.fd(), FlockOperation::Unlock);
            registry::close_listed(a.fd, a.slot);
        }
        if let Some(a) = probe.filter(|_| !lost) {
            record_release_if_free(s, &a, &stamp);
        }
        drop(g);
        Ok(())
    }

    fn check(&self, s: &Arc<Shared>) -> Result<Check> {
        for path in s.paths() {
            match crate::platform::stat::lstat(path) {
                Ok(st) if st.st_nlink > 0 => {
                    let key = (st.st_dev, st.st_ino);
                    if !s.state().anchors.iter().any(|a| a.key == key) {
                        return Ok(Check::Replaced);
                    }
                }
                Ok(_) | Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => {
                    return Ok(Check::Unlinked)
                }
                Err(e) => return Err(Error::io("lstat", path, e)),
            }
        }
        Ok(Check::Held)
    }

    /// Looks at the path itself (one `lstat`), and puts the lease file
    /// back right here when it is gone (as the holder's watch would).
    fn ensure_held(&self, lease: &Lease) -> Result<()> {
        let s = lease.shared();
        if whole(lease)? {
            return Ok(());
        }
        if s.watched {
            crate::file::anchor::check_now(s);
            if let Phase::Lost(l) = &s.state().phase {
                return Err(Error::Lost(Box::new(l.clone())));
            }
            if whole(lease)? {
                return Ok(());
            }
        }
        Err(Error::io(
            "open",
            &s.lease_path,
            std::io::Error::other(
                "the lease file is no longer at its path and could not be put back yet",
            ),
        ))
    }

    fn hand_on(&self, s: &Shared) -> Result<OwnedFd> {
        let mut st = s.state();
        let a = st
            .anchors
            .last()
            .ok_or_else(|| Error::invalid("lease", "this lease holds no descriptor"))?;
        let key = a.key;
        let fd = rustix::io::dup(a.fd()).map_err(|e| Error::io("dup", &s.lease_path, e))?;
        st.inherited = Some(key);
        Ok(fd)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Does the lease path name a file this lease holds? Asked through the
/// handle, so a release that raced in meanwhile is reported as one.
fn whole(lease: &Lease) -> Result<bool> {
    Ok(lease.check()? == Check::Held)
}

/// After closing a lease whose descriptor another process keeps: if the
/// lease file can be locked now, nobody holds it any more, so the release
/// is recorded (into our own record only); otherwise it is not.
fn record_release_if_free(s: &Shared, a: &Anchor, stamp: &str) {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
    let Ok(Ok((fd, slot))) =
        registry::open_listed(|| Ok(rustix::fs::open(&s.lease_path, flags, Mode::empty())?))
    else {
        return;
    };
    // SAFETY: open until close_listed below.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let same = crate::platform::stat::fstat(bfd).is_ok_and(|st| (st.st_dev, st.st_ino) == a.key);
    if same && rustix::fs::flock(bfd, FlockOperation::NonBlockingLockExclusive).is_ok() {
        let bytes = process::read_at_most(bfd, a.len, record::RECORD_MAX_BYTES).unwrap_or_default();
        let ours = matches!(Content::parse(&bytes), Content::Record(r)
            if r.nonce.is_some() && r.nonce == s.record.nonce);
        if ours && a.writable {
            let line = Record::released_line(&a.line, stamp);
            let _ = write_padded(bfd, &s.lease_path, &line, bytes.len());
        }
        let _ = rustix::fs::flock(bfd, FlockOperation::Unlock);
    }
    registry::close_listed(fd, slot);
}

/// Write a record line in place at offset 0, padded with spaces to the
/// file's current length `len` so no `ftruncate` is needed; a file far
/// longer than the line (a big record once) is cut instead. Never a
/// temporary file renamed over the lease file. Returns the file's length.
pub(crate) fn write_padded(
    fd: BorrowedFd<'_>,
    path: &Path,
    line: &[u8],
    len: usize,
) -> Result<usize> {
    const CUT_ABOVE: usize = 8 * 1024;
    let cut = len > CUT_ABOVE && len > 2 * line.len();
    let data = if cut {
        std::borrow::Cow::Borrowed(line)
    } else {
        record::padded(line, len)
    };
    let mut done = 0;
    while done < data.len() {
        match rustix::io::pwrite(fd, &data[done..], done as u64) {
            Ok(0) => return Err(Error::io("pwrite", path, rustix::io::Errno::NOSPC)),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(Error::io("pwrite", path, e)),
        }
    }
    if cut {
        rustix::fs::ftruncate(fd, data.len() as u64)
            .map_err(|e| Error::io("ftruncate", path, e))?;
    }
    Ok(data.len().max(if cut { 0 } else { len }))
}
