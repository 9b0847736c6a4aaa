//! README.md's Rust quickstart, compiled and run: the block under
//! "### Rust" must be, line for line, the body of `quickstart` below (the
//! other quickstarts run in tests/quickstarts.py). Its own test binary: it
//! changes the working directory, as a program pasting it would run in one.

#[path = "common/child.rs"]
mod child;

use std::cell::Cell;

use child::spawn_until_held;

thread_local! {
    static RECOVERED: Cell<bool> = const { Cell::new(false) };
}

#[rustfmt::skip]
fn quickstart() -> Result<(), sidelease::Error> {
    // README begin
use sidelease::{Lease, Options, Wait};
use std::time::Duration;

let lease = Lease::acquire("app.db", &Options::new().wait(Wait::Timeout(Duration::from_secs(2))))?;
if lease.previous_released_cleanly() == Some(false) {
    // the previous holder died holding the lease: run crash recovery
    RECOVERED.set(true);
}
lease.release()?; // or drop it
    // README end
    Ok(())
}

/// The README's block, and this file's copy of it (the line that marks
/// where recovery runs here stands for README's comment alone).
fn blocks() -> (String, String) {
    let readme = include_str!("../../README.md");
    let rust = readme
        .split("\n### Rust\n")
        .nth(1)
        .and_then(|s| s.split("```rust\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("README.md has a Rust quickstart block");
    let me = include_str!("quickstart.rs");
    let body = me
        .split("    // README begin\n")
        .nth(1)
        .and_then(|s| s.split("    // README end\n").next())
        .expect("the markers above");
    let body: String = body
        .lines()
        .filter(|l| !l.contains("RECOVERED.set"))
        .map(|l| format!("{l}\n"))
        .collect();
    (rust.to_string(), body)
}

#[test]
fn the_readme_rust_quickstart_runs_as_written() {
    let (readme, here) = blocks();
    assert_eq!(
        readme, here,
        "README.md's Rust quickstart and core/tests/quickstart.rs differ"
    );
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    // Never held before: nothing to recover.
    quickstart().unwrap();
    assert!(!RECOVERED.get());
    // Released cleanly: nothing to recover.
    quickstart().unwrap();
    assert!(!RECOVERED.get());
    // A holder SIGKILLed while it held the lease: the next one recovers.
    let mut holder = spawn_until_held(
        "child_holds_until_killed",
        "SIDELEASE_CHILD_TARGET",
        dir.path().join("app.db"),
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    quickstart().unwrap();
    assert!(
        RECOVERED.get(),
        "a holder that never released was not recovered from"
    );
}

#[test]
#[ignore = "run by the test above as its holder"]
fn child_holds_until_killed() {
    let db = std::env::var("SIDELEASE_CHILD_TARGET").unwrap();
    let _l = sidelease::Lease::acquire(&db, &sidelease::Options::new()).unwrap();
    println!("HELD");
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(600));
}
