//! `sidelease status`: the inspection, for people and for scripts.

use std::path::Path;
use std::process::ExitCode;

use sidelease::{inspect, Inspection, Options, State};

use crate::EXIT_ERROR;

/// `status` of a path that is not there and has no lease file: EX_NOINPUT.
const EXIT_NO_SUCH: u8 = 66;

pub fn run(target: &Path, suffix: &str, json: bool) -> ExitCode {
    let opts = Options::new().suffix(suffix);
    let i = match inspect(target, &opts) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sidelease: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    // Free, and neither the database nor its lease file is there: most
    // likely a mistyped path, which `status $DB &&
    // maintenance` must not read as "free" (EX_NOINPUT, as a read of a
    // missing file). A database not created yet says so too.
    let absent = i.state == State::Free
        && !crate::is_postgres(target)
        && [target, &i.lease_path].iter().all(
            |p| matches!(p.symlink_metadata(), Err(e) if e.kind() == std::io::ErrorKind::NotFound),
        );
    if json {
        println!("{}", i.to_json());
    } else {
        print!("{}", human(&i));
    }
    if absent {
        eprintln!(
            "sidelease: {}: no such file, and no lease file ({}): a mistyped path? \
             (exit {EXIT_NO_SUCH})",
            target.display(),
            i.lease_path.display()
        );
        return ExitCode::from(EXIT_NO_SUCH);
    }
    ExitCode::from(match i.state {
        State::Free => 0,
        State::Held => 3,
        State::Split => 4,
        State::Unknown => 5,
    })
}

fn pids(p: &[u32]) -> String {
    if p.is_empty() {
        return "none".into();
    }
    p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

pub fn human(i: &Inspection) -> String {
    let mut out = format!("{}: {}\n", i.lease_path.display(), i.state.as_str());
    if crate::is_postgres(&i.lease_path) {
        if let Some(s) = &i.server {
            out += &format!(
                "  session:    backend pid {} from {} ({}), {}\n",
                s.backend_pid,
                s.client_addr
                    .as_deref()
                    .unwrap_or("a local socket or hidden"),
                s.application_name
                    .as_deref()
                    .unwrap_or("application name hidden"),
                match s.encrypted {
                    Some(true) => "encrypted (TLS)",
                    Some(false) => "not encrypted",
                    None => "encryption hidden",
                }
            );
        }
    } else {
        out += &format!("  holders:    {}\n", pids(&i.holders));
    }
    out += &format!("  record:     {}", i.record_status.as_str());
    if let Some(r) = &i.record {
        let mut parts = Vec::new();
        if let Some(pid) = r.pid {
            parts.push(format!("pid {pid}"));
        }
        if let Some(rt) = &r.runtime {
            parts.push(rt.clone());
        }
        if let Some(h) = &r.host {
            parts.push(format!("on {h}"));
        }
        if let Some(s) = &r.started_at {
            parts.push(format!("since {s}"));
        }
        if let Some(g) = r.generation {
            parts.push(format!("generation {g}"));
        }
        if let Some(rel) = &r.released_at {
            parts.push(format!("released {rel}"));
        }
        out += &format!(" ({})", parts.join(", "));
    }
    out.push('\n');
    if !i.orphans.is_empty() {
        let o: Vec<String> = i
            .orphans
            .iter()
            .map(|o| format!("pid {} holds former lease file inode {}", o.pid, o.inode))
            .collect();
        out += &format!("  orphans:    {}\n", o.join("; "));
    }
    if !i.former.is_empty() {
        // The holder's own: files it kept locked when it put the lease file
        // back (someone deleted, moved or replaced it). Not a split.
        let f: Vec<String> = i
            .former
            .iter()
            .map(|o| format!("inode {} (pid {})", o.inode, o.pid))
            .collect();
        out += &format!(
            "  former:     the holder also keeps {} it held before the lease file was put back\n",
            f.join(", ")
        );
    }
    if i.unattributed > 0 {
        out += &format!(
            "  unattributed: {} exclusive flock lock(s) on this filesystem belong to processes \
             this user may not inspect\n",
            i.unattributed
        );
    }
    if !i.unavailable.is_empty() {
        let what: Vec<String> = i
            .unavailable
            .iter()
            .map(|m| format!("{} ({})", m.as_str(), m.consequence()))
            .collect();
        out += &format!(
            "  platform:   {}, without {}\n",
            sidelease::platform::IMPLEMENTATION,
            what.join(", ")
        );
    }
    out
}
