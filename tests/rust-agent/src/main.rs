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
            match unsafe { libc::fork() } {
                0 => loop {
                    unsafe { libc::pause() };
                },
                -1 => json!({"ok": false, "error": {"kind": "io", "message": "fork failed"}}),
                child => json!({"ok": true, "child": child}),
            }
        }
        "stress" => stress(cmd),
        "crash" => {
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
    let (mut done, mut overlaps, mut timeouts) = (0u64, 0u64, 0u64);
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
        drop(lease);
        done += 1;
    }
    json!({"ok": true, "done": done, "overlaps": overlaps, "timeouts": timeouts})
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
    let lost = !fds[0].revents().is_empty();
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
