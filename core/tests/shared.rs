//! PostgreSQL leases on the shared session (the default; `session=own` opts
//! out): one connection per server for every such lease of a process, against the real test
//! cluster (see postgres.rs). The tests run one at a time: they count this
//! process's sessions, and one ends a shared session on purpose.
#![cfg(feature = "postgres")]

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sidelease::{ErrorKind, Lease, LeaseState, Options};

mod common;
use common::{env, psql, server_locks, unique};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lease on its server's shared session: the default.
fn shared_url(base: &str, name: &str) -> String {
    format!("{base}?lease={name}")
}

/// This process's sessions on the server (shared or a lease's own).
fn my_sessions() -> usize {
    psql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'sidelease {}@%' \
         AND application_name NOT LIKE '% witness'",
        std::process::id()
    ))
    .parse()
    .unwrap()
}

/// The server PIDs of this process's sessions.
fn session_pids() -> String {
    psql(&format!(
        "SELECT string_agg(pid::text, E'\\n' ORDER BY pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'sidelease {}@%' AND application_name NOT LIKE '% witness'",
        std::process::id()
    ))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Wait until `f` holds (a session ends on the server a moment after the
/// client closed it).
fn eventually(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn child_test(name: &str) -> Command {
    let mut c = common::command(common::this_exe());
    c.args(["--exact", name, "--nocapture", "--include-ignored"]);
    c
}

#[test]
fn a_thousand_leases_share_one_connection_and_a_handful_of_descriptors() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let prefix = unique("k");
    let urls: Vec<String> = (0..1000)
        .map(|i| shared_url(&base, &format!("{prefix}-{i}")))
        .collect();
    let fds = open_fds();
    let leases: Vec<Lease> = urls
        .iter()
        .map(|u| Lease::acquire(u, &Options::new()).unwrap())
        .collect();
    assert_eq!(my_sessions(), 1, "1,000 leases, sessions of this process");
    let grown = open_fds().saturating_sub(fds);
    assert!(grown <= 8, "1,000 leases opened {grown} descriptors");
    // Each is held on the server, by the one session.
    let holders = psql(&format!(
        "SELECT count(*), count(DISTINCT l.pid) FROM pg_locks l JOIN sidelease_leases s \
         ON l.classid = ((s.key >> 32) & 4294967295)::oid AND l.objid = (s.key & 4294967295)::oid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND s.name LIKE '{prefix}-%'"
    ));
    assert_eq!(holders, "1000|1");
    for l in &leases {
        assert_eq!(l.generation(), Some(1));
        l.ensure_held_now().unwrap();
    }
    // Another process is refused each one.
    let out = child_test("child_tries_each")
        .env("SIDELEASE_CHILD_BASE", &base)
        .env("SIDELEASE_CHILD_PREFIX", &prefix)
        .env("SIDELEASE_CHILD_EXPECT", "in_use")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("CHILD in_use 1000 of 1000"), "{text}");
    for l in &leases {
        l.release().unwrap();
    }
    eventually("the shared session closed", Duration::from_secs(5), || {
        my_sessions() == 0
    });
    let left = psql(&format!(
        "SELECT count(*) FROM sidelease_leases WHERE name LIKE '{prefix}-%' AND released_at IS NULL"
    ));
    assert_eq!(left, "0", "rows not recorded released");
}

#[test]
#[ignore = "run by the tests here in a child process"]
fn child_tries_each() {
    let base = std::env::var("SIDELEASE_CHILD_BASE").unwrap();
    let prefix = std::env::var("SIDELEASE_CHILD_PREFIX").unwrap();
    let expect = std::env::var("SIDELEASE_CHILD_EXPECT").unwrap();
    let mut matched = 0;
    let mut held = Vec::new();
    let mut first_session = String::new();
    for i in 0..1000 {
        if i == 1 {
            first_session = session_pids();
        }
        let u = shared_url(&base, &format!("{prefix}-{i}"));
        match (Lease::acquire(&u, &Options::new()), expect.as_str()) {
            (Err(e), "in_use") if e.kind() == ErrorKind::InUse => matched += 1,
            // The previous holder lost it: its row was never released.
            (Ok(l), "acquired") if l.previous_released_cleanly() == Some(false) => {
                matched += 1;
                held.push(l);
            }
            (r, _) => println!("CHILD {i}: {:?}", r.map(|l| l.previous_released_cleanly())),
        }
    }
    // One session served every try: the one open after the first.
    let sessions = session_pids();
    assert_eq!(
        sessions, first_session,
        "sessions after the first try, and at the end"
    );
    assert!(!sessions.contains('\n'), "{sessions}");
    println!("CHILD {expect} {matched} of 1000");
}

#[test]
fn ending_the_shared_session_loses_every_lease_on_it_and_another_process_gets_each() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let prefix = unique("f");
    let leases: Vec<Lease> = (0..1000)
        .map(|i| {
            Lease::acquire(shared_url(&base, &format!("{prefix}-{i}")), &Options::new()).unwrap()
        })
        .collect();
    let lost = Arc::new(AtomicUsize::new(0));
    for l in &leases {
        let lost = lost.clone();
        l.on_lost(move |_| {
            lost.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    // The session an earlier test of this process used may still be on its
    // way out (the server lists it until it has gone): only ours is ended.
    eventually(
        "one session of this process",
        Duration::from_secs(5),
        || my_sessions() == 1,
    );
    let ended = psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name LIKE 'sidelease {}@% shared'",
        std::process::id()
    ));
    assert_eq!(ended, "1");
    eventually("every lease told", Duration::from_secs(5), || {
        lost.load(Ordering::SeqCst) == 1000
    });
    for l in &leases {
        match l.state() {
            LeaseState::Lost(why) => assert!(
                why.reason.contains("administrator command"),
                "{}",
                why.reason
            ),
            s => panic!("{s:?}"),
        }
        assert_eq!(l.ensure_held().unwrap_err().kind(), ErrorKind::Lost);
    }
    let out = child_test("child_tries_each")
        .env("SIDELEASE_CHILD_BASE", &base)
        .env("SIDELEASE_CHILD_PREFIX", &prefix)
        .env("SIDELEASE_CHILD_EXPECT", "acquired")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("CHILD acquired 1000 of 1000"), "{text}");
    for l in &leases {
        l.release().unwrap();
    }
}

/// A server of its own with `max_connections=50` (`tests/pg/cluster
/// scratch`), stopped when the test ends.
struct Scratch {
    dir: String,
    url: String,
}

impl Scratch {
    fn start() -> Scratch {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/pg/cluster");
        let out = Command::new("bash")
            .args([script, "scratch", "127.0.0.1"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let var = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .unwrap_or_else(|| panic!("{name} in {text}"))
                .to_owned()
        };
        Scratch {
            url: format!(
                "postgresql://app:app-secret@127.0.0.1:{}/app",
                var("SCRATCH_PORT")
            ),
            dir: var("SCRATCH_DIR"),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/pg/cluster");
        let _ = Command::new("bash")
            .args([script, "stop", &self.dir])
            .status();
    }
}

#[test]
fn a_server_with_fifty_connections_holds_five_hundred_leases_of_one_process() {
    let _one = alone();
    let server = Scratch::start();
    let prefix = unique("m");
    let leases: Vec<Lease> = (0..500)
        .map(|i| {
            Lease::acquire(
                shared_url(&server.url, &format!("{prefix}-{i}")),
                &Options::new(),
            )
            .unwrap_or_else(|e| panic!("lease {i}: {e}"))
        })
        .collect();
    // Leases with connections of their own run out: the server's
    // max_connections (50, 3 of them reserved for superusers): SQLSTATE
    // 53300, too_many_connections.
    let own: Vec<_> = (0..50)
        .map(|i| {
            Lease::acquire(
                format!("{}?session=own&lease={prefix}-own-{i}", server.url),
                &Options::new(),
            )
        })
        .collect();
    let refused: Vec<String> = own
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(
        refused.iter().any(|e| e.contains("SQLSTATE 53300")),
        "50 leases of their own on a server of 50 connections: {refused:?}"
    );
    drop(own);
    for l in &leases {
        l.ensure_held().unwrap();
        l.release().unwrap();
    }
}

#[test]
fn eight_threads_cycle_a_thousand_times_on_one_session_and_no_answer_goes_astray() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let prefix = unique("c");
    // One lease held throughout keeps the shared session open.
    let anchor = Lease::acquire(
        shared_url(&base, &format!("{prefix}-anchor")),
        &Options::new(),
    )
    .unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let base = base.clone();
            let prefix = prefix.clone();
            std::thread::spawn(move || {
                let mut last: HashMap<String, u64> = HashMap::new();
                for i in 0..1000 {
                    let name = format!("{prefix}-{t}-{}", i % 4);
                    let u = shared_url(&base, &name);
                    let l = Lease::acquire(&u, &Options::new()).unwrap();
                    let generation = l.generation().unwrap();
                    let want = last.get(&name).map_or(1, |g| g + 1);
                    assert_eq!(generation, want, "{name}: the generation of another lease?");
                    if generation > 1 {
                        let prev = l.previous().unwrap();
                        assert!(prev.target.as_deref().unwrap().ends_with(&name));
                        assert_eq!(prev.generation, Some(generation - 1));
                        assert_eq!(l.previous_released_cleanly(), Some(true));
                    }
                    assert!(l.record().target.as_deref().unwrap().ends_with(&name));
                    l.ensure_held().unwrap();
                    l.release().unwrap();
                    last.insert(name, generation);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(my_sessions(), 1);
    anchor.ensure_held_now().unwrap();
    let rows = psql(&format!(
        "SELECT count(*), sum(generation), count(*) FILTER (WHERE released_at IS NULL) \
         FROM sidelease_leases WHERE name LIKE '{prefix}-%-%'"
    ));
    assert_eq!(rows, "32|8000|0");
    anchor.release().unwrap();
    eventually("the shared session closed", Duration::from_secs(5), || {
        my_sessions() == 0
    });
}

/// The server backend of this process's shared session.
fn shared_backend() -> i32 {
    psql(&format!(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'sidelease {}@% shared'",
        std::process::id()
    ))
    .parse()
    .unwrap()
}

/// Stop (or continue) a server backend: the session stalls, its socket
/// stays open.
fn signal(pid: i32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Whether some session holds the lease `name`'s advisory lock.
fn locked(name: &str) -> bool {
    psql(&format!(
        "SELECT count(*) FROM pg_locks l JOIN sidelease_leases s \
         ON l.classid = ((s.key >> 32) & 4294967295)::oid AND l.objid = (s.key & 4294967295)::oid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND s.name = '{name}'"
    )) == "1"
}

#[test]
fn a_stalled_session_loses_the_tight_lease_alone_and_its_old_handle_cannot_release_the_new() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let (tight, loose) = (unique("tight"), unique("loose"));
    let tight_url = format!("{base}?confirm_within=100&lease={tight}");
    let old = Lease::acquire(&tight_url, &Options::new()).unwrap();
    let other = Lease::acquire(
        format!("{base}?confirm_within=4000&lease={loose}"),
        &Options::new(),
    )
    .unwrap();
    let backend = shared_backend();
    signal(backend, "-STOP");
    // Asked at once, while the tight lease's heartbeat goes unanswered:
    // the loose lease is confirmed only by an answer the server gives once
    // it runs again, never by a heartbeat that timed out.
    let t0 = Instant::now();
    let (asked, answered_at, cont_at, old_state) = std::thread::scope(|scope| {
        let asker = scope.spawn(|| {
            let r = other.ensure_held_now();
            (r, t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(400));
        let old_state = old.state();
        let cont_at = t0.elapsed();
        signal(backend, "-CONT");
        let (r, at) = asker.join().unwrap();
        (r, at, cont_at, old_state)
    });
    match asked {
        Ok(()) => assert!(
            answered_at >= cont_at,
            "confirmed after {answered_at:?}, while the server was stopped (until {cont_at:?})"
        ),
        Err(e) => assert_eq!(e.kind(), ErrorKind::Io, "{e}"),
    }
    assert!(matches!(old_state, LeaseState::Lost(_)), "{old_state:?}");
    assert_eq!(other.state(), LeaseState::Held);
    other.ensure_held_now().unwrap();
    // The lost lease's lock is given back once the session answers; the
    // lease is taken anew (a new generation) on the same session.
    eventually(
        "the lost lease's lock given back",
        Duration::from_secs(5),
        || !locked(&tight),
    );
    let new = Lease::acquire(&tight_url, &Options::new()).unwrap();
    assert_eq!(new.generation(), Some(2));
    // Releasing the old handle leaves the new lease alone.
    old.release().unwrap();
    new.ensure_held_now().unwrap();
    assert!(locked(&tight));
    assert_eq!(
        psql(&format!(
            "SELECT generation, released_at IS NULL FROM sidelease_leases WHERE name = '{tight}'"
        )),
        "2|t"
    );
    new.release().unwrap();
    other.release().unwrap();
    assert!(!locked(&tight) && !locked(&loose));
}

#[test]
fn a_release_on_a_shared_session_waits_out_a_fencing_transaction_holding_the_lock() {
    let _one = alone();
    let base = env("SIDELEASE_TEST_PG");
    let name = unique("fenced");
    let u = shared_url(&base, &name);
    let l = Lease::acquire(&u, &Options::new()).unwrap();
    let fencing = {
        let name = name.clone();
        std::thread::spawn(move || {
            psql(&format!(
                "BEGIN; SELECT generation FROM sidelease_leases WHERE name = '{name}' FOR SHARE; \
                 SELECT pg_sleep(1.5); COMMIT;"
            ))
        })
    };
    // Until the transaction is in its sleep, so past its FOR SHARE (a
    // fixed head start lost the race to psql's start on a busy machine).
    eventually(
        "the fencing transaction holds its row",
        Duration::from_secs(10),
        || {
            psql(&format!(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event = 'PgSleep' AND query LIKE '%{name}%FOR SHARE%'"
            )) == "1"
        },
    );
    let watcher = {
        let name = name.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            locked(&name)
        })
    };
    let t = Instant::now();
    l.release().unwrap();
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(800), "{took:?}");
    assert!(
        watcher.join().unwrap(),
        "the lock was given back before the release was recorded"
    );
    fencing.join().unwrap();
    assert!(!locked(&name));
    let next = Lease::acquire(&u, &Options::new()).unwrap();
    assert_eq!(next.generation(), Some(2));
    assert_eq!(next.previous_released_cleanly(), Some(true));
}

#[test]
fn through_pgbouncer_a_shared_session_works_in_session_mode_and_is_refused_otherwise() {
    let _one = alone();
    let n = unique("pool");
    let url = format!(
        "{}?session=shared&lease={n}",
        env("SIDELEASE_TEST_PGBOUNCER")
    );
    let l = Lease::acquire(&url, &Options::new()).unwrap();
    assert_eq!(l.generation(), Some(1));
    assert_eq!(server_locks(&n), 1);
    std::thread::sleep(Duration::from_millis(1500));
    l.ensure_held_now().unwrap();
    l.release().unwrap();
    assert_eq!(server_locks(&n), 0);
    for var in [
        "SIDELEASE_TEST_PGBOUNCER_TX1",
        "SIDELEASE_TEST_PGBOUNCER_TX5",
        "SIDELEASE_TEST_PGBOUNCER_STMT",
    ] {
        for _ in 0..3 {
            let n = unique("pool");
            let e = Lease::acquire(
                format!("{}?session=shared&lease={n}", env(var)),
                &Options::new(),
            )
            .expect_err(&format!("{var}: acquired through a transaction pooler"));
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{var}: {e}");
            let text = e.to_string();
            assert!(
                text.contains("pooler") && text.contains("session-mode"),
                "{var}: {text}"
            );
            assert_eq!(
                server_locks(&n),
                0,
                "{var}: a lock was left on a pooled backend"
            );
        }
    }
}

/// Two leases on the shared session, and how many of them were lost.
struct Kept {
    leases: Vec<Lease>,
    lost: Arc<AtomicUsize>,
}

impl Kept {
    fn acquire(base: &str) -> Kept {
        let leases: Vec<Lease> = (0..2)
            .map(|_| Lease::acquire(shared_url(base, &unique("kept")), &Options::new()).unwrap())
            .collect();
        let lost = Arc::new(AtomicUsize::new(0));
        for l in &leases {
            let lost = lost.clone();
            l.on_lost(move |_| {
                lost.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        Kept { leases, lost }
    }

    /// Each held and confirmed now, none ever lost.
    fn still_held(&self) {
        for l in &self.leases {
            assert_eq!(l.state(), LeaseState::Held);
            l.ensure_held().unwrap();
        }
        assert_eq!(
            self.lost.load(Ordering::SeqCst),
            0,
            "a lease on the session was lost"
        );
    }

    fn release(self) {
        for l in self.leases {
            l.release().unwrap();
        }
    }
}

/// Drops what a test made on the server, even when the test fails.
struct OnServer(String);

impl Drop for OnServer {
    fn drop(&mut self) {
        // Never a panic here: it may run while the test unwinds.
        let (ok, _, err) = common::psql_output(&self.0);
        if !ok {
            eprintln!("clean-up {}: {err}", self.0);
        }
    }
}

/// One lease's slow statement on the shared session (a trigger that sleeps
/// 1.5 s on its row; a commit waiting for a synchronous standby is the
/// same) costs the other leases on that session nothing: the statement
/// is ended after a quarter of the tightest bound, the slow acquisition
/// goes on alone on a connection of its own, and the others are
/// confirmed all along.
#[test]
fn a_slow_statement_for_one_lease_costs_the_others_on_the_session_nothing() {
    let _alone = alone();
    let base = env("SIDELEASE_TEST_PG");
    let others = Kept::acquire(&base);
    let slow = unique("slow");
    let f = unique("slow_row").replace('-', "_");
    psql(&format!(
        "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           PERFORM pg_sleep(1.5); RETURN NEW; END $$; \
         CREATE TRIGGER {f} BEFORE INSERT OR UPDATE ON sidelease_leases FOR EACH ROW \
           WHEN (NEW.name = '{slow}') EXECUTE FUNCTION {f}()"
    ));
    let _cleanup = OnServer(format!(
        "DROP TRIGGER IF EXISTS {f} ON sidelease_leases; DROP FUNCTION IF EXISTS {f}()"
    ));
    let t = Instant::now();
    let got = Lease::acquire(shared_url(&base, &slow), &Options::new());
    let took = t.elapsed();
    let got = got.unwrap_or_else(|e| panic!("the slow lease after {took:?}: {e}"));
    // Its own connection waited out the trigger (1.5 s, once or twice).
    assert!(took < Duration::from_secs(6), "{took:?}");
    std::thread::sleep(Duration::from_millis(1500));
    others.still_held();
    got.release().unwrap();
    others.release();
}

/// The same with a trigger that ignores the server's request to end it
/// (it catches `query_canceled` and sleeps on): the shared session stays
/// held up for about 4 s, past the slow acquisition's wait for it and
/// through heartbeats queued behind it, longer than the others' 1 s bound.
/// A witness on a connection of its own confirms them meanwhile: the
/// session's backend still holds their locks. Without it both were lost
/// 1 s after their last confirmation.
#[test]
fn a_statement_that_ignores_the_cancel_costs_the_others_nothing() {
    stubborn_statement(&env("SIDELEASE_TEST_PG"), true);
}

/// Through a pooler, the witness does not vouch for the shared session (a
/// server session behind a client gone silent may be handed on, its locks
/// with it): the same stall costs the others their bound, as it did
/// before there was a witness.
#[test]
fn through_a_pooler_the_witness_vouches_for_nothing() {
    stubborn_statement(&env("SIDELEASE_TEST_PGBOUNCER"), false);
}

fn stubborn_statement(base: &str, vouched: bool) {
    let _alone = alone();
    // The table first (a first acquisition makes it on a connection of its
    // own), so both the others are on the shared session.
    Lease::acquire(shared_url(base, &unique("table")), &Options::new())
        .unwrap()
        .release()
        .unwrap();
    let others = Kept::acquire(base);
    let slow = unique("stubborn");
    let f = unique("stubborn_row").replace('-', "_");
    // 1.5 s (the request to end it, sent after 0.25 s, has that long to
    // come), or 4 s once asked to end (every such request is ignored).
    psql(&format!(
        "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ \
         DECLARE t0 timestamptz := clock_timestamp(); last interval := '1.5 s'; BEGIN \
           WHILE clock_timestamp() < t0 + last LOOP \
             BEGIN PERFORM pg_sleep(0.02); \
             EXCEPTION WHEN query_canceled THEN last := interval '4 s'; END; \
           END LOOP; \
           RETURN NEW; END $$; \
         CREATE TRIGGER {f} BEFORE INSERT ON sidelease_leases FOR EACH ROW \
           WHEN (NEW.name = '{slow}') EXECUTE FUNCTION {f}()"
    ));
    // On an insert only: the row the shared session's try writes is new,
    // and the statements that record it released later are updates (ended
    // too, they would sleep on each time).
    let _cleanup = OnServer(format!(
        "DROP TRIGGER IF EXISTS {f} ON sidelease_leases; DROP FUNCTION IF EXISTS {f}()"
    ));
    // Watched from here all along: each of the others is confirmed
    // within its bound while the session is held up (or, not vouched
    // for, lost).
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let checks = {
        let leases: Vec<Lease> = others
            .leases
            .iter()
            .map(|l| l.try_clone().unwrap())
            .collect();
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            while watching.load(Ordering::SeqCst) {
                for l in &leases {
                    if let Err(e) = l.ensure_held() {
                        return Err(format!("check {n}: a lease beside the stall: {e}"));
                    }
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(n)
        })
    };
    let t = Instant::now();
    // Waiting: the try's lock stays with the shared session until the
    // statement that took it ends there, and is then given back.
    let got = Lease::acquire(
        shared_url(base, &slow),
        &Options::new().wait(sidelease::Wait::Timeout(Duration::from_secs(10))),
    );
    let took = t.elapsed();
    let got = got.unwrap_or_else(|e| panic!("the stubborn lease after {took:?}: {e}"));
    assert!(took < Duration::from_secs(8), "{took:?}");
    if vouched {
        // The shared session is answering again (the trigger ended there).
        eventually(
            "the shared session answering",
            Duration::from_secs(6),
            || others.leases[0].ensure_held_now().is_ok(),
        );
    }
    watching.store(false, Ordering::SeqCst);
    let checked = checks.join().unwrap();
    if vouched {
        let n = checked.unwrap_or_else(|e| panic!("{e}"));
        assert!(n >= 40, "{n} checks");
        others.still_held();
    } else {
        let e = checked.expect_err("the others held through a stall no one vouched for");
        assert!(e.contains("did not confirm"), "{e}");
        assert_eq!(others.lost.load(Ordering::SeqCst), 2);
    }
    got.release().unwrap();
    others.release();
    // The stubborn lease's own session is kept a moment for reuse; the
    // next test counts this process's sessions.
    eventually(
        "no session of this process left",
        Duration::from_secs(10),
        || my_sessions() == 0,
    );
}

/// The same with a commit that never returns: the role commits
/// synchronously and its synchronous standby is gone. Each statement of
/// the shared session that writes (an acquisition's row, a release) is
/// ended after its share of the bound (the server then says the commit is
/// local only), so the leases already held stay confirmed and a new one
/// is had, not refused as "in use" by this process's own lock.
#[test]
fn a_commit_waiting_for_a_lost_synchronous_standby_costs_the_others_nothing() {
    let _alone = alone();
    let base = env("SIDELEASE_TEST_PG");
    // A shared session of its own: the role's setting applies from the
    // start of a session.
    eventually(
        "no session of this process left",
        Duration::from_secs(5),
        || my_sessions() == 0,
    );
    // The role first, then the shared session with the leases already held
    // (its commits wait for no standby yet), then the standby; undone last
    // to first: the standby's setting reset and the server reloaded, then
    // the role.
    psql("ALTER ROLE app SET synchronous_commit = on");
    let _role = OnServer("ALTER ROLE app RESET synchronous_commit".into());
    let _reload = OnServer("SELECT pg_reload_conf()".into());
    let others = Kept::acquire(&base);
    psql("ALTER SYSTEM SET synchronous_standby_names = 'sidelease_gone_standby'");
    let _standby = OnServer("ALTER SYSTEM RESET synchronous_standby_names".into());
    psql("SELECT pg_reload_conf()");
    // The reload is a signal the server handles when it gets to it: once a
    // new session sees the standby, the server has told every session, and
    // the shared one takes the setting before its next statement (on a busy
    // machine the acquisition below came first, and waited for nothing).
    eventually(
        "a new session waiting for the gone standby",
        Duration::from_secs(10),
        || psql("SHOW synchronous_standby_names").trim() == "sidelease_gone_standby",
    );
    let t = Instant::now();
    let one = Lease::acquire(shared_url(&base, &unique("stalled")), &Options::new());
    let took = t.elapsed();
    let one = one.unwrap_or_else(|e| panic!("after {took:?}: {e}"));
    eprintln!("acquired beside a stalled commit in {took:?}");
    // The commit did stall (until its share of the 1 s bound), and no
    // longer.
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(2),
        "{took:?}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    others.still_held();
    one.release().unwrap();
    others.release();
}
