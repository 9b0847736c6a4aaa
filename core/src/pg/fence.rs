//! The one case a successor does not wait out a fence: the holder it is
//! for provably ended. A holder cut off from the server (a network cut, an
//! operator's `pg_terminate_backend`) goes on believing it holds the lease
//! until its own bound passes, so the next holder waits that out (the
//! fence, the server's count, carried through the holders in between). A
//! process that has ended believes nothing: after a SIGKILL on this host
//! the fence cost a failover its whole bound (1 s by default) for nothing,
//! and a crash loop that bound at every step.

use std::time::Duration;

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

/// How long to wait before a holder whose lock was taken could no longer
/// believe it holds the lease: the latest fence whose holder is not
/// provably gone. `fences` is the write's list; `server`, the server's
/// count of them all, stands when the list cannot be read.
pub(crate) fn left(fences: Option<&str>, server: Duration) -> Duration {
    let Some(list) = fences.and_then(|f| serde_json::from_str::<Vec<Fence>>(f).ok()) else {
        return server;
    };
    let me = process::current();
    list.iter()
        .filter(|f| !ended(f, me))
        .map(|f| Duration::from_millis(f.left.clamp(0.0, 4002.0) as u64))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// Whether the holder a fence is for has provably ended: it was a process
/// of this boot of this machine (host name, machine id and boot id: a VM
/// cloned from a snapshot keeps the boot id) and of this PID namespace
/// (whose processes this one's `/proc` shows), and its PID names no
/// process, or one whose threads all exited, that started when it did.
/// Anything else keeps the fence: another host, another PID namespace,
/// another boot, a record that does not say, a PID another process has
/// taken since.
fn ended(f: &Fence, me: &process::Identity) -> bool {
    let same = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
    me.proc_is_ours
        && same(&f.boot_id, &me.boot_id)
        && same(&f.host, &me.host)
        && same(&f.machine_id, &me.machine_id)
        && me.pid_ns.is_some()
        && f.pid_ns == me.pid_ns
        && matches!((f.pid, f.proc_start), (Some(pid), Some(start)) if process::exited(pid, start) == Some(true))
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

    fn wait(fences: &[Fence]) -> Duration {
        left(
            Some(&serde_json::to_string(fences).unwrap()),
            Duration::from_secs(9),
        )
    }

    #[test]
    fn only_a_fence_for_an_ended_process_of_this_boot_and_namespace_is_skipped() {
        let ms = Duration::from_millis;
        // Unreadable: the server's count stands. None: nothing to wait.
        assert_eq!(left(Some("not json"), ms(700)), ms(700));
        assert_eq!(left(None, ms(700)), ms(700));
        assert_eq!(wait(&[]), Duration::ZERO);
        // A fence that says nothing of its holder (a fence whose holder
        // record did not say) is kept, and never longer than 4 s.
        assert_eq!(
            left(Some(r#"[{"left": 900}, {"left": 99999}]"#), ms(1)),
            ms(4002)
        );
        if !process::current().proc_is_ours || process::start_time(process::pid()).is_none() {
            // The portable platform reads no start times: nothing skipped.
            let mut c = Command::new("true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            assert_eq!(wait(&[fence_of(pid, None, 500.0)]), ms(500));
            return;
        }
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = sleeper.id();
        let start = process::start_time(pid).unwrap();
        // Running: kept.
        assert_eq!(wait(&[fence_of(pid, Some(start), 500.0)]), ms(500));
        // Killed, not reaped (a zombie of that start): skipped.
        sleeper.kill().unwrap();
        let t = std::time::Instant::now();
        while process::exited(pid, start) != Some(true) {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::sleep(ms(5));
        }
        assert_eq!(wait(&[fence_of(pid, Some(start), 500.0)]), Duration::ZERO);
        // Beside a fence for a process still running, that one stands.
        let me = process::pid();
        let mine = process::start_time(me).unwrap();
        assert_eq!(
            wait(&[
                fence_of(pid, Some(start), 800.0),
                fence_of(me, Some(mine), 300.0)
            ]),
            ms(300)
        );
        // Another boot, another PID namespace, no boot said: kept.
        let dead = fence_of(pid, Some(start), 500.0);
        let other_boot = Fence {
            boot_id: Some("another-boot".into()),
            ..dead.clone()
        };
        assert_eq!(wait(&[other_boot]), ms(500));
        let other_ns = Fence {
            pid_ns: dead.pid_ns.map(|n| n + 1),
            ..dead.clone()
        };
        assert_eq!(wait(&[other_ns]), ms(500));
        assert_eq!(
            wait(&[Fence {
                boot_id: None,
                ..dead.clone()
            }]),
            ms(500)
        );
        let other_host = Fence {
            host: Some("another-host".into()),
            ..dead.clone()
        };
        assert_eq!(wait(&[other_host]), ms(500));
        let other_machine = Fence {
            machine_id: Some("another".into()),
            ..dead.clone()
        };
        assert_eq!(wait(&[other_machine]), ms(500));
        assert_eq!(wait(&[fence_of(pid, None, 500.0)]), ms(500));
        // Reaped: no such process, skipped.
        sleeper.wait().unwrap();
        assert_eq!(wait(&[fence_of(pid, Some(start), 500.0)]), Duration::ZERO);
        // A live process under a start time not its own (the PID reused
        // since): kept.
        assert_eq!(wait(&[fence_of(me, Some(mine + 1), 500.0)]), ms(500));
    }
}
