//! Hostile and broken input over a real TCP server (axum on 127.0.0.1:0, raw HTTP/1.1 bytes
//! where a client library would refuse to send them). Each case must end in a clear 4xx or 5xx
//! (or, for a response quirk, a byte-exact replay), with nothing stored and no panic; a valid
//! retry then runs normally.
//!
//! Bad keys sent through reqwest (one value each) are covered in `tests/http/rejections.rs`;
//! this file sends what reqwest cannot: raw non-ASCII and control bytes, obs-fold, 10 KiB
//! keys, mixed-case repeated lines, lying `Content-Length`s and broken chunked bodies.
//! Tampered records in the store are in `tests/store/hostile_records.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{http as support_http, raw_http};

use axum::response::IntoResponse;
use bytes::Bytes;
use http_body_util::Full;
use raw_http::{BODY, Raw, keyed, post};
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use support_http::{
    LAYER_NS, OBS_TEXT, TestServer, Work, memory_app, store_key, with_auth, work_fingerprint,
};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::http::{Rejection, RejectionKind, RequestBody};
use tower_idempotency::store::Claim;
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal, Store};

async fn app_with(
    layer: impl Fn(Arc<MemoryStore>) -> IdempotencyLayer<Arc<MemoryStore>>,
) -> (TestServer, Work, Arc<MemoryStore>) {
    let work = Work::plain();
    let (server, store) = memory_app(&work, layer).await;
    (server, work, store)
}

async fn app() -> (TestServer, Work, Arc<MemoryStore>) {
    app_with(IdempotencyLayer::new).await
}

/// A valid request by alice with `key`, which must run (201, not a replay).
async fn assert_valid_request_runs(server: &TestServer, key: &str) -> Raw {
    let a = server
        .one(&post("/work", &keyed("alice", key.as_bytes()), BODY))
        .await;
    assert_eq!(a.status, 201, "a valid request runs: {}", a.describe());
    assert!(!a.is_replay(), "and is not a replay");
    a
}

// ---------------------------------------------------------------------------------------------
// Keys the client libraries would not send
// ---------------------------------------------------------------------------------------------

/// Raw header blocks that must each be refused with 400 before anything is stored.
fn hostile_key_headers() -> Vec<(&'static str, Vec<u8>)> {
    let line = |v: &[u8]| [b"idempotency-key: ", v, b"\r\n"].concat();
    let long = vec![b'a'; 10 * 1024];
    vec![
        ("empty", line(b"")),
        ("only spaces", line(b"   ")),
        ("empty quoted", line(b"\"\"")),
        ("10 KiB bare", line(&long)),
        ("10 KiB quoted", line(&[&b"\""[..], &long, b"\""].concat())),
        ("NUL byte", line(b"a\0b")),
        ("control byte 0x01", line(b"a\x01b")),
        ("escape byte 0x1b", line(b"a\x1b[31mb")),
        ("DEL byte 0x7f", line(b"a\x7fb")),
        ("tab inside a bare key", line(b"a\tb")),
        ("bare CR inside", line(b"a\rb")),
        ("UTF-8 bytes", line("clé-1".as_bytes())),
        ("Latin-1 byte 0xe9", line(b"cl\xe9")),
        ("bytes 0xff 0xfe", line(b"\xff\xfe")),
        ("quoted UTF-8", line("\"clé\"".as_bytes())),
        ("two lines", [line(b"k1"), line(b"k1")].concat()),
        (
            "two lines, names in other cases",
            [
                b"Idempotency-Key: k1\r\n".to_vec(),
                b"IDEMPOTENCY-KEY: k2\r\n".to_vec(),
            ]
            .concat(),
        ),
        ("bare list", line(b"a, b")),
        ("quoted list", line(b"\"a\", \"b\"")),
        ("trailing comma", line(b"a,")),
        ("unterminated quoted string", line(b"\"abc")),
        ("bad escape in a quoted string", line(b"\"a\\qb\"")),
        ("junk after a quoted string", line(b"\"abc\"x")),
        ("quote inside a bare key", line(b"ab\"c")),
        (
            "obs-fold continuation",
            [line(b"a"), b" b\r\n".to_vec()].concat(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_over_raw_tcp_are_400_and_store_nothing() {
    let (server, work, store) = app().await;
    let mut by_hyper = Vec::new();
    for (name, key_lines) in hostile_key_headers() {
        let mut req = raw_http::head(
            "/work",
            &[
                ("content-type", &b"application/json"[..]),
                ("x-principal", b"alice"),
            ],
        );
        req.extend_from_slice(&key_lines);
        req.extend_from_slice(
            format!(
                "content-length: {}\r\nconnection: close\r\n\r\n",
                BODY.len()
            )
            .as_bytes(),
        );
        req.extend_from_slice(BODY);
        let answers = server.exchange(&req).await;
        let [a] = answers.as_slice() else {
            panic!("{name}: one answer expected, got {answers:?}");
        };
        assert_eq!(a.status, 400, "{name}: {}", a.describe());
        match a.code() {
            // The layer refused it: with its reason.
            Some(code) => assert_eq!(code, "idempotency.key_invalid", "{name}"),
            // hyper refused the request line or header block before any service saw it.
            None => by_hyper.push(name),
        }
        assert_eq!(work.executions(), 0, "{name}: the handler did not run");
        assert_eq!(store.stats().entries, 0, "{name}: nothing was stored");
    }
    eprintln!("refused by hyper's parser before the layer: {by_hyper:?}");
    // RELIABILITY.md's figures: 25 blocks, 6 of them refused by hyper, the other 19 by the layer.
    assert_eq!(hostile_key_headers().len(), 25);
    assert_eq!(
        by_hyper,
        [
            "NUL byte",
            "control byte 0x01",
            "escape byte 0x1b",
            "DEL byte 0x7f",
            "bare CR inside",
            "obs-fold continuation",
        ],
        "the bytes hyper refuses before any service runs"
    );
    assert_valid_request_runs(&server, "valid-after-hostile-keys").await;
    assert_eq!(store.stats().entries, 1);
}

// ---------------------------------------------------------------------------------------------
// Request bodies: over the limit, lying lengths, broken streams
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_length_over_the_limit_is_413_before_the_body_is_sent() {
    let (server, work, store) = app_with(|s| IdempotencyLayer::new(s).max_request_body(16)).await;
    // Declares 10 GB and sends none of it: the answer must come from the header alone.
    let mut req = raw_http::head("/work", &keyed("alice", b"k-declared"));
    req.extend_from_slice(b"content-length: 10000000000\r\nconnection: close\r\n\r\n");
    let a = server.one(&req).await;
    a.assert_problem(413, "idempotency.body_too_large");
    assert_eq!((work.executions(), store.stats().entries), (0, 0));
    // The same key with a body that fits runs normally.
    let ok = server
        .one(&post("/work", &keyed("alice", b"k-declared"), b"{}"))
        .await;
    assert_eq!(ok.status, 201, "{}", ok.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_without_a_length_is_413_and_stores_nothing() {
    let (server, work, store) = app_with(|s| IdempotencyLayer::new(s).max_request_body(16)).await;
    let mut req = raw_http::head("/work", &keyed("alice", b"k-chunked"));
    req.extend_from_slice(b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    for _ in 0..4 {
        req.extend_from_slice(b"a\r\n0123456789\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let a = server.one(&req).await;
    a.assert_problem(413, "idempotency.body_too_large");
    assert_eq!((work.executions(), store.stats().entries), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_that_says_more_than_sent_then_hangs_up_stores_nothing() {
    let (server, work, store) = app().await;
    let mut req = raw_http::head("/work", &keyed("alice", b"k-short"));
    req.extend_from_slice(b"content-length: 100\r\n\r\n");
    req.extend_from_slice(&BODY[..10]);
    let answers = server.exchange_then_hang_up(&req).await;
    // The body ends early: the layer cannot fingerprint it. Whether the answer still reaches
    // the half-closed socket is up to hyper; when it does, it is a 400.
    for a in &answers {
        a.assert_problem(400, "idempotency.body_unreadable");
    }
    eprintln!(
        "lying Content-Length (more than sent): {} answer(s)",
        answers.len()
    );
    assert_eq!(work.executions(), 0, "the handler did not run");
    assert_eq!(store.stats().entries, 0, "nothing was claimed");
    // Not left pending: the retry runs at once (no 409).
    assert_valid_request_runs(&server, "k-short").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_that_says_less_than_sent_fingerprints_only_the_declared_bytes() {
    let (server, work, store) = app().await;
    // Declares 5 bytes and sends 5 + junk on a keep-alive connection: the junk is parsed as a
    // next request (and refused by hyper); it never joins the first request's body.
    let mut req = raw_http::head("/work", &keyed("alice", b"k-long"));
    req.extend_from_slice(b"content-length: 5\r\n\r\n12345EXTRA BYTES THAT ARE NOT HTTP\r\n\r\n");
    let answers = server.exchange(&req).await;
    let first = answers.first().expect("the declared request is answered");
    assert_eq!(first.status, 201, "{}", first.describe());
    assert_eq!(
        first.json()["body_len"],
        5,
        "the handler saw the declared 5 bytes"
    );
    for junk in &answers[1..] {
        assert!(
            (400..500).contains(&junk.status),
            "the junk is refused: {}",
            junk.describe()
        );
    }
    assert_eq!(work.executions(), 1);
    assert_eq!(
        store.stats().entries,
        1,
        "one record: the declared request's"
    );
    let replay = server
        .one(&post("/work", &keyed("alice", b"k-long"), b"12345"))
        .await;
    assert!(
        replay.is_replay(),
        "the 5-byte request replays: {}",
        replay.describe()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_that_breaks_half_way_is_400_body_unreadable_and_stores_nothing() {
    let (server, work, store) = app().await;
    let mut req = raw_http::head("/work", &keyed("alice", b"k-broken"));
    req.extend_from_slice(b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    req.extend_from_slice(b"5\r\n{\"ite\r\nzz-not-a-chunk-size\r\n");
    let a = server.one(&req).await;
    a.assert_problem(400, "idempotency.body_unreadable");
    assert_eq!((work.executions(), store.stats().entries), (0, 0));
    assert_valid_request_runs(&server, "k-broken").await;
}

/// A client body that yields one chunk, then an error.
#[derive(Debug, Default)]
struct BreaksHalfWay {
    sent: bool,
}

impl http_body::Body for BreaksHalfWay {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        if self.sent {
            return Poll::Ready(Some(Err(std::io::Error::other("the client body breaks"))));
        }
        self.sent = true;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            b"{\"ite",
        )))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_body_stream_that_errors_half_way_stores_nothing() {
    let (server, work, store) = app().await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<BreaksHalfWay>();
    let req = http::Request::post(format!("http://{}/work", server.addr()))
        .header("content-type", "application/json")
        .header("x-principal", "alice")
        .header("idempotency-key", "k-stream")
        .body(BreaksHalfWay::default())
        .unwrap();
    // The client aborts the request: it sees an error (or, if the server answered first, a
    // 400), never a success.
    match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await {
        Ok(Ok(res)) => assert_eq!(res.status(), 400),
        Ok(Err(_)) => {}
        Err(_) => panic!("the aborted request hung"),
    }
    // The server notices the broken body on its own schedule.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!((work.executions(), store.stats().entries), (0, 0));
    assert_valid_request_runs(&server, "k-stream").await;
}

#[tokio::test]
async fn erroring_request_body_through_oneshot_is_400_body_unreadable() {
    let store = Arc::new(MemoryStore::new());
    let ran = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&ran);
    let svc = IdempotencyLayer::new(Arc::clone(&store)).layer(service_fn(
        move |_req: http::Request<RequestBody<BreaksHalfWay>>| {
            seen.store(true, Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new()))) }
        },
    ));
    let req = http::Request::post("/work")
        .header("idempotency-key", "k")
        .extension(Principal::new("alice"))
        .body(BreaksHalfWay::default())
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 400);
    let kind = res.extensions().get::<Rejection>().map(Rejection::kind);
    assert_eq!(kind, Some(RejectionKind::BodyUnreadable));
    assert!(!ran.load(Ordering::SeqCst), "the handler did not run");
    assert_eq!(store.stats().entries, 0, "nothing was stored");
}

// ---------------------------------------------------------------------------------------------
// Responses: obs-text header values, 100 Set-Cookie lines
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_response_header_values_are_replayed_byte_exact() {
    let (server, work, _store) = app().await;
    let mut headers = keyed("alice", b"k-obs");
    headers.push(("x-mode", &b"obs-text"[..]));
    let first = server.one(&post("/work", &headers, BODY)).await;
    let second = server.one(&post("/work", &headers, BODY)).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert_eq!(
        first.header("content-disposition"),
        Some(OBS_TEXT),
        "the caller gets the bytes"
    );
    assert!(second.is_replay(), "{}", second.describe());
    assert_eq!(
        second.header("content-disposition"),
        Some(OBS_TEXT),
        "an allowed header with obs-text bytes is replayed byte for byte"
    );
    assert_eq!(
        second.header("x-raw"),
        None,
        "a header off the allow list is not replayed"
    );
    assert_eq!(second.body, first.body);
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_set_cookie_lines_reach_the_caller_and_none_is_stored() {
    let (server, work, store) = app().await;
    let marker = "SETCOOKIEMARKER7f3a";
    let mut headers = keyed("alice", b"k-cookies");
    headers.push(("x-mode", &b"cookies"[..]));
    headers.push(("x-marker", marker.as_bytes()));
    let first = server.one(&post("/work", &headers, BODY)).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert_eq!(
        first.header_all("set-cookie").len(),
        101,
        "the caller gets every Set-Cookie the handler set"
    );

    // The record at rest: no cookie name or value anywhere in its bytes.
    let Claim::Done { record, .. } = store
        .claim(
            &store_key(LAYER_NS, "alice", "k-cookies"),
            &work_fingerprint(BODY),
            Duration::from_secs(1),
        )
        .await
        .unwrap()
    else {
        panic!("the request was recorded");
    };
    let bytes = record.as_bytes();
    for needle in [marker.as_bytes(), b"set-cookie", b"sid0"] {
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "{:?} is not in the stored record",
            String::from_utf8_lossy(needle)
        );
    }
    let stored = record.decode(1 << 20).unwrap();
    assert!(
        stored
            .headers
            .iter()
            .all(|(n, _)| n.as_ref() != b"set-cookie")
    );

    let replay = server.one(&post("/work", &headers, BODY)).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert!(
        replay.header_all("set-cookie").is_empty(),
        "no cookie is replayed"
    );
    assert_eq!(work.executions(), 1);
}

// ---------------------------------------------------------------------------------------------
// A handler that panics
// ---------------------------------------------------------------------------------------------

/// Turns a panic of the inner service's future into a 500, as tower-http's `CatchPanicLayer`
/// does (`catch_unwind` around each poll).
#[derive(Clone, Debug)]
struct CatchPanic<S>(S);

#[derive(Clone, Debug)]
struct CatchPanicLayer;

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;
    fn layer(&self, inner: S) -> CatchPanic<S> {
        CatchPanic(inner)
    }
}

impl<S, Req> Service<Req> for CatchPanic<S>
where
    S: Service<Req>,
    S::Response: IntoResponse,
    S::Future: Send + 'static,
{
    type Response = axum::response::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let mut fut = Box::pin(self.0.call(req));
        Box::pin(std::future::poll_fn(
            move |cx| match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
                Ok(Poll::Ready(res)) => Poll::Ready(res.map(IntoResponse::into_response)),
                Ok(Poll::Pending) => Poll::Pending,
                Err(_) => Poll::Ready(Ok(http::StatusCode::INTERNAL_SERVER_ERROR.into_response())),
            },
        ))
    }
}

/// Where the panic is caught.
#[derive(Debug, Clone, Copy)]
enum Catch {
    /// Nowhere: axum's default; the connection task dies and the client sees the connection
    /// close without an answer.
    Nowhere,
    /// Outside the idempotency layer: the caller gets a 500.
    Outside,
}

/// A handler that panics once, with the panic caught as `catch` says (or not at all): the
/// panic unwinds through the layer, which neither completes nor releases, so the key stays
/// pending (409) until its lease lapses and the retry then runs. Never stuck beyond the lease.
/// The store's clock is moved by hand: a busy machine cannot make the lease lapse early.
async fn assert_panic_leaves_the_key_to_its_lease(catch: Catch) {
    let clock = ManualClock::new();
    let store = Arc::new(
        MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store"),
    );
    let work = Work::plain();
    work.panic_next(1);
    let layer = IdempotencyLayer::new(Arc::clone(&store));
    let lease = layer.engine().lease();
    let routes = work.routes().layer(layer);
    let routes = match catch {
        Catch::Nowhere => routes,
        Catch::Outside => routes.layer(CatchPanicLayer),
    };
    let server = TestServer::start(with_auth(routes)).await;
    let mut headers = keyed("alice", b"k-panic");
    headers.push(("x-mode", &b"panic"[..]));
    let req = post("/work", &headers, BODY);

    let answers = server.exchange(&req).await;
    match catch {
        Catch::Nowhere => assert!(answers.is_empty(), "no answer: {answers:?}"),
        Catch::Outside => {
            let [a] = answers.as_slice() else {
                panic!("{answers:?}")
            };
            assert_eq!(a.status, 500, "{}", a.describe());
        }
    }
    assert_eq!(work.executions(), 1);
    assert_eq!(
        store.stats().pending,
        1,
        "the key is left pending, not released"
    );

    let retry = server.one(&req).await;
    retry.assert_problem(409, "idempotency.in_flight");
    clock.advance(lease - Duration::from_millis(1));
    let retry = server.one(&req).await;
    retry.assert_problem(409, "idempotency.in_flight");
    assert_eq!(work.executions(), 1, "no re-run inside the lease");

    clock.advance(Duration::from_millis(2));
    let ran = server.one(&req).await;
    assert_eq!(ran.status, 201, "the lease lapsed: {}", ran.describe());
    assert_eq!(ran.execution(), Some(2), "the retry ran the work again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_handler_with_no_catch_leaves_the_key_to_its_lease() {
    assert_panic_leaves_the_key_to_its_lease(Catch::Nowhere).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_handler_caught_outside_the_layer_leaves_the_key_to_its_lease() {
    assert_panic_leaves_the_key_to_its_lease(Catch::Outside).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_handler_caught_inside_the_layer_is_a_500_and_releases_the_key() {
    let store = Arc::new(MemoryStore::new());
    let work = Work::plain();
    work.panic_next(1);
    let layer = IdempotencyLayer::new(Arc::clone(&store));
    // Inside: the layer sees the 500, which is not recorded, and releases the key.
    let server =
        TestServer::start(with_auth(work.routes().layer(CatchPanicLayer).layer(layer))).await;
    let mut headers = keyed("alice", b"k-panic-inside");
    headers.push(("x-mode", &b"panic"[..]));
    let req = post("/work", &headers, BODY);
    let a = server.one(&req).await;
    assert_eq!(a.status, 500, "{}", a.describe());
    assert_eq!(store.stats().entries, 0, "released");
    let retry = server.one(&req).await;
    assert_eq!(
        retry.status,
        201,
        "the retry runs at once: {}",
        retry.describe()
    );
    assert_eq!(work.executions(), 2);
}
