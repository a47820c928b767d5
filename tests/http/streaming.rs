//! Streaming responses: a `text/event-stream` response,
//! or a body that has not ended within the collection bound, goes to the client as it comes,
//! never held back until its end; it is recorded as status and headers once it has ended, and
//! a stream that never ends does not hold its key forever.

use crate::support;

#[allow(dead_code, unreachable_pub)]
use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use http_body::{Body, Frame};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use support::http::{RequestExt, SpyStore, TestServer, bounded, eventually, send, with_auth};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::http::Streaming;

const BODY: &str = r#"{"prompt":"tell me a story","stream":true}"#;
/// How long a streamed answer may take to show its first bytes (generous: a shared machine).
const PROMPTLY: Duration = Duration::from_secs(5);

/// A body fed by the test, chunk by chunk, that ends when the test drops its sender.
struct ChannelBody(mpsc::UnboundedReceiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(c))))
    }
}

/// The streaming handler's state: how often it ran, and the sender of each run's body.
#[derive(Clone, Default)]
struct Streams {
    runs: Arc<AtomicUsize>,
    senders: Arc<Mutex<Vec<Option<mpsc::UnboundedSender<Bytes>>>>>,
}

impl Streams {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Sends `chunk` on the body of run `run` (counted from 0).
    fn send(&self, run: usize, chunk: &'static str) {
        let senders = self.senders.lock().expect("senders");
        senders[run]
            .as_ref()
            .expect("the stream is open")
            .send(Bytes::from_static(chunk.as_bytes()))
            .expect("the body is still read");
    }

    /// Ends the body of run `run`.
    fn end(&self, run: usize) {
        self.senders.lock().expect("senders")[run] = None;
    }

    /// Sends a chunk on the body of run `run` if anyone still reads it (a write is how the
    /// server learns that its client went away).
    fn poke(&self, run: usize) {
        if let Some(tx) = &self.senders.lock().expect("senders")[run] {
            let _ = tx.send(Bytes::from_static(b"poke;"));
        }
    }

    /// Whether the body of run `run` was dropped (the layer or the server let go of it).
    fn dropped(&self, run: usize) -> bool {
        self.senders.lock().expect("senders")[run]
            .as_ref()
            .is_none_or(mpsc::UnboundedSender::is_closed)
    }
}

/// `POST /stream`: a 200 whose body is fed by the test, first chunk `first;` at once. The
/// content type is `x-content-type` (default `text/event-stream`).
async fn stream(State(streams): State<Streams>, headers: HeaderMap) -> Response {
    let run = streams.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Bytes::from_static(b"first;")).expect("first chunk");
    streams.senders.lock().expect("senders").push(Some(tx));
    let content_type = headers
        .get("x-content-type")
        .cloned()
        .unwrap_or(HeaderValue::from_static("text/event-stream"));
    let mut res = Response::new(AxumBody::new(ChannelBody(rx)));
    res.headers_mut().insert(header::CONTENT_TYPE, content_type);
    res.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/streams/{run}")).expect("location"),
    );
    res
}

async fn server_with(layer: IdempotencyLayer<SpyStore>) -> (TestServer, Streams) {
    let streams = Streams::default();
    let router = Router::new()
        .route("/stream", post(stream))
        .with_state(streams.clone())
        .layer(layer);
    (TestServer::start(with_auth(router)).await, streams)
}

fn request(server: &TestServer, key: &str) -> reqwest::RequestBuilder {
    server.post("/stream", BODY).principal("alice").key(key)
}

/// Sends the request and waits for the head of the answer, which must come while the handler's
/// body is still open.
async fn open(rb: reqwest::RequestBuilder) -> reqwest::Response {
    bounded(
        PROMPTLY,
        "the head of a streaming answer (held back until the stream's end?)",
        rb.send(),
    )
    .await
    .expect("the request reaches the server")
}

/// Reads from `res` until `expected` bytes came, which must come while the body is still open.
async fn read_exactly(res: &mut reqwest::Response, expected: &str) {
    let mut got = Vec::new();
    while got.len() < expected.len() {
        let chunk = bounded(
            PROMPTLY,
            "the next bytes of a streaming answer",
            res.chunk(),
        )
        .await
        .expect("the body is read")
        .unwrap_or_else(|| panic!("the body ended after {got:?}, expected {expected:?}"));
        got.extend_from_slice(&chunk);
    }
    assert_eq!(
        String::from_utf8_lossy(&got),
        expected,
        "nothing lost, in order"
    );
}

/// Reads `res` to its end; the end must come promptly.
async fn read_to_end(res: &mut reqwest::Response) -> Vec<u8> {
    let mut rest = Vec::new();
    while let Some(chunk) = bounded(PROMPTLY, "the end of a streaming answer", res.chunk())
        .await
        .expect("the body is read")
    {
        rest.extend_from_slice(&chunk);
    }
    rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_goes_out_as_it_comes_and_is_recorded_as_status_and_headers_once_ended() {
    let store = SpyStore::new();
    let (server, streams) = server_with(IdempotencyLayer::new(store.clone())).await;

    let mut res = open(request(&server, "k-sse")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    read_exactly(&mut res, "first;").await;
    streams.send(0, "second;");
    read_exactly(&mut res, "second;").await;

    // While it streams, the key is held: a repeat is told the work is in progress.
    send(request(&server, "k-sse"))
        .await
        .assert_problem(409, "idempotency.in_flight");
    assert_eq!(
        store.completes(),
        0,
        "not recorded before the body has ended"
    );

    streams.send(0, "last;");
    streams.end(0);
    assert_eq!(read_to_end(&mut res).await, b"last;");
    assert_eq!(store.completes(), 1, "recorded once the body ended");
    assert_eq!(store.releases(), 0);

    let replay = send(request(&server, "k-sse")).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.status, 200);
    assert_eq!(replay.header("content-type"), Some("text/event-stream"));
    assert_eq!(replay.header("location"), Some("/streams/1"));
    assert!(
        replay.body.is_empty(),
        "status and headers only: {}",
        replay.describe()
    );
    assert_eq!(streams.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_not_ended_within_the_collection_bound_goes_out_as_it_comes_nothing_lost() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone())
        .streaming(Streaming::default().collect_timeout(Duration::from_millis(200)));
    let (server, streams) = server_with(layer).await;
    let download = || request(&server, "k-slow").header("x-content-type", "text/csv");

    let started = Instant::now();
    let mut res = open(download()).await;
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "held for the collection bound first ({:?})",
        started.elapsed()
    );
    assert_eq!(res.headers()["content-type"], "text/csv");
    // What the layer read while it waited comes first, then the rest as it comes.
    read_exactly(&mut res, "first;").await;
    streams.send(0, "second;");
    read_exactly(&mut res, "second;").await;
    assert_eq!(
        store.completes(),
        0,
        "not recorded before the body has ended"
    );
    streams.end(0);
    assert!(read_to_end(&mut res).await.is_empty());
    assert_eq!(store.completes(), 1, "recorded once the body ended");

    let replay = send(download()).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.header("content-type"), Some("text/csv"));
    assert!(
        replay.body.is_empty(),
        "status and headers only: {}",
        replay.describe()
    );
    assert_eq!(streams.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_ended_within_the_collection_bound_is_recorded_whole() {
    let store = SpyStore::new();
    let (server, streams) = server_with(IdempotencyLayer::new(store.clone())).await;
    let quick = || request(&server, "k-quick").header("x-content-type", "text/plain");
    // The test ends the body soon after the handler answered: well within the default bound.
    let ender = {
        let streams = streams.clone();
        tokio::spawn(async move {
            assert!(eventually(PROMPTLY, || streams.runs() == 1).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
            streams.send(0, "done;");
            streams.end(0);
        })
    };
    let first = send(quick()).await;
    ender.await.expect("the test's sender");
    assert_eq!(&first.body[..], b"first;done;");
    let replay = send(quick()).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(
        &replay.body[..],
        b"first;done;",
        "the whole body was recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_that_never_ends_holds_its_key_only_up_to_the_stream_lease_limit() {
    let lease = Duration::from_millis(300);
    let limit = Duration::from_millis(900);
    // The store's clock is moved by hand: the lease lapses when the test says, not when a busy
    // machine falls behind its renewals.
    let clock = tower_idempotency::store::clock::ManualClock::new();
    let store = SpyStore::over(
        tower_idempotency::MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store"),
    );
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(store.clone())
            .lease(lease)
            .build(),
    )
    .streaming(Streaming::default().lease_limit(limit));
    let (server, streams) = server_with(layer).await;

    let started = Instant::now();
    let mut res = open(request(&server, "k-endless")).await;
    read_exactly(&mut res, "first;").await;
    // Within the limit the lease is renewed.
    assert!(
        eventually(PROMPTLY, || store.renews() > 0).await,
        "the lease was renewed while the body streamed"
    );
    send(request(&server, "k-endless"))
        .await
        .assert_problem(409, "idempotency.in_flight");

    // Then renewal stops and the key is left to its lease.
    tokio::time::sleep_until(started + limit + 3 * lease).await;
    let renews = store.renews();
    tokio::time::sleep(2 * lease).await;
    assert_eq!(store.renews(), renews, "no renewal after the limit");
    clock.advance(lease + Duration::from_millis(1));

    // Once the lease lapsed, a retry runs again, while the first stream still goes on.
    let retry_deadline = Instant::now() + PROMPTLY;
    let mut retry = loop {
        let res = open(request(&server, "k-endless")).await;
        if res.status() == 200 {
            break res;
        }
        assert_eq!(res.status(), 409, "in flight until the lease lapses");
        assert!(Instant::now() < retry_deadline, "the key was never let go");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        started.elapsed() >= limit,
        "held at least up to the limit ({:?})",
        started.elapsed()
    );
    read_exactly(&mut retry, "first;").await;
    assert_eq!(streams.runs(), 2);
    streams.send(0, "still-going;");
    read_exactly(&mut res, "still-going;").await;
    assert!(!streams.dropped(0), "the first stream was never cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_going_away_mid_stream_leaves_the_key_pending_until_its_lease_lapses() {
    // The store's clock is moved by hand: a busy machine cannot make the lease lapse early.
    let clock = tower_idempotency::store::clock::ManualClock::new();
    let store = SpyStore::over(
        tower_idempotency::MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store"),
    );
    let layer = IdempotencyLayer::new(store.clone());
    let lease = layer.engine().lease();
    let (server, streams) = server_with(layer).await;

    let mut res = open(request(&server, "k-gone")).await;
    read_exactly(&mut res, "first;").await;
    drop(res);
    assert!(
        eventually(PROMPTLY, || {
            streams.poke(0);
            streams.dropped(0)
        })
        .await,
        "the server let go of the body"
    );
    assert_eq!(store.completes(), 0, "the client never received the end");
    assert_eq!(store.releases(), 0, "the work happened: not released");
    send(request(&server, "k-gone"))
        .await
        .assert_problem(409, "idempotency.in_flight");
    clock.advance(lease - Duration::from_millis(1));
    send(request(&server, "k-gone"))
        .await
        .assert_problem(409, "idempotency.in_flight");

    clock.advance(Duration::from_millis(2));
    let mut retry = open(request(&server, "k-gone")).await;
    assert_eq!(retry.status(), 200, "re-run after the lease");
    read_exactly(&mut retry, "first;").await;
    assert_eq!(streams.runs(), 2);
}
