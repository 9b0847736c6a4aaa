//! A PostgreSQL lease target: `postgresql://[user[:password]@]host[:port]/database?lease=NAME`
//! (or `postgres://`), any other libpq-style URL parameters passed on. The
//! password never leaves this module except into the connection's
//! configuration: everything shown (records, errors, inspect) uses
//! `Target::shown`.

use std::str::FromStr;

use sha2::{Digest, Sha256};
use tokio_postgres::config::Host;

use super::{mask, split_url, tls};
use crate::error::{Error, Result};

/// Longest lease name accepted, in bytes.
pub const NAME_MAX: usize = 200;

/// What distinguishes this library's advisory-lock keys from anyone else's.
const KEY_NAMESPACE: &[u8] = b"sidelease lease\0";

#[derive(Clone)]
pub(crate) struct Target {
    pub config: tokio_postgres::Config,
    /// The URL with its password replaced by `***`.
    pub shown: String,
    pub name: String,
    pub key: i64,
    /// Identifies the lease in this process: user, hosts, ports, database
    /// and name (never the password).
    pub identity: String,
    pub tls: tls::Settings,
    /// The holder's bound (`confirm_within`): past it without the server
    /// confirming the session, the lease counts as lost.
    pub confirm_within: std::time::Duration,
    /// Which shared session a lease may use: a digest of everything that
    /// makes the connection (the URL but its lease parameters, the TLS
    /// settings, the user and password however given), so leases share a
    /// session only with leases that would have opened the same one.
    pub server: String,
    /// `session=shared` (`Some(true)`): the lease lives on its server's
    /// shared session; `session=own` (`Some(false)`): on a connection of
    /// its own. Unsaid (`None`): shared, unless the caller hands the lease
    /// on to another process (`Options::inheritable`).
    pub shared: Option<bool>,
}

/// The default `confirm_within`, and its range: the server may end a silent
/// session 5 s after its last statement, so the holder must have given up
/// well before.
pub const CONFIRM_DEFAULT_MS: u64 = 1000;
/// The shortest `confirm_within` a URL may ask for, in milliseconds.
pub const CONFIRM_MIN_MS: u64 = 100;
/// The longest `confirm_within` a URL may ask for, in milliseconds.
pub const CONFIRM_MAX_MS: u64 = 4000;

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// The advisory-lock key of a lease name: the first 8 bytes of SHA-256 over
/// the namespaced name, big-endian, so every client on every platform
/// computes the same key.
pub fn key_of(name: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(KEY_NAMESPACE);
    h.update(name.as_bytes());
    let d = h.finalize();
    let mut k = [0u8; 8];
    k.copy_from_slice(&d[..8]);
    i64::from_be_bytes(k)
}

fn bad(message: impl Into<String>) -> Error {
    Error::invalid("target", message)
}

fn percent_decode(s: &str, what: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(format!("bad percent-encoding in the {what}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(format!("the {what} is not UTF-8")))
}

impl Target {
    pub fn parse(url: &str) -> Result<Target> {
        if url.contains(|c: char| c.is_control() || c == ' ') {
            return Err(bad(format!(
                "{}: a PostgreSQL URL has no spaces or control characters",
                mask(url)
            )));
        }
        let shown = mask(url);
        let parts = split_url(url).ok_or_else(|| bad(format!("{shown}: not a PostgreSQL URL")))?;
        if parts.place.contains('@') {
            return Err(bad(format!(
                "{shown}: more than one `@` before the parameters: percent-encode `@` in the \
                 user, password or lease name as %40"
            )));
        }
        let query = parts.query.unwrap_or("");
        let mut name = None;
        let mut passed: Vec<String> = Vec::new();
        let mut tls_given: Vec<(&str, String)> = Vec::new();
        let mut binding_given = false;
        let mut confirm = std::time::Duration::from_millis(CONFIRM_DEFAULT_MS);
        let mut shared = None;
        for p in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match k {
                "lease" => {
                    if name.is_some() {
                        return Err(bad(format!("{shown}: `lease` is given twice")));
                    }
                    name = Some(percent_decode(v, "lease name")?);
                }
                _ if tls::PARAMS.iter().any(|(t, _)| *t == k) => {
                    tls_given.push((k, percent_decode(v, k)?));
                }
                "session" => {
                    shared = match v {
                        "own" => Some(false),
                        "shared" => Some(true),
                        _ => {
                            return Err(bad(format!(
                                "{shown}: session={}: `shared` (one session per server for \
                                 the leases of this process, the default) or `own` (a connection \
                                 of the lease's own)",
                                super::printable(v)
                            )))
                        }
                    };
                }
                "confirm_within" => {
                    let ms = v
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| (CONFIRM_MIN_MS..=CONFIRM_MAX_MS).contains(ms))
                        .ok_or_else(|| {
                            bad(format!(
                                "{shown}: confirm_within={}: milliseconds, {CONFIRM_MIN_MS} to \
                                 {CONFIRM_MAX_MS} (the server may end a silent session 5 s after \
                                 its last answer; the holder must have counted it lost by then)",
                                super::printable(v)
                            ))
                        })?;
                    confirm = std::time::Duration::from_millis(ms);
                }
                "channel_binding" => {
                    binding_given = true;
                    passed.push(p.to_owned());
                }
                _ => passed.push(p.to_owned()),
            }
        }
        if !binding_given {
            if let Some(v) = std::env::var("PGCHANNELBINDING")
                .ok()
                .filter(|v| !v.is_empty())
            {
                if !matches!(v.as_str(), "disable" | "prefer" | "require") {
                    return Err(bad(format!(
                        "{shown}: PGCHANNELBINDING={} in the environment: disable, prefer or \
                         require",
                        super::printable(&v)
                    )));
                }
                passed.push(format!("channel_binding={v}"));
            }
        }
        let tls = tls::Settings::parse(&tls_given, &shown)?;
        let name = name.ok_or_else(|| {
            bad(format!(
                "{shown}: no lease name; add `?lease=NAME` (for example \
                 postgresql://app@db-1/app?lease=scheduler)"
            ))
        })?;
        check_name(&name, &shown)?;
        // The driver takes the credentials to the first `@` anywhere: an
        // `@` in the path or a parameter (libpq reads it as the value's)
        // travels percent-encoded.
        let mut rebuilt = format!("{}://", parts.scheme.to_ascii_lowercase());
        if let Some(c) = parts.creds {
            rebuilt.push_str(c);
            rebuilt.push('@');
        }
        rebuilt.push_str(parts.place);
        if !passed.is_empty() {
            rebuilt.push('?');
            rebuilt.push_str(&passed.join("&").replace('@', "%40"));
        }
        let mut config = tokio_postgres::Config::from_str(&rebuilt).map_err(|e| {
            // The parser's message may quote the URL: say what is wrong
            // without it.
            bad(format!(
                "{shown}: not a valid PostgreSQL URL ({})",
                strip_quoted(&e.to_string())
            ))
        })?;
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER")
                .ok()
                .filter(|u| !u.is_empty())
                .or_else(os_user)
                .ok_or_else(|| bad(format!("{shown}: no user in the URL, PGUSER or the system")))?;
            config.user(user);
        }
        if config.get_password().is_none() {
            if let Ok(pw) = std::env::var("PGPASSWORD") {
                config.password(pw);
            }
        }
        if config.get_hosts().is_empty() {
            config.host("localhost");
        }
        if config.get_dbname().is_none() {
            let user = config.get_user().unwrap_or_default().to_owned();
            config.dbname(user);
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(s) => s.clone(),
                Host::Unix(p) => p.to_string_lossy().into_owned(),
            })
            .collect();
        let identity = format!(
            "{}@{}:{:?}/{}#{}",
            config.get_user().unwrap_or_default(),
            hosts.join(","),
            config.get_ports(),
            config.get_dbname().unwrap_or_default(),
            name
        );
        let server = {
            let mut h = Sha256::new();
            for part in [
                rebuilt.as_bytes(),
                // As resolved: the PGSSL* variables stand in for what the
                // URL does not say, and may change between acquisitions.
                format!("{tls_given:?} {tls:?}").as_bytes(),
                config.get_user().unwrap_or_default().as_bytes(),
                config.get_password().unwrap_or_default(),
            ] {
                h.update((part.len() as u64).to_be_bytes());
                h.update(part);
            }
            h.finalize().iter().map(|b| format!("{b:02x}")).collect()
        };
        Ok(Target {
            shared,
            server,
            key: key_of(&name),
            config,
            shown,
            name,
            identity,
            tls,
            confirm_within: confirm,
        })
    }
}

fn check_name(name: &str, shown: &str) -> Result<()> {
    if name.is_empty() {
        return Err(bad(format!("{shown}: the lease name is empty")));
    }
    if name.len() > NAME_MAX {
        return Err(bad(format!(
            "{shown}: the lease name is {} bytes; at most {NAME_MAX}",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(bad(format!(
            "{shown}: the lease name has control characters"
        )));
    }
    Ok(())
}

/// Drop anything quoted from a parser message (it may quote the input).
fn strip_quoted(msg: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    for c in msg.chars() {
        if c == '`' || c == '"' {
            quoted = !quoted;
            if quoted {
                out.push('…');
            }
            continue;
        }
        if !quoted {
            out.push(c);
        }
    }
    out
}

fn os_user() -> Option<String> {
    let uid = rustix::process::getuid().as_raw();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let id = f.nth(1)?;
        (id.parse::<u32>().ok()? == uid).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_big_endian_sha256() {
        // sha256("sidelease lease\0scheduler"), first 8 bytes, big-endian:
        // the same on every platform.
        let k = key_of("scheduler");
        assert_eq!(k, key_of("scheduler"));
        assert_ne!(k, key_of("scheduler2"));
        let mut h = Sha256::new();
        h.update(b"sidelease lease\0scheduler");
        let d = h.finalize();
        assert_eq!(k.to_be_bytes(), d[..8]);
    }

    #[test]
    fn confirm_within_is_milliseconds_in_range() {
        let t = Target::parse("postgresql://db/app?lease=x").unwrap();
        assert_eq!(t.confirm_within, std::time::Duration::from_millis(1000));
        let t = Target::parse("postgresql://db/app?lease=x&confirm_within=250").unwrap();
        assert_eq!(t.confirm_within, std::time::Duration::from_millis(250));
        for v in ["", "99", "4001", "1s", "-5", "1e3", "%00"] {
            let e = Target::parse(&format!(
                "postgresql://app:pw@db/app?lease=x&confirm_within={v}"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("confirm_within="), "{v}: {e}");
            assert!(e.contains("milliseconds, 100 to 4000"), "{v}: {e}");
            assert!(!e.contains("pw@"), "{e}");
        }
    }

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            mask("postgresql://app:s3cret@db-1:5432/app?lease=x&password=p2"),
            "postgresql://app:***@db-1:5432/app?lease=x&password=***"
        );
        assert_eq!(
            mask("postgres://db-1/app?lease=x"),
            "postgres://db-1/app?lease=x"
        );
        let t = Target::parse("postgresql://app:s3cret@db-1/app?lease=sched%20uler").unwrap();
        assert_eq!(t.name, "sched uler");
        assert!(!t.shown.contains("s3cret"));
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(!t.identity.contains("s3cret"));
        // Read as the driver reads it: the credentials run to the first `@`;
        // anything ambiguous is hidden, and so is any parameter named like a
        // password.
        for (url, secret) in [
            ("postgresql://app:pa/ss@db/app?lease=x", "pa/ss"),
            ("postgresql://app:pa?ss@db/app?lease=x", "pa?ss"),
            ("postgresql://app:pa#ss@db/app?lease=x", "pa#ss"),
            ("postgresql://app:p%40ss@db/app?lease=x", "p%40ss"),
            ("postgresql://app:p@ss@db/app?lease=x", "ss@"),
            ("postgresql://db/app?lease=x&pass%77ord=hunter2", "hunter2"),
            ("postgresql://db/app?lease=x&%70assword=hunter2", "hunter2"),
            ("postgresql://db/app?lease=x&PASSWORD=hunter2", "hunter2"),
            ("postgresql://db/app?lease=x& password=hunter2", "hunter2"),
        ] {
            assert!(!mask(url).contains(secret), "{url}: {}", mask(url));
            match Target::parse(url) {
                Ok(t) => {
                    assert!(!t.shown.contains(secret), "{url}: {}", t.shown);
                    assert!(!t.identity.contains(secret), "{url}: {}", t.identity);
                }
                Err(e) => assert!(!e.to_string().contains(secret), "{url}: {e}"),
            }
        }
        let t = Target::parse("postgresql://app:pa/ss@db/app?lease=x").unwrap();
        assert_eq!(t.config.get_password(), Some(&b"pa/ss"[..]));
        assert_eq!(t.name, "x");
        let e = Target::parse("postgresql://app:p@ss@db/app?lease=x").unwrap_err();
        assert!(e.to_string().contains("%40"), "{e}");
        // An `@` in a parameter, no user part (libpq reads it so): the
        // parameter's, not credentials.
        let url = "postgresql://localhost/app?lease=s1&password=S3KRTw@x";
        assert!(!mask(url).contains("S3KRTw"), "{}", mask(url));
        let t = Target::parse(url).unwrap();
        assert_eq!(t.name, "s1");
        assert_eq!(t.config.get_password(), Some(&b"S3KRTw@x"[..]));
        assert!(!t.shown.contains("S3KRTw"), "{}", t.shown);
        // Control characters are shown escaped, never raw.
        let e = Target::parse("postgresql://app:pw@db/app?lease=x\x1b[2J").unwrap_err();
        assert!(!e.to_string().contains('\x1b'), "{e}");
        assert!(e.to_string().contains("\\x1b"), "{e}");
    }

    #[test]
    fn the_scheme_is_read_in_any_case_and_half_urls_are_no_file_names() {
        use std::path::Path;
        let upper = Target::parse("POSTGRESQL://app@db/app?lease=x").unwrap();
        let lower = Target::parse("postgresql://app@db/app?lease=x").unwrap();
        assert_eq!(upper.identity, lower.identity);
        assert_eq!(upper.key, lower.key);
        for t in ["PostgreSQL://db/app?lease=x", "POSTGRES://db/app?lease=x"] {
            assert!(super::super::classify(Path::new(t)).unwrap(), "{t}");
        }
        for (t, why) in [
            (
                "postgresql:/app:pw@db/app?lease=x",
                "starts with postgresql://",
            ),
            ("Postgres:db/app?lease=x", "starts with postgresql://"),
            ("?lease=scheduler", "`?lease=`"),
            ("/srv/app/?lease=scheduler", "`?lease=`"),
        ] {
            let e = super::super::classify(Path::new(t))
                .unwrap_err()
                .to_string();
            assert!(e.contains(why) && e.contains("`target`"), "{t}: {e}");
            assert!(!e.contains("pw@"), "{t}: {e}");
        }
        for t in ["app.db", "/srv/a?b", "/srv/lease=x", "postgresql"] {
            assert!(!super::super::classify(Path::new(t)).unwrap(), "{t}");
        }
    }

    #[test]
    fn bad_urls_name_the_problem_without_the_password() {
        let cases = [
            ("postgresql://app:pw@db/app", "no lease name"),
            ("postgresql://app:pw@db/app?lease=", "empty"),
            ("postgresql://app:pw@db/app?lease=a&lease=b", "twice"),
            ("postgresql://app:pw@db/app?lease=%zz", "percent"),
            (
                "postgresql://app:pw@db/app?lease=x&sslmode=verify",
                "not a mode",
            ),
            (
                "postgresql://app:pw@db/app?lease=x&sslmode=allow&sslpassword=pw",
                "encrypted",
            ),
            ("postgresql://app:pw@db/app?lease=x&bogus=1", "not a valid"),
            ("postgresql://app:pw@db:notaport/app?lease=x", "not a valid"),
            ("postgresql://app:pw@db/app?lease=a%0Ab", "control"),
        ];
        for (url, want) in cases {
            let e = Target::parse(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("pw@"), "{url}: {e}");
            assert!(e.contains("`target`"), "{url}: {e}");
        }
        let long = format!("postgresql://db/app?lease={}", "n".repeat(NAME_MAX + 1));
        assert!(Target::parse(&long)
            .unwrap_err()
            .to_string()
            .contains("at most 200"));
    }
}
