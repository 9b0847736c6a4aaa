//! Milliseconds on the monotonic clock. Unlike Linux's `CLOCK_BOOTTIME` it
//! may stop while the system is suspended, so a bound measured on it can
//! run long by the time spent suspended (docs/platforms.md).

pub fn boot_ms() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC is POSIX.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}
