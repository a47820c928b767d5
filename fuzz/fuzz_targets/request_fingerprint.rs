//! Arbitrary request heads and bodies through the layer (key, principal, fingerprint, claim,
//! replay): never a panic, and a rejection never reaches the handler.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::convert::Infallible;
use tower::{Layer, ServiceExt};
use tower_idempotency::{IdempotencyLayer, Principal};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let (head, body) = rest.split_at((split as usize).min(rest.len()));
    let mut builder = http::Request::post("/orders");
    for line in head.split(|b| *b == b'\n') {
        if let Some(pos) = line.iter().position(|b| *b == b':') {
            let (name, value) = (&line[..pos], &line[pos + 1..]);
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                builder = builder.header(n, v);
            }
        }
    }
    let Ok(mut req) = builder.body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(body))) else {
        return;
    };
    req.extensions_mut().insert(Principal::new("fuzz"));
    let svc = IdempotencyLayer::default().max_request_body(512).layer(tower::service_fn(|_req| async {
        Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(b"ok"))))
    }));
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let res = rt.block_on(svc.oneshot(req)).expect("infallible");
    assert!(res.status().as_u16() >= 200);
});
