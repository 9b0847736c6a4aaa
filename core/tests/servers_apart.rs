//! Two servers whose backends are numbered alike, as every pair of
//! containers' servers is (each alone in a PID namespace, its backends
//! taking the same few PIDs): a lease this process holds on one is never
//! taken for the lease of the same name on the other, whatever backend
//! holds it there (issue 37). Each server is `tests/pg/cluster scratch-ns`;
//! the collision is made, not hoped for: the kernel's `ns_last_pid` of one
//! namespace is set so that its next backend gets the PID that holds the
//! other's lock. Needs root (tests/run runs as root, as CI does).
#![cfg(feature = "postgres")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use sidelease::elector::{Elector, Event};
use sidelease::{ErrorKind, Lease, Options, Wait};

mod common;
use common::unique;

const CLUSTER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/pg/cluster");

/// A server alone in a PID namespace, stopped (the namespace ended) when
/// the test ends.
struct NsServer {
    dir: String,
    url: String,
}

impl NsServer {
    fn start() -> NsServer {
        let out = Command::new("bash")
            .args([CLUSTER, "scratch-ns", "127.0.0.1"])
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
        NsServer {
            url: format!(
                "postgresql://app:app-secret@127.0.0.1:{}/app",
                var("SCRATCH_PORT")
            ),
            dir: var("SCRATCH_DIR"),
        }
    }

    /// The next process this server starts (a backend, for the next
    /// connection) gets PID `pid` in its namespace.
    fn next_pid_is(&self, pid: u32) {
        let st = Command::new("bash")
            .args([CLUSTER, "ns-last-pid", &self.dir, &(pid - 1).to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// One statement as the superuser.
    fn admin(&self, sql: &str) {
        let url = self.url.replace("app:app-secret@", "postgres@");
        let out = Command::new("psql")
            .args([url.as_str(), "-v", "ON_ERROR_STOP=1", "-qAtc", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The backend holding lease `name` here, from the server.
    fn holder(&self, name: &str) -> Option<u32> {
        let i = sidelease::inspect(format!("{}?lease={name}", self.url), &Options::new()).unwrap();
        i.server.map(|s| s.backend_pid)
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .args([CLUSTER, "stop", &self.dir])
            .status();
    }
}

/// A child process of this test binary: it holds `SIDELEASE_APART_URL`,
/// says HELD, then for each line on stdin (`try URL`, `wait URL`, `elect
/// URL`) takes that lease as told and says what it got, until stdin ends.
#[test]
#[ignore = "run by the tests below in a child process"]
fn child_apart() {
    let url = std::env::var("SIDELEASE_APART_URL").unwrap();
    let _held = Lease::acquire(&url, &Options::new()).unwrap();
    println!("HELD");
    std::io::stdout().flush().unwrap();
    let mut kept = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let (how, url) = line.split_once(' ').unwrap();
        let said = match how {
            "try" | "wait" => {
                let wait = match how {
                    "try" => Wait::NoWait,
                    _ => Wait::Timeout(Duration::from_secs(2)),
                };
                match Lease::acquire(url, &Options::new().wait(wait)) {
                    Ok(l) => {
                        let held = l.ensure_held().is_ok();
                        kept.push(l);
                        format!("GOT held={held}")
                    }
                    Err(e) => format!("REFUSED {:?}: {e}", e.kind()),
                }
            }
            "elect" => {
                // Campaigning, told who holds it (the server's answer, not
                // a pause that a slow machine could pass unanswered); or
                // elected.
                let e = Arc::new(Elector::new(url, &Options::new()).unwrap());
                let (tx, rx) = std::sync::mpsc::channel();
                let waiting = std::sync::Mutex::new(tx.clone());
                e.on_event(move |ev| {
                    if let Event::Waiting(c) = ev {
                        let pid = c.holder.as_ref().and_then(|r| r.pid);
                        let _ = waiting
                            .lock()
                            .unwrap()
                            .send(format!("CAMPAIGNING, held by {pid:?}"));
                    }
                });
                let c = e.clone();
                let campaign = std::thread::spawn(move || {
                    let elected = c.campaign().map(|t| t.is_some());
                    let _ = tx.send(format!("ELECTED {elected:?}"));
                });
                let said = rx
                    .recv_timeout(Duration::from_secs(20))
                    .unwrap_or_else(|_| "SILENT".into());
                e.stop();
                let _ = campaign.join();
                said
            }
            _ => panic!("{line}"),
        };
        println!("{said}");
        std::io::stdout().flush().unwrap();
    }
}

/// A child holding `url`, and its stdin and stdout to tell it more.
struct Holder {
    child: Child,
    to: Option<ChildStdin>,
    from: BufReader<ChildStdout>,
}

impl Holder {
    fn start(url: &str) -> Holder {
        let mut child = common::command(common::this_exe())
            .args(["--exact", "child_apart", "--nocapture", "--include-ignored"])
            .env("SIDELEASE_APART_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let to = child.stdin.take();
        let from = BufReader::new(child.stdout.take().unwrap());
        let mut h = Holder { child, to, from };
        assert_eq!(h.answer(), "HELD");
        h
    }

    /// The child's next word, past the test harness's own lines.
    fn answer(&mut self) -> String {
        loop {
            let mut line = String::new();
            let n = self.from.read_line(&mut line).unwrap();
            assert!(n > 0, "the child ended");
            let line = line.trim_end();
            if ["HELD", "GOT", "REFUSED", "ELECTED", "CAMPAIGNING", "SILENT"]
                .iter()
                .any(|w| line.starts_with(w))
            {
                return line.to_owned();
            }
        }
    }

    fn ask(&mut self, how: &str, url: &str) -> String {
        let to = self.to.as_mut().unwrap();
        writeln!(to, "{how} {url}").unwrap();
        to.flush().unwrap();
        self.answer()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Its stdin closed, it lets its leases go and ends.
        drop(self.to.take());
        let _ = self.child.wait();
    }
}

/// Process A holds `name` on server 1 through a backend of PID P; process
/// B holds `name` on server 2, its lock on a backend of the same PID P,
/// made so; then A, asked to take `name` on server 2 as `how` says, must be
/// refused (or kept waiting): B holds it. `query` is what both lease URLs
/// add (`&session=own`).
fn apart(s1: &NsServer, s2: &NsServer, query: &str, how: &str) -> String {
    let name = unique("apart");
    let url = |s: &NsServer| format!("{}?lease={name}{query}", s.url);
    let mut a = Holder::start(&url(s1));
    let p = s1.holder(&name).expect("A holds the lease on server 1");
    // B's lock on server 2 on a backend of PID P. A shared session opens
    // its connection and the pooler probe's side by side, so which of the
    // two backends locks is either: start at P or just below, until the
    // lock lands on P.
    let mut b = None;
    let mut got = Vec::new();
    for attempt in 0..16 {
        s2.next_pid_is(p - attempt % 2);
        let h = Holder::start(&url(s2));
        let at = s2.holder(&name);
        got.push(at);
        if at == Some(p) {
            b = Some(h);
            break;
        }
        drop(h);
        // Its backends end a moment after it did, freeing P.
        std::thread::sleep(Duration::from_millis(200));
    }
    let b = b.unwrap_or_else(|| panic!("no backend of server 2 took PID {p}: {got:?}"));
    let said = a.ask(how, &url(s2));
    // B still holds it, on its own backend.
    assert_eq!(s2.holder(&name), Some(p), "{said}");
    let b = b.child.id();
    said.replace(&format!("leased by pid {b} "), "leased by B ")
        .replace(&format!("held by Some({b})"), "held by B")
}

#[test]
fn a_lease_on_one_server_is_never_taken_for_the_same_name_on_another() {
    let (s1, s2) = (NsServer::start(), NsServer::start());
    for query in ["", "&session=own"] {
        let said = apart(&s1, &s2, query, "try");
        assert!(said.starts_with("REFUSED InUse"), "{query}: {said}");
        assert!(said.contains("leased by B "), "{query}: {said}");
        let said = apart(&s1, &s2, query, "wait");
        assert!(said.starts_with("REFUSED Timeout"), "{query}: {said}");
        assert!(said.contains("leased by B "), "{query}: {said}");
        let said = apart(&s1, &s2, query, "elect");
        assert_eq!(said, "CAMPAIGNING, held by B", "{query}");
    }
}

/// A server that will not say which it is (`pg_control_system()` revoked,
/// as a hardened one may): "unknown" is not "the same server", so a lease
/// this process holds there is not shared with an acquisition through
/// another spelling of it. That one is refused, naming this process, or
/// waits on it until its timeout (on a server that says, the two share:
/// postgres.rs).
#[test]
fn a_server_that_will_not_say_which_it_is_shares_nothing_across_spellings() {
    let s = NsServer::start();
    s.admin("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC");
    let name = unique("unsaid");
    let held = Lease::acquire(format!("{}?lease={name}", s.url), &Options::new()).unwrap();
    let other = s.url.replace("@127.0.0.1:", "@localhost:");
    let e = Lease::acquire(format!("{other}?lease={name}"), &Options::new()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("leased by pid {} ", std::process::id())),
        "{e}"
    );
    // Waiting, it waits on its own lease until its timeout.
    let wait = Options::new().wait(Wait::Timeout(Duration::from_millis(500)));
    let e = Lease::acquire(format!("{other}?lease={name}"), &wait).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    held.release().unwrap();
}
