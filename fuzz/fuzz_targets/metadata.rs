//! Caller metadata as JSON text: deep nesting, huge strings, odd numbers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidelease::record::{self, Content, Record};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(map) = record::parse_metadata(text) else {
        return;
    };
    // Accepted metadata fits in a record that reads back whole.
    let r = Record {
        schema: Some(1),
        metadata: Some(map),
        ..Record::default()
    };
    let line = r.to_line();
    assert!(
        line.len() <= record::RECORD_MAX_BYTES,
        "{} bytes",
        line.len()
    );
    match Content::parse(&line) {
        Content::Record(back) => assert_eq!(back.metadata, r.metadata),
        other => panic!("a record with accepted metadata did not parse: {other:?}"),
    }
});
