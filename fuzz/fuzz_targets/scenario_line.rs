//! Any bytes, read as a scenario: the reader and the record parser must
//! answer (a record or a bad line), never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::replay::scenario::{parse_record, ScenarioReader};

fuzz_target!(|data: &[u8]| {
    let mut reader = ScenarioReader::new(data);
    while let Some(line) = reader.next_line() {
        match line {
            Ok((_, text)) => {
                let _ = parse_record(&text);
            }
            Err(_) => break,
        }
    }
});
