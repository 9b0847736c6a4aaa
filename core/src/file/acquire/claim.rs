//! The steps of an acquisition once the lock is taken (DESIGN §3): claim
//! the file with our record, check that the path still names it, look for
//! former files (the split guard), give a young file its grace, register.
//!
//! The order is what makes one holder (issue 35). The record goes in
//! first, right after the lock, and only then is the path checked: a
//! contender whose guard finds this file replaced reads our record in it
//! and is refused, or read it before we wrote it, so looked after the
//! replacement, and then our check fails and we back out. Between our lock
//! and our record nothing of ours is in the file, and a contender cannot
//! tell us from an unrelated lock (an undecided one): that window is a
//! `pread` and a `pwrite` long, never a whole guard scan. A claim that is
//! backed out (the path names another file, a former file is held, a grace
//! is due) puts back what the file said before.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use super::{FilePending, OpenFile, GRACE_BUDGET, REANCHOR_GRACE};
use crate::error::{Error, Result};
use crate::faults;
use crate::file::guard::{self, Orphan};
use crate::file::previous::{next_generation, vouched_for, young};
use crate::file::watch;
use crate::file::write_padded;
use crate::lease::{Lease, Shared, SharedInit};
use crate::options::Wait;
use crate::path;
use crate::platform::process;
use crate::record::{self, Content, Record};
use crate::registry::{self, Flight, Key};

/// What a locked file came to.
pub(super) enum Claimed {
    Lease(Lease),
    /// Refused by a former file's holder, or giving a young file its grace:
    /// the attempt waits.
    Waiting,
    /// Try the same open file again now (a grace slept through, NoWait).
    Again,
    /// The path names another file now: open it again.
    Replaced,
}

/// Our record as written (or, read-only, as it would be).
struct Claim {
    rec: Record,
    line: Vec<u8>,
    /// The file's length now.
    len: usize,
}

impl FilePending {
    /// At the bound on replaced rounds: a single attempt fails, naming
    /// it; a wait backs off instead (`true`: the attempt ends as one
    /// refused, and the wait's next check starts a fresh count), so a file
    /// replaced faster than it can be locked costs a waiter time, never an
    /// error before its deadline.
    pub(super) fn replaced_too_often(&mut self, rounds: u32) -> Result<bool> {
        let bound = crate::faults::replaced_rounds(super::MAX_REPLACED_ROUNDS);
        if rounds < bound {
            return Ok(false);
        }
        if !matches!(self.opts.wait, Wait::NoWait) {
            self.backed_off = Some(rounds);
            return Ok(true);
        }
        Err(Error::io(
            "open",
            self.lease_path(),
            std::io::Error::other(format!(
                "the lease file was replaced {rounds} times while being locked"
            )),
        ))
    }

    /// The open file is locked: claim it, check it, guard it, hold it.
    pub(super) fn claim(&mut self, flight: Flight) -> Result<Claimed> {
        let Some(of) = self.open.as_ref() else {
            return Err(Error::invalid("lease", "no open lease file"));
        };
        let key = of.key;
        faults::step("acquire.locked");
        // Watch before the identity check: a replacement after the check
        // is then an event for the holder's watch.
        let ticket = if self.opts.watch {
            watch::begin(of.fd())
        } else {
            None
        };
        let bytes = process::read_at_most(of.fd(), of.size, record::RECORD_MAX_BYTES)
            .map_err(|e| Error::io("pread", &of.canon, e))?;
        let previous = if bytes.len() > record::RECORD_MAX_BYTES {
            Content::Unreadable
        } else {
            Content::parse(&bytes)
        };
        faults::step("acquire.read");
        let vouched = vouched_for(&previous, key, &of.canon, of.untouched);
        let dir = self.dir_identity(&previous, key, vouched)?;
        // What the guard is known to say without a scan after the lock.
        let known = if !self.opts.split_guard {
            Some((false, false))
        } else if vouched {
            Some((true, false))
        } else {
            of.prechecked
        };
        // A grace known to be due before any look is given before the
        // claim: a holder putting its file back then meets no record of
        // ours (which it would take for a rival's win) while we wait.
        if let Some((split_checked, undecided)) = known {
            if let Some(wait) = self.grace_due(of, &previous, split_checked, undecided) {
                let _ = rustix::fs::flock(of.fd(), FlockOperation::Unlock);
                return Ok(self.give_grace(wait, flight));
            }
        }
        let mut claim = self.write_claim(of, &previous, &bytes, dir, known.is_some_and(|k| k.0))?;
        faults::step("acquire.written");
        // Does the path, as the caller spelled it, still name this inode?
        // (Its directory may have been renamed since the open, and the
        // kernel's name for it with it.)
        if !self.still_named(of, &bytes)? {
            drop(flight);
            self.open = None; // closing drops the lock on the stale inode
            return Ok(Claimed::Replaced);
        }
        let (split_checked, undecided) = match known {
            Some(k) => k,
            None => {
                let target = path::target_of(&of.canon, &self.opts.suffix);
                let outcome = match guard::check(of.fd(), &self.me(of, &target, dir)) {
                    Ok(o) => o,
                    Err(e) => {
                        back_out(of, &bytes);
                        return Err(e);
                    }
                };
                if let Some(orphan) = outcome.orphan {
                    // Keep the descriptor (no close event for our own
                    // watch); unlock it so nobody waits on us.
                    back_out(of, &bytes);
                    drop(flight);
                    self.refused_by(orphan, key);
                    return Ok(Claimed::Waiting);
                }
                // Once more after the scan: a file we could not write our
                // record into (read-only), or whose record was cut away
                // meanwhile, was an anonymous lock to a contender's guard
                // (undecided), and a contender that completed on a
                // replacement during our scan must not be joined.
                if !self.still_named(of, &bytes)? {
                    drop(flight);
                    self.open = None;
                    return Ok(Claimed::Replaced);
                }
                (outcome.complete, outcome.undecided)
            }
        };
        faults::step("acquire.guarded");
        if let Some(wait) = self.grace_due(of, &previous, split_checked, undecided) {
            back_out(of, &bytes);
            return Ok(self.give_grace(wait, flight));
        }
        if known.is_none() && split_checked && of.writable {
            // The guard found no former file: say so, so the next holder
            // of this very file may skip its own scan.
            claim.rec.split_checked = Some(true);
            claim.line = claim.rec.to_line();
            claim.len = match write_padded(of.fd(), &of.canon, &claim.line, claim.len) {
                Ok(n) => n,
                Err(e) => {
                    back_out(of, &bytes);
                    return Err(e);
                }
            };
        }
        registry::get().lock().forget_refusal(&of.canon);
        let lease = self.register(claim, previous, &bytes, flight)?;
        if let Some(t) = ticket {
            watch::attach(t, &lease.shared_arc());
        }
        Ok(Claimed::Lease(lease))
    }

    /// Whether the path, as the caller spelled it, still names the locked
    /// file; when not, the claim is withdrawn.
    fn still_named(&self, of: &OpenFile, bytes: &[u8]) -> Result<bool> {
        match crate::platform::stat::lstat(&self.spelled.lease) {
            Ok(st) if (st.st_dev, st.st_ino) == of.key && st.st_nlink > 0 => Ok(true),
            Ok(_) | Err(Errno::NOENT) | Err(Errno::NOTDIR) => {
                back_out(of, bytes);
                Ok(false)
            }
            Err(e) => {
                back_out(of, bytes);
                Err(Error::io("lstat", &of.canon, e))
            }
        }
    }

    /// How long a young file's grace is, if one is due: the guard did not
    /// run or left a lock undecided, and this file was not waited on nor
    /// graced before, within the attempt's budget for graces.
    fn grace_due(
        &self,
        of: &OpenFile,
        previous: &Content,
        split_checked: bool,
        undecided: bool,
    ) -> Option<std::time::Duration> {
        if (split_checked && !undecided)
            || of.waited
            || of.graced
            || self.grace_spent >= GRACE_BUDGET
        {
            return None;
        }
        young(of.age, previous, REANCHOR_GRACE)
    }

    /// The file is unlocked: wait `wait` for a holder of a former file to
    /// put it back (then the kernel refuses us).
    fn give_grace(&mut self, wait: std::time::Duration, flight: Flight) -> Claimed {
        self.grace_spent += wait;
        drop(flight);
        if let Some(of) = self.open.as_mut() {
            of.graced = true;
            // A holder may put back its record during the grace: look
            // again after it.
            of.prechecked = None;
        }
        if self.opts.wait == Wait::NoWait {
            std::thread::sleep(wait);
            return Claimed::Again;
        }
        self.grace_until = Some(Instant::now() + wait);
        Claimed::Waiting
    }

    /// Write our record into the locked file (the claim), with a
    /// generation after the previous one.
    fn write_claim(
        &self,
        of: &OpenFile,
        previous: &Content,
        bytes: &[u8],
        dir: (u64, u64),
        split_checked: bool,
    ) -> Result<Claim> {
        let generation = if of.writable {
            Some(next_generation(previous, bytes, &of.canon)?)
        } else {
            None
        };
        let rec = self.new_record(of, generation, dir, split_checked)?;
        let line = rec.to_line();
        let len = if of.writable {
            match write_padded(of.fd(), &of.canon, &line, bytes.len()) {
                Ok(n) => n,
                Err(e) => {
                    back_out(of, bytes);
                    return Err(e);
                }
            }
        } else {
            bytes.len()
        };
        Ok(Claim { rec, line, len })
    }

    /// Claimed, checked and guarded: register the lease and return it.
    fn register(
        &mut self,
        claim: Claim,
        previous: Content,
        bytes: &[u8],
        flight: Flight,
    ) -> Result<Lease> {
        let of = self
            .open
            .take()
            .ok_or_else(|| Error::invalid("lease", "no open lease file"))?;
        // Numbered above every inotify instance of ours, so that when this
        // process is killed its lock is let go before any instance's
        // teardown (watch::order). The watch's instance is made before
        // the open (watch::prepare): only a file opened below a waiter's
        // instance, or in a hole below the watch's, is moved (one fcntl,
        // and one close at release). Here, once the claim is won, so that
        // a file is moved once: a claim given up for a grace or a refusal
        // keeps its file and claims it again later, when more instances
        // may be open.
        let mut of = of;
        of.fd = watch::above_instances(of.fd, of.slot);
        let key = of.key;
        let access = of.access;
        // The previous record as it was written (it parsed, so it is JSON).
        let previous_json =
            matches!(previous, Content::Record(_)).then(|| record::utf8(bytes.trim_ascii()));
        let (anchor, canon) = of.into_anchor(claim.line, claim.len);
        let shared = Arc::new(Shared::new(SharedInit {
            target: path::target_of(&canon, &self.opts.suffix),
            lease_path: canon,
            record: claim.rec,
            previous,
            previous_json,
            spelled: self.spelled.lease.clone(),
            watched: self.opts.watch,
            access,
            anchor,
        }));
        let reg = registry::get();
        let mut g = reg.lock();
        g.insert(key, shared.clone());
        g.note_held(&shared.lease_path, key);
        flight.end_locked(&mut g);
        drop(g);
        Ok(Lease::from_shared(shared))
    }

    /// The guard's look, before locking: a former file still held. Nothing
    /// found here is as good as nothing found after locking: a process that
    /// holds a former file once this one locks the file at the path held it
    /// already (it locked it while it was the file at the path, before this
    /// attempt opened the one there now).
    pub(super) fn precheck(&mut self) -> Result<guard::Outcome> {
        let Some(of) = self.open.as_ref() else {
            return Err(Error::invalid("lease", "no open lease file"));
        };
        let dir = self.dir_identity(&Content::Empty, of.key, false)?;
        let target = path::target_of(&of.canon, &self.opts.suffix);
        let outcome = guard::precheck(of.fd(), of.key.1, &self.me(of, &target, dir));
        if outcome.orphan.is_none() {
            registry::get().lock().forget_refusal(&of.canon);
        }
        Ok(outcome)
    }

    /// This lease, as the guard looks for its former files.
    fn me<'a>(&'a self, of: &'a OpenFile, target: &'a Path, dir: (u64, u64)) -> guard::Me<'a> {
        guard::Me {
            lease_path: &of.canon,
            spelled: &self.spelled.lease,
            target,
            name: &self.spelled.name,
            dir,
            file_dev: Some(of.key.0),
        }
    }

    /// Refused: a live process holds a former file of this lease.
    pub(super) fn refused_by(&mut self, orphan: Orphan, key: Key) {
        if let Some(of) = &self.open {
            registry::get().lock().remember_refusal(&of.canon);
        }
        self.orphan = Some(orphan);
        self.arm_watch(key);
    }

    /// The lease file's directory as (device, inode): copied from the
    /// previous record when it was written for this very file at this very
    /// path (no `stat` in the steady state), otherwise looked up.
    pub(super) fn dir_identity(
        &self,
        previous: &Content,
        key: Key,
        vouched: bool,
    ) -> Result<(u64, u64)> {
        let Some(of) = self.open.as_ref() else {
            return Err(Error::invalid("lease", "no open lease file"));
        };
        if let Content::Record(r) = previous {
            if vouched || (r.device, r.inode) == (Some(key.0), Some(key.1)) {
                if let (Some(d), Some(i), Some(lp)) = (r.dir_device, r.dir_inode, &r.lease_path) {
                    if Path::new(lp) == of.canon {
                        return Ok((d, i));
                    }
                }
            }
        }
        let dir = path::parent_of(&of.canon);
        let st = crate::platform::stat::stat(dir).map_err(|e| Error::io("stat", dir, e))?;
        Ok((st.st_dev, st.st_ino))
    }

    fn new_record(
        &self,
        of: &OpenFile,
        generation: Option<u64>,
        dir: (u64, u64),
        split_checked: bool,
    ) -> Result<Record> {
        let target = path::target_of(&of.canon, &self.opts.suffix);
        Ok(Record {
            generation,
            lease_path: Some(of.canon.to_string_lossy().into_owned()),
            device: Some(of.key.0),
            inode: Some(of.key.1),
            split_checked: Some(split_checked),
            dir_device: Some(dir.0),
            dir_inode: Some(dir.1),
            file_name: Some(self.spelled.name.to_string_lossy().into_owned()),
            spelled_path: (self.spelled.lease != of.canon)
                .then(|| self.spelled.lease.to_string_lossy().into_owned()),
            ..Record::of_this_process(target.to_string_lossy().into_owned(), &self.opts)?
        })
    }
}

/// Withdraw a claim: put back what the file said before (never leave a
/// record of a hold that never was, in the file at the path or in one moved
/// aside: an operator's copy), then unlock. Best effort: whoever locks the
/// file next reads it under its own lock.
///
/// A record put back no longer vouches (`split_checked: false`): writing it
/// makes the file look untouched again (its status-change time is its
/// modification time), and a file moved aside and back while we held it
/// would then skip the next holder's guard with a former file still held —
/// the very thing a withdrawn claim may have been refused for.
fn back_out(of: &OpenFile, bytes: &[u8]) {
    if of.writable {
        let put_back = no_longer_vouching(bytes);
        let bytes = put_back.as_deref().unwrap_or(bytes);
        let _ = rustix::io::pwrite(of.fd(), bytes, 0);
        let _ = rustix::fs::ftruncate(of.fd(), bytes.len() as u64);
    }
    let _ = rustix::fs::flock(of.fd(), FlockOperation::Unlock);
}

/// The record in `bytes` with `split_checked` set to false, when it says
/// true; every other field as it was (fields this version does not know
/// included).
fn no_longer_vouching(bytes: &[u8]) -> Option<Vec<u8>> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(bytes.trim_ascii()) else {
        // A record our own reading accepts but a plain JSON value does not
        // (a number out of range in a field we ignore): put it back as we
        // read it, never still vouching.
        let Content::Record(mut r) = Content::parse(bytes) else {
            return None;
        };
        if r.split_checked != Some(true) {
            return None;
        }
        r.split_checked = Some(false);
        return Some(r.to_line());
    };
    let checked = v.as_object_mut()?.get_mut("split_checked")?;
    if *checked != serde_json::Value::Bool(true) {
        return None;
    }
    *checked = serde_json::Value::Bool(false);
    let mut line = serde_json::to_vec(&v).ok()?;
    line.push(b'\n');
    Some(line)
}
