//! The Rust test agent: one JSON command per line on stdin, one JSON answer
//! per line on stdout. Every runtime's agent speaks this same protocol
//! (tests/PROTOCOL.md), so one scenario runs against all of them.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;

use serde_json::{json, Value};
use sidelease::{inspect, Error, Lease, LeaseState, Options, Wait};

fn main() {
    let mut handles: HashMap<u64, Lease> = HashMap::new();
    let mut next = 1u64;
    let exec_count: u64 = std::env::var("SIDELEASE_AGENT_EXECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    say(
        json!({"event": "ready", "pid": std::process::id(), "runtime": "rust", "execs": exec_count}),
    );
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let cmd: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                say(json!({"ok": false, "error": {"kind": "protocol", "message": e.to_string()}}));
                continue;
            }
        };
        let answer = run(&cmd, &mut handles, &mut next, exec_count);
        say(answer);
    }
}

fn say(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn run(cmd: &Value, handles: &mut HashMap<u64, Lease>, next: &mut u64, execs: u64) -> Value {
    let name = cmd["cmd"].as_str().unwrap_or("");
    let handle = || cmd["handle"].as_u64().unwrap_or(0);
    match name {
        "ping" => json!({"ok": true, "pid": std::process::id()}),
        "acquire" => match options(cmd).and_then(|o| Lease::acquire(target(cmd), &o)) {
            Ok(lease) => {
                let id = *next;
                *next += 1;
                let v = lease_json(id, &lease);
                handles.insert(id, lease);
                v
            }
            Err(e) => error_json(&e),
        },
        "release" => match handles.get(&handle()) {
            Some(l) => match l.release() {
                Ok(()) => json!({"ok": true}),
                Err(e) => error_json(&e),
            },
            None => {
                json!({"ok": false, "error": {"kind": "protocol", "message": "no such handle"}})
            }
        },
        "check" => match handles.get(&handle()) {
            Some(l) => match l.check() {
                Ok(c) => json!({"ok": true, "check": c.as_str()}),
                Err(e) => error_json(&e),
            },
            None => {
                json!({"ok": false, "error": {"kind": "protocol", "message": "no such handle"}})
            }
        },
        "ensure" | "ensure_now" => match handles.get(&handle()) {
            Some(l) => match if name == "ensure" {
                l.ensure_held()
            } else {
                l.ensure_held_now()
            } {
                Ok(()) => json!({"ok": true}),
                Err(e) => error_json(&e),
            },
            None => {
                json!({"ok": false, "error": {"kind": "protocol", "message": "no such handle"}})
            }
        },
        "state" => match handles.get(&handle()) {
            Some(l) => state_json(l),
            None => {
                json!({"ok": false, "error": {"kind": "protocol", "message": "no such handle"}})
            }
        },
        "wait_lost" => match handles.get(&handle()) {
            Some(l) => wait_lost(l, cmd["timeout"].as_f64().unwrap_or(5.0)),
            None => {
                json!({"ok": false, "error": {"kind": "protocol", "message": "no such handle"}})
            }
        },
        "inspect" => match options(cmd).and_then(|o| inspect(target(cmd), &o)) {
            Ok(i) => {
                json!({"ok": true, "inspect": serde_json::from_str::<Value>(&i.to_json()).unwrap_or(Value::Null)})
            }
            Err(e) => error_json(&e),
        },
        "exec_self" => {
            let exe = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => {
                    return json!({"ok": false, "error": {"kind": "io", "message": e.to_string()}})
                }
            };
            // Only returns on failure; the new image says "ready" itself.
            let e = std::process::Command::new(exe)
                .env("SIDELEASE_AGENT_EXECS", (execs + 1).to_string())
                .exec();
            json!({"ok": false, "error": {"kind": "io", "message": e.to_string()}})
        }
        "fork_child" => {
            // The child keeps whatever it inherited and lives until killed.
            // SAFETY: the child only calls pause(2), which is
            // async-signal-safe, until it is killed.
            match unsafe { libc::fork() } {
                0 => loop {
                    // SAFETY: as above.
                    unsafe { libc::pause() };
                },
                -1 => json!({"ok": false, "error": {"kind": "io", "message": "fork failed"}}),
                child => json!({"ok": true, "child": child}),
            }
        }
        "stress" => stress(cmd),
        "spin" => spin(cmd),
        "threads" => threads(cmd),
        "fork_storm" => fork_storm(cmd),
        "crash" => {
            // SAFETY: kill(2) on this very process; nothing runs after it.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            json!({"ok": false})
        }
        "exit" => std::process::exit(cmd["code"].as_i64().unwrap_or(0) as i32),
        other => {
            json!({"ok": false, "error": {"kind": "protocol", "message": format!("unknown command {other:?}")}})
        }
    }
}

/// The mutual-exclusion loop of tests/PROTOCOL.md.
fn stress(cmd: &Value) -> Value {
    let (owner, counter) = (
        cmd["owner"].as_str().unwrap_or(""),
        cmd["counter"].as_str().unwrap_or(""),
    );
    let me = std::process::id().to_string();
    let timeout = cmd["timeout"].as_f64().unwrap_or(5.0);
    let opts = match Wait::from_secs_f64(timeout) {
        Ok(w) => Options::new()
            .wait(w)
            .split_guard(cmd["split_guard"].as_bool().unwrap_or(true)),
        Err(e) => return error_json(&e),
    };
    let (mut done, mut overlaps, mut timeouts, mut lost) = (0u64, 0u64, 0u64, 0u64);
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    for _ in 0..cmd["iterations"].as_u64().unwrap_or(0) {
        let lease = match Lease::acquire(target(cmd), &opts) {
            Ok(l) => l,
            Err(Error::Timeout(_)) => {
                timeouts += 1;
                continue;
            }
            Err(e) => return error_json(&e),
        };
        if read(owner).trim() != "-" {
            overlaps += 1;
        }
        let _ = std::fs::write(owner, &me);
        let n: u64 = read(counter).trim().parse().unwrap_or(0);
        let _ = std::fs::write(counter, (n + 1).to_string());
        if read(owner).trim() != me {
            overlaps += 1;
        }
        let _ = std::fs::write(owner, "-");
        if lease.ensure_held().is_err() {
            lost += 1;
        }
        drop(lease);
        done += 1;
    }
    json!({"ok": true, "done": done, "overlaps": overlaps, "timeouts": timeouts, "lost": lost})
}

/// One attempt after another (`timeout` 0), as fast as it goes, for
/// `seconds`: how many were refused, how many won (each win a critical
/// section checked against `owner`, as in `stress`), and what else failed.
fn spin(cmd: &Value) -> Value {
    let owner = cmd["owner"].as_str().unwrap_or("");
    let me = std::process::id().to_string();
    let until = std::time::Instant::now()
        + std::time::Duration::from_secs_f64(cmd["seconds"].as_f64().unwrap_or(1.0));
    let opts = Options::new().split_guard(cmd["split_guard"].as_bool().unwrap_or(true));
    let (mut refused, mut won, mut overlaps) = (0u64, 0u64, 0u64);
    let mut errors: Vec<String> = Vec::new();
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    while std::time::Instant::now() < until {
        match Lease::acquire(target(cmd), &opts) {
            Ok(lease) => {
                won += 1;
                if read(owner).trim() != "-" {
                    overlaps += 1;
                }
                let _ = std::fs::write(owner, &me);
                std::thread::sleep(std::time::Duration::from_millis(1));
                if read(owner).trim() != me {
                    overlaps += 1;
                }
                let _ = std::fs::write(owner, "-");
                drop(lease);
            }
            Err(Error::InUse(_)) => refused += 1,
            // The directory or file vanished under a deleting test: a
            // failed attempt, not a second holder.
            Err(e) => {
                if errors.len() < 5 {
                    errors.push(e.to_string());
                }
            }
        }
    }
    json!({"ok": true, "refused": refused, "won": won, "overlaps": overlaps, "errors": errors})
}

/// `threads` threads acquire one new lease at the same moment, `rounds`
/// times (a new lease file each round, in `dir`), one attempt each: every
/// acquisition must get a handle on the one lease, none may be refused by
/// its own process.
fn threads(cmd: &Value) -> Value {
    use std::sync::{Arc, Barrier};
    let dir = cmd["dir"].as_str().unwrap_or("").to_owned();
    let n = cmd["threads"].as_u64().unwrap_or(8) as usize;
    let rounds = cmd["rounds"].as_u64().unwrap_or(1000);
    let barrier = Arc::new(Barrier::new(n));
    let me = std::process::id();
    let workers: Vec<_> = (0..n)
        .map(|_| {
            let (dir, barrier) = (dir.clone(), barrier.clone());
            std::thread::spawn(move || {
                let (mut ok, mut self_refused, mut other) = (0u64, 0u64, Vec::new());
                for r in 0..rounds {
                    let target = format!("{dir}/round-{r}.db");
                    barrier.wait();
                    let got = Lease::acquire(&target, &Options::new());
                    barrier.wait(); // all have tried while the others hold
                    match got {
                        Ok(l) => {
                            ok += 1;
                            drop(l);
                        }
                        Err(e) => match e.contention() {
                            Some(c) if c.holders.contains(&me) || c.holders.is_empty() => {
                                self_refused += 1
                            }
                            _ => other.push(e.to_string()),
                        },
                    }
                }
                (ok, self_refused, other)
            })
        })
        .collect();
    let (mut ok, mut self_refused, mut other) = (0, 0, Vec::new());
    for w in workers {
        let (o, s, e) = w.join().unwrap_or_default();
        ok += o;
        self_refused += s;
        other.extend(e);
    }
    other.truncate(5);
    json!({"ok": true, "acquired": ok, "refused_by_self": self_refused, "other_errors": other})
}

/// Fork `forks` times while another thread acquires and releases `target`
/// in a loop; after each fork the child tells it is past its fork handler
/// and waits, and its descriptors are examined: none may refer to the lease
/// file. Then this process must still acquire the lease.
fn fork_storm(cmd: &Value) -> Value {
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let t = target(cmd).to_owned();
    let forks = cmd["forks"].as_u64().unwrap_or(5000);
    let first = match Lease::acquire(&t, &Options::new()) {
        Ok(l) => l,
        Err(e) => return error_json(&e),
    };
    let lp = first.lease_path().to_path_buf();
    drop(first);
    let key = match std::fs::metadata(&lp) {
        Ok(m) => (m.dev(), m.ino()),
        Err(e) => return json!({"ok": false, "error": {"kind": "io", "message": e.to_string()}}),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let worker = {
        let (stop, cycles, t) = (stop.clone(), cycles.clone(), t.clone());
        std::thread::spawn(move || {
            let mut refused = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match Lease::acquire(&t, &Options::new()) {
                    Ok(l) => drop(l),
                    Err(_) => refused += 1,
                }
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            refused
        })
    };
    let mut bad = 0u64;
    for _ in 0..forks {
        let mut p = [0i32; 2];
        // SAFETY: plain pipe/fork/write/pause; the child only makes
        // async-signal-safe calls.
        unsafe {
            if libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                break;
            }
            let child = libc::fork();
            if child == 0 {
                libc::write(p[1], b"x".as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
            let mut b = 0u8;
            libc::read(p[0], (&mut b as *mut u8).cast(), 1);
            libc::close(p[0]);
            libc::close(p[1]);
            if holds_fd_of(child as u32, key) {
                bad += 1;
            }
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let refused = worker.join().unwrap_or(0);
    let last = Lease::acquire(&t, &Options::new()).map(drop);
    json!({"ok": true, "forks": forks, "children_with_lease_fd": bad,
           "cycles": cycles.load(Ordering::Relaxed), "worker_refused": refused,
           "final_acquire": last.map_or_else(|e| e.to_string(), |_| "ok".into())})
}

fn holds_fd_of(pid: u32, key: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| {
        d.flatten()
            .any(|e| std::fs::metadata(e.path()).is_ok_and(|m| (m.dev(), m.ino()) == key))
    })
}

fn target(cmd: &Value) -> &str {
    cmd["target"].as_str().unwrap_or("")
}

fn options(cmd: &Value) -> Result<Options, Error> {
    let mut o = Options::new();
    if let Some(s) = cmd["suffix"].as_str() {
        o = o.suffix(s);
    }
    o = o.wait(match &cmd["timeout"] {
        Value::Null => Wait::Forever,
        v => Wait::from_secs_f64(v.as_f64().unwrap_or(0.0))?,
    });
    if cmd.get("timeout").is_none() {
        o = o.wait(Wait::NoWait);
    }
    if let Some(m) = cmd.get("metadata") {
        o = o.metadata(m.clone())?;
    }
    if let Some(b) = cmd["split_guard"].as_bool() {
        o = o.split_guard(b);
    }
    if let Some(b) = cmd["watch"].as_bool() {
        o = o.watch(b);
    }
    if let Some(b) = cmd["allow_unsupported_fs"].as_bool() {
        o = o.allow_unsupported_fs(b);
    }
    Ok(o)
}

fn state_json(l: &Lease) -> Value {
    let st = l.state();
    let reason = match &st {
        LeaseState::Lost(lost) => json!(lost.reason),
        _ => Value::Null,
    };
    json!({"ok": true, "state": st.as_str(), "reason": reason})
}

/// Wait on the lease's lost descriptor (as an event loop would) for up to
/// `timeout` seconds.
fn wait_lost(l: &Lease, timeout: f64) -> Value {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let start = std::time::Instant::now();
    let fd = match l.lost_fd() {
        Ok(fd) => fd,
        Err(e) => return error_json(&e),
    };
    let ms = (timeout * 1000.0) as i64;
    let ts = Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let _ = poll(&mut fds, Some(&ts));
    let lost = !fds[0].revents().is_empty() && matches!(l.state(), LeaseState::Lost(_));
    let mut v = state_json(l);
    v["lost"] = json!(lost);
    v["elapsed_ms"] = json!(start.elapsed().as_secs_f64() * 1000.0);
    v
}

fn lease_json(id: u64, l: &Lease) -> Value {
    json!({
        "ok": true,
        "handle": id,
        "lease_path": l.lease_path(),
        "target": l.target(),
        "generation": l.generation(),
        "record": l.record().to_value(),
        "previous": l.previous().map(|r| r.to_value()),
        "previous_released_cleanly": l.previous_released_cleanly(),
        "record_written": l.record_written(),
    })
}

fn error_json(e: &Error) -> Value {
    let mut err = json!({"kind": e.kind().as_str(), "message": e.to_string()});
    if let Some(c) = e.contention() {
        err["holder"] = c
            .holder
            .as_ref()
            .map(|r| r.to_value())
            .unwrap_or(Value::Null);
        err["holders"] = json!(c.holders);
    }
    if let Some(n) = e.errno() {
        err["errno"] = json!(n);
    }
    json!({"ok": false, "error": err})
}
