//! Hostile and broken input over a real TCP server (axum on 127.0.0.1:0, raw HTTP/1.1 bytes
//! where a client library would refuse to send them). Each case must end in a clear 4xx or 5xx
//! (or, for a response quirk, a byte-exact replay), with nothing stored and no panic; a valid
//! retry then runs normally.
//!
//! Bad keys sent through reqwest (one value each) are covered in `tests/http_rejections.rs`;
//! this file sends what reqwest cannot: raw non-ASCII and control bytes, obs-fold, 10 KiB
//! keys, mixed-case repeated lines, lying `Content-Length`s and broken chunked bodies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/raw_http.rs"]
mod raw_http;
#[cfg(feature = "redis")]
#[path = "support/redis_server.rs"]
mod redis_server;

use axum::response::IntoResponse;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use raw_http::{OBS_TEXT, Raw, Server, Work, keyed, post, with_auth};
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::http::{Rejection, RejectionKind, RequestBody};
use tower_idempotency::{
    Claim, Fingerprint, IdempotencyKey, IdempotencyLayer, MemoryStore, Principal, Record, Scope,
    Secret, Store, StoreKey, StoredResponse,
};

const BODY: &[u8] = br#"{"item":"book"}"#;
const NS: &str = "default";

/// The layer over a shared memory store, and the app: auth → idempotency → handler.
async fn app_with(
    layer: impl Fn(Arc<MemoryStore>) -> IdempotencyLayer<Arc<MemoryStore>>,
) -> (Server, Work, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let work = Work::new();
    let router = with_auth(work.routes().layer(layer(Arc::clone(&store))));
    (Server::start(router).await, work, store)
}

async fn app() -> (Server, Work, Arc<MemoryStore>) {
    app_with(IdempotencyLayer::with_store).await
}

fn store_key(principal: &str, key: &str) -> StoreKey {
    StoreKey::derive(
        NS,
        &Scope::principal(principal),
        &IdempotencyKey::new(key, 255).unwrap(),
    )
}

/// The layer's default fingerprint of `POST /work` with a JSON body.
fn fingerprint(body: &[u8]) -> Fingerprint {
    Fingerprint::builder()
        .field(b"POST")
        .field(b"/work")
        .field(b"")
        .field(b"application/json")
        .field(body)
        .finish()
}

/// A valid request by alice with `key`, which must run (201, not a replay).
async fn assert_valid_request_runs(server: &Server, key: &str) -> Raw {
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
    assert_valid_request_runs(&server, "valid-after-hostile-keys").await;
    assert_eq!(store.stats().entries, 1);
}

// ---------------------------------------------------------------------------------------------
// Request bodies: over the limit, lying lengths, broken streams
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_length_over_the_limit_is_413_before_the_body_is_sent() {
    let (server, work, store) =
        app_with(|s| IdempotencyLayer::with_store(s).max_request_body(16)).await;
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
    let (server, work, store) =
        app_with(|s| IdempotencyLayer::with_store(s).max_request_body(16)).await;
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
    let svc = IdempotencyLayer::with_store(Arc::clone(&store)).layer(service_fn(
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
            &store_key("alice", "k-cookies"),
            &fingerprint(BODY),
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

const PANIC_LEASE: Duration = Duration::from_secs(1);

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
async fn assert_panic_leaves_the_key_to_its_lease(catch: Catch) {
    let store = Arc::new(MemoryStore::new());
    let work = Work::new();
    work.panic_next(1);
    let layer = IdempotencyLayer::with_store(Arc::clone(&store)).lease(PANIC_LEASE);
    let routes = work.routes().layer(layer);
    let routes = match catch {
        Catch::Nowhere => routes,
        Catch::Outside => routes.layer(CatchPanicLayer),
    };
    let server = Server::start(with_auth(routes)).await;
    let mut headers = keyed("alice", b"k-panic");
    headers.push(("x-mode", &b"panic"[..]));
    let req = post("/work", &headers, BODY);

    let panicked_at = Instant::now();
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

    // Poll until the retry runs; it must within the lease plus a margin.
    let ran = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let a = server.one(&req).await;
        if a.status == 201 {
            break a;
        }
        a.assert_problem(409, "idempotency.in_flight");
        assert!(
            panicked_at.elapsed() < PANIC_LEASE + Duration::from_secs(3),
            "the key is stuck beyond its lease"
        );
    };
    let waited = panicked_at.elapsed();
    assert!(
        waited >= PANIC_LEASE,
        "no re-run inside the lease ({waited:?})"
    );
    assert_eq!(ran.execution(), Some(2), "the retry ran the work again");
    eprintln!("{catch:?}: the key ran again {waited:?} after the panic (lease {PANIC_LEASE:?})");
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
    let work = Work::new();
    work.panic_next(1);
    let layer = IdempotencyLayer::with_store(Arc::clone(&store)).lease(PANIC_LEASE);
    // Inside: the layer sees the 500, which is not recorded, and releases the key.
    let server = Server::start(with_auth(work.routes().layer(CatchPanicLayer).layer(layer))).await;
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

// ---------------------------------------------------------------------------------------------
// Tampered records
// ---------------------------------------------------------------------------------------------

/// A genuine record of the handler's kind of answer.
fn genuine() -> StoredResponse {
    StoredResponse::new(
        201,
        vec![
            (
                Bytes::from_static(b"content-type"),
                Bytes::from_static(b"application/json"),
            ),
            (
                Bytes::from_static(b"location"),
                Bytes::from_static(b"/things/1"),
            ),
        ],
        Some(Bytes::from_static(br#"{"execution":1,"body_len":15}"#)),
    )
}

fn encode(r: &StoredResponse) -> Vec<u8> {
    r.encode().unwrap().into_bytes().to_vec()
}

fn edit(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = encode(&genuine());
    f(&mut b);
    b
}

fn with_headers(status: u16, extra: &[(&'static str, &'static str)]) -> Vec<u8> {
    let mut r = genuine();
    r.status = status;
    for (n, v) in extra {
        r.headers.push((
            Bytes::from_static(n.as_bytes()),
            Bytes::from_static(v.as_bytes()),
        ));
    }
    encode(&r)
}

/// Tampered versions of [`genuine`]: each must be refused at replay (no secret needed).
fn tampered() -> Vec<(&'static str, Vec<u8>)> {
    let len = encode(&genuine()).len();
    let body_len_at = len - genuine().body.unwrap().len() - 4;
    let big = StoredResponse::new(201, vec![], Some(Bytes::from(vec![b'x'; (1 << 20) + 1])));
    vec![
        ("wrong version byte (2)", edit(|b| b[2] = 2)),
        ("wrong version byte (0)", edit(|b| b[2] = 0)),
        ("bad magic", edit(|b| b[0] ^= 0x01)),
        ("unknown flag bit", edit(|b| b[3] |= 0x80)),
        ("trailers flag without trailers", edit(|b| b[3] |= 0x02)),
        ("MAC flag without a tag", edit(|b| b[3] |= 0x04)),
        ("status-only flag with a body", edit(|b| b[3] &= !0x01)),
        ("status 500", with_headers(500, &[])),
        ("status 302", with_headers(302, &[])),
        (
            "status 1000",
            edit(|b| b[4..6].copy_from_slice(&1000u16.to_be_bytes())),
        ),
        (
            "set-cookie injected",
            with_headers(201, &[("set-cookie", "session=stolen")]),
        ),
        (
            "date injected",
            with_headers(201, &[("date", "Thu, 01 Jan 1970 00:00:00 GMT")]),
        ),
        (
            "header off the allow list",
            with_headers(201, &[("x-evil", "1")]),
        ),
        ("header count + 1", edit(|b| b[7] += 1)),
        (
            "LF in a header value",
            edit(|b| {
                let at = b.windows(9).position(|w| w == b"/things/1").unwrap();
                b[at] = b'\n';
            }),
        ),
        ("body length + 1", edit(|b| b[body_len_at + 3] += 1)),
        (
            "truncated by one byte",
            edit(|b| {
                b.pop();
            }),
        ),
        ("one trailing byte", edit(|b| b.push(0))),
        ("empty", Vec::new()),
        ("body over the record limit", encode(&big)),
    ]
}

/// Plants `bytes` as alice's completed record of `key` for the request `BODY`.
async fn plant<S: Store>(store: &S, key: &str, bytes: Vec<u8>, fp: &Fingerprint) {
    let k = store_key("alice", key);
    let Claim::Claimed(token) = store.claim(&k, fp, Duration::from_secs(60)).await.unwrap() else {
        panic!("the key to plant under is free");
    };
    let record = Record::from_bytes(Bytes::from(bytes));
    assert!(
        store
            .complete(&k, &token, fp, record, Duration::from_secs(600))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_records_in_the_memory_store_are_503_record_invalid_and_never_replayed() {
    let (server, work, store) = app().await;
    for (i, (name, bytes)) in tampered().into_iter().enumerate() {
        let key = format!("k-tampered-{i}");
        plant(&*store, &key, bytes, &fingerprint(BODY)).await;
        let a = server
            .one(&post("/work", &keyed("alice", key.as_bytes()), BODY))
            .await;
        assert_eq!(
            (a.status, a.code().as_deref()),
            (503, Some("idempotency.record_invalid")),
            "{name}: {}",
            a.describe()
        );
        assert!(!a.is_replay(), "{name}: never replayed");
    }
    assert_eq!(
        work.executions(),
        0,
        "a refused record is no reason to run again"
    );
    // Control: the genuine bytes, planted the same way, replay.
    plant(&*store, "k-genuine", encode(&genuine()), &fingerprint(BODY)).await;
    let a = server
        .one(&post("/work", &keyed("alice", b"k-genuine"), BODY))
        .await;
    assert!(
        a.is_replay(),
        "the genuine record replays: {}",
        a.describe()
    );
}

/// Sends alice's `BODY` request with `key` through `layer` over a handler that must not run;
/// returns (replayed, rejection kind).
async fn oneshot_replay(
    layer: IdempotencyLayer<Arc<MemoryStore>>,
    key: &str,
) -> (bool, Option<RejectionKind>) {
    let ran = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&ran);
    let svc = layer.layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            seen.store(true, Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new()))) }
        },
    ));
    let req = http::Request::post("/work")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert!(
        !ran.load(Ordering::SeqCst),
        "a planted record never leads to a run"
    );
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let kind = res.extensions().get::<Rejection>().map(Rejection::kind);
    if replayed {
        let status = res.status().as_u16();
        assert!(
            (200..500).contains(&status),
            "a replay has a recordable status: {status}"
        );
        for name in res.headers().keys() {
            assert!(
                tower_idempotency::http::DEFAULT_ALLOWED_HEADERS.contains(name)
                    || name == "idempotent-replayed",
                "only allowed headers are replayed: {name}"
            );
        }
        let _ = res.into_body().collect().await;
    }
    (replayed, kind)
}

/// Flips every bit of `record` (one at a time), plants each result in a fresh store under
/// alice's key with fingerprint `fp`, and asks `layer_for` a store whether it replays it.
/// Returns (refused, replayed) counts.
async fn flip_every_bit(
    record: &[u8],
    fp: &Fingerprint,
    layer_for: impl Fn(Arc<MemoryStore>) -> IdempotencyLayer<Arc<MemoryStore>>,
) -> (usize, usize, Vec<usize>) {
    let (mut refused, mut replayed, mut replayed_bytes) = (0, 0, Vec::new());
    for bit in 0..record.len() * 8 {
        let mut b = record.to_vec();
        b[bit / 8] ^= 1 << (bit % 8);
        let store = Arc::new(MemoryStore::new());
        plant(&*store, "k-flip", b, fp).await;
        match oneshot_replay(layer_for(store), "k-flip").await {
            (false, Some(RejectionKind::RecordInvalid)) => refused += 1,
            (true, None) => {
                replayed += 1;
                if replayed_bytes.last() != Some(&(bit / 8)) {
                    replayed_bytes.push(bit / 8);
                }
            }
            other => panic!("bit {bit}: unexpected answer {other:?}"),
        }
    }
    (refused, replayed, replayed_bytes)
}

#[tokio::test]
async fn with_a_secret_every_bit_flip_of_a_record_is_refused() {
    let secret = Secret::new(*b"hostile-input-test-secret-32-byt").unwrap();
    let layer_for = |s: Arc<MemoryStore>| IdempotencyLayer::with_store(s).secret(secret.clone());
    // The layer's own record, sealed, and the keyed fingerprint it is stored under.
    let origin = Arc::new(MemoryStore::new());
    let svc = layer_for(Arc::clone(&origin)).layer(service_fn(
        |_req: http::Request<RequestBody<Full<Bytes>>>| async {
            let mut res = http::Response::new(Full::new(Bytes::from_static(br#"{"execution":1}"#)));
            *res.status_mut() = http::StatusCode::CREATED;
            res.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("application/json"),
            );
            Ok::<_, Infallible>(res)
        },
    ));
    let req = http::Request::post("/work")
        .header("content-type", "application/json")
        .header("idempotency-key", "k-flip")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap();
    assert_eq!(svc.oneshot(req).await.unwrap().status(), 201);
    let Claim::Done {
        fingerprint: keyed_fp,
        record,
    } = origin
        .claim(
            &store_key("alice", "k-flip"),
            &fingerprint(BODY),
            Duration::from_secs(1),
        )
        .await
        .unwrap()
    else {
        panic!("recorded");
    };
    assert_ne!(
        keyed_fp,
        fingerprint(BODY),
        "the stored fingerprint is keyed"
    );
    // Unchanged, it replays under the same secret.
    let control = Arc::new(MemoryStore::new());
    plant(&*control, "k-flip", record.as_bytes().to_vec(), &keyed_fp).await;
    assert_eq!(
        oneshot_replay(layer_for(control), "k-flip").await,
        (true, None)
    );

    let (refused, replayed, _) = flip_every_bit(record.as_bytes(), &keyed_fp, layer_for).await;
    eprintln!(
        "sealed record of {} bytes: {refused} bit flips refused, {replayed} replayed",
        record.len()
    );
    assert_eq!(replayed, 0, "with a secret, no flipped record is replayed");
    assert_eq!(refused, record.len() * 8);
}

#[tokio::test]
async fn without_a_secret_bit_flips_are_refused_or_replayed_as_valid_records_never_run() {
    let record = encode(&genuine());
    let (refused, replayed, bytes) =
        flip_every_bit(&record, &fingerprint(BODY), IdempotencyLayer::with_store).await;
    eprintln!(
        "plain record of {} bytes: {refused} bit flips refused, {replayed} replayed \
         (only flips at bytes {bytes:?} survive validation)",
        record.len()
    );
    assert_eq!(refused + replayed, record.len() * 8);
    // The envelope (magic, version, flags) is always checked; what survives is a flip inside
    // the status, a header value or the body, which only a secret can detect.
    assert!(
        bytes.iter().all(|b| *b >= 4),
        "an envelope flip was replayed: {bytes:?}"
    );
}

#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use crate::redis_server::{RedisServer, available};
    use tower_idempotency::store::redis::{RedisStore, redis};

    async fn set_raw(store: &RedisStore, key: &StoreKey, value: &[u8]) {
        let mut conn = store.connection().clone();
        redis::cmd("SET")
            .arg(store.redis_key(key))
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }

    /// `'D' + fingerprint(32) + record`: the store's layout of a completed key.
    fn done_value(fp: &Fingerprint, record: &[u8]) -> Vec<u8> {
        [&b"D"[..], fp.as_bytes(), record].concat()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tampered_records_in_redis_are_503_and_never_replayed() {
        if !available() {
            return;
        }
        let server = RedisServer::start();
        let ns = "hostile-redis";
        let store = RedisStore::connect(&server.url(), ns).await.unwrap();
        let work = Work::new();
        let layer = IdempotencyLayer::with_store(store.clone());
        let app = Server::start(with_auth(work.routes().layer(layer))).await;
        let fp = fingerprint(BODY);

        for (i, (name, bytes)) in tampered().into_iter().enumerate() {
            let key = format!("k-tampered-{i}");
            set_raw(&store, &store_key("alice", &key), &done_value(&fp, &bytes)).await;
            let a = app
                .one(&post("/work", &keyed("alice", key.as_bytes()), BODY))
                .await;
            assert_eq!(
                (a.status, a.code().as_deref()),
                (503, Some("idempotency.record_invalid")),
                "{name}: {}",
                a.describe()
            );
        }
        // Values that are not the store's layout at all: the claim fails, the work never runs.
        let garbage: [(&str, Vec<u8>); 5] = [
            ("empty value", Vec::new()),
            ("unknown state byte", [&b"X"[..], &[0; 48]].concat()),
            (
                "pending of the wrong length",
                [&b"P"[..], &[0; 40]].concat(),
            ),
            ("done shorter than a fingerprint", b"D0123".to_vec()),
            ("text", b"hello, I am not a record".to_vec()),
        ];
        for (i, (name, value)) in garbage.into_iter().enumerate() {
            let key = format!("k-garbage-{i}");
            set_raw(&store, &store_key("alice", &key), &value).await;
            let a = app
                .one(&post("/work", &keyed("alice", key.as_bytes()), BODY))
                .await;
            assert_eq!(
                (a.status, a.code().as_deref()),
                (503, Some("idempotency.store_failed")),
                "{name}: {}",
                a.describe()
            );
        }
        assert_eq!(work.executions(), 0, "nothing ran");

        // Control: the genuine record, written the same way, replays.
        set_raw(
            &store,
            &store_key("alice", "k-genuine"),
            &done_value(&fp, &encode(&genuine())),
        )
        .await;
        let a = app
            .one(&post("/work", &keyed("alice", b"k-genuine"), BODY))
            .await;
        assert!(a.is_replay(), "{}", a.describe());
    }
}
