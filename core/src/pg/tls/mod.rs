//! TLS for PostgreSQL leases, with libpq's parameters and their meaning
//! (rustls, no OpenSSL: the wheel and the addon stay self-contained).
//!
//! | `sslmode`     | TLS                               | server certificate checked          |
//! |---------------|-----------------------------------|-------------------------------------|
//! | `disable`     | never                             | —                                   |
//! | `allow`       | only if plaintext is refused      | chain, if a root certificate exists |
//! | `prefer` (default) | if the server offers it      | chain, if a root certificate exists |
//! | `require`     | always                            | chain, if a root certificate exists |
//! | `verify-ca`   | always                            | chain                               |
//! | `verify-full` | always                            | chain and host name                 |
//!
//! The root certificate is `sslrootcert` (a file, or `system` for the
//! platform's roots, which asks for `verify-full`), else
//! `~/.postgresql/root.crt` if it exists; the client certificate is
//! `sslcert`/`sslkey`, else `~/.postgresql/postgresql.{crt,key}` if they
//! exist. The `PGSSL*` variables stand in for parameters the URL does not
//! give. Over a Unix socket there is no TLS (as libpq).

mod binding;
mod stream;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};

pub(crate) use stream::Connector;

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

#[derive(Clone, Debug)]
enum Root {
    /// `~/.postgresql/root.crt`, if it exists.
    Default,
    File(PathBuf),
    System,
}

/// The TLS parameters of one target, as given (files are read at each
/// connection, as libpq does, so a rotated certificate is picked up).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub mode: Mode,
    root: Root,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    crl: Option<PathBuf>,
    sni: bool,
    tls12: bool,
    tls13: bool,
}

/// The URL parameters this module takes (the driver refuses them), each
/// with the variable that stands in when the URL is silent.
pub(crate) const PARAMS: &[(&str, Option<&str>)] = &[
    ("sslmode", Some("PGSSLMODE")),
    ("sslrootcert", Some("PGSSLROOTCERT")),
    ("sslcert", Some("PGSSLCERT")),
    ("sslkey", Some("PGSSLKEY")),
    ("sslcrl", Some("PGSSLCRL")),
    ("sslcrldir", Some("PGSSLCRLDIR")),
    ("sslsni", Some("PGSSLSNI")),
    ("sslpassword", None),
    ("sslcompression", Some("PGSSLCOMPRESSION")),
    ("ssl_min_protocol_version", Some("PGSSLMINPROTOCOLVERSION")),
    ("ssl_max_protocol_version", Some("PGSSLMAXPROTOCOLVERSION")),
    ("requiressl", Some("PGREQUIRESSL")),
];

fn bad(shown: &str, message: impl std::fmt::Display) -> Error {
    Error::invalid("target", format!("{shown}: {message}"))
}

/// libpq's protocol version names, as an order.
fn version(shown: &str, key: &str, v: &str) -> Result<u8> {
    match v.to_ascii_lowercase().as_str() {
        "tlsv1" => Ok(0),
        "tlsv1.1" => Ok(1),
        "tlsv1.2" => Ok(2),
        "tlsv1.3" => Ok(3),
        _ => Err(bad(
            shown,
            format!(
                "{key}={}: not a TLS version (TLSv1, TLSv1.1, TLSv1.2 or TLSv1.3)",
                super::printable(v)
            ),
        )),
    }
}

impl Settings {
    /// From the URL's TLS parameters (`given`, percent-decoded) and, where
    /// it is silent, the environment.
    pub(crate) fn parse(given: &[(&str, String)], shown: &str) -> Result<Settings> {
        let get = |key: &str| -> Option<String> {
            if let Some((_, v)) = given.iter().rev().find(|(k, _)| *k == key) {
                return Some(v.clone());
            }
            let var = PARAMS.iter().find(|(k, _)| *k == key)?.1?;
            std::env::var(var).ok().filter(|v| !v.is_empty())
        };
        if get("sslpassword").is_some() {
            return Err(bad(
                shown,
                "sslpassword: an encrypted client key is not supported; give sslkey an \
                 unencrypted key readable by this user only (chmod 0600)",
            ));
        }
        if get("sslcrldir").is_some() {
            return Err(bad(
                shown,
                "sslcrldir is not supported; give sslcrl one file of revocation lists",
            ));
        }
        let root = match get("sslrootcert") {
            None => Root::Default,
            Some(v) if v == "system" => Root::System,
            Some(v) => Root::File(PathBuf::from(v)),
        };
        let requested = match get("sslmode") {
            Some(v) => Some(match v.as_str() {
                "disable" => Mode::Disable,
                "allow" => Mode::Allow,
                "prefer" => Mode::Prefer,
                "require" => Mode::Require,
                "verify-ca" => Mode::VerifyCa,
                "verify-full" => Mode::VerifyFull,
                _ => {
                    return Err(bad(
                        shown,
                        format!(
                            "sslmode={}: not a mode (disable, allow, prefer, require, verify-ca \
                             or verify-full)",
                            super::printable(&v)
                        ),
                    ))
                }
            }),
            None => match get("requiressl").as_deref() {
                Some("1") => Some(Mode::Require),
                Some("0") | None => None,
                Some(v) => {
                    return Err(bad(
                        shown,
                        format!("requiressl={}: 0 or 1", super::printable(v)),
                    ))
                }
            },
        };
        let mode = match (&root, requested) {
            (Root::System, None) => Mode::VerifyFull,
            (Root::System, Some(m)) if m != Mode::VerifyFull => {
                return Err(bad(
                    shown,
                    format!(
                        "sslrootcert=system trusts every CA the platform trusts, so it needs \
                         sslmode=verify-full (not {}): with any weaker mode anyone with a \
                         certificate from any public CA could pose as the server",
                        mode_name(m)
                    ),
                ))
            }
            (_, m) => m.unwrap_or(Mode::Prefer),
        };
        let sni = match get("sslsni").as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(v) => {
                return Err(bad(
                    shown,
                    format!("sslsni={}: 0 or 1", super::printable(v)),
                ))
            }
        };
        let min = match get("ssl_min_protocol_version") {
            Some(v) => version(shown, "ssl_min_protocol_version", &v)?,
            None => 2,
        };
        let max = match get("ssl_max_protocol_version") {
            Some(v) => version(shown, "ssl_max_protocol_version", &v)?,
            None => 3,
        };
        if max < 2 {
            return Err(bad(
                shown,
                "ssl_max_protocol_version below TLSv1.2: this library speaks TLSv1.2 and TLSv1.3 \
                 only (the older versions are broken)",
            ));
        }
        if min > max {
            return Err(bad(
                shown,
                "ssl_min_protocol_version is above ssl_max_protocol_version",
            ));
        }
        Ok(Settings {
            mode,
            root,
            cert: get("sslcert").map(PathBuf::from),
            key: get("sslkey").map(PathBuf::from),
            crl: get("sslcrl").map(PathBuf::from),
            sni,
            tls12: min <= 2,
            tls13: max >= 3,
        })
    }

    /// The handshake for one connection to `host` (`None` for
    /// `sslmode=disable`): files are read now.
    pub(crate) fn connector(&self, host: &str, shown: &str) -> Result<Option<Connector>> {
        if self.mode == Mode::Disable {
            return Ok(None);
        }
        let bad = |m: String| bad(shown, m);
        let provider = provider();
        let (roots, described) = match &self.root {
            Root::System => (
                Some(system_roots().map_err(&bad)?),
                "the system's roots".into(),
            ),
            Root::File(p) => (load_roots(p, self.mode, shown)?, p.display().to_string()),
            Root::Default => match home().map(|h| h.join(".postgresql/root.crt")) {
                Some(p) => (load_roots(&p, self.mode, shown)?, p.display().to_string()),
                None if self.mode == Mode::VerifyCa || self.mode == Mode::VerifyFull => {
                    return Err(bad(no_root("~/.postgresql/root.crt")))
                }
                None => (None, String::new()),
            },
        };
        let versions: Vec<&'static SupportedProtocolVersion> = [
            self.tls12.then_some(&rustls::version::TLS12),
            self.tls13.then_some(&rustls::version::TLS13),
        ]
        .into_iter()
        .flatten()
        .collect();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| bad(format!("TLS settings: {e}")))?;
        let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> = match roots {
            None => Arc::new(verify::Unverified(provider.clone())),
            Some(roots) => {
                let mut b = WebPkiServerVerifier::builder_with_provider(roots, provider.clone());
                if let Some(p) = &self.crl {
                    b = b
                        .with_crls(load_crls(p, shown)?)
                        .only_check_end_entity_revocation();
                }
                let full = b.build().map_err(|e| bad(format!("sslrootcert: {e}")))?;
                if self.mode == Mode::VerifyFull {
                    full
                } else {
                    Arc::new(verify::ChainOnly(full))
                }
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match self.client_identity(shown)? {
            Some((certs, key)) => builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| bad(format!("sslcert/sslkey: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        let name = match ServerName::try_from(host.to_owned()) {
            Ok(n) => n,
            Err(_) if self.mode == Mode::VerifyFull => {
                return Err(bad(format!(
                    "sslmode=verify-full: the host {} is neither a DNS name nor an IP address a \
                     certificate could name",
                    super::printable(host)
                )))
            }
            Err(_) => {
                config.enable_sni = false;
                ServerName::IpAddress(std::net::Ipv4Addr::UNSPECIFIED.into())
            }
        };
        config.enable_sni &= self.sni;
        Ok(Some(Connector {
            config: Arc::new(config),
            name,
            host: super::printable(host),
            roots: described,
            used: Arc::new(OnceLock::new()),
            tried: Arc::default(),
            linger: false,
        }))
    }

    /// The client certificate chain and key, if there is one to present.
    fn client_identity(
        &self,
        shown: &str,
    ) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>> {
        let home = home();
        let cert = match (&self.cert, &home) {
            (Some(p), _) => p.clone(),
            (None, Some(h)) => h.join(".postgresql/postgresql.crt"),
            (None, None) => return Ok(None),
        };
        // As libpq: a certificate file that is not there means none.
        let cert_pem = match std::fs::read(&cert) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read sslcert", &cert, e)),
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| {
                bad(
                    shown,
                    format!("sslcert {}: not PEM certificates ({e})", cert.display()),
                )
            })?;
        if certs.is_empty() {
            return Err(bad(
                shown,
                format!("sslcert {}: no certificate in it", cert.display()),
            ));
        }
        let key = match (&self.key, &home) {
            (Some(p), _) => p.clone(),
            (None, Some(h)) => h.join(".postgresql/postgresql.key"),
            (None, None) => return Err(bad(shown, "sslcert is given but sslkey is not")),
        };
        let meta = std::fs::metadata(&key).map_err(|e| {
            bad(
                shown,
                format!(
                    "certificate {} present, but not its private key {}: {e}",
                    cert.display(),
                    key.display()
                ),
            )
        })?;
        check_key_mode(&key, &meta).map_err(|m| bad(shown, m))?;
        let key_pem = std::fs::read(&key).map_err(|e| Error::io("read sslkey", &key, e))?;
        if key_pem.windows(9).any(|w| w == b"ENCRYPTED") {
            return Err(bad(
                shown,
                format!(
                "sslkey {}: the key is encrypted, which this library does not support; decrypt \
                 it (openssl pkey -in KEY -out KEY.plain) and keep it readable by this user only",
                key.display()
            ),
            ));
        }
        let der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            bad(
                shown,
                format!("sslkey {}: not a PEM private key ({e})", key.display()),
            )
        })?;
        Ok(Some((certs, der)))
    }
}

pub(crate) fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Disable => "disable",
        Mode::Allow => "allow",
        Mode::Prefer => "prefer",
        Mode::Require => "require",
        Mode::VerifyCa => "verify-ca",
        Mode::VerifyFull => "verify-full",
    }
}

/// As libpq: a key others can read is refused (0600 at most for the user's
/// own, 0640 for one root owns).
fn check_key_mode(key: &Path, meta: &std::fs::Metadata) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode();
    let me = rustix::process::geteuid().as_raw();
    let loose = if meta.uid() == 0 && me != 0 {
        mode & 0o037 != 0
    } else {
        mode & 0o077 != 0
    };
    if loose || (meta.uid() != me && meta.uid() != 0) {
        return Err(format!(
            "sslkey {}: the private key file has group or world access, or another owner; it \
             must be u=rw (0600) or less if this user owns it, or u=rw,g=r (0640) or less if \
             root owns it",
            key.display()
        ));
    }
    Ok(())
}

fn no_root(path: &str) -> String {
    format!(
        "root certificate file {path} does not exist: give sslrootcert (a file, or system for \
         the platform's trusted roots), or a weaker sslmode that does not verify the server"
    )
}

fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// The roots in a PEM file; `None` where the file is not there and the mode
/// does not ask for verification (libpq then checks nothing).
/// A file that cannot be read is an I/O error naming it (the system's errno);
/// one that holds no roots is the setting's problem.
fn load_roots(path: &Path, mode: Mode, shown: &str) -> Result<Option<Arc<RootCertStore>>> {
    let pem = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match mode {
                Mode::VerifyCa | Mode::VerifyFull => {
                    Err(bad(shown, no_root(&path.display().to_string())))
                }
                _ => Ok(None),
            }
        }
        Err(e) => return Err(Error::io("read sslrootcert", path, e)),
    };
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(
        CertificateDer::pem_slice_iter(&pem).filter_map(std::result::Result::ok),
    );
    if added == 0 {
        return Err(bad(
            shown,
            format!(
                "sslrootcert {}: no certificate this library can read in it",
                path.display()
            ),
        ));
    }
    Ok(Some(Arc::new(store)))
}

fn load_crls(path: &Path, shown: &str) -> Result<Vec<CertificateRevocationListDer<'static>>> {
    let pem = std::fs::read(path).map_err(|e| Error::io("read sslcrl", path, e))?;
    let crls: Vec<_> = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| {
            bad(
                shown,
                format!("sslcrl {}: not PEM revocation lists ({e})", path.display()),
            )
        })?;
    if crls.is_empty() {
        return Err(bad(
            shown,
            format!("sslcrl {}: no revocation list in it", path.display()),
        ));
    }
    Ok(crls)
}

/// The platform's trusted roots, read once per process.
fn system_roots() -> std::result::Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<std::result::Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(crate::platform::roots::system_roots());
            if store.is_empty() {
                return Err(
                    "sslrootcert=system: no trusted root certificates found on this system \
                     (install ca-certificates, or set SSL_CERT_FILE)"
                        .to_owned(),
                );
            }
            Ok(Arc::new(store))
        })
        .clone()
}

/// The user's home directory, as libpq finds it: `HOME`, else the password
/// database.
fn home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    let uid = rustix::process::geteuid().as_raw();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 5 && f[2].parse::<u32>().ok()? == uid).then(|| PathBuf::from(f[5]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(params: &[(&str, &str)]) -> Result<Settings> {
        let given: Vec<(&str, String)> = params.iter().map(|(k, v)| (*k, v.to_string())).collect();
        Settings::parse(&given, "postgresql://db/app?lease=x")
    }

    #[test]
    fn modes_as_libpq_spells_them() {
        for (v, m) in [
            ("disable", Mode::Disable),
            ("allow", Mode::Allow),
            ("prefer", Mode::Prefer),
            ("require", Mode::Require),
            ("verify-ca", Mode::VerifyCa),
            ("verify-full", Mode::VerifyFull),
        ] {
            assert_eq!(parse(&[("sslmode", v)]).unwrap().mode, m);
        }
        let e = parse(&[("sslmode", "verify")]).unwrap_err().to_string();
        assert!(e.contains("sslmode=verify: not a mode"), "{e}");
    }

    #[test]
    fn system_roots_ask_for_verify_full() {
        assert_eq!(
            parse(&[("sslrootcert", "system")]).unwrap().mode,
            Mode::VerifyFull
        );
        let e = parse(&[("sslrootcert", "system"), ("sslmode", "require")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs sslmode=verify-full (not require)"), "{e}");
    }

    #[test]
    fn what_is_not_supported_says_so() {
        for (k, v, want) in [
            ("sslpassword", "pw", "encrypted client key"),
            ("sslcrldir", "/x", "sslcrldir is not supported"),
            (
                "ssl_max_protocol_version",
                "TLSv1.1",
                "TLSv1.2 and TLSv1.3 only",
            ),
            ("ssl_min_protocol_version", "SSLv3", "not a TLS version"),
            ("sslsni", "2", "sslsni=2: 0 or 1"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(want), "{k}={v}: {e}");
            assert!(!e.contains("pw"), "{e}");
        }
        let e = parse(&[
            ("ssl_min_protocol_version", "TLSv1.3"),
            ("ssl_max_protocol_version", "TLSv1.2"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("min_protocol_version is above"), "{e}");
    }
}
