//! The system's trusted root certificates, for `sslrootcert=system`.
//!
//! Everywhere but macOS, `rustls-native-certs` reads them from the files
//! OpenSSL would (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the distribution's
//! bundle). On macOS it asks the Security framework, which only links with
//! Apple's SDK, and these artifacts are linked without it; macOS keeps the
//! same roots as a PEM bundle at `/etc/ssl/cert.pem`, which its own
//! LibreSSL and curl read, so that file (or `SSL_CERT_FILE`) is read
//! instead. Built, not run here (docs/platforms.md).

use rustls::pki_types::CertificateDer;

/// Every root found; empty when none is.
#[cfg(not(target_vendor = "apple"))]
pub fn system_roots() -> Vec<CertificateDer<'static>> {
    rustls_native_certs::load_native_certs().certs
}

/// Every root found; empty when none is.
#[cfg(target_vendor = "apple")]
pub fn system_roots() -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    let file = std::env::var_os("SSL_CERT_FILE")
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| "/etc/ssl/cert.pem".into());
    match CertificateDer::pem_file_iter(file) {
        Ok(certs) => certs.filter_map(Result::ok).collect(),
        Err(_) => Vec::new(),
    }
}
