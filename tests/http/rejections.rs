//! Rejections over a real TCP server: bad keys, the request body limit, store
//! failures, full scopes and stores, and the problem+json shape, plus a custom renderer.

use crate::support;

use axum::extract::Request;
use axum::middleware::{self, Next};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::http::{
    Chunks, FailingBody, RequestExt, SpyStore, TestServer, Work, bounded, eventually, send,
    server_with,
};
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::http::{RejectionKind, RequestBody};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal};

const BODY: &str = r#"{"item":"book"}"#;

// ---------------------------------------------------------------------------------------------
// Bad keys: 400 key_invalid, nothing stored, and the same request with a good key runs
// ---------------------------------------------------------------------------------------------

/// Sends `values` as `Idempotency-Key` header lines; expects 400 `key_invalid` whose detail
/// mentions `reason`, no store call and no handler run; then the same request with a valid key
/// runs normally.
async fn assert_key_refused(values: &[HeaderValue], reason: &str) {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    let mut rb = server.post("/work", BODY).principal("alice");
    for v in values {
        rb = rb.header("idempotency-key", v.clone());
    }
    let a = send(rb).await;
    a.assert_problem(400, "idempotency.key_invalid");
    let detail = a.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.contains(reason),
        "the detail says why ({reason:?}): {detail:?}"
    );
    assert!(
        a.header("retry-after").is_none(),
        "a bad key is not retryable"
    );
    assert_eq!(
        work.executions(),
        0,
        "the handler did not run for {values:?}"
    );
    assert_eq!(store.claims(), 0, "nothing was stored for {values:?}");

    let ok = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key("valid-key"),
    )
    .await;
    assert_eq!(
        ok.status,
        201,
        "the same request with a valid key: {}",
        ok.describe()
    );
    assert!(!ok.is_replay(), "and it runs normally");
    assert_eq!(work.executions(), 1);
    assert_eq!(store.claims(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_key_is_400_key_invalid_and_nothing_is_stored() {
    assert_key_refused(&[HeaderValue::from_static("")], "empty").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_quoted_key_is_400_key_invalid_and_nothing_is_stored() {
    assert_key_refused(&[HeaderValue::from_static("\"\"")], "empty").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_of_256_bytes_is_400_key_invalid_and_nothing_is_stored() {
    let long = HeaderValue::from_str(&"a".repeat(256)).expect("visible ASCII");
    assert_key_refused(&[long], "longer than 255 bytes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_of_255_bytes_is_accepted() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let key = "a".repeat(255);
    let first = send(server.post("/work", BODY).principal("alice").key(&key)).await;
    let second = send(server.post("/work", BODY).principal("alice").key(&key)).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(second.is_replay(), "{}", second.describe());
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_longer_than_a_configured_max_key_len_is_400() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone()).max_key_len(8);
    let (server, work) = server_with(layer).await;
    let a = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key("123456789"),
    )
    .await;
    a.assert_problem(400, "idempotency.key_invalid");
    let ok = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key("12345678"),
    )
    .await;
    assert_eq!(ok.status, 201, "{}", ok.describe());
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_with_a_control_byte_is_400_key_invalid_and_nothing_is_stored() {
    // HTAB is the one control byte HTTP/1.1 carries inside a field value (hyper refuses the
    // others before any middleware sees them).
    let tab = HeaderValue::from_bytes(b"ab\tcd").expect("HTAB is a valid field byte");
    assert_key_refused(&[tab], "control character").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_from_identify_with_a_control_byte_is_400_key_invalid() {
    let store = SpyStore::new();
    // The closure turns `x-key: k` into `k\u{1}`: a control byte no header could carry.
    let layer = IdempotencyLayer::new(store.clone()).identify(|parts| {
        parts
            .headers
            .get("x-key")
            .and_then(|v| v.to_str().ok())
            .map(|k| format!("{k}\u{1}"))
    });
    let (server, work) = server_with(layer).await;
    let a = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .header("x-key", "k"),
    )
    .await;
    a.assert_problem(400, "idempotency.key_invalid");
    assert_eq!(work.executions(), 0);
    assert_eq!(store.claims(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_ascii_key_is_400_key_invalid_and_nothing_is_stored() {
    let raw = HeaderValue::from_bytes("clé-1".as_bytes()).expect("obs-text is a valid field byte");
    assert_key_refused(&[raw], "non-ASCII").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_ascii_quoted_key_is_400_key_invalid_and_nothing_is_stored() {
    let raw =
        HeaderValue::from_bytes("\"clé\"".as_bytes()).expect("obs-text is a valid field byte");
    assert_key_refused(&[raw], "non-ASCII").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_key_header_lines_are_400_key_invalid_even_when_equal() {
    let line = HeaderValue::from_static("k1");
    assert_key_refused(&[line.clone(), line], "exactly once").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_of_keys_is_400_key_invalid_and_nothing_is_stored() {
    assert_key_refused(&[HeaderValue::from_static(r#""a", "b""#)], "not a list").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_quoted_string_key_is_400_key_invalid_and_nothing_is_stored() {
    assert_key_refused(&[HeaderValue::from_static("\"abc")], "quoted string").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_key_with_an_inner_space_is_400_key_invalid() {
    assert_key_refused(&[HeaderValue::from_static("a b")], "space").await;
}

// ---------------------------------------------------------------------------------------------
// Request body limit: 413
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_the_limit_with_content_length_is_413_and_the_handler_does_not_run() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone()).max_request_body(16);
    let (server, work) = server_with(layer).await;
    let body = "x".repeat(17);
    let a = send(server.post("/work", &body).principal("alice").key("big")).await;
    a.assert_problem(413, "idempotency.body_too_large");
    assert_eq!(work.executions(), 0, "the handler did not run");
    assert_eq!(
        store.claims(),
        0,
        "a declared length over the limit is refused before a claim"
    );

    let fits = send(
        server
            .post("/work", &body[..16])
            .principal("alice")
            .key("small"),
    )
    .await;
    assert_eq!(fits.status, 201, "16 bytes fit: {}", fits.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_without_content_length_is_413_and_the_handler_does_not_run() {
    let store = SpyStore::new();
    let work = Work::new();
    let layer = IdempotencyLayer::new(store.clone()).max_request_body(16);
    // Records what the server saw, to prove the body had no Content-Length.
    let chunked = Arc::new(AtomicBool::new(false));
    let saw = Arc::clone(&chunked);
    let app = work
        .app(layer)
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let saw = Arc::clone(&saw);
            async move {
                let is_chunked = req.headers().get("transfer-encoding").is_some()
                    && req.headers().get("content-length").is_none();
                saw.store(is_chunked, Ordering::SeqCst);
                next.run(req).await
            }
        }));
    let server = TestServer::start(app).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Chunks>();
    let req = hyper::Request::post(server.url("/work"))
        .header("content-type", "application/json")
        .header("x-principal", "alice")
        .header("idempotency-key", "big-chunked")
        .body(Chunks::new(
            (0..4).map(|_| Bytes::from_static(b"0123456789")),
        ))
        .expect("request");
    let res = bounded(
        Duration::from_secs(10),
        "the chunked request",
        client.request(req),
    )
    .await
    .expect("the chunked request reaches the server");
    assert!(
        chunked.load(Ordering::SeqCst),
        "the request was sent chunked, without Content-Length"
    );
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).expect("problem json");
    assert_eq!(json["code"], "idempotency.body_too_large");
    assert_eq!(work.executions(), 0, "the handler did not run");
    assert_eq!(store.claims(), 0, "nothing was claimed");
}

#[tokio::test]
async fn request_body_that_fails_while_read_is_400_body_unreadable() {
    let ran = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&ran);
    let svc = IdempotencyLayer::default().layer(service_fn(
        move |_req: http::Request<RequestBody<FailingBody>>| {
            seen.store(true, Ordering::SeqCst);
            async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
            }
        },
    ));
    let req = http::Request::post("/work")
        .header("idempotency-key", "k")
        .extension(Principal::new("alice"))
        .body(FailingBody::new())
        .expect("request");
    let res = svc.oneshot(req).await.expect("the layer answers");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let rejection = res
        .extensions()
        .get::<tower_idempotency::http::Rejection>()
        .expect("the rejection is in the extensions");
    assert_eq!(rejection.kind(), RejectionKind::BodyUnreadable);
    assert_eq!(rejection.kind().code(), "idempotency.body_unreadable");
    assert!(!ran.load(Ordering::SeqCst), "the handler did not run");
}

// ---------------------------------------------------------------------------------------------
// Store failures and full stores
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failure_on_claim_is_503_store_failed_with_retry_after_and_the_handler_does_not_run()
{
    let store = SpyStore::new();
    store.fail_claims(true);
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    let a = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    a.assert_problem(503, "idempotency.store_failed");
    assert_eq!(a.header("retry-after"), Some("1"), "503 says when to retry");
    assert_eq!(
        work.executions(),
        0,
        "the handler never runs on an unclear answer"
    );
    assert_eq!(store.claims(), 1);

    store.fail_claims(false);
    let retry = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    assert_eq!(
        retry.status,
        201,
        "the retry runs once the store is back: {}",
        retry.describe()
    );
    assert!(!retry.is_replay());
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_with_all_its_records_pending_at_its_cap_is_429_scope_full_while_others_claim() {
    let memory = MemoryStore::builder()
        .max_entries_per_scope(2)
        .build()
        .expect("valid bounds");
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::over(memory))).await;
    let slow = |key: &str| {
        tokio::spawn(send(
            server
                .post("/work", BODY)
                .principal("alice")
                .key(key)
                .delay_ms(1_000),
        ))
    };
    let first = slow("k1");
    let second = slow("k2");
    assert!(
        eventually(Duration::from_secs(5), || work.executions() == 2).await,
        "alice's two slow requests reached the handler"
    );
    let third = send(server.post("/work", BODY).principal("alice").key("k3")).await;
    third.assert_problem(429, "idempotency.scope_full");
    assert_eq!(
        third.header("retry-after"),
        Some("1"),
        "429 says when to retry"
    );

    let bob = send(server.post("/work", BODY).principal("bob").key("k1")).await;
    assert_eq!(
        bob.status,
        201,
        "another scope still claims: {}",
        bob.describe()
    );
    assert!(!bob.is_replay());
    assert_eq!(work.executions(), 3, "alice's third request did not run");

    for t in [first, second] {
        let a = bounded(Duration::from_secs(10), "a slow request", t)
            .await
            .expect("the slow request task");
        assert_eq!(a.status, 201, "{}", a.describe());
    }
    // Once alice's records are completed, her scope makes room from her oldest completed one.
    let later = send(server.post("/work", BODY).principal("alice").key("k3")).await;
    assert_eq!(later.status, 201, "{}", later.describe());
    assert!(!later.is_replay());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_full_of_pending_records_is_503_store_full() {
    let memory = MemoryStore::builder()
        .max_entries(2)
        .shards(1)
        .build()
        .expect("valid bounds");
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::over(memory))).await;
    let slow = |principal: &str| {
        tokio::spawn(send(
            server
                .post("/work", BODY)
                .principal(principal)
                .key("k1")
                .delay_ms(1_000),
        ))
    };
    let first = slow("alice");
    let second = slow("bob");
    assert!(
        eventually(Duration::from_secs(5), || work.executions() == 2).await,
        "both slow requests reached the handler"
    );
    let third = send(server.post("/work", BODY).principal("carol").key("k1")).await;
    third.assert_problem(503, "idempotency.store_full");
    assert_eq!(
        third.header("retry-after"),
        Some("1"),
        "503 says when to retry"
    );
    assert_eq!(work.executions(), 2, "carol's request did not run");

    for t in [first, second] {
        let a = bounded(Duration::from_secs(10), "a slow request", t)
            .await
            .expect("the slow request task");
        assert_eq!(a.status, 201, "{}", a.describe());
    }
    // With completed records to drop, the store makes room again.
    let later = send(server.post("/work", BODY).principal("carol").key("k1")).await;
    assert_eq!(later.status, 201, "{}", later.describe());
}

// ---------------------------------------------------------------------------------------------
// The shape of a rejection
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_is_problem_json_with_no_store_and_a_stable_code() {
    let (server, _work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let a = send(server.post("/work", BODY).principal("alice")).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert_eq!(a.header("cache-control"), Some("no-store"));
    assert!(a.header("retry-after").is_none(), "400 has no Retry-After");
    let json = a.json();
    assert_eq!(json["status"], 400, "{json}");
    assert_eq!(json["code"], "idempotency.key_missing", "{json}");
    assert_eq!(
        json["type"],
        "https://docs.rs/tower-idempotency/latest/tower_idempotency/http/enum.RejectionKind.html#variant.KeyMissing",
        "the problem type names the case: {json}"
    );
    assert_eq!(
        json["title"],
        RejectionKind::KeyMissing.title(),
        "the title is the kind's title: {json}"
    );
    assert!(
        json["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "a detail sentence: {json}"
    );
    assert!(
        a.header("set-cookie").is_none(),
        "nothing of the handler leaks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rejection_kind_has_its_documented_status_and_code() {
    let table = [
        (RejectionKind::KeyMissing, 400, "idempotency.key_missing"),
        (RejectionKind::KeyInvalid, 400, "idempotency.key_invalid"),
        (
            RejectionKind::PrincipalMissing,
            401,
            "idempotency.principal_missing",
        ),
        (RejectionKind::InFlight, 409, "idempotency.in_flight"),
        (RejectionKind::KeyReused, 422, "idempotency.key_reused"),
        (
            RejectionKind::BodyTooLarge,
            413,
            "idempotency.body_too_large",
        ),
        (
            RejectionKind::BodyUnreadable,
            400,
            "idempotency.body_unreadable",
        ),
        (RejectionKind::Store, 503, "idempotency.store_failed"),
        (RejectionKind::ScopeFull, 429, "idempotency.scope_full"),
        (RejectionKind::StoreFull, 503, "idempotency.store_full"),
        (
            RejectionKind::RecordInvalid,
            503,
            "idempotency.record_invalid",
        ),
    ];
    for (kind, status, code) in table {
        assert_eq!(kind.status().as_u16(), status, "{kind:?}");
        assert_eq!(kind.code(), code, "{kind:?}");
    }
}

fn custom_renderer(r: &tower_idempotency::http::Rejection) -> http::Response<Bytes> {
    http::Response::builder()
        .status(r.status())
        .header("content-type", "text/plain")
        .header("x-custom", "yes")
        .body(Bytes::from(format!("custom: {}", r.kind().code())))
        .expect("a custom rejection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_renderer_is_used_for_rejections() {
    let layer = IdempotencyLayer::new(SpyStore::new()).render_rejection(custom_renderer);
    let (server, work) = server_with(layer).await;
    let a = send(server.post("/work", BODY).principal("alice")).await;
    assert_eq!(a.status, 400, "{}", a.describe());
    assert_eq!(a.header("content-type"), Some("text/plain"));
    assert_eq!(a.header("x-custom"), Some("yes"));
    assert_eq!(&a.body[..], b"custom: idempotency.key_missing");
    assert_eq!(work.executions(), 0);

    // Handler responses are not touched by the renderer.
    let ok = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    assert_eq!(ok.status, 201);
    assert!(ok.header("x-custom").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_problem_type_of_your_own_is_sent_through_render_rejection() {
    let layer = IdempotencyLayer::new(SpyStore::new()).render_rejection(|r| {
        let case = r.code().trim_start_matches("idempotency.");
        r.clone()
            .with_problem_type(format!("https://api.example.com/problems/{case}"))
            .to_problem_response()
    });
    let (server, work) = server_with(layer).await;
    let a = send(server.post("/work", BODY).principal("alice")).await;
    assert_eq!(a.status, 400, "{}", a.describe());
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let json = a.json();
    assert_eq!(
        json["type"], "https://api.example.com/problems/key_missing",
        "{json}"
    );
    assert_eq!(json["code"], "idempotency.key_missing", "{json}");
    assert_eq!(work.executions(), 0);
}

async fn rejection_via_oneshot<St: tower_idempotency::Store>(
    layer: &IdempotencyLayer<St>,
) -> http::Response<tower_idempotency::http::ResponseBody<Full<Bytes>>> {
    let svc = layer.layer(service_fn(
        |_req: http::Request<RequestBody<Full<Bytes>>>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
        },
    ));
    // A key but no principal: 401.
    let req = http::Request::post("/work")
        .header("idempotency-key", "k")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    svc.oneshot(req).await.expect("the layer answers")
}

#[tokio::test]
async fn rejection_is_in_the_response_extensions_with_the_default_renderer() {
    let res = rejection_via_oneshot(&IdempotencyLayer::default()).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let r = res
        .extensions()
        .get::<tower_idempotency::http::Rejection>()
        .expect("the rejection is in the extensions");
    assert_eq!(r.kind(), RejectionKind::PrincipalMissing);
}

#[tokio::test]
async fn rejection_is_in_the_response_extensions_with_a_custom_renderer() {
    let res =
        rejection_via_oneshot(&IdempotencyLayer::default().render_rejection(custom_renderer)).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        res.headers().get("x-custom").map(HeaderValue::as_bytes),
        Some(&b"yes"[..]),
        "the custom renderer made the response"
    );
    let r = res
        .extensions()
        .get::<tower_idempotency::http::Rejection>()
        .expect("the rejection is in the extensions");
    assert_eq!(r.kind(), RejectionKind::PrincipalMissing);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"custom: idempotency.principal_missing");
}
