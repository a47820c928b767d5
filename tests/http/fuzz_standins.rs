//! Bounded proptest stand-ins for the cargo-fuzz targets in `fuzz/`, so CI exercises the same
//! properties on stable Rust: the key parser, the record decoder and the request-to-fingerprint
//! path never panic, and what they accept is valid.

#[path = "../support/record_cases.rs"]
mod record_cases;

use bytes::Bytes;
use proptest::prelude::*;
use std::convert::Infallible;
use tower::{Layer, ServiceExt};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Principal};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2_000,
        ..ProptestConfig::default()
    }
}

/// Header-ish bytes: mostly printable, with quotes, commas, escapes and the odd control byte.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            8 => 0x20u8..0x7f,
            2 => prop::sample::select(vec![b'"', b'\\', b',', b';', b'=', b' ', b'\t']),
            1 => any::<u8>(),
        ],
        0..300,
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn key_parser_never_panics_and_accepts_only_valid_keys(data in header_bytes()) {
        if let Ok(key) = IdempotencyKey::parse_header(&data) {
            let k = key.as_str();
            prop_assert!(!k.is_empty() && k.len() <= 255);
            prop_assert!(k.bytes().all(|b| (0x20..=0x7e).contains(&b)), "key {:?}", k);
            prop_assert!(IdempotencyKey::new(k).is_ok());
        }
    }

    #[test]
    fn quoted_and_bare_forms_agree(key in "[A-Za-z0-9_.:/+-]{1,64}") {
        let bare = IdempotencyKey::parse_header(key.as_bytes()).unwrap();
        let quoted = IdempotencyKey::parse_header(format!("\"{key}\"").as_bytes()).unwrap();
        prop_assert_eq!(bare, quoted);
    }

}

proptest! {
    // Each case builds a runtime and a layer: fewer cases keep the suite fast.
    #![proptest_config(ProptestConfig { cases: 500, ..config() })]

    #[test]
    fn arbitrary_requests_through_the_layer_never_panic(
        head in prop::collection::vec((header_name(), header_bytes()), 0..6),
        body in prop::collection::vec(any::<u8>(), 0..700),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let mut builder = http::Request::post("/orders");
        for (name, value) in &head {
            if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(name.as_bytes()), http::HeaderValue::from_bytes(value)) {
                builder = builder.header(n, v);
            }
        }
        let mut req = builder.body(http_body_util::Full::new(Bytes::from(body))).unwrap();
        req.extensions_mut().insert(Principal::new("fuzz"));
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ran2 = ran.clone();
        let svc = IdempotencyLayer::default().max_request_body(512).layer(tower::service_fn(move |_req| {
            ran2.store(true, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(Bytes::from_static(b"ok")))) }
        }));
        let res = rt.block_on(svc.oneshot(req)).unwrap();
        let rejected = res.extensions().get::<tower_idempotency::http::Rejection>().is_some();
        prop_assert!(!(rejected && ran.load(std::sync::atomic::Ordering::SeqCst)), "a rejected request reached the handler");
        prop_assert!(rejected || res.status() == 200, "status {}", res.status());
    }
}

/// The decoder on damaged valid records (the cases of the `record_decoder` fuzz target): no
/// panic, what decodes re-encodes to the same bytes, and the cases reach past the magic and the
/// header, and each of the decoder's refusals.
#[test]
fn record_decoder_reaches_every_field_of_damaged_records() {
    use proptest::test_runner::{Config, TestRunner};
    use record_cases::Reach;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    const CASES: u32 = 4_000;
    #[derive(Debug, Default)]
    struct Tally {
        cases: u32,
        past_magic: u32,
        past_header: u32,
        decoded: u32,
        refusals: BTreeMap<&'static str, u32>,
    }
    let tally = RefCell::new(Tally::default());
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(any::<u8>(), 64..512), |data| {
            let input = record_cases::case(&data);
            let mut t = tally.borrow_mut();
            t.cases += 1;
            let reach = record_cases::reach(&input);
            t.past_magic += u32::from(reach != Reach::Magic);
            t.past_header += u32::from(reach == Reach::Fields);
            match record_cases::check(&input) {
                Ok(()) => t.decoded += 1,
                Err(reason) => *t.refusals.entry(reason).or_default() += 1,
            }
            Ok(())
        })
        .unwrap();
    let t = tally.into_inner();
    eprintln!("record decoder: {t:?}");
    assert_eq!(t.cases, CASES);
    assert!(t.past_magic * 100 >= CASES * 94, "past the magic: {t:?}");
    assert!(t.past_header * 100 >= CASES * 90, "past the header: {t:?}");
    assert!(
        t.decoded * 100 >= CASES * 15,
        "decoded and re-encoded: {t:?}"
    );
    for reason in [
        "truncated record",
        "bad magic",
        "unknown record version",
        "unknown record flags",
        "status out of range",
        "invalid field",
        "body over the record limit",
        "body in a status-only record",
        "kept until before written",
        "trailing bytes",
        "record is encrypted; only its secret opens it",
    ] {
        assert!(
            t.refusals.contains_key(reason),
            "refusal {reason:?} never reached: {t:?}"
        );
    }
    assert_eq!(t.refusals.len(), 11, "a refusal not listed above: {t:?}");
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("idempotency-key".to_owned()),
        1 => Just("content-type".to_owned()),
        1 => Just("content-length".to_owned()),
        1 => "[a-z-]{1,12}",
    ]
}
