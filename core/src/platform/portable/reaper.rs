//! Keeping a command's descendants within reach: there is no portable
//! subreaper, so a command's orphaned descendants go to init and are not
//! found (docs/platforms.md says so).

use std::io;
use std::time::Duration;

/// Not available here: `false`.
pub fn become_subreaper() -> io::Result<bool> {
    Ok(false)
}

/// Not available here: an error saying so.
pub fn end_descendants(_grace: Duration, _bound: Duration) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "this platform cannot find a command's orphaned descendants",
    ))
}
