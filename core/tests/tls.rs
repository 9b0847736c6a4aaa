//! PostgreSQL leases over TLS, against the test cluster's real server
//! (`tests/pg/cluster start`: ssl=on with a certificate for DNS name
//! `localhost` only, signed by the test CA in SIDELEASE_TEST_PG_PKI; role
//! `tlsonly` may connect over TLS only, `certuser` with a client certificate
//! only). libpq's sslmode semantics, the PGSSL* variables, client
//! certificates, channel binding, and certificate errors that say what
//! failed without showing the password.
//!
//! What depends on the environment or the home directory runs in a child
//! process of this binary (`child`), so no test changes another's.
#![cfg(feature = "postgres")]

use std::path::Path;
use std::process::Command;

use sidelease::{inspect, ErrorKind, Lease, Options};

mod common;
use common::{env, psql};

fn name() -> String {
    common::unique("tls")
}

fn pki(file: &str) -> String {
    Path::new(&env("SIDELEASE_TEST_PG_PKI"))
        .join(file)
        .display()
        .to_string()
}

fn port() -> String {
    env("SIDELEASE_TEST_PG_PORT")
}

/// `app` on the TLS server, through `host`, with extra parameters.
fn app(host: &str, params: &str) -> String {
    format!(
        "postgresql://app:app-secret@{host}:{}/app?lease={}{params}",
        port(),
        name()
    )
}

/// A column of `pg_stat_ssl` for the backend holding lease `url` (found
/// by `inspect`, asked as the superuser who may see every session), and
/// what that inspection says of encryption.
fn stat_ssl(url: &str, column: &str) -> (String, Option<bool>) {
    let lease = url
        .split("lease=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    let admin = format!(
        "{}?lease={lease}&sslmode=disable",
        env("SIDELEASE_TEST_PG_ADMIN")
    );
    let server = inspect(&admin, &Options::new())
        .unwrap()
        .server
        .expect("the server shows a holder");
    let said = psql(&format!(
        "SELECT {column} FROM pg_stat_ssl WHERE pid = {}",
        server.backend_pid
    ));
    (said, server.encrypted)
}

/// Whether `pg_stat_ssl` shows the backend holding lease `url` encrypted
/// (and `inspect` says the same).
fn server_says_encrypted(url: &str) -> bool {
    let (said, inspected) = stat_ssl(url, "ssl");
    assert_eq!(
        inspected,
        Some(said == "t"),
        "inspect and pg_stat_ssl differ"
    );
    said == "t"
}

fn acquire_ok(url: &str) -> Lease {
    Lease::acquire(url, &Options::new()).unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn refused(url: &str) -> String {
    let e = Lease::acquire(url, &Options::new()).expect_err(url);
    let text = e.to_string();
    for secret in ["app-secret", "tlsonly-secret"] {
        assert!(!text.contains(secret), "the password shows: {text}");
    }
    assert!(
        matches!(e.kind(), ErrorKind::Io | ErrorKind::InvalidArgument),
        "{:?}: {text}",
        e.kind()
    );
    text
}

/// Run `test` of this binary in a child process with `vars` (and HOME set
/// to `home`, so the default ~/.postgresql files are the test's own).
fn child(test: &str, home: &Path, vars: &[(&str, &str)]) {
    let me = common::this_exe();
    let mut cmd = common::command(me);
    cmd.args(["--exact", test, "--nocapture", "--include-ignored"])
        .env("SIDELEASE_TLS_CHILD", "1")
        .env("HOME", home);
    for v in [
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGSSLCERT",
        "PGSSLKEY",
        "PGCHANNELBINDING",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test}: {text}"
    );
}

fn in_child() -> bool {
    std::env::var_os("SIDELEASE_TLS_CHILD").is_some()
}

fn empty_home() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn verify_full_with_the_test_ca_acquires_encrypted() {
    let url = app(
        "localhost",
        &format!("&sslmode=verify-full&sslrootcert={}", pki("ca.crt")),
    );
    let lease = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
    let rec = lease.record();
    assert_eq!(rec.encrypted, Some(true));
    lease.ensure_held().unwrap();
    lease.release().unwrap();
}

#[test]
fn the_wrong_ca_or_a_name_the_certificate_does_not_have_is_refused() {
    let e = refused(&app(
        "localhost",
        &format!("&sslmode=verify-full&sslrootcert={}", pki("other-ca.crt")),
    ));
    assert!(
        e.contains("not signed by a CA in")
            && e.contains("other-ca.crt")
            && e.contains("unknown CA"),
        "{e}"
    );
    // 127.0.0.1 reaches the same server; its certificate names localhost.
    let e = refused(&app(
        "127.0.0.1",
        &format!("&sslmode=verify-full&sslrootcert={}", pki("ca.crt")),
    ));
    assert!(
        e.contains("does not name the host 127.0.0.1") && e.contains("mismatch"),
        "{e}"
    );
}

#[test]
fn verify_ca_checks_the_chain_and_not_the_name() {
    let url = app(
        "127.0.0.1",
        &format!("&sslmode=verify-ca&sslrootcert={}", pki("ca.crt")),
    );
    let lease = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
    drop(lease);
    let e = refused(&app(
        "127.0.0.1",
        &format!("&sslmode=verify-ca&sslrootcert={}", pki("other-ca.crt")),
    ));
    assert!(e.contains("unknown CA"), "{e}");
}

#[test]
fn verify_modes_need_a_root_certificate() {
    if !in_child() {
        return child(
            "verify_modes_need_a_root_certificate",
            empty_home().path(),
            &[],
        );
    }
    for mode in ["verify-ca", "verify-full"] {
        let e = refused(&app("localhost", &format!("&sslmode={mode}")));
        assert!(
            e.contains("root certificate file") && e.contains("does not exist"),
            "{mode}: {e}"
        );
    }
}

#[test]
fn require_without_a_root_certificate_encrypts_unverified() {
    if !in_child() {
        return child(
            "require_without_a_root_certificate_encrypts_unverified",
            empty_home().path(),
            &[],
        );
    }
    // The name and the CA are not checked: encryption without
    // authentication of the server, as libpq's require.
    let url = app("127.0.0.1", "&sslmode=require");
    let lease = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
    assert_eq!(lease.record().encrypted, Some(true));
}

#[test]
fn a_root_certificate_in_the_home_directory_makes_require_verify() {
    // libpq: with ~/.postgresql/root.crt present, require (and prefer)
    // verify the chain; prefer falls back to plaintext when it fails.
    if !in_child() {
        let home = empty_home();
        std::fs::create_dir(home.path().join(".postgresql")).unwrap();
        std::fs::copy(
            pki("other-ca.crt"),
            home.path().join(".postgresql/root.crt"),
        )
        .unwrap();
        return child(
            "a_root_certificate_in_the_home_directory_makes_require_verify",
            home.path(),
            &[],
        );
    }
    let e = refused(&app("localhost", "&sslmode=require"));
    assert!(
        e.contains("unknown CA") && e.contains(".postgresql/root.crt"),
        "{e}"
    );
    let url = app("localhost", "&sslmode=prefer");
    let lease = acquire_ok(&url);
    assert!(!server_says_encrypted(&url));
    assert_eq!(lease.record().encrypted, Some(false));
}

#[test]
fn the_default_prefers_tls() {
    if !in_child() {
        return child("the_default_prefers_tls", empty_home().path(), &[]);
    }
    let url = app("localhost", "");
    let _lease = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
}

#[test]
fn a_hostssl_only_role_refuses_plaintext_clearly() {
    if !in_child() {
        return child(
            "a_hostssl_only_role_refuses_plaintext_clearly",
            empty_home().path(),
            &[],
        );
    }
    let base = env("SIDELEASE_TEST_PG_TLSONLY");
    let e = refused(&format!("{base}?lease={}&sslmode=disable", name()));
    assert!(
        e.contains("pg_hba.conf") && e.contains("no encryption"),
        "{e}"
    );
    // allow: plaintext first, TLS when the server refuses it.
    for mode in ["allow", "prefer", "require"] {
        let url = format!("{base}?lease={}&sslmode={mode}", name());
        let _l = acquire_ok(&url);
        assert!(server_says_encrypted(&url), "{mode}");
    }
}

#[test]
fn the_environment_stands_in_for_the_url() {
    if !in_child() {
        let ca = pki("ca.crt");
        return child(
            "the_environment_stands_in_for_the_url",
            empty_home().path(),
            &[("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", &ca)],
        );
    }
    // Neither sslmode nor sslrootcert in the URL: verified all the same.
    let url = app("localhost", "");
    let _l = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
    let e = refused(&app("127.0.0.1", ""));
    assert!(e.contains("does not name the host 127.0.0.1"), "{e}");
    // The URL wins over the environment.
    let url = app("127.0.0.1", "&sslmode=disable");
    let _l = acquire_ok(&url);
    assert!(!server_says_encrypted(&url));
}

#[test]
fn pgsslmode_require_in_the_environment_is_not_ignored() {
    if !in_child() {
        return child(
            "pgsslmode_require_in_the_environment_is_not_ignored",
            empty_home().path(),
            &[("PGSSLMODE", "require")],
        );
    }
    let url = app("127.0.0.1", "");
    let _l = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
}

#[test]
fn a_client_certificate_logs_in() {
    let base = env("SIDELEASE_TEST_PG_CERTUSER");
    let url = format!(
        "{base}?lease={}&sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        name(),
        pki("ca.crt"),
        pki("client.crt"),
        pki("client.key")
    );
    let lease = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
    drop(lease);
    // Without one the server refuses, and says why.
    let e = refused(&format!(
        "{base}?lease={}&sslmode=verify-full&sslrootcert={}&sslcert=/nonexistent",
        name(),
        pki("ca.crt")
    ));
    assert!(e.contains("certificate"), "{e}");
}

#[test]
fn a_client_key_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client.key");
    std::fs::copy(pki("client.key"), &key).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = refused(&format!(
        "{}?lease={}&sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        env("SIDELEASE_TEST_PG_CERTUSER"),
        name(),
        pki("ca.crt"),
        pki("client.crt"),
        key.display()
    ));
    assert!(e.contains("group or world access"), "{e}");
}

#[test]
fn channel_binding_works_over_tls_and_is_refused_without_it() {
    let url = app(
        "localhost",
        &format!(
            "&sslmode=verify-full&sslrootcert={}&channel_binding=require",
            pki("ca.crt")
        ),
    );
    // SCRAM-SHA-256-PLUS: the server checks the tls-server-end-point hash
    // this library computed; a wrong one fails the login.
    let lease = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
    drop(lease);
    let e = refused(&app(
        "localhost",
        "&sslmode=disable&channel_binding=require",
    ));
    assert!(e.contains("channel binding"), "{e}");
}

#[test]
fn pgchannelbinding_in_the_environment_is_not_ignored() {
    if !in_child() {
        return child(
            "pgchannelbinding_in_the_environment_is_not_ignored",
            empty_home().path(),
            &[("PGCHANNELBINDING", "require")],
        );
    }
    let e = refused(&app("localhost", "&sslmode=disable"));
    assert!(e.contains("channel binding"), "{e}");
    let _l = acquire_ok(&app("localhost", "&sslmode=require"));
}

/// A fake server that answers the SSL request with `S` and presents the
/// expired certificate (Python's ssl module; the script exits after one
/// handshake).
fn expired_server() -> (std::process::Child, u16) {
    let script = format!(
        r#"
import socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain({cert:?}, {key:?})
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.recv(8); c.sendall(b"S")
try:
    ctx.wrap_socket(c, server_side=True)
except Exception:
    pass
"#,
        cert = pki("expired.crt"),
        key = pki("expired.key"),
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    (child, line.trim().parse().unwrap())
}

#[test]
fn an_expired_server_certificate_is_refused_saying_so() {
    let (mut server, port) = expired_server();
    let e = refused(&format!(
        "postgresql://app:app-secret@localhost:{port}/app?lease={}&sslmode=verify-full&sslrootcert={}",
        name(),
        pki("ca.crt")
    ));
    assert!(e.contains("expired"), "{e}");
    server.wait().unwrap();
}

#[test]
fn url_parameters_name_their_problem() {
    let base = format!(
        "postgresql://app:app-secret@localhost:{}/app?lease=x",
        port()
    );
    for (params, want) in [
        ("&sslmode=verify", "not a mode"),
        (
            "&sslrootcert=system&sslmode=require",
            "needs sslmode=verify-full",
        ),
        ("&sslpassword=app-secret", "encrypted client key"),
        (
            "&sslmode=verify-full&sslrootcert=/nonexistent/ca.crt",
            "does not exist",
        ),
        (
            "&sslmode=require&sslcrl=/nonexistent.crl&sslrootcert=CA",
            "sslcrl",
        ),
    ] {
        let url = format!("{base}{params}").replace("=CA", &format!("={}", pki("ca.crt")));
        let e = refused(&url);
        assert!(e.contains(want), "{params}: {e}");
    }
}

#[test]
fn system_roots_do_not_trust_the_test_ca() {
    let e = refused(&app("localhost", "&sslrootcert=system"));
    assert!(e.contains("unknown CA") && e.contains("system"), "{e}");
}

#[test]
fn a_revocation_list_refuses_a_revoked_server_certificate() {
    let ca = pki("ca.crt");
    let url = app(
        "localhost",
        &format!(
            "&sslmode=verify-full&sslrootcert={ca}&sslcrl={}",
            pki("none-revoked.crl")
        ),
    );
    let _l = acquire_ok(&url);
    let e = refused(&app(
        "localhost",
        &format!(
            "&sslmode=verify-full&sslrootcert={ca}&sslcrl={}",
            pki("server-revoked.crl")
        ),
    ));
    assert!(e.contains("revoked"), "{e}");
}

#[test]
fn protocol_versions_sni_and_requiressl_as_libpq_has_them() {
    let version = |url: &str| stat_ssl(url, "coalesce(version, 'none')").0;
    let ca = pki("ca.crt");
    for (params, want) in [
        ("&ssl_max_protocol_version=TLSv1.2", "TLSv1.2"),
        ("&ssl_min_protocol_version=TLSv1.3", "TLSv1.3"),
        ("&sslsni=0&sslcompression=0", "TLSv1.3"),
    ] {
        let url = app(
            "localhost",
            &format!("&sslmode=verify-full&sslrootcert={ca}{params}"),
        );
        let _l = acquire_ok(&url);
        assert_eq!(version(&url), want, "{params}");
    }
    let url = app("127.0.0.1", "&requiressl=1");
    let _l = acquire_ok(&url);
    assert!(server_says_encrypted(&url));
}
