//! The elector within one process, against a rival that is a plain `flock`
//! on another open of the lease file (flock locks belong to open files, so
//! it conflicts with the lease as another process would). Losses and
//! SIGKILLed leaders are tested between real processes, by the bindings'
//! suites and `cli/tests/lead.rs`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};
use sidelease::elector::{Elector, Ended, Event, Outcome};
use sidelease::{Error, Options};

fn lease_path(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}{}", db.display(), sidelease::DEFAULT_SUFFIX))
}

/// A plain exclusive flock on the lease file, as `flock(1)` would take.
fn rival(db: &Path) -> File {
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(lease_path(db))
        .unwrap();
    flock(&f, FlockOperation::LockExclusive).unwrap();
    f
}

fn is_free(db: &Path) -> bool {
    let f = File::open(lease_path(db)).unwrap();
    flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// Every event, as a line.
fn recorder(e: &Elector) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    e.on_event(move |ev| {
        let line = match ev {
            Event::Waiting(c) => format!("waiting {:?}", c.holders),
            Event::Elected { generation } => format!("elected {generation:?}"),
            Event::Lost { reason } => format!("lost {reason}"),
            Event::SteppedDown { why } => format!("stepped down {}", why.kind()),
            Event::Error { error, retry_in } => format!("error {error} {retry_in:?}"),
            Event::Stopped => "stopped".into(),
        };
        s.lock().unwrap().push(line);
    });
    seen
}

fn elect(e: &Elector) -> sidelease::elector::Term {
    e.campaign().unwrap().expect("elected")
}

#[test]
fn a_free_lease_elects_at_once_and_stepping_down_frees_it() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let e = Elector::new(&db, &Options::new()).unwrap();
    let seen = recorder(&e);
    let term = elect(&e);
    // A first lease file: the generation starts at the clock (issue 35).
    let g = term.generation().unwrap();
    assert!(g > 1_600_000_000_000_000, "{g}");
    assert!(!is_free(&db));
    let s = e.snapshot();
    assert!(s.leading && s.leader_since.is_some());
    assert_eq!((s.generation, s.elections, s.losses), (Some(g), 1, 0));
    assert_eq!(term.cancelled(), None);
    assert_eq!(term.wait_cancelled(Some(Duration::from_millis(20))), None);
    assert_eq!(term.step_down(Outcome::Returned), Ended::Released);
    assert!(is_free(&db));
    let s = e.snapshot();
    assert!(!s.leading && s.leader_since.is_none());
    assert_eq!(s.generation, Some(g));
    assert_eq!(
        *seen.lock().unwrap(),
        [format!("elected Some({g})"), "stepped down released".into()]
    );
}

#[test]
fn a_campaign_waits_for_the_holder_names_it_once_and_is_elected_when_it_lets_go() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let r = rival(&db);
    let e = Arc::new(Elector::new(&db, &Options::new()).unwrap());
    let seen = recorder(&e);
    let c = e.clone();
    let campaign = std::thread::spawn(move || c.campaign().unwrap().map(|t| t.generation()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!campaign.is_finished());
    // The rival writes no record; only a platform that lists lock holders
    // can name it, and a holder nobody can name is not told ("unknown").
    let told: Vec<String> = if cfg!(feature = "portable") {
        vec![]
    } else {
        vec![format!("waiting [{}]", std::process::id())]
    };
    assert_eq!(*seen.lock().unwrap(), told, "told once, not per wake-up");
    let let_go = Instant::now();
    drop(r);
    assert!(matches!(campaign.join().unwrap(), Some(Some(_))), "elected");
    assert!(
        let_go.elapsed() < Duration::from_secs(1),
        "{:?}",
        let_go.elapsed()
    );
}

#[test]
fn stop_ends_a_campaign_and_every_campaign_after_it() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let _r = rival(&db);
    let e = Arc::new(Elector::new(&db, &Options::new()).unwrap());
    let seen = recorder(&e);
    let c = e.clone();
    let campaign = std::thread::spawn(move || c.campaign().unwrap().is_none());
    std::thread::sleep(Duration::from_millis(100));
    let stopped = Instant::now();
    e.stop();
    assert!(campaign.join().unwrap());
    assert!(stopped.elapsed() < Duration::from_millis(500));
    assert!(e.campaign().unwrap().is_none());
    assert!(e.is_stopped());
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.iter().filter(|l| *l == "stopped").count(),
        1,
        "{seen:?}"
    );
}

#[test]
fn stop_cancels_the_term_and_the_reason_stays_stopped() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let e = Arc::new(Elector::new(&db, &Options::new()).unwrap());
    let term = elect(&e);
    let s = e.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        s.stop();
    });
    assert_eq!(term.wait_cancelled(None), Some(Ended::Stopped));
    assert!(!is_free(&db), "the lease is kept until the work steps down");
    assert_eq!(
        term.step_down(Outcome::Failed("late".into())),
        Ended::Stopped
    );
    assert!(is_free(&db));
    assert!(e.campaign().unwrap().is_none());
}

#[test]
fn work_that_fails_or_ends_at_once_backs_off_doubling_and_a_stop_cuts_it_short() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let e = Arc::new(Elector::new(&db, &Options::new()).unwrap());
    let failed = elect(&e).step_down(Outcome::Failed("boom".into()));
    assert_eq!(failed, Ended::Failed("boom".into()));
    assert_eq!(e.snapshot().failures, 1);
    let t = Instant::now();
    let term = elect(&e);
    let first = t.elapsed();
    assert!(first >= Duration::from_millis(100), "{first:?}");
    assert_eq!(term.step_down(Outcome::Returned), Ended::Released);
    assert_eq!(
        e.snapshot().failures,
        2,
        "a term under 1 s counts as a failure"
    );
    let t = Instant::now();
    let term = elect(&e);
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    drop(term);
    assert_eq!(e.snapshot().failures, 3);
    let s = e.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        s.stop();
    });
    let t = Instant::now();
    assert!(e.campaign().unwrap().is_none());
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "the 400 ms back-off ends on stop"
    );
}

#[test]
fn a_term_that_lasts_resets_the_back_off_and_one_campaign_runs_at_a_time() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let e = Elector::new(&db, &Options::new()).unwrap();
    // Three failures: the back-off a reset must undo is 400 ms, well clear
    // of a busy machine's late wake-up.
    for _ in 0..3 {
        elect(&e).step_down(Outcome::Failed("boom".into()));
    }
    let term = elect(&e);
    match e.campaign() {
        Err(Error::InvalidArgument { argument, message }) => {
            assert_eq!(argument, "elector");
            assert!(message.contains("one term at a time"), "{message}");
        }
        other => panic!("a second campaign: {:?}", other.map(|t| t.is_some())),
    }
    std::thread::sleep(Duration::from_millis(1050));
    term.step_down(Outcome::Returned);
    assert_eq!(e.snapshot().failures, 0);
    // No back-off. The portable platform has no file events: a wait that
    // finds the file still being looked at polls again 250 ms later.
    let bound = if cfg!(feature = "portable") {
        1000
    } else {
        300
    };
    let t = Instant::now();
    let term = elect(&e);
    assert!(
        t.elapsed() < Duration::from_millis(bound),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(e.snapshot().elections, 5);
    drop(term);
}

#[test]
fn run_leads_until_stopped_and_a_bad_target_is_an_error_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let e = Arc::new(Elector::new(&db, &Options::new()).unwrap());
    let s = e.clone();
    let mut terms = 0;
    e.run(|term| {
        terms += 1;
        if terms == 2 {
            s.stop();
        }
        term.wait_cancelled(Some(Duration::from_millis(1100)));
        Ok(())
    })
    .unwrap();
    assert_eq!(terms, 2);
    assert!(is_free(&db));
    match Elector::new("", &Options::new()) {
        Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "target"),
        other => panic!("{:?}", other.is_ok()),
    }
    match Elector::new("postgres:/nohost", &Options::new()) {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("a mistyped URL: {:?}", other.is_ok()),
    }
    // A path that cannot name a lease file is a typo: returned at once,
    // naming it, rather than retried behind error events.
    let long = d.path().join("x".repeat(300));
    let not_a_dir = d.path().join("plain");
    std::fs::write(&not_a_dir, "").unwrap();
    for bad in [
        d.path().join("missing/app.db"),
        not_a_dir.join("app.db"),
        long,
    ] {
        let e = Elector::new(&bad, &Options::new()).unwrap();
        let errors = Arc::new(AtomicUsize::new(0));
        let n = errors.clone();
        e.on_event(move |ev| {
            if let Event::Error { .. } = ev {
                n.fetch_add(1, Ordering::SeqCst);
            }
        });
        match e.campaign() {
            Err(err @ Error::Io { .. }) => {
                let parent = bad.parent().unwrap().to_string_lossy();
                assert!(err.to_string().contains(&*parent), "{err}")
            }
            other => panic!("{}: {:?}", bad.display(), other.map(|t| t.is_some())),
        }
        assert_eq!(errors.load(Ordering::SeqCst), 0, "{}", bad.display());
    }
}

#[test]
fn leadership_is_per_process_two_electors_of_one_process_lead_together() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let (a, b) = (
        Elector::new(&db, &Options::new()).unwrap(),
        Elector::new(&db, &Options::new()).unwrap(),
    );
    let (ta, tb) = (elect(&a), elect(&b));
    assert_eq!(ta.generation(), tb.generation(), "one lease, shared");
    ta.step_down(Outcome::Returned);
    assert!(!is_free(&db), "the other term still holds it");
    tb.step_down(Outcome::Returned);
    assert!(is_free(&db));
}
