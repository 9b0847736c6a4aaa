//! A driver for agents: spawn one, send a command, read its one-line answer
//! with a bounded wait. Order between processes comes from these handshakes,
//! never from sleeps; a broken handshake fails loudly with the transcript.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

pub const STEP: Duration = Duration::from_secs(10);

pub struct Agent {
    pub child: Child,
    pub pid: u32,
    stdin: ChildStdin,
    lines: Receiver<String>,
    transcript: Vec<String>,
}

impl Agent {
    pub fn spawn() -> Agent {
        Agent::spawn_cmd(Command::new(env!("CARGO_BIN_EXE_sidelease-agent")))
    }

    pub fn spawn_cmd(mut cmd: Command) -> Agent {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // A copy of the agent just written (reachable_agent) is "busy" while
        // a child forked by another test thread still holds the writer's
        // descriptor, until that child execs: try again shortly.
        let mut tries = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => break r.expect("spawn agent"),
            }
        };
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        let mut a = Agent {
            child,
            pid,
            stdin,
            lines: rx,
            transcript: Vec::new(),
        };
        let ready = a.recv();
        assert_eq!(ready["event"], "ready", "{}", a.transcript());
        a
    }

    pub fn transcript(&self) -> String {
        format!(
            "agent {} transcript:\n  {}",
            self.pid,
            self.transcript.join("\n  ")
        )
    }

    pub fn recv(&mut self) -> Value {
        match self.lines.recv_timeout(STEP) {
            Ok(line) => {
                self.transcript.push(format!("< {line}"));
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}\n{}", self.transcript()))
            }
            Err(e) => panic!("no answer within {STEP:?} ({e})\n{}", self.transcript()),
        }
    }

    pub fn send(&mut self, cmd: Value) {
        let line = cmd.to_string();
        self.transcript.push(format!("> {line}"));
        writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .unwrap_or_else(|e| panic!("agent gone ({e})\n{}", self.transcript()));
    }

    pub fn call(&mut self, cmd: Value) -> Value {
        self.send(cmd);
        self.recv()
    }

    /// Acquire and expect success; returns the answer.
    pub fn acquire_ok(&mut self, target: &str) -> Value {
        let a = self.call(json!({"cmd": "acquire", "target": target}));
        assert_eq!(a["ok"], true, "acquire failed: {a}\n{}", self.transcript());
        a
    }

    /// Acquire with the given command and expect success.
    pub fn acquire_ok_with(&mut self, cmd: Value) -> Value {
        let a = self.call(cmd);
        assert_eq!(a["ok"], true, "acquire failed: {a}\n{}", self.transcript());
        a
    }

    /// Acquire and expect an error of `kind`; returns the error object.
    pub fn acquire_err(&mut self, cmd: Value, kind: &str) -> Value {
        let a = self.call(cmd);
        assert_eq!(
            a["ok"],
            false,
            "expected {kind}, got {a}\n{}",
            self.transcript()
        );
        assert_eq!(a["error"]["kind"], kind, "{a}\n{}", self.transcript());
        a["error"].clone()
    }

    pub fn inspect(&mut self, target: &str) -> Value {
        let a = self.call(json!({"cmd": "inspect", "target": target}));
        assert_eq!(a["ok"], true, "{a}\n{}", self.transcript());
        a["inspect"].clone()
    }

    pub fn signal(&mut self, sig: i32) -> std::process::ExitStatus {
        // SAFETY: kill(2) on the agent this test started.
        unsafe { libc::kill(self.pid as i32, sig) };
        self.wait_exit()
    }

    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + STEP;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "agent did not exit\n{}",
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Kill a process this test started (a forked child of an agent), by PID.
pub fn kill_pid(pid: i64) {
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

pub fn is_alive(pid: i64) -> bool {
    // SAFETY: kill(2) with signal 0 only checks the PID.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// A copy of the agent binary in a directory every user can reach (mode
/// 0755 all the way), for agents started as another user.
pub fn reachable_agent() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static COPY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sidelease-agent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let to = dir.join("sidelease-agent");
        std::fs::copy(env!("CARGO_BIN_EXE_sidelease-agent"), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The copy is 70+ MB; the harness ends with exit(3), which runs this.
        extern "C" fn remove_copy() {
            let dir = std::env::temp_dir().join(format!("sidelease-agent-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(dir);
        }
        // SAFETY: registers a plain function that only removes a directory.
        unsafe { libc::atexit(remove_copy) };
        to
    })
    .clone()
}
