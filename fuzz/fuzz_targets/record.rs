//! The lease file's bytes, whatever they are: the record parser, the
//! generation salvaged from a torn record, and the JSON spelling of paths.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidelease::record::{self, Content, Record};

fuzz_target!(|data: &[u8]| {
    match Content::parse(data) {
        Content::Record(r) => {
            // What sidelease writes back must read back the same.
            let line = r.to_line();
            match Content::parse(&line) {
                Content::Record(again) => assert_eq!(*again, *r),
                other => panic!("a record did not survive its own line: {other:?}"),
            }
            let padded = record::padded(&line, line.len() + 64);
            assert!(matches!(Content::parse(&padded), Content::Record(_)));
            if r.released_at.is_none() {
                let ts = "2026-12-01T00:00:00.000Z";
                match Content::parse(&Record::released_line(&line, ts)) {
                    Content::Record(rel) => assert_eq!(rel.released_at.as_deref(), Some(ts)),
                    other => panic!("the released line did not parse: {other:?}"),
                }
            }
        }
        Content::Empty => assert!(data.iter().all(u8::is_ascii_whitespace)),
        Content::Unreadable => {}
    }
    // Never a panic, and never less than a generation spelled plainly there.
    if let record::Salvaged::Found(g) = record::salvage_generation(data) {
        // (JSON digits only: `+1` or `1e3` is no generation anyone wrote.)
        let plain = std::str::from_utf8(data)
            .ok()
            .and_then(|s| s.strip_prefix("\"generation\":"))
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(p) = plain {
            assert!(g >= p, "salvaged {g} from bytes saying {p}");
        }
    }
    // Any path bytes become one JSON string: exactly the path when it is
    // UTF-8; otherwise with `\udcXX` escapes for the other bytes (Python's
    // surrogateescape, which json.loads and JSON.parse accept and serde_json
    // refuses, so it reads them here as `\u00XX`).
    let lit = record::json_path(data);
    match std::str::from_utf8(data) {
        Ok(s) => {
            let back: String = serde_json::from_str(&lit).expect("json_path output is JSON");
            assert_eq!(back, s);
        }
        Err(_) => {
            serde_json::from_str::<String>(&lit.replace("\\udc", "\\u00"))
                .expect("json_path output is one JSON string");
        }
    }
});
