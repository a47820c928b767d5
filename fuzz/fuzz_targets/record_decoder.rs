//! The record decoder never panics, and whatever it accepts re-encodes to the same bytes and
//! decodes to the same response. Most inputs are turned into a valid record, then damaged, so
//! the fuzzer reaches every field rather than stopping at the magic; an input whose first byte
//! is odd is decoded as it is.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/support/record_cases.rs"]
mod record_cases;

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((mode, rest)) if mode % 2 == 1 => {
            let _ = record_cases::check(rest);
        }
        _ => {
            let _ = record_cases::check(&record_cases::case(data));
        }
    }
});
