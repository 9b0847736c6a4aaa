//! The holder record (schema 1): diagnostics written inside the lease file.
//! The kernel lock is the authority; nothing here decides who holds a lease.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The record format this library writes, and the only one it reads as a
/// record (`schema` in the JSON).
pub const SCHEMA: u32 = 1;

/// Largest caller metadata accepted, serialized.
pub const METADATA_MAX_BYTES: usize = 16 * 1024;

/// Largest lease file content read back as a record; a larger file is
/// reported as unreadable rather than read without bound.
pub const RECORD_MAX_BYTES: usize = 64 * 1024;

/// One holder record. Fields the platform cannot provide are omitted, never
/// faked, so every field is optional when read back.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Record {
    /// The record format: [`SCHEMA`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<u32>,
    /// The fencing token: one more than the previous record's, so it grows
    /// with every acquisition (a PostgreSQL lease: its holder row's counter).
    /// `None` in a record not yet written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The holder's PID, in its own PID namespace (`pid_ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The holder's host name (`uname` nodename).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// When the holder acquired the lease: UTC, RFC 3339 with milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// The path the lease protects: the lease file's canonical path without
    /// its suffix (a PostgreSQL lease: its URL with the password masked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The lease file's canonical path (`None` for a PostgreSQL lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_path: Option<String>,
    /// 16 random bytes as 32 lower-case hex digits, fresh for every
    /// acquisition: tells two holders apart where PID and start time match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// The kernel's boot ID (`/proc/sys/kernel/random/boot_id`): a PID of
    /// another boot is stale. `None` where the platform has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// `/etc/machine-id`, where the system has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// The holder's PID namespace (inode of `/proc/self/ns/pid`); `None`
    /// where the platform cannot tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    /// The holder's start time, in clock ticks after boot (field 22 of
    /// `/proc/PID/stat`): with `pid` and `boot_id` it names one process, so a
    /// reused PID is not taken for the holder. `None` where the platform cannot
    /// tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_start: Option<u64>,
    /// What took the lease: `rust` unless a binding says otherwise
    /// (`python`, `node`, `c`, ...; [`crate::Options::runtime()`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The library that wrote the record: [`crate::LIBRARY`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    /// The caller's metadata ([`crate::Options::metadata()`]), as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Device and inode of the lease file this holder locked, and whether
    /// its acquisition was split-checked (see the split guard): together
    /// they let the next holder of the same inode skip `/proc/locks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u64>,
    /// The lease file's inode (see `device`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    /// Whether the acquisition was split-checked (see `device`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_checked: Option<bool>,
    /// The lease file's directory (device and inode) and its name there:
    /// what a bind mount or a rename within the directory does not change,
    /// so the split guard recognises a former lease file by them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir_device: Option<u64>,
    /// The directory's inode (see `dir_device`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir_inode: Option<u64>,
    /// The lease file's name in its directory (see `dir_device`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    /// The lease file's path as the holder spelled it (absolute), when a
    /// symlink on the way made it differ from `lease_path`: the path a
    /// service opens is what the lease protects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spelled_path: Option<String>,
    /// Whether a PostgreSQL holder's session is encrypted (TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
    /// A PostgreSQL holder's bound (`confirm_within`, milliseconds): how
    /// long it may go on believing it holds the lease once the server
    /// stopped confirming its session. A successor whose predecessor did
    /// not release waits this out before it acts (the elector does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_within_ms: Option<u64>,
    /// When the holder released the lease cleanly: UTC, RFC 3339 with
    /// milliseconds. `None` while it is held, and after a crash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
}

/// What the bytes of a lease file say.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// Nothing was ever written (a new lease file).
    Empty,
    /// A record that parses as schema 1 JSON.
    Record(Box<Record>),
    /// Bytes that are not a record: torn, corrupted or foreign.
    Unreadable,
}

impl Content {
    /// Judge raw lease file bytes. The whole content must be one JSON object
    /// (trailing whitespace allowed), so a record torn by a crash between the
    /// in-place write and the truncate is never taken as valid.
    pub fn parse(bytes: &[u8]) -> Content {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Content::Empty;
        }
        // Straight into the record type (unknown fields are ignored): going
        // through a generic JSON value first doubled the cost of a cycle.
        // serde also reads a struct from a JSON array: only objects count.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Content::Unreadable;
        }
        match serde_json::from_slice::<Record>(bytes) {
            Ok(r) if r.schema == Some(SCHEMA) => Content::Record(Box::new(r)),
            _ => Content::Unreadable,
        }
    }

    /// The record, when the content is one.
    pub fn record(&self) -> Option<&Record> {
        match self {
            Content::Record(r) => Some(r),
            _ => None,
        }
    }
}

impl Record {
    /// A new holder record of this process for `target` (a fresh nonce, no
    /// generation and no lease-file fields yet).
    pub(crate) fn of_this_process(target: String, options: &crate::Options) -> Result<Record> {
        let me = crate::platform::process::current();
        let nonce = crate::nonce::fresh_hex().map_err(|e| {
            use crate::platform::random;
            Error::io(random::CALL, std::path::Path::new(random::SOURCE), e)
        })?;
        Ok(Record {
            schema: Some(SCHEMA),
            generation: None,
            pid: Some(me.pid),
            host: me.host.clone(),
            started_at: Some(now_rfc3339()),
            target: Some(target),
            lease_path: None,
            nonce: Some(nonce),
            boot_id: me.boot_id.clone(),
            machine_id: me.machine_id.clone(),
            pid_ns: me.pid_ns,
            proc_start: me.proc_start,
            runtime: Some(options.runtime.clone().unwrap_or_else(|| "rust".into())),
            library: Some(crate::LIBRARY.into()),
            metadata: options.metadata.clone(),
            device: None,
            inode: None,
            split_checked: None,
            dir_device: None,
            dir_inode: None,
            file_name: None,
            spelled_path: None,
            encrypted: None,
            confirm_within_ms: None,
            released_at: None,
        })
    }

    /// Serialized form written to the lease file: one JSON line.
    pub fn to_line(&self) -> Vec<u8> {
        // Serializing plain strings, numbers and a JSON map cannot fail.
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// The line of this record with `released_at` added, from the line
    /// already written (`released_at` is the last field, so appending it is
    /// what serializing the whole record again would give).
    pub fn released_line(line: &[u8], released_at: &str) -> Vec<u8> {
        let body = line.strip_suffix(b"}\n").unwrap_or(line);
        let mut v = Vec::with_capacity(line.len() + 48);
        v.extend_from_slice(body);
        v.extend_from_slice(b",\"released_at\":\"");
        v.extend_from_slice(released_at.as_bytes());
        v.extend_from_slice(b"\"}\n");
        v
    }

    /// The record as one JSON object (no trailing newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The record as a JSON value (an object; fields it lacks are left out).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Record {
    /// Does this record belong to the lease file named `name` in directory
    /// `dir` (device, inode), or to one of `paths` (the lease file's
    /// canonical path and the path as spelled)? Either is enough: the
    /// directory's identity survives a bind mount or a rename of the
    /// directory's path, a path survives the directory being renamed away,
    /// replaced (by another directory or a symlink), re-created or mounted
    /// over.
    pub fn names_lease(&self, dir: (u64, u64), name: &str, paths: &[&str]) -> bool {
        let by_dir = matches!((self.dir_device, self.dir_inode, &self.file_name),
            (Some(d), Some(i), Some(n)) if (d, i) == dir && n == name);
        let named = |p: &Option<String>| p.as_deref().is_some_and(|p| paths.contains(&p));
        by_dir || named(&self.lease_path) || named(&self.spelled_path)
    }
}

/// JSON bytes (already parsed or written by serde, so UTF-8) as a string:
/// the fast check, not the lossy one (which walks byte by byte).
pub(crate) fn utf8(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `line` padded with spaces (before its newline) to at least `len` bytes,
/// so an in-place rewrite over a longer record needs no `ftruncate`: JSON
/// allows the whitespace, and the whole file still parses as one object.
pub fn padded(line: &[u8], len: usize) -> std::borrow::Cow<'_, [u8]> {
    if line.len() >= len {
        return std::borrow::Cow::Borrowed(line);
    }
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(body);
    v.resize(len - 1, b' ');
    v.push(b'\n');
    std::borrow::Cow::Owned(v)
}

/// A JSON string literal for a path. Bytes that are not UTF-8 become
/// `\udcXX` escapes (Python's `surrogateescape` convention), which
/// `json.loads` and `JSON.parse` both accept, so any path survives the trip
/// (`os.fsencode` gives the bytes back).
pub fn json_path(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    let mut rest = bytes;
    while !rest.is_empty() {
        let (good, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, &[][..]),
            Err(e) => {
                let (g, b) = rest.split_at(e.valid_up_to());
                (std::str::from_utf8(g).unwrap_or_default(), b)
            }
        };
        for c in good.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        if let Some((&b, tail)) = bad.split_first() {
            let _ = write!(out, "\\udc{b:02x}");
            rest = tail;
        } else {
            rest = bad;
        }
    }
    out.push('"');
    out
}

/// What a lease file's bytes that are not a valid record say of the last
/// generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Salvaged {
    /// The largest `"generation":N` found (a record torn by a crash keeps
    /// the new generation at its head).
    Found(u64),
    /// No generation is spelled there.
    Nothing,
    /// A generation there does not fit in 64 bits.
    TooLarge,
}

/// The largest `"generation":N` in bytes that are not a valid record, so
/// the fencing token keeps growing across a corrupted record.
pub fn salvage_generation(bytes: &[u8]) -> Salvaged {
    const KEY: &[u8] = b"\"generation\":";
    let mut best: Option<u64> = None;
    let mut i = 0;
    while let Some(pos) = bytes[i..].windows(KEY.len()).position(|w| w == KEY) {
        let start = i + pos + KEY.len();
        let digits: Vec<u8> = bytes[start..]
            .iter()
            .copied()
            .skip_while(|b| *b == b' ')
            .take_while(u8::is_ascii_digit)
            .collect();
        if !digits.is_empty() {
            let Some(n) = std::str::from_utf8(&digits)
                .ok()
                .and_then(|d| d.parse::<u64>().ok())
            else {
                return Salvaged::TooLarge;
            };
            best = Some(best.map_or(n, |b| b.max(n)));
        }
        i = start;
    }
    match best {
        Some(g) => Salvaged::Found(g),
        None => Salvaged::Nothing,
    }
}

/// Check caller metadata: a JSON object of bounded size.
pub fn validate_metadata(v: &Value) -> Result<Map<String, Value>> {
    let Value::Object(map) = v else {
        return Err(Error::invalid(
            "metadata",
            format!("must be a JSON object, got {}", json_type(v)),
        ));
    };
    let size = serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX);
    if size > METADATA_MAX_BYTES {
        return Err(Error::invalid(
            "metadata",
            format!("is {size} bytes serialized; the limit is {METADATA_MAX_BYTES}"),
        ));
    }
    Ok(map.clone())
}

/// Parse caller metadata given as JSON text (the C, Python and Node surfaces).
pub fn parse_metadata(text: &str) -> Result<Map<String, Value>> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Error::invalid("metadata", format!("is not valid JSON: {e}")))?;
    validate_metadata(&v)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Current UTC time as RFC 3339 with milliseconds (`2026-11-30T09:00:00.123Z`).
pub fn now_rfc3339() -> String {
    format_rfc3339(SystemTime::now())
}

/// `t` as UTC RFC 3339 with milliseconds, as [`now_rfc3339`] writes it
/// (times before 1970 as 1970).
pub fn format_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Milliseconds since the epoch of a timestamp as [`format_rfc3339`]
/// writes it (`2026-11-30T09:00:00.123Z`); `None` for any other text.
pub fn parse_rfc3339_millis(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let shape = b.len() == 24
        && [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
            (23, b'Z'),
        ]
        .iter()
        .all(|&(i, c)| b[i] == c);
    if !shape {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<u64> {
        let digits = &b[from..to];
        digits.iter().all(u8::is_ascii_digit).then(|| {
            digits
                .iter()
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))
        })
    };
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec, ms) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 23)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let days = days_from_civil(y as i64, m as i64, d as i64);
    let days = u64::try_from(days).ok()?;
    Some(days * 86_400_000 + h * 3_600_000 + mi * 60_000 + sec * 1000 + ms)
}

/// The inverse of [`civil_from_days`] (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = y - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// algorithm), so no date crate is needed for one timestamp format.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_parse_back_to_their_millisecond() {
        for ms in [0u64, 951_782_400_123, 1_796_000_000_999, 4_102_444_800_000] {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(parse_rfc3339_millis(&format_rfc3339(t)), Some(ms));
        }
        for bad in [
            "",
            "2026-11-30T09:00:00Z",
            "2026-13-30T09:00:00.123Z",
            "2026-11-30T09:00:00.12xZ",
            "+026-11-30T09:00:00.123Z",
        ] {
            assert_eq!(parse_rfc3339_millis(bad), None, "{bad}");
        }
    }

    #[test]
    fn timestamps_are_rfc3339_millis() {
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_796_029_200_123);
        assert_eq!(format_rfc3339(t), "2026-11-30T09:00:00.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(format_rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn content_empty_record_unreadable() {
        assert_eq!(Content::parse(b""), Content::Empty);
        assert_eq!(Content::parse(b" \n"), Content::Empty);
        assert_eq!(Content::parse(b"garbage"), Content::Unreadable);
        assert_eq!(Content::parse(b"[1,2]"), Content::Unreadable);
        assert_eq!(Content::parse(b"{\"schema\":2}"), Content::Unreadable);
        assert_eq!(
            Content::parse(b"{\"schema\":1,\"pid\":\"x\"}"),
            Content::Unreadable
        );
        let r = Content::parse(b"{\"schema\":1,\"pid\":42,\"extra\":true}\n");
        assert_eq!(r.record().and_then(|r| r.pid), Some(42));
    }

    #[test]
    fn torn_record_is_unreadable() {
        let old = Record {
            schema: Some(1),
            pid: Some(1),
            host: Some("a-much-longer-host-name".into()),
            ..Default::default()
        };
        let new = Record {
            schema: Some(1),
            pid: Some(2),
            ..Default::default()
        };
        let mut bytes = old.to_line();
        let line = new.to_line();
        bytes[..line.len()].copy_from_slice(&line);
        assert_eq!(Content::parse(&bytes), Content::Unreadable);
        bytes.truncate(line.len());
        assert_eq!(Content::parse(&bytes), Content::Record(Box::new(new)));
    }

    #[test]
    fn metadata_must_be_a_bounded_object() {
        assert!(parse_metadata("{\"app\":\"x\",\"port\":8000}").is_ok());
        for bad in ["[1]", "3", "null", "{", "\"s\""] {
            let e = parse_metadata(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidArgument {
                        argument: "metadata",
                        ..
                    }
                ),
                "{bad}"
            );
        }
        let big = format!("{{\"k\":\"{}\"}}", "x".repeat(METADATA_MAX_BYTES));
        assert!(parse_metadata(&big)
            .unwrap_err()
            .to_string()
            .contains("limit"));
    }

    #[test]
    fn released_line_equals_serializing_again() {
        let mut r = Record {
            schema: Some(1),
            pid: Some(7),
            metadata: Some(serde_json::from_str("{\"a\":[1,{\"b\":\"}\"}]}").unwrap()),
            ..Default::default()
        };
        let line = r.to_line();
        r.released_at = Some("2026-11-30T09:00:00.000Z".into());
        assert_eq!(
            Record::released_line(&line, "2026-11-30T09:00:00.000Z"),
            r.to_line()
        );
    }

    #[test]
    fn padding_keeps_one_object() {
        let line = b"{\"schema\":1}\n";
        let p = padded(line, 40);
        assert_eq!(p.len(), 40);
        assert!(matches!(Content::parse(&p), Content::Record(_)));
        assert_eq!(&*padded(line, 3), &line[..]);
    }

    /// Found by the `metadata` fuzz target: without serde_json's exact
    /// float parsing, these read back one unit in the last place off.
    #[test]
    fn metadata_numbers_read_back_as_written() {
        for text in [
            r#"{"a":1e308,"b":-0.4862315771769313486231577e302}"#,
            r#"{"b":-0.0,"c":18446744073709551616,"d":1.79769313486231574309}"#,
        ] {
            let r = Record {
                schema: Some(SCHEMA),
                metadata: Some(parse_metadata(text).unwrap()),
                ..Record::default()
            };
            match Content::parse(&r.to_line()) {
                Content::Record(back) => assert_eq!(back.metadata, r.metadata, "{text}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn paths_survive_as_json() {
        assert_eq!(json_path(b"/a/b\"c"), "\"/a/b\\\"c\"");
        assert_eq!(json_path(b"/x/\xff\xfe.db"), "\"/x/\\udcff\\udcfe.db\"");
        assert_eq!(json_path(b"/\xc3\xa9\n"), "\"/\u{e9}\\u000a\"");
        let v: Value = serde_json::from_str(&json_path("/ok/ü".as_bytes())).unwrap();
        assert_eq!(v, Value::String("/ok/ü".into()));
    }

    #[test]
    fn records_name_their_lease() {
        let r = Record {
            dir_device: Some(1),
            dir_inode: Some(2),
            file_name: Some("app.db.backend-lease".into()),
            lease_path: Some("/elsewhere".into()),
            ..Default::default()
        };
        // The directory's identity (a bind mount, a renamed path)...
        assert!(r.names_lease(
            (1, 2),
            "app.db.backend-lease",
            &["/srv/app.db.backend-lease"]
        ));
        // ...or the path (the directory renamed away, replaced, re-created
        // or mounted over: another directory at the same path).
        assert!(r.names_lease((1, 3), "app.db.backend-lease", &["/elsewhere"]));
        assert!(!r.names_lease(
            (1, 3),
            "app.db.backend-lease",
            &["/srv/app.db.backend-lease"]
        ));
        assert!(!r.names_lease(
            (1, 2),
            "other.db.backend-lease",
            &["/srv/other.db.backend-lease"]
        ));
        // The path as a holder spelled it through a symlink since replaced.
        let spelled = Record {
            lease_path: Some("/srv/r1/db.backend-lease".into()),
            spelled_path: Some("/srv/current/db.backend-lease".into()),
            ..Default::default()
        };
        assert!(spelled.names_lease(
            (9, 9),
            "db.backend-lease",
            &["/srv/r2/db.backend-lease", "/srv/current/db.backend-lease"]
        ));
        let old = Record {
            lease_path: Some("/srv/x".into()),
            ..Default::default()
        };
        assert!(old.names_lease((0, 0), "", &["/srv/x"]));
    }

    #[test]
    fn record_round_trips_and_omits_missing_fields() {
        let r = Record {
            schema: Some(1),
            generation: Some(3),
            pid: Some(7),
            ..Default::default()
        };
        let text = r.to_json();
        assert_eq!(text, "{\"schema\":1,\"generation\":3,\"pid\":7}");
        assert_eq!(
            Content::parse(text.as_bytes()),
            Content::Record(Box::new(r))
        );
    }
}
