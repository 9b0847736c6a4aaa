//! A clock that keeps counting while the system is suspended (a machine
//! asleep, a VM its host paused), so that a bound measured on it — how long
//! since the server last confirmed a lease — holds across either; the
//! monotonic clock stops meanwhile.

/// Milliseconds since boot, suspended time included.
pub fn boot_ms() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_BOOTTIME exists since Linux 2.6.39,
    // and the monotonic clock stands in should it not.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) } != 0 {
        // SAFETY: as above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    }
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_with_real_time_and_never_goes_back() {
        let (a, t) = (super::boot_ms(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let b = super::boot_ms();
        let real = t.elapsed().as_millis() as u64;
        assert!(b >= a + 49 && b <= a + real + 2, "{a} {b} {real}");
    }
}
