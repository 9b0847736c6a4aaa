//! sidelease_inspect_json: the identity probe.

use std::os::raw::c_char;

use sidelease_core::{inspect, Options};

use crate::error::sidelease_status;
use crate::guard::{guard, non_null_mut, put};
use crate::strings::{give, path_arg, str_arg};

/// Inspect the lease of `target` without holding or blocking it (where the
/// kernel's lock table is missing or names no holder, a shared lock is taken
/// and let go at once; an acquirer's attempt in that moment looks once more).
/// `suffix` may be NULL for the default. `*out` receives a JSON object
/// (keys target, lease_path, state, holders, record, record_status,
/// orphans: former lease files held by a process that does not hold the
/// file at the path; former: those the current holder keeps since it put
/// the file back; unattributed; server: for a PostgreSQL target the session
/// holding it, {backend_pid, client_addr, application_name, encrypted}, else
/// null; platform: {implementation: "linux" or "portable", unavailable: the
/// kernel's answers it could not have, of "lock-table", "descriptors",
/// "file-events"}) to free with sidelease_string_free().
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT,
/// SIDELEASE_ERR_INVALID_ARGUMENT or SIDELEASE_ERR_IO.
#[no_mangle]
pub unsafe extern "C" fn sidelease_inspect_json(
    target: *const c_char,
    suffix: *const c_char,
    out: *mut *mut c_char,
) -> sidelease_status {
    guard(|| {
        let target = path_arg(target, "target")?;
        non_null_mut(out, "out")?;
        let mut opts = Options::new();
        if !suffix.is_null() {
            opts = opts.suffix(str_arg(suffix, "suffix")?);
        }
        let i = inspect(target, &opts)?;
        put(out, give(i.to_json()));
        Ok(())
    })
}
