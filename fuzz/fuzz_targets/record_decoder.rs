//! The record decoder never panics on arbitrary bytes, and whatever it accepts re-encodes to a
//! record that decodes to the same response.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_idempotency::store::Record;

fuzz_target!(|data: &[u8]| {
    let record = Record::from_bytes(bytes::Bytes::copy_from_slice(data));
    if let Ok(response) = record.decode(64 * 1024) {
        let again = response.encode().expect("a decoded record re-encodes");
        assert_eq!(again.decode(64 * 1024).expect("re-decodes"), response);
    }
});
