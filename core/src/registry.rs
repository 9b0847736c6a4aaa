//! The process registry: one lease per lease file (keyed by device and inode)
//! shared by every handle of this process, the acquisitions in flight (so
//! threads acquiring one lease at the same moment end up sharing it), and
//! the descriptor slots the fork handler reads.
//!
//! After `fork` only the forking thread exists in the child and any lock may
//! be held by a thread that is gone, so the child handler takes no lock and
//! allocates nothing: it closes the descriptors it finds in a lock-free slot
//! table, bumps the fork epoch (handles of an older epoch are dead) and drops
//! the registry pointer so the child lazily builds a fresh one.

use std::collections::{HashMap, HashSet};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::forkgate;
use crate::lease::Shared;

/// A lease file as `stat` identifies it: (device, inode).
pub(crate) type Key = (u64, u64);

const CHUNK: usize = 1024;
const CHUNKS: usize = 256;
/// Most lease descriptors one process can have open at once.
pub const MAX_LEASES: usize = CHUNK * CHUNKS;

type Chunk = [AtomicI32; CHUNK];

/// Descriptor slots the fork handler can read without a lock. A chunk is
/// allocated (in the parent, under the registry lock) when first needed and
/// never freed.
static SLOTS: [AtomicPtr<Chunk>; CHUNKS] = [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS];
/// Beside each slot, the first number of a descriptor `raise_listed` moved
/// up, kept open (a second descriptor of the same open file) until the slot
/// is released, so that moving leaves no free number below the library's
/// inotify instances for the process's next open to take (see
/// `raise_listed`). Allocated with the slot's chunk.
static KEPT: [AtomicPtr<Chunk>; CHUNKS] = [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS];
static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(ptr::null_mut());
static ABANDONED: AtomicPtr<Registry> = AtomicPtr::new(ptr::null_mut());
static EPOCH: AtomicU64 = AtomicU64::new(0);
static ATTEMPTS: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Registry {
    inner: Mutex<Inner>,
    /// The slot allocator has its own lock, taken only inside fork windows,
    /// so a window never waits for the registry lock (whose holder may be
    /// waiting for a fork to finish).
    slots: Mutex<SlotAlloc>,
    /// Signalled whenever an acquisition in flight ends.
    settled: Condvar,
    /// The registry a forked child abandoned (its parent's), kept reachable
    /// rather than freed: freeing in the child is not safe, and a leak
    /// checker should not count it lost.
    _abandoned: *mut Registry,
}

// SAFETY: `_abandoned` is never dereferenced; everything else is a Mutex or
// a Condvar.
unsafe impl Sync for Registry {}
// SAFETY: as above.
unsafe impl Send for Registry {}

#[derive(Default)]
pub(crate) struct Inner {
    /// Every lease file this process holds (each anchor of each lease).
    held: HashMap<Key, Arc<Shared>>,
    /// Acquisitions past their open and before their outcome, by canonical
    /// lease path: a second thread waits for the first one's outcome instead
    /// of being refused by its own process.
    inflight: HashMap<PathBuf, u64>,
    /// Threads waiting in `wait_settled` (a notify costs a system call, so
    /// it is only made when someone waits).
    waiting: usize,
    /// Lease paths where an attempt of this process was last refused by the
    /// holder of a former lease file (the next attempt looks for it before
    /// locking anything).
    refused: HashSet<PathBuf>,
    /// The file this process last acquired at each lease path.
    last_held: HashMap<PathBuf, Key>,
}

#[derive(Default)]
struct SlotAlloc {
    free: Vec<u32>,
    next: u32,
}

/// The fork epoch: handles made in an earlier epoch belong to the parent.
pub(crate) fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// A fresh identity for one acquisition (or re-anchor) in flight.
pub(crate) fn attempt_id() -> u64 {
    ATTEMPTS.fetch_add(1, Ordering::Relaxed)
}

/// The registry, if this process (since its last fork) has made one.
pub(crate) fn existing() -> Option<&'static Registry> {
    // SAFETY: registries are leaked boxes, never freed.
    unsafe { REGISTRY.load(Ordering::Acquire).as_ref() }
}

pub(crate) fn get() -> &'static Registry {
    let p = REGISTRY.load(Ordering::Acquire);
    // SAFETY: registries are leaked boxes, never freed (a forked child
    // abandons its parent's copy instead of freeing it).
    if let Some(r) = unsafe { p.as_ref() } {
        return r;
    }
    forkgate::install();
    let fresh = Box::into_raw(Box::new(Registry {
        inner: Mutex::new(Inner::default()),
        slots: Mutex::new(SlotAlloc::default()),
        settled: Condvar::new(),
        _abandoned: ABANDONED.load(Ordering::Acquire),
    }));
    match REGISTRY.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just leaked, never freed.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: a leaked box, never freed.
            unsafe { &*winner }
        }
    }
}

/// The fork child handler's part: close every lease descriptor the child
/// inherited (never `LOCK_UN`: the lock belongs to the open file description
/// the parent still has), start a new epoch, forget the registry.
pub(crate) fn after_fork_in_child() {
    for chunk in SLOTS.iter().chain(KEPT.iter()) {
        // SAFETY: chunks are never freed.
        if let Some(chunk) = unsafe { chunk.load(Ordering::Acquire).as_ref() } {
            for slot in chunk.iter() {
                let fd = slot.swap(-1, Ordering::AcqRel);
                if fd >= 0 {
                    // SAFETY: a descriptor this library opened; close is
                    // async-signal-safe.
                    unsafe { libc::close(fd) };
                }
            }
        }
    }
    EPOCH.fetch_add(1, Ordering::AcqRel);
    let old = REGISTRY.swap(ptr::null_mut(), Ordering::AcqRel);
    if !old.is_null() {
        ABANDONED.store(old, Ordering::Release);
    }
}

fn slot(index: u32) -> &'static AtomicI32 {
    let (c, i) = (index as usize / CHUNK, index as usize % CHUNK);
    // SAFETY: a slot index is only handed out after its chunk was installed,
    // and chunks are never freed.
    let chunk = unsafe { &*SLOTS[c].load(Ordering::Acquire) };
    &chunk[i]
}

fn kept(index: u32) -> &'static AtomicI32 {
    let (c, i) = (index as usize / CHUNK, index as usize % CHUNK);
    // SAFETY: installed with the slot's chunk (before its first index was
    // handed out) and never freed.
    let chunk = unsafe { &*KEPT[c].load(Ordering::Acquire) };
    &chunk[i]
}

impl Registry {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps inconsistent
        // (every update is one insert or remove), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait (releasing the lock) until some acquisition in flight ends, or
    /// `bound` passes.
    pub(crate) fn wait_settled<'a>(
        &'a self,
        mut guard: MutexGuard<'a, Inner>,
        bound: Duration,
    ) -> MutexGuard<'a, Inner> {
        guard.waiting += 1;
        let mut g = match self.settled.wait_timeout(guard, bound) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        };
        g.waiting -= 1;
        g
    }

    /// Wake the threads waiting for a flight to end (called with the
    /// registry lock held).
    fn notify_settled(&self, g: &Inner) {
        if g.waiting > 0 {
            self.settled.notify_all();
        }
    }

    /// Put a descriptor where the fork handler will find it.
    fn claim_slot(&self, fd: RawFd) -> Result<u32> {
        let mut a = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let index = match a.free.pop() {
            Some(i) => i,
            None => {
                let i = a.next;
                if i as usize >= MAX_LEASES {
                    return Err(Error::invalid(
                        "target",
                        format!("this process already has {MAX_LEASES} lease files open"),
                    ));
                }
                let c = i as usize / CHUNK;
                if SLOTS[c].load(Ordering::Acquire).is_null() {
                    let kept: Box<Chunk> = Box::new([const { AtomicI32::new(-1) }; CHUNK]);
                    KEPT[c].store(Box::into_raw(kept), Ordering::Release);
                    let chunk: Box<Chunk> = Box::new([const { AtomicI32::new(-1) }; CHUNK]);
                    SLOTS[c].store(Box::into_raw(chunk), Ordering::Release);
                }
                a.next += 1;
                i
            }
        };
        slot(index).store(fd, Ordering::Release);
        Ok(index)
    }

    /// Take a descriptor back from the fork handler's table, closing the
    /// number kept beside it (if any). Returns false when the handler
    /// already closed them (this is a forked child).
    fn release_slot(&self, index: u32, fd: RawFd) -> bool {
        let owned = slot(index)
            .compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if owned {
            let first = kept(index).swap(-1, Ordering::AcqRel);
            if first >= 0 {
                // SAFETY: a number `raise_listed` kept, ours, closed once.
                unsafe { libc::close(first) };
            }
            self.slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .free
                .push(index);
        }
        owned
    }
}

/// The marker of one acquisition in flight; dropping it ends the flight and
/// wakes the threads waiting for its outcome.
pub(crate) struct Flight {
    path: PathBuf,
    id: u64,
}

impl Flight {
    /// Claim the flight for `path`, first waiting (until `deadline`) for
    /// another thread's flight on it to end. `check` runs under the registry
    /// lock before each claim: when it returns `Some`, that is the outcome
    /// (a lease to share) and no flight is claimed.
    pub(crate) fn claim<T>(
        path: &Path,
        id: u64,
        deadline: Instant,
        mut check: impl FnMut(&mut Inner) -> Option<T>,
    ) -> std::result::Result<Flight, Option<T>> {
        let reg = get();
        let mut g = reg.lock();
        loop {
            if let Some(t) = check(&mut g) {
                return Err(Some(t));
            }
            match g.inflight.get(path) {
                Some(&other) if other != id => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(None);
                    }
                    g = reg.wait_settled(g, deadline - now);
                }
                _ => break,
            }
        }
        g.inflight.insert(path.to_path_buf(), id);
        Ok(Flight {
            path: path.to_path_buf(),
            id,
        })
    }

    /// End the flight while already holding the registry lock.
    pub(crate) fn end_locked(self, g: &mut Inner) {
        let mut me = std::mem::ManuallyDrop::new(self);
        let path = std::mem::take(&mut me.path);
        if g.inflight.get(&path) == Some(&me.id) {
            g.inflight.remove(&path);
        }
        get().notify_settled(g);
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let reg = get();
        let mut g = reg.lock();
        if g.inflight.get(&self.path) == Some(&self.id) {
            g.inflight.remove(&self.path);
        }
        reg.notify_settled(&g);
    }
}

impl Inner {
    /// Whether this process holds any lease (so a path lookup can be
    /// skipped when it holds none).
    pub(crate) fn holds_any(&self) -> bool {
        !self.held.is_empty()
    }

    /// Share a held lease: bump its handle count and return it. A lease
    /// that was lost is not shared (a new acquisition must contend for the
    /// file like anyone else).
    pub(crate) fn share(&mut self, key: Key) -> Option<Arc<Shared>> {
        let s = self.held.get(&key)?;
        if !s.shareable() {
            return None;
        }
        s.add_handle();
        Some(s.clone())
    }

    /// The lease that holds the file `key` (device as `stat` names it,
    /// inode), if this process holds it.
    pub(crate) fn holder_of(&self, key: Key) -> Option<&Arc<Shared>> {
        self.held.get(&key)
    }

    pub(crate) fn remember_refusal(&mut self, lease_path: &Path) {
        // Bounded: a process refused at very many paths starts over.
        if self.refused.len() >= 4096 {
            self.refused.clear();
        }
        self.refused.insert(lease_path.to_path_buf());
    }

    pub(crate) fn remembers_refusal(&self, lease_path: &Path) -> bool {
        !self.refused.is_empty() && self.refused.contains(lease_path)
    }

    pub(crate) fn forget_refusal(&mut self, lease_path: &Path) {
        if !self.refused.is_empty() {
            self.refused.remove(lease_path);
        }
    }

    /// Whether `key` is the file this process last acquired at `lease_path`.
    pub(crate) fn held_last(&self, lease_path: &Path, key: Key) -> bool {
        self.last_held.get(lease_path) == Some(&key)
    }

    pub(crate) fn note_held(&mut self, lease_path: &Path, key: Key) {
        if self.last_held.len() >= 4096 {
            self.last_held.clear();
        }
        if self.last_held.get(lease_path) != Some(&key) {
            self.last_held.insert(lease_path.to_path_buf(), key);
        }
    }

    pub(crate) fn insert(&mut self, key: Key, shared: Arc<Shared>) {
        self.held.insert(key, shared);
    }

    /// Forget the keys of a lease (its files: every one it holds when it
    /// ends, or one it let go). Only the lease's own keys are looked at: a
    /// release costs the same with 10,000 other leases held.
    pub(crate) fn forget(&mut self, shared: &Arc<Shared>, keys: impl IntoIterator<Item = Key>) {
        for key in keys {
            if self.held.get(&key).is_some_and(|s| Arc::ptr_eq(s, shared)) {
                self.held.remove(&key);
            }
        }
    }
}

/// Open a descriptor and list it for the fork handler, with no fork able to
/// land in between (see `forkgate`). `open` returns the descriptor.
pub(crate) fn open_listed(
    open: impl FnOnce() -> std::io::Result<std::os::fd::OwnedFd>,
) -> std::io::Result<Result<(RawFd, u32)>> {
    use std::os::fd::IntoRawFd;
    forkgate::window(|| {
        let fd = open()?.into_raw_fd();
        match get().claim_slot(fd) {
            Ok(slot) => Ok(Ok((fd, slot))),
            Err(e) => {
                // SAFETY: just opened, ours, closed once.
                unsafe { libc::close(fd) };
                Ok(Err(e))
            }
        }
    })
}

/// Renumber a descriptor listed by `open_listed` to the lowest free number
/// at or above `floor`: a duplicate of the same open file (its lock goes
/// with it, and is let go when the last of the two is), listed in the same
/// slot. The old number stays open beside it until the slot is released:
/// closed, it would be a free number below `floor` that the process's next
/// open takes, and a lock taken there after the lease (a leader's own lock)
/// would be let go after the lease when the process is killed, and after the
/// teardown of the instances in between. Returns the number to use (the
/// old one when no duplicate could be made).
pub(crate) fn raise_listed(fd: RawFd, slot_index: u32, floor: RawFd) -> RawFd {
    use std::os::fd::{BorrowedFd, IntoRawFd};
    forkgate::window(|| {
        // SAFETY: a listed descriptor, open for as long as its slot names it.
        let old = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(new) = rustix::io::fcntl_dupfd_cloexec(old, floor) else {
            return fd;
        };
        let new = new.into_raw_fd();
        if slot(slot_index)
            .compare_exchange(fd, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // A file is moved once, when its claim is won (acquire's
            // `register`, anchor's open); were one moved again, its first
            // kept number is closed here rather than leaked.
            let before = kept(slot_index).swap(fd, Ordering::AcqRel);
            if before >= 0 {
                // SAFETY: a number kept by an earlier raise, ours, closed once.
                unsafe { libc::close(before) };
            }
            new
        } else {
            // SAFETY: just made, ours, closed once.
            unsafe { libc::close(new) };
            fd
        }
    })
}

/// Unlist and close a descriptor listed by `open_listed` (a no-op in a
/// forked child, where the fork handler closed it).
pub(crate) fn close_listed(fd: RawFd, slot: u32) {
    forkgate::window(|| {
        if get().release_slot(slot, fd) {
            // SAFETY: the descriptor was ours and is closed exactly once.
            unsafe { libc::close(fd) };
        }
    })
}

/// Unlist a descriptor listed by `open_listed` whose owner `obj` closes it
/// when dropped (a socket inside an async stream): dropped inside the
/// window; leaked in a forked child, where the fork handler closed the
/// descriptor already and its number may name something else now.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn close_listed_by<T>(fd: RawFd, slot: u32, obj: T) {
    forkgate::window(|| {
        if get().release_slot(slot, fd) {
            drop(obj);
        } else {
            std::mem::forget(obj);
        }
    })
}
