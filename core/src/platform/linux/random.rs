//! Bytes from the kernel's random generator.

/// The call named in errors, and what it reads.
pub const CALL: &str = "getrandom";
pub const SOURCE: &str = "/dev/urandom";

/// Fill `bytes` (`getrandom(2)`, which blocks only until the pool is
/// initialised at boot).
pub fn fill(bytes: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < bytes.len() {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
