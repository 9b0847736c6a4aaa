//! `lead`'s watchdog (`sidelease __watchdog QUIET GRACE`) driven by this
//! test as its `lead`: a `lead` that runs but has gone quiet past its
//! deadline is only slow (a busy machine), and its command is killed only
//! once it has fed nothing for GRACE past the deadline (hung). The stopped
//! `lead` is `containment.rs`'s (`a_frozen_leaders_command_is_killed_…`).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sidelease::platform::clock::boot_ms;

#[path = "../../core/tests/common/mod.rs"]
mod common;

const BIN: &str = env!("CARGO_BIN_EXE_sidelease");
const GROUP: u64 = 1 << 63;

fn gone_or_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: a stopped lead cannot be told from a running one, silence is taken for a stop"
)]
fn a_running_lead_that_went_quiet_keeps_its_command_until_the_grace_passed() {
    const QUIET: u64 = 25;
    const GRACE: u64 = 600;
    let mut dog = common::command(BIN)
        .args(["__watchdog", &QUIET.to_string(), &GRACE.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = dog.stdin.take().unwrap();
    let mut from = dog.stdout.take().unwrap();
    let mut b = [0u8; 1];
    from.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"r", "the watchdog is ready");
    let mut cmd = Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    // The deadline 100 ms on, then the command's group; then silence, while
    // this process (its parent, its `lead`) runs on.
    let deadline = boot_ms() + 100;
    to.write_all(&deadline.to_le_bytes()).unwrap();
    to.write_all(&(GROUP | cmd.id() as u64).to_le_bytes())
        .unwrap();
    from.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"g", "the watchdog has the group");
    let t0 = Instant::now();
    let killed = loop {
        if cmd.try_wait().unwrap().is_some() || gone_or_zombie(cmd.id()) {
            break boot_ms();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the command was not killed within 10 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    // The bound is the deadline and the margin (twice QUIET) after it.
    assert!(
        killed >= deadline + 2 * QUIET + GRACE,
        "killed {} ms after the deadline, before the bound and the grace ({GRACE} ms) \
         passed, though its lead runs",
        killed as i64 - deadline as i64
    );
    let _ = cmd.wait();
    drop(to);
    assert!(dog.wait().unwrap().success());
    let mut err = String::new();
    dog.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        err.contains(
            "lead did not feed it (its lease's bound passed and it runs, fed nothing since: hung?)"
        ),
        "{err}"
    );
}
