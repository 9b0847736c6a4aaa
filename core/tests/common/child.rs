//! Running a program of ours as a child, one of this test binary's own
//! tests included, under the emulator when cross-targets runs the tests
//! (apart from the PostgreSQL helpers of `mod.rs`, so that a test file
//! built without the `postgres` feature can include it alone).

use std::ffi::OsStr;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// `program` as a command, through `$SIDELEASE_TEST_EMULATOR` when that is
/// set: tests/cross-targets runs the arm64 test binaries under qemu, and
/// nothing here makes the kernel run an arm64 program by itself, so a
/// child that is one of ours (the CLI, this test binary) is emulated too.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    match std::env::var("SIDELEASE_TEST_EMULATOR") {
        Ok(e) if !e.trim().is_empty() => {
            let mut words = e.split_whitespace();
            let mut c = Command::new(words.next().unwrap());
            c.args(words).arg(program);
            c
        }
        _ => Command::new(program),
    }
}

/// This test binary, to run one of its tests in a child process. Under the
/// emulator the process's executable is the program loader qemu was given,
/// so the binary is the path the loader was given: argv[0].
pub fn this_exe() -> PathBuf {
    match std::env::var("SIDELEASE_TEST_EMULATOR") {
        Ok(e) if !e.trim().is_empty() => {
            std::fs::canonicalize(std::env::args_os().next().unwrap()).unwrap()
        }
        _ => std::env::current_exe().unwrap(),
    }
}

/// This test binary's ignored test `test` run in a child with `var` set to
/// `value`, returned once it printed `HELD` (it holds what it was to hold).
pub fn spawn_until_held(test: &str, var: &str, value: impl AsRef<OsStr>) -> Child {
    let mut child = command(this_exe())
        .args(["--exact", test, "--nocapture", "--include-ignored"])
        .env(var, value)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("HELD") {
        let n = child.stdout.as_mut().unwrap().read(&mut buf).unwrap();
        assert!(n > 0, "the child ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    child
}
