//! Helpers for the hostile-input and security tests: an axum app on loopback whose handler is
//! steered by request headers, and a raw HTTP/1.1 client over `tokio::net::TcpStream` that
//! sends bytes no client library would (non-ASCII keys, repeated lines, lying lengths, broken
//! chunked bodies) and reads the answers back byte for byte.
//!
//! The handler (`POST /work`) reads:
//!
//! | header | effect |
//! | --- | --- |
//! | `x-principal` / `x-tenant` | the demo authentication puts a [`Principal`] into extensions |
//! | `x-mode: cookies` | the answer carries 100 `Set-Cookie` lines `sid<i>=<x-marker>-<i>` |
//! | `x-mode: obs-text` | the answer carries [`OBS_TEXT`] as `Content-Disposition` and `X-Raw` |
//! | `x-mode: panic` | the handler panics while [`Work::panics_left`] is above zero |
//!
//! Every answer is `201` with `{"execution": n, "body_len": n}` and a `Set-Cookie` carrying the
//! `x-marker` header's value when there is one.

// Each test crate uses part of this.
#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower_idempotency::engine::{Fingerprint, Scope};
use tower_idempotency::store::StoreKey;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, Principal};

/// A `Content-Disposition` value with obs-text bytes (0x80–0xff): not UTF-8.
pub const OBS_TEXT: &[u8] = b"attachment; filename=\"r\xe9sum\xe9-\x80\xff.txt\"";

/// The JSON request body the tests send.
pub const BODY: &[u8] = br#"{"item":"book"}"#;

/// The layer's namespace when none is set.
pub const LAYER_NS: &str = "default";

/// How long a raw exchange may take before the test fails.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The app
// ---------------------------------------------------------------------------------------------

/// The handler's counters.
#[derive(Clone, Default, Debug)]
pub struct Work {
    executions: Arc<AtomicUsize>,
    panics_left: Arc<AtomicUsize>,
}

impl Work {
    /// Fresh counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times the handler started.
    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    /// Makes the next `n` executions in `x-mode: panic` panic.
    pub fn panic_next(&self, n: usize) {
        self.panics_left.store(n, Ordering::SeqCst);
    }

    /// `POST /work` served by [`work`], with no layer.
    pub fn routes(&self) -> Router {
        Router::new()
            .route("/work", axum::routing::post(work))
            .with_state(self.clone())
    }
}

/// The test handler (see the module docs).
pub async fn work(State(state): State<Work>, headers: HeaderMap, body: Bytes) -> Response {
    let execution = state.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let mode = headers.get("x-mode").map(HeaderValue::as_bytes);
    if mode == Some(b"panic")
        && state
            .panics_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        panic!("the handler panics on purpose (execution {execution})");
    }
    let json = serde_json::json!({ "execution": execution, "body_len": body.len() });
    let mut res = (StatusCode::CREATED, axum::Json(json)).into_response();
    let h = res.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/things/{execution}")).expect("location"),
    );
    let marker = headers
        .get("x-marker")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(m) = &marker {
        h.append(
            header::SET_COOKIE,
            HeaderValue::from_str(&format!("session={m}")).expect("cookie"),
        );
    }
    match mode {
        Some(b"cookies") => {
            let m = marker.as_deref().unwrap_or("cookie");
            for i in 0..100 {
                h.append(
                    header::SET_COOKIE,
                    HeaderValue::from_str(&format!("sid{i}={m}-{i}; Path=/")).expect("cookie"),
                );
            }
        }
        Some(b"obs-text") => {
            let v = HeaderValue::from_bytes(OBS_TEXT).expect("obs-text is a valid field value");
            h.insert(header::CONTENT_DISPOSITION, v.clone());
            h.insert("x-raw", v);
        }
        _ => {}
    }
    res
}

/// The demo authentication: `x-principal` (and `x-tenant`) become a [`Principal`].
pub async fn auth(mut req: Request, next: Next) -> Response {
    // A block, so no borrow of the (non-`Sync`) request lives across the await.
    let principal = {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        header("x-principal").map(|p| {
            let principal = Principal::new(p);
            match header("x-tenant") {
                Some(t) => principal.with_tenant(t),
                None => principal,
            }
        })
    };
    if let Some(p) = principal {
        req.extensions_mut().insert(p);
    }
    next.run(req).await
}

/// Wraps `router` in the demo authentication.
pub fn with_auth(router: Router) -> Router {
    router.layer(middleware::from_fn(auth))
}

/// The store key the layer derives for `principal`'s `key` (default namespace, no tenant).
pub fn store_key(principal: &str, key: &str) -> StoreKey {
    StoreKey::derive(
        LAYER_NS,
        &Scope::principal(principal),
        &IdempotencyKey::new(key).expect("a valid test key"),
    )
}

/// The layer's default (plain) fingerprint of `POST /work` with a JSON `body`: method, path,
/// raw query, content-type, body.
pub fn default_fingerprint(body: &[u8]) -> Fingerprint {
    Fingerprint::builder()
        .field(b"POST")
        .field(b"/work")
        .field(b"")
        .field(b"application/json")
        .field(body)
        .finish()
}

/// Auth → the layer `layer` builds over a shared memory store → the handler, on a server.
pub async fn memory_app(
    layer: impl Fn(Arc<MemoryStore>) -> IdempotencyLayer<Arc<MemoryStore>>,
) -> (Server, Work, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let work = Work::new();
    let router = with_auth(work.routes().layer(layer(Arc::clone(&store))));
    (Server::start(router).await, work, store)
}

/// An app served by `axum::serve` on a fresh loopback port; aborted on drop.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves `router`.
    pub async fn start(router: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .await
                .expect("the server runs");
        });
        Self { addr, task }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends `bytes` on a new connection and reads every answer until the server closes it.
    pub async fn exchange(&self, bytes: &[u8]) -> Vec<Raw> {
        exchange(self.addr, bytes, false).await
    }

    /// Like [`exchange`](Self::exchange), but closes the sending half after the bytes, as a
    /// client that hangs up mid-body does.
    pub async fn exchange_then_hang_up(&self, bytes: &[u8]) -> Vec<Raw> {
        exchange(self.addr, bytes, true).await
    }

    /// Sends one request (with `Connection: close`) and returns its answer.
    pub async fn one(&self, bytes: &[u8]) -> Raw {
        let mut answers = self.exchange(bytes).await;
        assert_eq!(
            answers.len(),
            1,
            "exactly one answer expected, got {answers:?}"
        );
        answers.remove(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Raw requests
// ---------------------------------------------------------------------------------------------

/// A `POST` request as bytes: the request line, `Host`, the given header lines verbatim (name,
/// raw value), `Content-Length` of `body`, `Connection: close`, then `body`.
pub fn post(path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = head(path, headers);
    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(body);
    out
}

/// The request line, `Host` and the given header lines (no blank line, no length).
pub fn head(path: &str, headers: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = format!("POST {path} HTTP/1.1\r\nhost: localhost\r\n").into_bytes();
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The usual headers of a keyed request by `principal` with `key` (raw bytes).
pub fn keyed<'a>(principal: &'a str, key: &'a [u8]) -> Vec<(&'a str, &'a [u8])> {
    vec![
        ("content-type", &b"application/json"[..]),
        ("x-principal", principal.as_bytes()),
        ("idempotency-key", key),
    ]
}

async fn exchange(addr: SocketAddr, bytes: &[u8], hang_up: bool) -> Vec<Raw> {
    let io = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(bytes).await?;
        if hang_up {
            s.shutdown().await?;
        }
        let mut buf = Vec::new();
        // A reset after the answer (the server closing with unread bytes) still leaves the
        // answer in `buf`.
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(EXCHANGE_TIMEOUT, io)
        .await
        .expect("the server answers and closes the connection in time")
        .expect("the connection works");
    parse_all(&buf)
}

/// One answer as read from the wire.
#[derive(Debug, Clone)]
pub struct Raw {
    /// The status code.
    pub status: u16,
    /// Header lines in order: lowercase name, raw value bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl Raw {
    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of a header, in order.
    pub fn header_all(&self, name: &str) -> Vec<&[u8]> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    /// Whether this is a replay (`Idempotent-Replayed: true`).
    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some(b"true")
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The problem+json machine code, when the answer is a rejection of the layer.
    pub fn code(&self) -> Option<String> {
        (self.header("content-type") == Some(b"application/problem+json"))
            .then(|| self.json()["code"].as_str().map(str::to_owned))
            .flatten()
    }

    /// The handler's `execution` number.
    pub fn execution(&self) -> Option<u64> {
        self.json()["execution"].as_u64()
    }

    /// A one-line summary for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {:?} {}",
            self.status,
            self.code(),
            String::from_utf8_lossy(&self.body)
        )
    }

    /// Asserts a problem+json rejection of the layer.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.code().as_deref()),
            (status, Some(code)),
            "expected {status} {code}, got {}",
            self.describe()
        );
        assert!(!self.is_replay(), "a rejection is not a replay");
    }
}

/// Parses every complete answer in `buf`.
pub fn parse_all(mut buf: &[u8]) -> Vec<Raw> {
    let mut out = Vec::new();
    while let Some((raw, rest)) = parse_one(buf) {
        out.push(raw);
        buf = rest;
    }
    out
}

fn parse_one(buf: &[u8]) -> Option<(Raw, &[u8])> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = &buf[..end];
    let mut rest = &buf[end + 4..];
    let mut lines = head
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = lines.next()?;
    let status = std::str::from_utf8(status_line.get(9..12)?)
        .ok()?
        .parse()
        .ok()?;
    let mut headers = Vec::new();
    for line in lines {
        let colon = line.iter().position(|b| *b == b':')?;
        let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
        let value = line[colon + 1..].trim_ascii().to_vec();
        headers.push((name, value));
    }
    let find = |n: &str| headers.iter().find(|(h, _)| h == n).map(|(_, v)| v.clone());
    let body = if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked")) {
        let mut body = Vec::new();
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n")?;
            let size_hex = std::str::from_utf8(&rest[..eol]).ok()?;
            let size = usize::from_str_radix(size_hex.split(';').next()?.trim(), 16).ok()?;
            rest = &rest[eol + 2..];
            if size == 0 {
                let end = rest.windows(2).position(|w| w == b"\r\n")?;
                rest = &rest[end + 2..];
                break;
            }
            body.extend_from_slice(rest.get(..size)?);
            rest = rest.get(size + 2..)?;
        }
        body
    } else if let Some(len) = find("content-length") {
        let len: usize = std::str::from_utf8(&len).ok()?.parse().ok()?;
        let body = rest.get(..len)?.to_vec();
        rest = &rest[len..];
        body
    } else {
        let body = rest.to_vec();
        rest = &[];
        body
    };
    Some((
        Raw {
            status,
            headers,
            body,
        },
        rest,
    ))
}
