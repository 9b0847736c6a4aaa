//! Bytes from `/dev/urandom`, which every Unix has.

use std::io::Read;

/// The call named in errors, and what it reads.
pub const CALL: &str = "read";
pub const SOURCE: &str = "/dev/urandom";

pub fn fill(bytes: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open(SOURCE)?.read_exact(bytes)
}
