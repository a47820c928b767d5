//! The key parser never panics, and an accepted key obeys the key rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_idempotency::IdempotencyKey;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = IdempotencyKey::parse_header(data) {
        let k = key.as_str();
        assert!(!k.is_empty() && k.len() <= 255);
        assert!(k.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        // Whatever was accepted validates again as a key on its own.
        assert!(IdempotencyKey::new(k).is_ok());
    }
});
