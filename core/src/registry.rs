//! The process registry: one lease per lease file (keyed by device and inode)
//! shared by every handle of this process, and the fork handler that keeps a
//! child from holding its parent's leases.
//!
//! After `fork` only the forking thread exists in the child and any lock may
//! be held by a thread that is gone, so the child handler takes no lock and
//! allocates nothing: it closes the descriptors it finds in a lock-free slot
//! table, bumps the fork epoch (handles of an older epoch are dead) and drops
//! the registry pointer so the child lazily builds a fresh one.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};

use crate::error::{Error, Result};
use crate::lease::Shared;

pub(crate) type Key = (u64, u64);

const CHUNK: usize = 1024;
const CHUNKS: usize = 256;
/// Most leases one process can hold at once.
pub const MAX_LEASES: usize = CHUNK * CHUNKS;

type Chunk = [AtomicI32; CHUNK];

/// Descriptor slots the fork handler can read without a lock. A chunk is
/// allocated (in the parent, under the registry lock) when first needed and
/// never freed.
static SLOTS: [AtomicPtr<Chunk>; CHUNKS] = [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS];
static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(ptr::null_mut());
static EPOCH: AtomicU64 = AtomicU64::new(0);
static ATFORK: Once = Once::new();

pub(crate) struct Registry {
    inner: Mutex<Inner>,
    /// The registry a forked child abandoned (its parent's), kept reachable
    /// rather than freed: freeing in the child is not safe, and a leak
    /// checker should not count it lost.
    _abandoned: *mut Registry,
}

// SAFETY: `_abandoned` is never dereferenced; everything else is a Mutex.
unsafe impl Sync for Registry {}
unsafe impl Send for Registry {}

static ABANDONED: AtomicPtr<Registry> = AtomicPtr::new(ptr::null_mut());

#[derive(Default)]
pub(crate) struct Inner {
    leases: HashMap<Key, Entry>,
    free_slots: Vec<u32>,
    next_slot: u32,
}

struct Entry {
    shared: Arc<Shared>,
    count: usize,
}

/// The fork epoch: handles made in an earlier epoch belong to the parent.
pub(crate) fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

pub(crate) fn get() -> &'static Registry {
    let p = REGISTRY.load(Ordering::Acquire);
    // SAFETY: registries are leaked boxes, never freed (a forked child
    // abandons its parent's copy instead of freeing it).
    if let Some(r) = unsafe { p.as_ref() } {
        return r;
    }
    ATFORK.call_once(|| {
        // SAFETY: registering a handler that is async-signal-safe (close,
        // atomics only) is what pthread_atfork is for.
        unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
    });
    let fresh = Box::into_raw(Box::new(Registry {
        inner: Mutex::new(Inner::default()),
        _abandoned: ABANDONED.load(Ordering::Acquire),
    }));
    match REGISTRY.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            unsafe { &*winner }
        }
    }
}

extern "C" fn child_after_fork() {
    for chunk in &SLOTS {
        // SAFETY: chunks are never freed.
        if let Some(chunk) = unsafe { chunk.load(Ordering::Acquire).as_ref() } {
            for slot in chunk.iter() {
                let fd = slot.swap(-1, Ordering::AcqRel);
                if fd >= 0 {
                    // close, never LOCK_UN: the lock belongs to the open file
                    // description the parent still has.
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
    // SAFETY: a slot index is only handed out after its chunk was installed.
    let chunk = unsafe { &*SLOTS[c].load(Ordering::Acquire) };
    &chunk[i]
}

impl Registry {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (every update is one insert or remove), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// Share a held lease: bump its count and return it.
    pub(crate) fn share(&mut self, key: Key) -> Option<Arc<Shared>> {
        let e = self.leases.get_mut(&key)?;
        e.count += 1;
        Some(e.shared.clone())
    }

    pub(crate) fn get(&self, key: Key) -> Option<&Arc<Shared>> {
        self.leases.get(&key).map(|e| &e.shared)
    }

    pub(crate) fn insert(&mut self, key: Key, shared: Arc<Shared>) {
        self.leases.insert(key, Entry { shared, count: 1 });
    }

    /// Drop one handle's share; returns the lease when it was the last.
    pub(crate) fn unshare(&mut self, key: Key, shared: &Arc<Shared>) -> Option<Arc<Shared>> {
        let e = self.leases.get_mut(&key)?;
        if !Arc::ptr_eq(&e.shared, shared) {
            return None;
        }
        e.count -= 1;
        if e.count > 0 {
            return None;
        }
        self.leases.remove(&key).map(|e| e.shared)
    }

    /// Put a descriptor where the fork handler will find it.
    pub(crate) fn claim_slot(&mut self, fd: RawFd) -> Result<u32> {
        let index = match self.free_slots.pop() {
            Some(i) => i,
            None => {
                let i = self.next_slot;
                if i as usize >= MAX_LEASES {
                    return Err(Error::invalid(
                        "target",
                        format!("this process already has {MAX_LEASES} lease files open"),
                    ));
                }
                let c = i as usize / CHUNK;
                if SLOTS[c].load(Ordering::Acquire).is_null() {
                    let chunk: Box<Chunk> = Box::new([const { AtomicI32::new(-1) }; CHUNK]);
                    SLOTS[c].store(Box::into_raw(chunk), Ordering::Release);
                }
                self.next_slot += 1;
                i
            }
        };
        slot(index).store(fd, Ordering::Release);
        Ok(index)
    }

    /// Take a descriptor back from the fork handler's table. Returns false
    /// when the handler already closed it (this is a forked child).
    pub(crate) fn release_slot(&mut self, index: u32, fd: RawFd) -> bool {
        let owned = slot(index)
            .compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if owned {
            self.free_slots.push(index);
        }
        owned
    }
}
