//! The HTTP adapter over hyper-util's client, against local stubs on loopback (expanded per
//! store in `main.rs`).

use crate::door::wait_until;
use crate::support::http::SpyStore;
use crate::support::ports::Refusing;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::engine::{Engine, Scope};
use tower_idempotency::outbound::http::{CallError, HttpSendOnceLayer};
use tower_idempotency::outbound::{Delivery, OutboundError, OutboundErrorKind, Unknown};

type HttpDelivery = Delivery<Response<Bytes>, CallError>;
use tower_idempotency::{DerivedKey, IdempotencyKey, Store};

/// What the stub does with a request once it has read it whole.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Behave {
    /// Answers this status with a JSON body naming the request's number.
    Answer(u16),
    /// As `Answer`, with one more header line (`name: value`).
    AnswerWith(u16, &'static str),
    /// As `Answer`, with a body of 4 KiB.
    AnswerBig(u16),
    /// Closes the connection without an answer.
    Close,
    /// Never answers.
    Stall,
}

/// A provider on a loopback port: reads each request (head and body), counts it, remembers
/// its `Idempotency-Key`, and behaves as told. Stopped on drop.
pub(crate) struct Stub {
    addr: SocketAddr,
    received: Arc<AtomicUsize>,
    keys: Arc<Mutex<Vec<Option<String>>>>,
    behave: Arc<Mutex<Behave>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Stub {
    pub(crate) async fn start(behave: Behave) -> Self {
        Self::on(TcpListener::bind("127.0.0.1:0").await.unwrap(), behave)
    }

    fn on(listener: TcpListener, behave: Behave) -> Self {
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let keys = Arc::new(Mutex::new(Vec::new()));
        let behave = Arc::new(Mutex::new(behave));
        let (r, k, b) = (received.clone(), keys.clone(), behave.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let (r, k, b) = (r.clone(), k.clone(), b.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, &r, &k, &b).await;
                });
            }
        });
        Self {
            addr,
            received,
            keys,
            behave,
            task,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/charges", self.addr)
    }
    pub(crate) fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
    pub(crate) fn keys(&self) -> Vec<Option<String>> {
        self.keys.lock().unwrap().clone()
    }
    pub(crate) fn behave(&self, b: Behave) {
        *self.behave.lock().unwrap() = b;
    }
}

async fn serve(
    mut conn: TcpStream,
    received: &AtomicUsize,
    keys: &Mutex<Vec<Option<String>>>,
    behave: &Mutex<Behave>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        assert!(buf.len() < 64 * 1024, "a request head under 64 KiB");
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_owned))
    };
    let len: usize = header("content-length").map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + len {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let n = received.fetch_add(1, Ordering::SeqCst) + 1;
    keys.lock().unwrap().push(header("idempotency-key"));
    let b = *behave.lock().unwrap();
    let answer = |status: u16, extra: &str, pad: usize| {
        let body = format!(r#"{{"charge":{n},"pad":"{}"}}"#, "x".repeat(pad));
        format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\nset-cookie: s=secret\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    match b {
        Behave::Answer(status) => conn.write_all(answer(status, "", 0).as_bytes()).await?,
        Behave::AnswerWith(status, line) => {
            let extra = format!("{line}\r\n");
            conn.write_all(answer(status, &extra, 0).as_bytes()).await?;
        }
        Behave::AnswerBig(status) => conn.write_all(answer(status, "", 4096).as_bytes()).await?,
        Behave::Close => {}
        Behave::Stall => std::future::pending::<()>().await,
    }
    Ok(())
}

type Client_ = Client<HttpConnector, Full<Bytes>>;

fn client() -> Client_ {
    Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>()
}

pub(crate) fn charge(url: &str, key: Option<&str>, body: &'static str) -> Request<Bytes> {
    let mut req = Request::post(url).header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    req.body(Bytes::from_static(body.as_bytes())).unwrap()
}

pub(crate) async fn send<St: Store>(
    layer: &HttpSendOnceLayer<St>,
    req: Request<Bytes>,
) -> Result<HttpDelivery, OutboundError<CallError>> {
    layer.clone().layer_service(client()).oneshot(req).await
}

trait LayerService<St> {
    fn layer_service(
        self,
        c: Client_,
    ) -> tower_idempotency::outbound::http::HttpSendOnce<Client_, St>;
}

impl<St: Store> LayerService<St> for HttpSendOnceLayer<St> {
    fn layer_service(
        self,
        c: Client_,
    ) -> tower_idempotency::outbound::http::HttpSendOnce<Client_, St> {
        tower::Layer::layer(&self, c)
    }
}

fn status_of(d: &HttpDelivery) -> Option<u16> {
    d.receipt().map(|r: &Response<Bytes>| r.status().as_u16())
}

pub(crate) async fn a_webhook_sent_twice_is_delivered_once<S: Store>(store: SpyStore<S>) {
    let stub = Stub::start(Behave::Answer(201)).await;
    let layer = HttpSendOnceLayer::new(store);
    let first = send(
        &layer,
        charge(&stub.url(), Some("charge-17"), "{\"amount\":5}"),
    )
    .await
    .unwrap();
    let again = send(
        &layer,
        charge(&stub.url(), Some("charge-17"), "{\"amount\":5}"),
    )
    .await
    .unwrap();
    assert!(first.is_sent(), "{first:?}");
    assert!(matches!(again, Delivery::Replayed(_)), "{again:?}");
    assert_eq!(
        (status_of(&first), status_of(&again)),
        (Some(201), Some(201))
    );
    let (a, b) = (first.into_receipt().unwrap(), again.into_receipt().unwrap());
    assert_eq!(a.body(), b.body(), "the replay is the first answer");
    assert_eq!(b.headers()["content-type"], "application/json");
    assert!(
        b.headers().get("set-cookie").is_none(),
        "cookies are not kept in the store"
    );
    assert_eq!(stub.received(), 1, "the provider got one request");
    assert_eq!(
        stub.keys(),
        vec![Some("charge-17".to_owned())],
        "the key went along"
    );
}

pub(crate) async fn a_stub_that_reads_the_body_and_closes_is_unknown<S: Store>(store: SpyStore<S>) {
    let stub = Stub::start(Behave::Close).await;
    let layer = HttpSendOnceLayer::new(store);
    let first = send(&layer, charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(first, Delivery::Held(Unknown::Error(_))),
        "{first:?}"
    );
    stub.behave(Behave::Answer(201));
    let retry = send(&layer, charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(retry, Delivery::InFlight),
        "the key is held: {retry:?}"
    );
    assert_eq!(stub.received(), 1, "the retry did not send again");
}

pub(crate) async fn a_refused_connection_is_released_and_the_retry_sends<S: Store>(
    store: SpyStore<S>,
) {
    // A port held without listening: connections are refused, and no other test takes it
    // before the stub listens on it.
    let port = Refusing::new();
    let url = format!("http://127.0.0.1:{}/charges", port.port());
    let layer = HttpSendOnceLayer::new(store.clone());
    let err = send(&layer, charge(&url, Some("k"), "{}"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::Work, "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(store.releases(), 1, "the key was released");

    let stub = Stub::on(port.listen(), Behave::Answer(200));
    let retry = send(&layer, charge(&url, Some("k"), "{}")).await.unwrap();
    assert!(retry.is_sent(), "{retry:?}");
    assert_eq!(stub.received(), 1);
}

pub(crate) async fn the_inbound_derived_key_is_forwarded<S: Store>(store: SpyStore<S>) {
    let stub = Stub::start(Behave::Answer(201)).await;
    let layer = HttpSendOnceLayer::new(store).namespace("payments");
    // The derived key of an inbound request (what the `DerivedKey` extractor gives a handler).
    let derived = DerivedKey::derive(
        "orders",
        &Scope::principal("alice"),
        &IdempotencyKey::new("order-9").unwrap(),
    );
    let with_derived = || {
        let mut req = charge(&stub.url(), None, "{}");
        req.extensions_mut().insert(derived.clone());
        req
    };
    assert!(send(&layer, with_derived()).await.unwrap().is_sent());
    let again = send(&layer, with_derived()).await.unwrap();
    assert!(matches!(again, Delivery::Replayed(_)), "{again:?}");
    assert_eq!(stub.keys(), vec![Some(derived.as_str().to_owned())]);
}

pub(crate) async fn a_429_releases_and_a_500_holds<S: Store>(store: SpyStore<S>) {
    let stub = Stub::start(Behave::Answer(429)).await;
    let layer = HttpSendOnceLayer::new(store);
    let busy = send(&layer, charge(&stub.url(), Some("a"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(&busy, Delivery::Released(response) if response.status() == 429),
        "{busy:?}"
    );
    stub.behave(Behave::Answer(201));
    assert!(
        send(&layer, charge(&stub.url(), Some("a"), "{}"))
            .await
            .unwrap()
            .is_sent()
    );

    stub.behave(Behave::Answer(500));
    let broken = send(&layer, charge(&stub.url(), Some("b"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(&broken, Delivery::Held(Unknown::Response(r)) if r.status() == 500),
        "{broken:?}"
    );
    stub.behave(Behave::Answer(201));
    let retry = send(&layer, charge(&stub.url(), Some("b"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(retry, Delivery::InFlight),
        "a 500 may have charged: {retry:?}"
    );
    assert_eq!(
        stub.received(),
        3,
        "a: 429 then 201; b: 500, and its retry not sent"
    );
}

pub(crate) async fn a_timeout_after_the_request_was_written_is_unknown<S: Store>(
    store: SpyStore<S>,
) {
    let stub = Stub::start(Behave::Stall).await;
    // Seconds wide: the request must be written before the timeout ends the call.
    let client = ServiceBuilder::new()
        .layer(HttpSendOnceLayer::new(store))
        .timeout(Duration::from_secs(2))
        .service(client());
    let first = client
        .clone()
        .oneshot(charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(first, Delivery::Held(Unknown::Error(_))),
        "{first:?}"
    );
    wait_until(|| stub.received() == 1).await;
    stub.behave(Behave::Answer(201));
    let retry = client
        .oneshot(charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::InFlight), "{retry:?}");
    assert_eq!(stub.received(), 1);
}

pub(crate) async fn another_body_under_the_key_is_key_reused_and_a_failed_claim_sends_nothing<
    S: Store,
>(
    store: SpyStore<S>,
) {
    let stub = Stub::start(Behave::Answer(201)).await;
    let layer = HttpSendOnceLayer::new(store.clone());
    assert!(
        send(&layer, charge(&stub.url(), Some("k"), "{\"amount\":5}"))
            .await
            .unwrap()
            .is_sent()
    );
    let err = send(&layer, charge(&stub.url(), Some("k"), "{\"amount\":6}"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::KeyReused, "{err:?}");

    store.fail_claims(true);
    let err = send(&layer, charge(&stub.url(), Some("other"), "{}"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::Store, "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(
        stub.received(),
        1,
        "neither the reused key nor the failed claim sent"
    );
}

pub(crate) async fn a_call_dropped_after_it_was_written_keeps_its_key<S: Store>(
    store: SpyStore<S>,
) {
    let stub = Stub::start(Behave::Stall).await;
    let layer = HttpSendOnceLayer::new(store.clone());
    let calling = tokio::spawn({
        let layer = layer.clone();
        let url = stub.url();
        async move { send(&layer, charge(&url, Some("k"), "{}")).await }
    });
    wait_until(|| stub.received() == 1).await;
    calling.abort(); // the caller gives up once the provider has the request
    let _ = calling.await;
    stub.behave(Behave::Answer(201));
    // The hold renews the claim on a task of its own; a repeat is in flight before and after.
    for _ in 0..500 {
        if store.renews() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.renews(), 1, "the claim was renewed for the hold time");
    let retry = send(&layer, charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::InFlight), "{retry:?}");
    assert_eq!((stub.received(), store.releases()), (1, 0));
}

pub(crate) async fn a_303_after_a_create_is_kept_as_the_receipt<S: Store>(store: SpyStore<S>) {
    let stub = Stub::start(Behave::AnswerWith(303, "location: /charges/1")).await;
    let layer = HttpSendOnceLayer::new(store.clone());
    let first = send(&layer, charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    assert!(matches!(first, Delivery::Recorded(_)), "{first:?}");
    let again = send(&layer, charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    let Delivery::Replayed(r) = &again else {
        panic!("the redirect is the answer of the create: {again:?}")
    };
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/charges/1");
    assert_eq!(stub.received(), 1, "the charge went once");
    assert_eq!(store.releases(), 0);
}

pub(crate) async fn a_503_holds_unless_it_says_when_to_come_back<S: Store>(store: SpyStore<S>) {
    // Without `Retry-After`: a proxy's answer for an upstream that failed after forwarding.
    let stub = Stub::start(Behave::Answer(503)).await;
    let layer = HttpSendOnceLayer::new(store);
    let reset = send(&layer, charge(&stub.url(), Some("a"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(&reset, Delivery::Held(Unknown::Response(r)) if r.status() == 503),
        "{reset:?}"
    );
    stub.behave(Behave::Answer(201));
    let retry = send(&layer, charge(&stub.url(), Some("a"), "{}"))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::InFlight), "{retry:?}");

    // With it: the provider's own "unavailable, come back then".
    stub.behave(Behave::AnswerWith(503, "retry-after: 1"));
    let busy = send(&layer, charge(&stub.url(), Some("b"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(&busy, Delivery::Released(response) if response.status() == 503),
        "{busy:?}"
    );
    stub.behave(Behave::Answer(201));
    let retry = send(&layer, charge(&stub.url(), Some("b"), "{}"))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::Recorded(_)), "{retry:?}");
    assert_eq!(stub.received(), 3, "a once; b twice");
}

pub(crate) async fn an_unreachable_host_after_the_request_went_is_unknown<S: Store>(
    store: SpyStore<S>,
) {
    // A client whose established connection reports EHOSTUNREACH once the request is out.
    let sent = Arc::new(AtomicUsize::new(0));
    let client = {
        let sent = sent.clone();
        tower::service_fn(move |_req: Request<Full<Bytes>>| {
            sent.fetch_add(1, Ordering::SeqCst);
            async {
                Err::<Response<Full<Bytes>>, _>(std::io::Error::from(
                    std::io::ErrorKind::HostUnreachable,
                ))
            }
        })
    };
    let door = tower::Layer::layer(&HttpSendOnceLayer::new(store.clone()), client);
    let first = door
        .clone()
        .oneshot(charge("http://127.0.0.1:9/charges", Some("k"), "{}"))
        .await
        .unwrap();
    assert!(
        matches!(first, Delivery::Held(Unknown::Error(_))),
        "{first:?}"
    );
    let retry = door
        .oneshot(charge("http://127.0.0.1:9/charges", Some("k"), "{}"))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::InFlight), "{retry:?}");
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "the retry did not send again"
    );
    assert_eq!(store.releases(), 0);
}

pub(crate) async fn a_response_over_the_record_limit_is_kept_without_its_body<S: Store>(
    store: SpyStore<S>,
) {
    let stub = Stub::start(Behave::AnswerBig(201)).await;
    // The adapter takes the 4 KiB body (its limit is 1 MiB); the engine's records 1 KiB.
    let layer = HttpSendOnceLayer::new(Engine::builder(store).max_record_body(1024).build());
    let first = send(&layer, charge(&stub.url(), Some("k"), "{}"))
        .await
        .unwrap();
    let Delivery::Recorded(r) = &first else {
        panic!("{first:?}")
    };
    assert!(r.body().len() > 4096, "the caller gets the whole answer");
    for _ in 0..2 {
        let again = send(&layer, charge(&stub.url(), Some("k"), "{}"))
            .await
            .expect("not refused as an invalid record at every repeat");
        let Delivery::Replayed(r) = &again else {
            panic!("{again:?}")
        };
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["content-type"], "application/json");
        assert!(r.body().is_empty(), "kept without its body");
    }
    assert_eq!(stub.received(), 1);
}
