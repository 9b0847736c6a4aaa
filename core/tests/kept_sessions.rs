//! A lease's own session kept a moment after its release for the next
//! acquisition that goes alone to the same server (`core/src/pg/idle.rs`):
//! used again only while it is sound, named for its new lease, never kept
//! with a lock on it, through a pooler's socket, after a copy of it went to
//! a command, nor past its time. Against the throwaway cluster
//! (`tests/pg/cluster start`; tests/run starts one).
#![cfg(feature = "postgres")]

use std::time::{Duration, Instant};

use sidelease::{Lease, Options, Wait};

mod common;
use common::{env, holder_backend, psql};

/// Kept sessions are the process's: one test at a time takes them.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lease name short enough to show whole in a session's name (63
/// bytes with the process's PID and host), and no other run's.
fn short(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{tag}{n}-{nanos:x}")
}

fn own(base: &str, tag: &str) -> (String, String) {
    let name = short(tag);
    (format!("{base}?lease={name}&session=own"), name)
}

fn opts() -> Options {
    Options::new().wait(Wait::Timeout(Duration::from_secs(10)))
}

/// The backend's application name, or "" once the session is gone.
fn app_name(backend: i32) -> String {
    psql(&format!(
        "SELECT application_name FROM pg_stat_activity WHERE pid = {backend}"
    ))
}

/// Advisory locks the backend holds, of any lease.
fn locks_held(backend: i32) -> u32 {
    psql(&format!(
        "SELECT count(*) FROM pg_locks WHERE pid = {backend} AND locktype = 'advisory' AND granted"
    ))
    .parse()
    .unwrap()
}

fn gone_within(backend: i32, limit: Duration) -> Duration {
    let t = Instant::now();
    while !app_name(backend).is_empty() {
        assert!(
            t.elapsed() < limit,
            "backend {backend} still open {limit:?} later"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t.elapsed()
}

#[test]
fn a_released_session_serves_the_next_lease_on_that_server_then_closes() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let (a, a_name) = own(&base, "kept-a");
    let (b, b_name) = own(&base, "kept-b");
    let first = Lease::acquire(&a, &opts()).unwrap();
    let backend = holder_backend(&a_name);
    first.release().unwrap();
    let second = Lease::acquire(&b, &opts()).unwrap();
    assert_eq!(holder_backend(&b_name), backend, "the kept session holds b");
    assert!(
        app_name(backend).ends_with(&b_name),
        "named for its new lease: {}",
        app_name(backend)
    );
    assert_eq!(locks_held(backend), 1, "b's lock alone");
    second.release().unwrap();
    let released = Instant::now();
    // Kept again: open, holding nothing.
    assert_eq!(locks_held(backend), 0);
    // Not past its time: gone within IDLE_KEEP (2 s) and the close.
    gone_within(backend, Duration::from_secs(5));
    let after = released.elapsed();
    assert!(
        after > Duration::from_millis(1500),
        "closed after {after:?}, not kept"
    );
}

#[test]
fn a_kept_session_the_server_ended_costs_the_next_acquisition_nothing() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    // More rounds where a test build delays the kept session's thread
    // between seeing its end and closing its offer (SIDELEASE_FAULTS).
    let rounds = if cfg!(feature = "fault-injection") {
        40
    } else {
        5
    };
    for round in 0..rounds {
        let (a, a_name) = own(&base, "ended-a");
        let (b, b_name) = own(&base, "ended-b");
        let held = Lease::acquire(&a, &opts()).unwrap();
        let backend = holder_backend(&a_name).to_string();
        held.release().unwrap();
        psql(&format!("SELECT pg_terminate_backend({backend})"));
        // At once, before the client may have read the end (round 0), and
        // after it surely did.
        if round % 5 > 0 {
            std::thread::sleep(Duration::from_millis(20 * (round % 5)));
        }
        // One try: a session that broke during an attempt fails one that
        // cannot wait; a kept one that broke while kept must not.
        let lease =
            Lease::acquire(&b, &Options::new()).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_ne!(holder_backend(&b_name).to_string(), backend);
        lease.release().unwrap();
    }
}

#[test]
fn a_session_whose_socket_went_to_a_command_is_not_kept() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let (a, a_name) = own(&base, "handed-a");
    let lease = Lease::acquire(&a, &opts().inheritable(true)).unwrap();
    let backend = holder_backend(&a_name);
    let copy = lease.inheritable_fd().unwrap();
    lease.release().unwrap();
    drop(copy);
    // Closed by both ends now, as before kept sessions.
    gone_within(backend, Duration::from_secs(1));
}

#[test]
fn a_session_through_a_unix_socket_is_not_kept() {
    // Whatever listens on a socket file may be a pooler: its server
    // session goes back to the pool at once.
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let dir = env("SIDELEASE_TEST_PG_DIR");
    let port = env("SIDELEASE_TEST_PG_PORT");
    let creds = base.split_once("://").unwrap().1.split_once('@').unwrap().0;
    let name = short("unix");
    let url = format!("postgresql://{creds}@/app?host={dir}&port={port}&lease={name}&session=own");
    let lease = Lease::acquire(&url, &opts()).unwrap();
    let backend = holder_backend(&name);
    lease.release().unwrap();
    gone_within(backend, Duration::from_secs(1));
}

#[test]
fn a_fork_child_does_not_use_its_parent_kept_session() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let (a, a_name) = own(&base, "fork-a");
    let (b, b_name) = own(&base, "fork-b");
    let held = Lease::acquire(&a, &opts()).unwrap();
    let kept = holder_backend(&a_name);
    held.release().unwrap();
    assert!(!app_name(kept).is_empty(), "kept after the release");
    let kept = kept.to_string();
    // SAFETY: the child calls the library (which makes fork safe for
    // itself) and psql, and exits without unwinding.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        let code = match Lease::acquire(&b, &opts()) {
            Ok(l) => {
                let mine = holder_backend(&b_name).to_string();
                let _ = l.release();
                if mine == kept {
                    3
                } else {
                    0
                }
            }
            Err(_) => 2,
        };
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    let t = Instant::now();
    loop {
        // SAFETY: our child, and a status this frame owns.
        let r = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if r == child {
            break;
        }
        if t.elapsed() > Duration::from_secs(15) {
            // SAFETY: our child, not yet reaped (the PID is still ours).
            unsafe { libc::kill(child, libc::SIGKILL) };
            panic!("the child's acquisition hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(libc::WIFEXITED(status), "status {status}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "2: the child's acquisition failed; 3: it got the parent's session"
    );
}

#[test]
fn a_kept_session_bounds_the_next_row_write_as_a_new_one_would() {
    // A wait with a 60 s limit leaves its session's lock timeout at what
    // was left of it; the next lease on the kept session, one attempt,
    // must wait for a fencing transaction's row lock 5 s, as on a new
    // session, not the 60 s of the wait before.
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let (a, a_name) = own(&base, "bound-a");
    let (b, b_name) = own(&base, "bound-b");
    // b's row, written on the shared session.
    Lease::acquire(format!("{base}?lease={b_name}"), &Options::new())
        .unwrap()
        .release()
        .unwrap();
    let key = sidelease::pg::target::key_of(&a_name);
    let blocker =
        std::thread::spawn(move || psql(&format!("SELECT pg_advisory_lock({key}), pg_sleep(0.5)")));
    let t = Instant::now();
    while common::server_locks(&a_name) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the blocker never locked"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let waited = Lease::acquire(
        &a,
        &Options::new().wait(Wait::Timeout(Duration::from_secs(60))),
    )
    .unwrap();
    blocker.join().unwrap();
    let kept = holder_backend(&a_name);
    waited.release().unwrap();
    let fencing = std::thread::spawn(move || {
        psql(&format!(
            "BEGIN; SELECT generation FROM sidelease_leases WHERE name = '{b_name}' FOR SHARE; \
             SELECT pg_sleep(7); COMMIT;"
        ))
    });
    let t = Instant::now();
    while psql(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(7)%' \
                AND state = 'active' AND pid <> pg_backend_pid()",
    ) == "0"
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no fencing transaction"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let try_b = std::thread::spawn(move || {
        let t = Instant::now();
        (Lease::acquire(&b, &Options::new()), t.elapsed())
    });
    // b's row write waits for the row lock on the kept session.
    let t = Instant::now();
    while psql(&format!(
        "SELECT count(*) FROM pg_locks WHERE pid = {kept} AND NOT granted"
    )) == "0"
    {
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "b's row write never waited on the kept session"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (got, took) = try_b.join().unwrap();
    let e = got.unwrap_err();
    assert!(e.to_string().contains("fencing check"), "{e}");
    assert!(took < Duration::from_millis(6500), "{took:?}");
    fencing.join().unwrap();
}

#[test]
fn an_acquisition_refused_for_the_connection_limit_waits_for_a_slot() {
    // A role allowed one connection: a session kept after a release fills
    // it for a moment, and a waiting acquisition asks again meanwhile
    // rather than failing on the refusal.
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let role = short("klim").replace('-', "_");
    psql(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'limit-secret' CONNECTION LIMIT 1 IN ROLE app"
    ));
    struct DropRole(String);
    impl Drop for DropRole {
        fn drop(&mut self) {
            let r = &self.0;
            common::psql_output(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{r}'"
            ));
            common::psql_output(&format!("DROP ROLE IF EXISTS {r}"));
        }
    }
    let _cleanup = DropRole(role.clone());
    let at = base.split_once('@').unwrap().1;
    let limited = format!("postgresql://{role}:limit-secret@{at}");
    let (a, _) = own(&limited, "lim-a");
    let (b, b_name) = own(&limited, "lim-b");
    let held = Lease::acquire(&a, &opts()).unwrap();
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        (Lease::acquire(&b, &opts()), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    held.release().unwrap();
    let (got, took) = waiter.join().unwrap();
    let lease = got.unwrap_or_else(|e| panic!("after {took:?}: {e}"));
    assert!(holder_backend(&b_name) > 0);
    lease.release().unwrap();
}

#[test]
fn a_kept_session_whose_server_went_silent_is_left_for_a_new_one() {
    // The kept session's backend stopped (SIGSTOP): no reset tells the
    // client, the session just never answers. The next acquisition gives
    // it at most half its time, then connects anew.
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let (a, a_name) = own(&base, "silent-a");
    let (b, b_name) = own(&base, "silent-b");
    let held = Lease::acquire(&a, &opts()).unwrap();
    let kept = holder_backend(&a_name);
    held.release().unwrap();
    // SAFETY: a signal to the server process of this test's own session.
    if unsafe { libc::kill(kept, libc::SIGSTOP) } != 0 {
        let e = std::io::Error::last_os_error();
        panic!("SIGSTOP of backend {kept}: {e} (the suite runs as root or as the server's user)");
    }
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: as above; the backend goes on, then is ended.
            unsafe { libc::kill(self.0, libc::SIGCONT) };
            common::psql_output(&format!("SELECT pg_terminate_backend({})", self.0));
        }
    }
    let cont = Cont(kept);
    let t = Instant::now();
    let got = Lease::acquire(
        &b,
        &Options::new().wait(Wait::Timeout(Duration::from_secs(4))),
    );
    let took = t.elapsed();
    drop(cont);
    let lease = got.unwrap_or_else(|e| panic!("after {took:?}: {e}"));
    assert_ne!(holder_backend(&b_name), kept);
    lease.release().unwrap();
}

#[test]
fn a_session_through_pgbouncer_is_not_kept() {
    // The pooler's server session goes back to its pool at the release:
    // PgBouncer resets it (DISCARD ALL) as soon as its client is gone,
    // where a kept client would hold it 2 s.
    let _one = alone();
    let name = short("bouncer");
    let url = format!(
        "{}?lease={name}&session=own",
        env("SIDELEASE_TEST_PGBOUNCER")
    );
    let lease = Lease::acquire(&url, &opts()).unwrap();
    let backend = holder_backend(&name);
    lease.release().unwrap();
    let t = Instant::now();
    while psql(&format!(
        "SELECT query FROM pg_stat_activity WHERE pid = {backend}"
    )) != "DISCARD ALL"
    {
        assert!(
            t.elapsed() < Duration::from_millis(1000),
            "the pooler's server session was not given back: the client kept it"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
