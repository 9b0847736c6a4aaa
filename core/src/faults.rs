//! Fault injection for test builds: a seeded delay or yield at each step of
//! acquiring, re-anchoring, guarding and releasing a lease file (and where a
//! kept PostgreSQL session saw its end, `pg/idle.rs`, and before a wait's
//! lock request, `pg/wait.rs`), so that interleavings only many cores
//! reach on their own are reached on two.
//!
//! Compiled in only with the `fault-injection` feature (the soak in
//! `tests/soak` and tests/run's kept-session and given-up-wait tests build
//! it; no package, binding or release build enables it); without it
//! [`step`] is an empty inline function. With it, nothing happens unless
//! `SIDELEASE_FAULTS=SEED[:MAX_MICROS]` is set: then each step draws from a
//! generator seeded by SEED, the process and the step's count, and sleeps
//! up to MAX_MICROS (default 2000) a quarter of the time, yields another
//! quarter, and goes on at once otherwise. The same seed makes the same
//! draws in the same process at the same step count, so a seed that
//! reaches a race names a reproducible schedule of delays (the kernel's
//! own scheduling still varies).

// Built for the unit tests too, so its parsing is tested in every build.
#[cfg(any(test, feature = "fault-injection"))]
#[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
mod imp {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Duration;

    pub const VAR: &str = "SIDELEASE_FAULTS";

    struct Plan {
        seed: u64,
        max_micros: u64,
    }

    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);

    fn parse(v: &str) -> Result<Plan, String> {
        let (seed, max) = match v.split_once(':') {
            Some((s, m)) => (s, Some(m)),
            None => (v, None),
        };
        let seed = seed
            .trim()
            .parse()
            .map_err(|_| format!("{VAR}={v:?}: SEED must be an unsigned integer"))?;
        let max_micros = match max {
            Some(m) => m
                .trim()
                .parse()
                .map_err(|_| format!("{VAR}={v:?}: MAX_MICROS must be an unsigned integer"))?,
            None => 2000,
        };
        Ok(Plan { seed, max_micros })
    }

    fn plan() -> Option<&'static Plan> {
        PLAN.get_or_init(|| {
            let v = std::env::var(VAR).ok()?;
            match parse(&v) {
                Ok(p) => Some(p),
                Err(e) => {
                    // A test build only: say why no fault is injected.
                    eprintln!("sidelease: fault injection off: {e}");
                    None
                }
            }
        })
        .as_ref()
    }

    /// SplitMix64: small, fast and well mixed.
    fn mix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    fn name_hash(name: &str) -> u64 {
        name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
        })
    }

    pub fn step(name: &'static str) {
        let Some(p) = plan() else { return };
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let x = mix(p.seed ^ mix(u64::from(std::process::id()) << 20 ^ n) ^ name_hash(name));
        match x & 3 {
            0 => std::thread::sleep(Duration::from_micros((x >> 2) % (p.max_micros + 1))),
            1 => rustix::thread::sched_yield(),
            _ => {}
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_setting_is_parsed_or_named_in_the_error() {
            let p = parse("42").unwrap();
            assert_eq!((p.seed, p.max_micros), (42, 2000));
            let p = parse("7:300").unwrap();
            assert_eq!((p.seed, p.max_micros), (7, 300));
            let e = parse("x").err().unwrap();
            assert!(e.contains("SIDELEASE_FAULTS") && e.contains("SEED"), "{e}");
            let e = parse("1:y").err().unwrap();
            assert!(e.contains("MAX_MICROS"), "{e}");
        }
    }
}

/// One step of a lease operation: under fault injection, maybe a delay.
#[cfg(feature = "fault-injection")]
pub(crate) fn step(name: &'static str) {
    imp::step(name)
}

/// One step of a lease operation (fault injection is not compiled in).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn step(_name: &'static str) {}

/// How many rounds an attempt may find its lease file replaced before it
/// gives up (a single attempt) or backs off (a wait): `default`, unless a
/// fault-injection build runs with `SIDELEASE_FAULT_ROUNDS=N`, so that a
/// test reaches the bound on a machine too slow to replace a file 64 times
/// within one attempt.
#[cfg(feature = "fault-injection")]
pub(crate) fn replaced_rounds(default: u32) -> u32 {
    std::env::var("SIDELEASE_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The bound on replaced rounds (fault injection is not compiled in).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn replaced_rounds(default: u32) -> u32 {
    default
}
