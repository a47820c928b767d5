//! Raw HTTP/1.1 for the hostile-input and security tests: requests as bytes no client library
//! would send (non-ASCII keys, repeated lines, lying lengths, broken chunked bodies), sent to a
//! [`TestServer`] over `tokio::net::TcpStream`, and the answers read back byte for byte.
//!
//! The app behind the server is the one of [`super::http`]: [`Work::plain`] answers
//! `{"execution": n, "body_len": n}`, and `x-mode` (`cookies`, `obs-text`, `panic`) and
//! `x-marker` steer it (see that module's docs).
//!
//! [`Work::plain`]: super::http::Work::plain

use super::http::TestServer;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The JSON request body the tests send.
pub(crate) const BODY: &[u8] = br#"{"item":"book"}"#;

/// How long a raw exchange may take before the test fails.
pub(crate) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Raw exchanges with a [`TestServer`].
impl TestServer {
    /// Sends `bytes` on a new connection and reads every answer until the server closes it.
    pub(crate) async fn exchange(&self, bytes: &[u8]) -> Vec<Raw> {
        exchange(self.addr(), bytes, false).await
    }

    /// Like [`exchange`](Self::exchange), but closes the sending half after the bytes, as a
    /// client that hangs up mid-body does.
    pub(crate) async fn exchange_then_hang_up(&self, bytes: &[u8]) -> Vec<Raw> {
        exchange(self.addr(), bytes, true).await
    }

    /// Sends one request (with `Connection: close`) and returns its answer.
    pub(crate) async fn one(&self, bytes: &[u8]) -> Raw {
        let mut answers = self.exchange(bytes).await;
        assert_eq!(
            answers.len(),
            1,
            "exactly one answer expected, got {answers:?}"
        );
        answers.remove(0)
    }
}

// ---------------------------------------------------------------------------------------------
// Raw requests
// ---------------------------------------------------------------------------------------------

/// A `POST` request as bytes: the request line, `Host`, the given header lines verbatim (name,
/// raw value), `Content-Length` of `body`, `Connection: close`, then `body`.
pub(crate) fn post(path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = head(path, headers);
    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(body);
    out
}

/// The request line, `Host` and the given header lines (no blank line, no length).
pub(crate) fn head(path: &str, headers: &[(&str, &[u8])]) -> Vec<u8> {
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
pub(crate) fn keyed<'a>(principal: &'a str, key: &'a [u8]) -> Vec<(&'a str, &'a [u8])> {
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
pub(crate) struct Raw {
    /// The status code.
    pub(crate) status: u16,
    /// Header lines in order: lowercase name, raw value bytes.
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    /// The body (de-chunked).
    pub(crate) body: Vec<u8>,
}

impl Raw {
    /// The first value of a header.
    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of a header, in order.
    pub(crate) fn header_all(&self, name: &str) -> Vec<&[u8]> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    /// Whether this is a replay (`Idempotent-Replayed: true`).
    pub(crate) fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some(b"true")
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The problem+json machine code, when the answer is a rejection of the layer.
    pub(crate) fn code(&self) -> Option<String> {
        (self.header("content-type") == Some(b"application/problem+json"))
            .then(|| self.json()["code"].as_str().map(str::to_owned))
            .flatten()
    }

    /// The handler's `execution` number.
    pub(crate) fn execution(&self) -> Option<u64> {
        self.json()["execution"].as_u64()
    }

    /// A one-line summary for assertion messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} {:?} {}",
            self.status,
            self.code(),
            String::from_utf8_lossy(&self.body)
        )
    }

    /// Asserts a problem+json rejection of the layer.
    #[track_caller]
    pub(crate) fn assert_problem(&self, status: u16, code: &str) {
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
pub(crate) fn parse_all(mut buf: &[u8]) -> Vec<Raw> {
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
