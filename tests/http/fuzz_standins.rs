//! Bounded proptest stand-ins for the cargo-fuzz targets in `fuzz/`, so CI exercises the same
//! properties on stable Rust: the key parser, the record decoder and the request-to-fingerprint
//! path never panic, and what they accept is valid.

use bytes::Bytes;
use proptest::prelude::*;
use std::convert::Infallible;
use tower::{Layer, ServiceExt};
use tower_idempotency::store::Record;
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

    #[test]
    fn record_decoder_never_panics_on_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(response) = Record::from_bytes(Bytes::from(data)).decode(64 * 1024) {
            let again = response.encode().expect("a decoded record re-encodes");
            prop_assert_eq!(again.decode(64 * 1024).expect("re-decodes"), response);
        }
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

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("idempotency-key".to_owned()),
        1 => Just("content-type".to_owned()),
        1 => Just("content-length".to_owned()),
        1 => "[a-z-]{1,12}",
    ]
}
