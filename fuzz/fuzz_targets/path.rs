//! Targets and suffixes as arbitrary bytes (`..`, `//`, trailing slashes,
//! NUL, non-UTF-8, over-long names) through path resolution. `inspect` is
//! used because it never creates, locks or changes anything.
#![no_main]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use libfuzzer_sys::fuzz_target;
use sidelease::{inspect, Error, Options};

fuzz_target!(|data: &[u8]| {
    // The first byte splits the input into target and suffix.
    let (cut, rest) = match data.split_first() {
        Some((c, r)) => (*c as usize, r),
        None => (0, data),
    };
    let (target, suffix) = rest.split_at(cut.min(rest.len()));
    let mut opts = Options::new();
    if !suffix.is_empty() {
        opts = opts.suffix(String::from_utf8_lossy(suffix).into_owned());
    }
    let target = OsStr::from_bytes(target);
    match inspect(target, &opts) {
        Ok(i) => {
            // Whatever it says serialises to one whole JSON document (paths
            // that are not UTF-8 carry `\udcXX` escapes, which serde_json
            // refuses: read them as `\u00XX`).
            let json = i.to_json().replace("\\udc", "\\u00");
            serde_json::from_str::<serde_json::Value>(&json).expect("inspect JSON parses");
        }
        Err(e) => {
            // An error names what was wrong; it is never empty.
            assert!(!e.to_string().is_empty());
            if target.as_bytes().contains(&0) {
                assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
            }
        }
    }
});
