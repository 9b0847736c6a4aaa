//! The one case a successor does not wait out a fence: the holder it is
//! for provably ended. A holder cut off from the server (a network cut, an
//! operator's `pg_terminate_backend`) goes on believing it holds the lease
//! until its own bound passes, so the next holder waits that out (the
//! fence, the server's count, carried through the holders in between). A
//! process that has ended believes nothing: after a SIGKILL on this host
//! the fence cost a failover its whole bound (1 s by default) for nothing,
//! and a crash loop that bound at every step.

use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::platform::process;

/// One fence of a holder row, as the write returned it.
#[derive(Deserialize, Clone)]
#[cfg_attr(test, derive(serde::Serialize))]
struct Fence {
    /// Milliseconds of it left, on the server's clock (at most 4 s).
    left: f64,
    pid: Option<u32>,
    proc_start: Option<u64>,
    boot_id: Option<String>,
    pid_ns: Option<u64>,
    host: Option<String>,
    machine_id: Option<String>,
}

/// The fences a new holder waits out: each until its own end, less those
/// whose holder has provably ended since. Judged again at each look
/// (`left`), not once when the row was written: a holder killed a moment
/// before its lock passed on may still be on its way out then (its
/// connection closes before its last thread has exited, and on a busy
/// machine that gap has taken longer than a look can wait), and is let go
/// of the moment it has exited rather than after its whole bound.
pub(crate) struct Fences(Vec<Until>);

struct Until {
    until: Instant,
    /// PID and start time of a holder of this boot, machine and PID
    /// namespace: the only kind that can be seen to have ended.
    holder: Option<(u32, u64)>,
}

impl Fences {
    /// No fence: nothing to wait.
    pub(crate) fn none() -> Fences {
        Fences(Vec::new())
    }

    /// The fences of a write, from when it returned: `fences` is its list;
    /// `server`, the server's count of them all, stands when the list
    /// cannot be read.
    pub(crate) fn of(fences: Option<&str>, server: Duration) -> Fences {
        let now = Instant::now();
        if server.is_zero() {
            return Fences::none();
        }
        let Some(list) = fences.and_then(|f| serde_json::from_str::<Vec<Fence>>(f).ok()) else {
            return Fences(vec![Until {
                until: now + server,
                holder: None,
            }]);
        };
        let me = process::current();
        Fences(
            list.iter()
                .map(|f| Until {
                    until: now + Duration::from_millis(f.left.clamp(0.0, 4002.0) as u64),
                    holder: ours(f, me),
                })
                .collect(),
        )
    }

    /// How long to wait from now before no holder whose lock was taken
    /// could still believe it holds the lease: the latest fence ahead
    /// whose holder is not provably gone. `None` when nothing is left.
    /// One look at each such holder (a few reads of `/proc`), no wait.
    pub(crate) fn left(&self) -> Option<Duration> {
        let now = Instant::now();
        self.0
            .iter()
            .filter(|u| u.until > now)
            .filter(|u| !matches!(u.holder, Some((pid, start)) if process::exited(pid, start) == Some(true)))
            .map(|u| u.until - now)
            .max()
    }

    /// Whether a fence ahead is for a holder that may yet be seen to end
    /// and would shorten the wait if it did (so `left` is worth asking
    /// again before it passes): not this process (alive while it asks),
    /// and ending later than every fence nothing can cut short.
    pub(crate) fn may_end(&self) -> bool {
        let now = Instant::now();
        let me = process::pid();
        let other = |u: &Until| matches!(u.holder, Some((pid, _)) if pid != me);
        let fixed = self.0.iter().filter(|u| !other(u)).map(|u| u.until).max();
        self.0
            .iter()
            .any(|u| u.until > now && other(u) && fixed.is_none_or(|f| u.until > f))
    }
}

/// The holder of a fence, if it could be seen to end here: a process of
/// this boot of this machine (host name, machine id and boot id: a VM
/// cloned from a snapshot keeps the boot id) and of this PID namespace
/// (whose processes this one's `/proc` shows), with its PID and start time
/// (whose end `process::exited` tells: no process, or one whose threads
/// all exited, that started when it did). Anything else keeps its fence:
/// another host, another PID namespace, another boot, a record that does
/// not say; and a PID another process has taken since, by its start time.
fn ours(f: &Fence, me: &process::Identity) -> Option<(u32, u64)> {
    let same = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
    let here = me.proc_is_ours
        && same(&f.boot_id, &me.boot_id)
        && same(&f.host, &me.host)
        && same(&f.machine_id, &me.machine_id)
        && me.pid_ns.is_some()
        && f.pid_ns == me.pid_ns;
    match (f.pid, f.proc_start) {
        (Some(pid), Some(start)) if here => Some((pid, start)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn fence_of(pid: u32, start: Option<u64>, left: f64) -> Fence {
        let me = process::current();
        Fence {
            left,
            pid: Some(pid),
            proc_start: start,
            boot_id: me.boot_id.clone(),
            pid_ns: me.pid_ns,
            host: me.host.clone(),
            machine_id: me.machine_id.clone(),
        }
    }

    fn left_of(list: Option<&str>, server: Duration) -> Duration {
        Fences::of(list, server).left().unwrap_or(Duration::ZERO)
    }

    /// `left` counts from now: a little less than the fence written a
    /// moment ago (by less than 250 ms, however busy the machine: still
    /// told from none, and from the longer fence beside the 300 ms one).
    #[track_caller]
    fn near(got: Duration, want: Duration) {
        assert!(
            got <= want && got + Duration::from_millis(250) > want,
            "{got:?} left, not about {want:?}"
        );
    }

    fn wait(fences: &[Fence]) -> Duration {
        left_of(
            Some(&serde_json::to_string(fences).unwrap()),
            Duration::from_secs(9),
        )
    }

    #[test]
    fn only_a_fence_for_an_ended_process_of_this_boot_and_namespace_is_skipped() {
        let ms = Duration::from_millis;
        // Unreadable: the server's count stands. None: nothing to wait.
        near(left_of(Some("not json"), ms(700)), ms(700));
        near(left_of(None, ms(700)), ms(700));
        // The server counted nothing: nothing, whatever the list.
        assert_eq!(left_of(Some(r#"[{"left": 900}]"#), ms(0)), ms(0));
        assert_eq!(wait(&[]), Duration::ZERO);
        // A fence that says nothing of its holder (a fence whose holder
        // record did not say) is kept, and never longer than 4 s.
        near(
            left_of(Some(r#"[{"left": 900}, {"left": 99999}]"#), ms(1)),
            ms(4002),
        );
        if !process::current().proc_is_ours || process::start_time(process::pid()).is_none() {
            // The portable platform reads no start times: nothing skipped.
            let mut c = Command::new("true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            near(wait(&[fence_of(pid, None, 500.0)]), ms(500));
            return;
        }
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = sleeper.id();
        let start = process::start_time(pid).unwrap();
        // Running: kept.
        near(wait(&[fence_of(pid, Some(start), 500.0)]), ms(500));
        // Written while it ran, looked at again once it was killed: its
        // fence ends then (the successor of a holder that was still on its
        // way out when the row was written).
        let written = Fences::of(
            Some(&serde_json::to_string(&[fence_of(pid, Some(start), 3000.0)]).unwrap()),
            ms(3000),
        );
        assert!(written.may_end());
        near(written.left().unwrap(), ms(3000));
        // Killed, not reaped (a zombie of that start): skipped.
        sleeper.kill().unwrap();
        let t = std::time::Instant::now();
        while process::exited(pid, start) != Some(true) {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::sleep(ms(5));
        }
        assert_eq!(wait(&[fence_of(pid, Some(start), 500.0)]), Duration::ZERO);
        assert_eq!(written.left(), None);
        // Beside a fence for a process still running, that one stands.
        let me = process::pid();
        let mine = process::start_time(me).unwrap();
        near(
            wait(&[
                fence_of(pid, Some(start), 800.0),
                fence_of(me, Some(mine), 300.0),
            ]),
            ms(300),
        );
        // Another boot, another PID namespace, no boot said: kept.
        let dead = fence_of(pid, Some(start), 500.0);
        let other_boot = Fence {
            boot_id: Some("another-boot".into()),
            ..dead.clone()
        };
        // Nothing to look at again for: the wait is the fence's.
        let remote = Fences::of(
            Some(&serde_json::to_string(std::slice::from_ref(&other_boot)).unwrap()),
            ms(500),
        );
        assert!(!remote.may_end());
        // Nor for this process's own fence, nor for one that a fence
        // nothing can cut short outlasts.
        let of = |f: &[Fence]| Fences::of(Some(&serde_json::to_string(f).unwrap()), ms(900));
        assert!(!of(&[fence_of(me, Some(mine), 900.0)]).may_end());
        let longer = Fence {
            left: 900.0,
            ..other_boot.clone()
        };
        assert!(!of(&[dead.clone(), longer.clone()]).may_end());
        assert!(of(&[
            Fence {
                left: 950.0,
                ..dead.clone()
            },
            longer
        ])
        .may_end());
        near(wait(&[other_boot]), ms(500));
        let other_ns = Fence {
            pid_ns: dead.pid_ns.map(|n| n + 1),
            ..dead.clone()
        };
        near(wait(&[other_ns]), ms(500));
        near(
            wait(&[Fence {
                boot_id: None,
                ..dead.clone()
            }]),
            ms(500),
        );
        let other_host = Fence {
            host: Some("another-host".into()),
            ..dead.clone()
        };
        near(wait(&[other_host]), ms(500));
        let other_machine = Fence {
            machine_id: Some("another".into()),
            ..dead.clone()
        };
        near(wait(&[other_machine]), ms(500));
        near(wait(&[fence_of(pid, None, 500.0)]), ms(500));
        // Reaped: no such process, skipped.
        sleeper.wait().unwrap();
        assert_eq!(wait(&[fence_of(pid, Some(start), 500.0)]), Duration::ZERO);
        // A live process under a start time not its own (the PID reused
        // since): kept.
        near(wait(&[fence_of(me, Some(mine + 1), 500.0)]), ms(500));
    }
}
