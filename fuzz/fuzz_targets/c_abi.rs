//! The exported C functions in arbitrary orders with arbitrary strings: the
//! input is a program for a small machine holding options, cancel tokens
//! and lease handles. Every pointer passed is NULL or one the library gave
//! and not yet freed (anything else is undefined behaviour by contract, not
//! a finding). Acquisitions use fixed names in one private directory; any
//! bytes reach the string arguments, including `inspect`'s target.
#![no_main]

use std::ffi::{c_char, CString};
use std::ptr;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sidelease_c::*;

fn dir() -> &'static str {
    static DIR: OnceLock<String> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("sidelease-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.to_str().unwrap().to_owned()
    })
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    /// A length-prefixed string; NUL bytes end it early, as C would see it.
    fn string(&mut self) -> Option<CString> {
        let n = (self.byte()? as usize).min(self.0.len());
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        let s: Vec<u8> = s.iter().copied().take_while(|b| *b != 0).collect();
        Some(CString::new(s).unwrap())
    }
    fn maybe_null(&mut self) -> Option<Option<CString>> {
        Some(if self.byte()? & 1 == 0 {
            None
        } else {
            Some(self.string()?)
        })
    }
}

fn ptr_of(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |c| c.as_ptr())
}

#[derive(Default)]
struct Machine {
    options: Vec<*mut sidelease_options>,
    cancels: Vec<*mut sidelease_cancel>,
    leases: Vec<*mut sidelease_lease>,
}

fn pick<T>(v: &[*mut T], b: u8) -> *mut T {
    // One choice in eight is NULL, to reach every NULL check.
    if v.is_empty() || b % 8 == 7 {
        ptr::null_mut()
    } else {
        v[b as usize % v.len()]
    }
}

fn take<T>(v: &mut Vec<*mut T>, b: u8) -> Option<*mut T> {
    (!v.is_empty()).then(|| v.swap_remove(b as usize % v.len()))
}

fn out_string(f: impl FnOnce(*mut *mut c_char) -> sidelease_status) {
    let mut s: *mut c_char = ptr::null_mut();
    let st = f(&mut s);
    if st == sidelease_status::SIDELEASE_OK {
        assert!(!s.is_null());
        // SAFETY: a string the library returned, freed once.
        unsafe { sidelease_string_free(s) };
    } else {
        assert!(s.is_null(), "a failed call returned a string");
    }
}

fn step(m: &mut Machine, inp: &mut Input<'_>) -> Option<()> {
    let op = inp.byte()?;
    let b = inp.byte()?;
    // SAFETY (for every call below): each pointer is NULL or a live object
    // from this machine's tables, removed from them when freed.
    unsafe {
        match op % 20 {
            0 => {
                let mut o = ptr::null_mut();
                if sidelease_options_new(&mut o) == sidelease_status::SIDELEASE_OK {
                    m.options.push(o);
                }
            }
            1 => {
                if let Some(o) = take(&mut m.options, b) {
                    sidelease_options_free(o);
                }
            }
            2 => {
                // Never a wait longer than a few milliseconds (nobody would
                // end a wait forever); the refusals of bad values are tested
                // in tests/test_sidelease.c.
                let ms = i64::from(inp.byte()? % 6);
                sidelease_options_set_timeout_ms(pick(&m.options, b), ms);
            }
            3 => {
                let s = inp.maybe_null()?;
                sidelease_options_set_suffix(pick(&m.options, b), ptr_of(&s));
            }
            4 => {
                let s = inp.maybe_null()?;
                sidelease_options_set_metadata_json(pick(&m.options, b), ptr_of(&s));
            }
            5 => {
                let s = inp.maybe_null()?;
                sidelease_options_set_runtime(pick(&m.options, b), ptr_of(&s));
            }
            6 => {
                let on = inp.byte()? & 1 == 1;
                let o = pick(&m.options, b);
                match inp.byte()? % 3 {
                    0 => sidelease_options_set_split_guard(o, on),
                    1 => sidelease_options_set_watch(o, on),
                    _ => sidelease_options_set_allow_unsupported_fs(o, on),
                };
            }
            7 => {
                let mut c = ptr::null_mut();
                if sidelease_cancel_new(&mut c) == sidelease_status::SIDELEASE_OK {
                    m.cancels.push(c);
                }
            }
            8 => {
                sidelease_cancel_cancel(pick(&m.cancels, b));
            }
            9 => {
                if let Some(c) = take(&mut m.cancels, b) {
                    sidelease_cancel_free(c);
                }
            }
            10 | 11 => {
                let name = CString::new(format!("{}/db{}", dir(), inp.byte()? % 4)).unwrap();
                let mut l = ptr::null_mut();
                let st = sidelease_acquire(
                    name.as_ptr(),
                    pick(&m.options, b),
                    pick(&m.cancels, b >> 3),
                    &mut l,
                );
                if st == sidelease_status::SIDELEASE_OK {
                    assert!(!l.is_null());
                    m.leases.push(l);
                } else {
                    assert!(l.is_null(), "a failed acquire returned a lease");
                }
            }
            12 => {
                sidelease_lease_release(pick(&m.leases, b));
            }
            13 => {
                if let Some(l) = take(&mut m.leases, b) {
                    sidelease_lease_free(l);
                }
            }
            14 => {
                let l = pick(&m.leases, b);
                match inp.byte()? % 6 {
                    0 => out_string(|s| sidelease_lease_path(l, s)),
                    1 => out_string(|s| sidelease_lease_record_json(l, s)),
                    2 => out_string(|s| sidelease_lease_previous_json(l, s)),
                    3 => {
                        let mut c = sidelease_check::SIDELEASE_CHECK_HELD;
                        sidelease_lease_check(l, &mut c);
                    }
                    4 => {
                        let mut g = 0u64;
                        sidelease_lease_generation(l, &mut g);
                        let mut w = false;
                        sidelease_lease_record_written(l, &mut w);
                        sidelease_lease_previous_released_cleanly(l, &mut w);
                    }
                    _ => {
                        let mut s = sidelease_state::SIDELEASE_STATE_HELD;
                        sidelease_lease_state(l, &mut s);
                        sidelease_lease_ensure_held(l);
                        let mut fd = -1;
                        sidelease_lease_lost_fd(l, &mut fd);
                    }
                }
            }
            15 => {
                // Any bytes as the target: inspect never creates anything.
                let t = inp.maybe_null()?;
                let s = inp.maybe_null()?;
                out_string(|o| sidelease_inspect_json(ptr_of(&t), ptr_of(&s), o));
            }
            16 => {
                let name = CString::new(format!("{}/db{}", dir(), inp.byte()? % 4)).unwrap();
                out_string(|o| sidelease_inspect_json(name.as_ptr(), ptr::null(), o));
            }
            17 => {
                // Buffers of every size, including none.
                let len = inp.byte()? as usize % 80;
                let mut buf = vec![0x55 as c_char; len];
                let mut written = 0usize;
                let p = if len == 0 {
                    ptr::null_mut()
                } else {
                    buf.as_mut_ptr()
                };
                sidelease_last_error(p, len, &mut written);
                sidelease_last_holder_json(p, len, &mut written);
                sidelease_strerror(i32::from(b as i8), p, len, &mut written);
                if len > 0 {
                    assert!(buf.contains(&0), "no terminating NUL within the buffer");
                }
                let mut pids = vec![0u32; len / 4];
                let mut count = 0usize;
                let pp = if pids.is_empty() {
                    ptr::null_mut()
                } else {
                    pids.as_mut_ptr()
                };
                sidelease_last_holder_pids(pp, pids.len(), &mut count);
                sidelease_last_errno();
            }
            18 => {
                // NULL out-parameters everywhere they are taken.
                sidelease_options_new(ptr::null_mut());
                sidelease_cancel_new(ptr::null_mut());
                let name = CString::new(format!("{}/db0", dir())).unwrap();
                sidelease_acquire(name.as_ptr(), ptr::null(), ptr::null(), ptr::null_mut());
                sidelease_lease_path(pick(&m.leases, b), ptr::null_mut());
                sidelease_inspect_json(name.as_ptr(), ptr::null(), ptr::null_mut());
            }
            _ => {
                assert!(!sidelease_version().is_null());
            }
        }
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let mut m = Machine::default();
    let mut inp = Input(data);
    for _ in 0..64 {
        if step(&mut m, &mut inp).is_none() {
            break;
        }
    }
    // SAFETY: every pointer left is live and freed exactly once.
    unsafe {
        m.leases.drain(..).for_each(|l| sidelease_lease_free(l));
        m.cancels.drain(..).for_each(|c| sidelease_cancel_free(c));
        m.options.drain(..).for_each(|o| sidelease_options_free(o));
    }
});
