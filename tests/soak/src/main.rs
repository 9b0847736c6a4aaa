//! The tampering soak (issue 35): many processes take one lease over and
//! over while others delete the lease file, move it aside, or rename a
//! fresh empty file over it every 1-5 ms. Every critical section is logged
//! (pid, generation, start, end on the monotonic clock, whether
//! `ensure_held` still passed at its end) and the logs are checked:
//!
//! - a *silent overlap* is two critical sections that overlap in time where
//!   the one that started first still passed `ensure_held` at its end: two
//!   holders, neither told. Tampering may cost a holder its lease, but it
//!   must then be told (`ensure_held` fails);
//! - a generation (the fencing token) may never be given twice, nor be
//!   smaller than one given to a section that ended before it began.
//!
//! Built with the `faults` feature, the library injects seeded delays at
//! each step of acquire, re-anchor, guard and release
//! (`SIDELEASE_FAULTS`, core/src/faults.rs), so the interleavings that 16
//! cores reach by themselves are reached on 2.
//!
//! ```text
//! sidelease-soak run [--procs 8] [--sections 200] [--tamperers 2]
//!                    [--modes unlink,move,replace[,truncate]] [--seed S] [--max-delay-us 2000]
//!                    [--hold-us 300] [--seconds N] [--dir D] [--split-guard on|off]
//! ```
//! prints one JSON summary line and exits 1 when a check fails.
//!
//! With `--split-guard off` every worker acquires blind: the holder's watch
//! and a contender's grace for young files are all that keep one holder,
//! and they do not always (docs/guarantees.md, Blind contenders).

mod check;

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;
use sidelease::{Lease, Options, Wait};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&Flags::parse(&args[1..])),
        Some("worker") => worker(&Flags::parse(&args[1..])),
        Some("tamper") => tamper(&Flags::parse(&args[1..])),
        _ => Err("usage: sidelease-soak run|worker|tamper [--flag value]...".into()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("sidelease-soak: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--name value` pairs.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn parse(args: &[String]) -> Flags {
        let mut out = Vec::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let v = it.next().cloned().unwrap_or_default();
            out.push((k.trim_start_matches("--").to_owned(), v));
        }
        Flags(out)
    }
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    fn num(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name} {v:?}: expected an unsigned integer")),
        }
    }
    fn switch(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(default),
            Some("on") => Ok(true),
            Some("off") => Ok(false),
            Some(v) => Err(format!("--{name} {v:?}: expected on or off")),
        }
    }
    fn path(&self, name: &str) -> Result<PathBuf, String> {
        self.get(name)
            .map(PathBuf::from)
            .ok_or_else(|| format!("--{name} is required"))
    }
}

/// Nanoseconds on the monotonic clock, which every process shares.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A small seeded generator (xorshift64*), for the workers' hold times and
/// the tamperers' choices.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

const MODES: [&str; 4] = ["unlink", "move", "replace", "truncate"];

fn run(f: &Flags) -> Result<bool, String> {
    let procs = f.num("procs", 8)?;
    let sections = f.num("sections", 200)?;
    let tamperers = f.num("tamperers", 2)?;
    let hold_us = f.num("hold-us", 300)?;
    let modes = f.get("modes").unwrap_or("unlink,move,replace").to_owned();
    for m in modes.split(',') {
        if !MODES.contains(&m) {
            return Err(format!("--modes: unknown mode {m:?} (one of {MODES:?})"));
        }
    }
    let seed = match f.get("seed") {
        Some(_) => Some(f.num("seed", 0)?),
        None => None,
    };
    let max_delay = f.num("max-delay-us", 2000)?;
    let split_guard = f.switch("split-guard", true)?;
    // A bound on the run: workers start no section after it.
    let seconds = f.num("seconds", 0)?;
    let deadline = (seconds > 0).then(|| now_ns() + seconds * 1_000_000_000);
    let (dir, made) = match f.get("dir") {
        Some(d) => (PathBuf::from(d), false),
        None => {
            let d = std::env::temp_dir().join(format!("sidelease-soak-{}", std::process::id()));
            std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            (d, true)
        }
    };
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let db = dir.join("app.db");
    let lease = dir.join("app.db.backend-lease");
    let stop = dir.join("stop");
    let started = Instant::now();
    let spawn = |args: Vec<String>| -> Result<Child, String> {
        let mut c = Command::new(&me);
        c.args(args).stdin(Stdio::null());
        if let Some(s) = seed {
            c.env("SIDELEASE_FAULTS", format!("{s}:{max_delay}"));
        } else {
            c.env_remove("SIDELEASE_FAULTS");
        }
        c.spawn()
            .map_err(|e| format!("spawn {}: {e}", me.display()))
    };
    let mut tampering = Vec::new();
    for i in 0..tamperers {
        tampering.push(spawn(vec![
            "tamper".into(),
            "--lease".into(),
            lease.display().to_string(),
            "--stop".into(),
            stop.display().to_string(),
            "--modes".into(),
            modes.clone(),
            "--seed".into(),
            (seed.unwrap_or(0) * 1000 + i).to_string(),
            "--count".into(),
            dir.join(format!("tampered.{i}")).display().to_string(),
        ])?);
    }
    let mut workers = Vec::new();
    for i in 0..procs {
        workers.push(spawn(vec![
            "worker".into(),
            "--db".into(),
            db.display().to_string(),
            "--sections".into(),
            sections.to_string(),
            "--hold-us".into(),
            hold_us.to_string(),
            "--log".into(),
            dir.join(format!("sections.{i}")).display().to_string(),
            "--deadline-ns".into(),
            deadline.unwrap_or(u64::MAX).to_string(),
            "--split-guard".into(),
            (if split_guard { "on" } else { "off" }).into(),
        ])?);
    }
    let mut failed_workers = 0;
    for mut w in workers {
        if !w.wait().map_err(|e| e.to_string())?.success() {
            failed_workers += 1;
        }
    }
    std::fs::write(&stop, b"").map_err(|e| format!("{}: {e}", stop.display()))?;
    for mut t in tampering {
        t.wait().map_err(|e| e.to_string())?;
    }
    let report = check::analyse(&dir, procs, tamperers)?;
    // Not vacuous: half the sections asked for, or (bounded in time) a
    // thousand.
    let asked = if deadline.is_some() {
        (procs * sections).min(1000)
    } else {
        procs * sections / 2
    };
    let ok = report.passed(asked) && failed_workers == 0;
    let summary = serde_json::json!({
        "ok": ok,
        "seed": seed,
        "max_delay_us": seed.map(|_| max_delay),
        "procs": procs,
        "modes": modes,
        "split_guard": split_guard,
        "seconds": started.elapsed().as_secs_f64(),
        "failed_workers": failed_workers,
        "report": report.to_json(),
    });
    println!("{summary}");
    if made && ok {
        let _ = std::fs::remove_dir_all(&dir);
    } else if !ok {
        eprintln!("sidelease-soak: logs kept in {}", dir.display());
    }
    Ok(ok)
}

/// Take the lease `--sections` times; log each critical section.
fn worker(f: &Flags) -> Result<bool, String> {
    let db = f.path("db")?;
    let sections = f.num("sections", 200)?;
    let hold_us = f.num("hold-us", 300)?;
    let log_path = f.path("log")?;
    // Unbuffered: a worker killed mid-run leaves every section it logged.
    let mut log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let deadline = f.num("deadline-ns", u64::MAX)?;
    let split_guard = f.switch("split-guard", true)?;
    let detector_path = db.with_file_name("detector");
    let detector = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&detector_path)
        .map_err(|e| format!("{}: {e}", detector_path.display()))?;
    let pid = std::process::id();
    let mut rng = Rng::new(u64::from(pid));
    for _ in 0..sections {
        let now = now_ns();
        if now >= deadline {
            break;
        }
        // At most a minute, and not much past the run's bound.
        let left = Duration::from_nanos(deadline - now).saturating_add(Duration::from_secs(5));
        let opts = Options::new()
            .split_guard(split_guard)
            .wait(Wait::Timeout(left.min(Duration::from_secs(60))));
        let lease = match Lease::acquire(&db, &opts) {
            Ok(l) => l,
            Err(e) => {
                writeln!(log, "E {:?} {}", e.kind(), e.to_string().replace('\n', " "))
                    .map_err(|e| e.to_string())?;
                continue;
            }
        };
        let start = now_ns();
        let generation = lease.generation().unwrap_or(0);
        // A second, independent witness: an exclusive flock on a file no
        // one tampers with, taken inside every critical section.
        let alone =
            rustix::fs::flock(detector.as_fd(), FlockOperation::NonBlockingLockExclusive).is_ok();
        let hold = rng.below(hold_us + 1);
        if hold > 0 {
            std::thread::sleep(Duration::from_micros(hold));
        }
        let held = lease.ensure_held().is_ok();
        let end = now_ns();
        if alone {
            let _ = rustix::fs::flock(detector.as_fd(), FlockOperation::Unlock);
        }
        let _ = lease.release();
        writeln!(
            log,
            "S {pid} {generation} {start} {end} {} {}",
            u8::from(held),
            u8::from(alone)
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(true)
}

/// Delete, move aside, or rename a fresh file over the lease file every
/// 1-5 ms until `--stop` exists; write the count to `--count`.
fn tamper(f: &Flags) -> Result<bool, String> {
    let lease = f.path("lease")?;
    let stop = f.path("stop")?;
    let count_path = f.path("count")?;
    let modes: Vec<String> = f
        .get("modes")
        .unwrap_or("unlink,move,replace")
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut rng = Rng::new(f.num("seed", 0)? ^ u64::from(std::process::id()));
    let dir = lease.parent().unwrap_or(Path::new(".")).to_path_buf();
    let me = std::process::id();
    let (mut done, mut i) = (0u64, 0u64);
    while !stop.exists() {
        i += 1;
        let mode = &modes[rng.below(modes.len() as u64) as usize];
        let acted = match mode.as_str() {
            "unlink" => std::fs::remove_file(&lease).is_ok(),
            "move" => std::fs::rename(&lease, dir.join(format!("aside.{me}"))).is_ok(),
            // `: > file`: whatever record is in it is gone, its lock stays.
            "truncate" => std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&lease)
                .is_ok(),
            _ => {
                let fresh = dir.join(format!("fresh.{me}.{i}"));
                std::fs::write(&fresh, b"").is_ok() && std::fs::rename(&fresh, &lease).is_ok()
            }
        };
        done += u64::from(acted);
        std::thread::sleep(Duration::from_micros(1000 + rng.below(4001)));
    }
    std::fs::write(&count_path, done.to_string())
        .map_err(|e| format!("{}: {e}", count_path.display()))?;
    Ok(true)
}
