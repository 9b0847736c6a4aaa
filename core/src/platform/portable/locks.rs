//! No table of the machine's locks: who holds a lock is unknown. Whether
//! it is held at all is asked of the lock itself (a shared `flock` taken
//! and let go at once, in `inspect`).

use std::io;

pub use crate::platform::common::FlockLock;

pub fn flock_locks_on(_major: u32, _minor: u32) -> io::Result<Vec<FlockLock>> {
    super::note_unavailable(super::Missing::LockTable);
    Err(super::unsupported("the table of locks"))
}

pub fn exclusive_flock_locks() -> io::Result<Vec<FlockLock>> {
    super::note_unavailable(super::Missing::LockTable);
    Err(super::unsupported("the table of locks"))
}
