//! Send-once email over lettre: a job that runs twice delivers one message.
//!
//! ```
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::outbound::Delivery;
//! use tower_idempotency::outbound::lettre::LettreSendOnce;
//! use tower_idempotency::outbound::lettre::lettre::message::header::{HeaderName, HeaderValue};
//! use tower_idempotency::outbound::lettre::lettre::transport::stub::AsyncStubTransport;
//! use tower_idempotency::outbound::lettre::lettre::{AsyncTransport, Message};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let stub = AsyncStubTransport::new_ok();
//! let mailer = LettreSendOnce::new(MemoryStore::new(), stub.clone());
//! let welcome = || {
//!     Message::builder()
//!         .from("shop@example.com".parse().unwrap())
//!         .to("ada@example.com".parse().unwrap())
//!         .subject("Welcome")
//!         .raw_header(HeaderValue::new(
//!             HeaderName::new_from_ascii_str("Idempotency-Key"),
//!             "welcome:ada".to_owned(),
//!         ))
//!         .body(String::from("Welcome aboard."))
//!         .unwrap()
//! };
//! assert!(matches!(mailer.send(welcome()).await, Ok(Delivery::Recorded(()))));
//! assert!(matches!(mailer.send(welcome()).await, Ok(Delivery::Replayed(()))));
//! assert_eq!(stub.messages().await.len(), 1, "the job ran twice, one message went");
//! # }
//! ```
//!
//! [`LettreSendOnce`] wraps any lettre [`AsyncTransport`]: SMTP, the stub, your own. It is
//! one itself. A message whose key already went is answered with the receipt of its first
//! send, and not handed to the transport again. Feature `lettre`; lettre itself is
//! re-exported here as [`lettre`].
//!
//! # The key
//!
//! The key is the message's `Idempotency-Key` header by default; [`key_header`] names
//! another. With [`key_from_message_id`] it is the `Message-ID`. The caller may also give it
//! with [`LettreSendOnce::send_with_key`]. A message without a key is sent as it is and
//! answered [`Delivery::Untracked`]; [`require_key`] refuses it instead.
//!
//! lettre's message builder adds no `Message-ID`. Only `message_id(None)` does, a random one
//! per build, which de-duplicates nothing. Set a stable one, such as
//! `<welcome-42@shop.example>`. With [`key_from_message_id`] a message without one is
//! refused ([`KeyMissing`](super::OutboundErrorKind::KeyMissing)), not sent unguarded.
//!
//! The adapter's keys live in their own namespace, `outbound/lettre`. So one job key used
//! for a mail and for a charge is two keys.
//!
//! **The fingerprint** covers the envelope: the sender and every recipient, `Bcc` included.
//! It covers every header but `Date`, `Message-ID` and the key header. It covers each MIME
//! part's headers and body, but not a multipart's random boundary. For an attachment
//! (`Content-Disposition: attachment`) it covers the headers only: its name and type, not
//! its bytes. A schedule or any other header of yours counts as a header.
//!
//! # What the transport's answers mean
//!
//! [`MailClassifier`] gives these verdicts, for lettre's SMTP and stub transports.
//!
//! | answer | verdict | key |
//! | --- | --- | --- |
//! | `Ok`; for SMTP, the 250 reply to the end of the data | `Record`: the reply is the receipt | completed |
//! | SMTP 4xx reply to any command, the end of the data included ([`Error::is_transient`]) | `Release` | released |
//! | SMTP 5xx reply ([`Error::is_permanent`]) | `Fail` | released |
//! | the connection could not be made: lettre's connection kind (refused, DNS, no address, TLS setup) | `Release` | released |
//! | the transport was shut down ([`Error::is_transport_shutdown`]) | `Release` | released |
//! | the send took longer than [`timeout`]: a server took the data and stalls before its reply | `Hold` | held |
//! | lettre's timeout, a network error (an unreachable host included), a reply that does not parse ([`Error::is_response`]), a client error ([`Error::is_client`]) | `Hold` | held |
//! | any error of the stub transport | `Fail` | released |
//!
//! For a transport of your own, give [`classify`](LettreSendOnce::classify) an
//! [`engine::Classify`](crate::engine::Classify) of `Result<T::Ok, MailError<T::Error>>`.
//!
//! lettre's errors do not say which command failed. So a network error holds its key
//! wherever it happened, for the [hold time](LettreSendOnce::hold). An SMTP server replies
//! to the end of the data only once it has taken the message. A timeout waiting for that
//! reply is the classic "it may have gone". lettre 0.11 has no predicate for its connection
//! kind, made only while connecting, before any command. The adapter reads the kind's name
//! from the error's `Debug`. Should a later lettre print it otherwise, a failed connection
//! holds its key: nothing is ever sent twice.
//!
//! lettre's async SMTP transport bounds only its connect with its own timeout. So the
//! wrapper bounds each whole send with [`timeout`].
//!
//! [`key_header`]: LettreSendOnce::key_header
//! [`key_from_message_id`]: LettreSendOnce::key_from_message_id
//! [`timeout`]: LettreSendOnce::timeout
//! [`require_key`]: LettreSendOnce::require_key
//! [`Error::is_transient`]: ::lettre::transport::smtp::Error::is_transient
//! [`Error::is_permanent`]: ::lettre::transport::smtp::Error::is_permanent
//! [`Error::is_transport_shutdown`]: ::lettre::transport::smtp::Error::is_transport_shutdown
//! [`Error::is_response`]: ::lettre::transport::smtp::Error::is_response
//! [`Error::is_client`]: ::lettre::transport::smtp::Error::is_client

/// The lettre crate this adapter is built on (0.11).
pub use ::lettre;

use super::delivery::{Delivery, OutboundError};
use super::identify::{Identify, Identity};
use super::service::SendOnceLayer;
use crate::engine::key::IdempotencyKey;
use crate::engine::{
    BoxFuture, Classify, Codec, CodecError, CodecErrorKind, Engine, Fingerprint,
    FingerprintBuilder, KeyError, Raw, Scope, Verdict,
};
use crate::store::Store;
use ::lettre::address::Envelope;
use ::lettre::transport::smtp;
use ::lettre::{AsyncTransport, Message};
use bytes::Bytes;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// The lettre adapter's key namespace.
const NAMESPACE: &str = "outbound/lettre";

/// The bound of one send: the `timeout` lettre's SMTP transport uses for commands.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// An outgoing email as the door sees it: its envelope, its formatted bytes and the key the
/// caller gave, if any.
#[derive(Clone, Debug)]
pub struct Mail {
    envelope: Envelope,
    raw: Vec<u8>,
    key: Option<String>,
}

impl Mail {
    /// A message, formatted as lettre sends it.
    #[must_use]
    pub fn new(message: &Message) -> Self {
        Self {
            envelope: message.envelope().clone(),
            raw: message.formatted(),
            key: None,
        }
    }

    /// Formatted bytes and their envelope (what `AsyncTransport::send_raw` takes).
    #[must_use]
    pub fn raw(envelope: Envelope, raw: Vec<u8>) -> Self {
        Self {
            envelope,
            raw,
            key: None,
        }
    }

    /// The same mail under a key given by the caller (it wins over the message's headers).
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// Why a send failed: the transport's error, or the send ran past the timeout.
#[derive(Debug)]
pub struct MailError<E> {
    inner: MailInner<E>,
}

#[derive(Debug)]
enum MailInner<E> {
    Transport(E),
    Timeout(Duration),
}

/// What kind of [`MailError`] this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MailErrorKind {
    /// The transport returned an error.
    Work,
    /// The send took longer than the [timeout](LettreSendOnce::timeout). Its delivery is
    /// unknown.
    Timeout,
}

impl MailErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.work_failed`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Work => "idempotency.work_failed",
            Self::Timeout => "idempotency.timeout",
        }
    }
}

impl<E> MailError<E> {
    /// What kind of error this is.
    #[must_use]
    pub fn kind(&self) -> MailErrorKind {
        match self.inner {
            MailInner::Transport(_) => MailErrorKind::Work,
            MailInner::Timeout(_) => MailErrorKind::Timeout,
        }
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.work_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// The transport's error, when that is what failed.
    #[must_use]
    pub fn get_ref(&self) -> Option<&E> {
        match &self.inner {
            MailInner::Transport(e) => Some(e),
            MailInner::Timeout(_) => None,
        }
    }

    /// The transport's error, when that is what failed.
    #[must_use]
    pub fn into_inner(self) -> Option<E> {
        match self.inner {
            MailInner::Transport(e) => Some(e),
            MailInner::Timeout(_) => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for MailError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            MailInner::Transport(e) => write!(f, "the mail transport failed: {e}"),
            MailInner::Timeout(d) => write!(f, "the send took longer than {d:?}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for MailError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.inner {
            MailInner::Transport(e) => Some(e),
            MailInner::Timeout(_) => None,
        }
    }
}

/// The verdict on an SMTP error.
fn smtp_verdict(e: &smtp::Error) -> Verdict {
    // A negative reply (to any command, the end of the data included) took nothing.
    if e.is_permanent() {
        Verdict::Fail
    } else if e.is_transient() || e.is_transport_shutdown() {
        Verdict::Release
    } else if e.is_response() || e.is_client() || e.is_timeout() {
        Verdict::Hold
    } else if is_connection_kind(e) {
        Verdict::Release
    } else {
        Verdict::Hold
    }
}

/// lettre's connection kind (made only while connecting or setting up TLS, before any
/// command): lettre 0.11 has no predicate for it, so its name is read from the derived
/// `Debug` of the kind. Anything else reads as not a connection error: the safe side.
fn is_connection_kind(e: &smtp::Error) -> bool {
    const KIND: &str = "lettre::transport::smtp::Error { kind: Connection";
    format!("{e:?}")
        .strip_prefix(KIND)
        .is_some_and(|rest| rest.starts_with([',', ' ']))
}

/// The classifier of the lettre adapter: the table in the [module docs](self).
///
/// `Ok` is `Record`, a timeout `Hold`. An error of lettre's SMTP transport is read by its
/// reply class; any error of the stub transport is `Fail`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MailClassifier;

impl<R> Classify<Result<R, MailError<smtp::Error>>> for MailClassifier {
    fn classify(&self, result: &Result<R, MailError<smtp::Error>>) -> Verdict {
        match result {
            Ok(_) => Verdict::Record,
            Err(e) => match &e.inner {
                MailInner::Timeout(_) => Verdict::Hold,
                MailInner::Transport(e) => smtp_verdict(e),
            },
        }
    }
}

impl<R> Classify<Result<R, MailError<::lettre::transport::stub::Error>>> for MailClassifier {
    fn classify(&self, result: &Result<R, MailError<::lettre::transport::stub::Error>>) -> Verdict {
        match result {
            Ok(_) => Verdict::Record,
            Err(e) => match &e.inner {
                MailInner::Timeout(_) => Verdict::Hold,
                MailInner::Transport(_) => Verdict::Fail,
            },
        }
    }
}

/// Where the key of a message is read.
#[derive(Clone, Debug)]
enum KeyFrom {
    Header(String),
    MessageId,
}

/// Reads a mail's key and fingerprint (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct MailIdentify {
    from: KeyFrom,
}

impl Default for MailIdentify {
    fn default() -> Self {
        Self {
            from: KeyFrom::Header("idempotency-key".to_owned()),
        }
    }
}

impl Identify<Mail> for MailIdentify {
    fn identify(&self, mail: &Mail) -> Result<Option<Identity>, KeyError> {
        let (head, _) = split_head(&mail.raw);
        let headers = parse_headers(head);
        let key_header = match &self.from {
            KeyFrom::Header(name) => name.as_str(),
            KeyFrom::MessageId => "message-id",
        };
        let key = match &mail.key {
            Some(k) => k.clone(),
            None => match headers.iter().find(|(n, _)| n == key_header) {
                Some((_, v)) => v.clone(),
                None => return Ok(None),
            },
        };
        let key = IdempotencyKey::new(&key)?;
        let mut fp = Fingerprint::builder().field(b"envelope").field(
            mail.envelope
                .from()
                .map_or("", AsRef::<str>::as_ref)
                .as_bytes(),
        );
        for to in mail.envelope.to() {
            fp = fp.field(AsRef::<str>::as_ref(to).as_bytes());
        }
        let fp = fingerprint_part(fp, &mail.raw, Some(key_header), 0);
        Ok(Some(Identity::new(key, fp.finish())))
    }
}

/// Nested multiparts deeper than this are fingerprinted as bytes.
const MAX_DEPTH: usize = 16;

/// Folds a MIME entity (the message, or one of its parts) into the fingerprint.
fn fingerprint_part(
    mut fp: FingerprintBuilder,
    entity: &[u8],
    top_key_header: Option<&str>,
    depth: usize,
) -> FingerprintBuilder {
    let (head, body) = split_head(entity);
    let headers = parse_headers(head);
    let value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let content_type = value("content-type").unwrap_or("text/plain");
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let boundary = essence
        .starts_with("multipart/")
        .then(|| param(content_type, "boundary"))
        .flatten();
    for (name, v) in &headers {
        let skip =
            top_key_header.is_some_and(|k| name == "date" || name == "message-id" || name == k);
        if skip {
            continue;
        }
        fp = fp.field(name.as_bytes());
        // A multipart's boundary is random per build: its type alone tells it.
        fp = if name == "content-type" && boundary.is_some() {
            fp.field(essence.as_bytes())
        } else {
            fp.field(v.as_bytes())
        };
    }
    let attachment = value("content-disposition").is_some_and(|d| {
        d.trim_start()
            .to_ascii_lowercase()
            .starts_with("attachment")
    });
    match boundary {
        Some(b) if depth < MAX_DEPTH => {
            for part in mime_parts(body, b.as_bytes()) {
                fp = fingerprint_part(fp.field(b"part"), part, None, depth + 1);
            }
            fp
        }
        _ if attachment => fp.field(b"attachment"),
        _ => fp.field(b"body").field(body),
    }
}

/// The head and body of an entity, split at the first empty line.
fn split_head(entity: &[u8]) -> (&[u8], &[u8]) {
    if let Some(i) = entity.windows(4).position(|w| w == b"\r\n\r\n") {
        (&entity[..i], &entity[i + 4..])
    } else if let Some(i) = entity.windows(2).position(|w| w == b"\n\n") {
        (&entity[..i], &entity[i + 2..])
    } else {
        (entity, &[])
    }
}

/// Header fields with lowercase names and unfolded, trimmed values, in order.
fn parse_headers(head: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(head);
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with([' ', '\t']) {
            if let Some((_, v)) = out.last_mut() {
                v.push(' ');
                v.push_str(line.trim());
            }
        } else if let Some((n, v)) = line.split_once(':') {
            out.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    out
}

/// A parameter of a header value (`boundary="abc"` → `abc`).
fn param(value: &str, name: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|p| {
        let (n, v) = p.split_once('=')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The parts of a multipart body: between `--boundary` lines, up to `--boundary--`.
fn mime_parts<'a>(body: &'a [u8], boundary: &[u8]) -> Vec<&'a [u8]> {
    let mut delimiter = b"--".to_vec();
    delimiter.extend_from_slice(boundary);
    let mut starts = Vec::new();
    let mut i = 0;
    while let Some(at) = find(&body[i..], &delimiter) {
        let pos = i + at;
        let at_line_start = pos == 0 || body[pos - 1] == b'\n';
        i = pos + delimiter.len();
        if at_line_start {
            starts.push(pos);
        }
    }
    let mut parts = Vec::new();
    for w in starts.windows(2) {
        let (from, to) = (w[0] + delimiter.len(), w[1]);
        if body[from..].starts_with(b"--") {
            break;
        }
        let mut part = &body[from..to];
        part = part
            .strip_prefix(b"\r\n")
            .or_else(|| part.strip_prefix(b"\n"))
            .unwrap_or(part);
        part = part
            .strip_suffix(b"\r\n")
            .or_else(|| part.strip_suffix(b"\n"))
            .unwrap_or(part);
        parts.push(part);
    }
    parts
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// An SMTP reply as a receipt: kept as its wire text (`250-…\r\n250 …\r\n`).
impl Codec<smtp::response::Response> for Raw {
    fn encode(&self, reply: &smtp::response::Response) -> Result<Bytes, CodecError> {
        let code = reply.code().to_string();
        let lines: Vec<&str> = reply.message().collect();
        let mut out = String::new();
        if lines.is_empty() {
            out.push_str(&code);
            out.push_str(" \r\n");
        }
        for (i, line) in lines.iter().enumerate() {
            let sep = if i + 1 == lines.len() { ' ' } else { '-' };
            out.push_str(&format!("{code}{sep}{line}\r\n"));
        }
        Ok(Bytes::from(out))
    }

    fn decode(&self, bytes: Bytes) -> Result<smtp::response::Response, CodecError> {
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            CodecError::with_source(CodecErrorKind::Decode, "an SMTP reply that is not UTF-8", e)
        })?;
        smtp::response::Response::from_str(text)
            .map_err(|e| CodecError::with_source(CodecErrorKind::Decode, "not an SMTP reply", e))
    }
}

/// A lettre transport as a tower service of [`Mail`], each send bounded by a timeout.
struct TransportService<T> {
    transport: Arc<T>,
    timeout: Option<Duration>,
}

impl<T> Clone for TransportService<T> {
    fn clone(&self) -> Self {
        Self {
            transport: Arc::clone(&self.transport),
            timeout: self.timeout,
        }
    }
}

impl<T> Service<Mail> for TransportService<T>
where
    T: AsyncTransport + Send + Sync + 'static,
    T::Ok: Send,
    T::Error: Send,
{
    type Response = T::Ok;
    type Error = MailError<T::Error>;
    type Future = BoxFuture<'static, Result<T::Ok, MailError<T::Error>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mail: Mail) -> Self::Future {
        let (transport, timeout) = (Arc::clone(&self.transport), self.timeout);
        let transport_error = |e| MailError {
            inner: MailInner::Transport(e),
        };
        Box::pin(async move {
            let send = transport.send_raw(&mail.envelope, &mail.raw);
            match timeout {
                Some(t) => match tokio::time::timeout(t, send).await {
                    Ok(res) => res.map_err(transport_error),
                    Err(_) => Err(MailError {
                        inner: MailInner::Timeout(t),
                    }),
                },
                None => send.await.map_err(transport_error),
            }
        })
    }
}

/// The send-once door over a lettre transport.
///
/// It is an [`AsyncTransport`] itself. Its `Ok` is the [`Delivery`]; its `Error` is the
/// [`OutboundError`]. Build it with [`new`](Self::new) and the setters; see the
/// [module docs](self).
#[must_use]
pub struct LettreSendOnce<T, St, C = MailClassifier> {
    layer: SendOnceLayer<St, MailIdentify, C>,
    transport: TransportService<T>,
    /// The key requirement the caller set; else it follows where the key is read.
    require_key: Option<bool>,
}

impl<T, St, C: Clone> Clone for LettreSendOnce<T, St, C> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            transport: self.transport.clone(),
            require_key: self.require_key,
        }
    }
}

impl<T, St, C> fmt::Debug for LettreSendOnce<T, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LettreSendOnce")
            .field("layer", &self.layer)
            .field("timeout", &self.transport.timeout)
            .finish_non_exhaustive()
    }
}

impl<T, St: Store> LettreSendOnce<T, St> {
    /// The door over `transport`, its keys claimed through `engine`, an [`Engine`] or a
    /// store.
    pub fn new(engine: impl Into<Engine<St>>, transport: T) -> Self {
        Self {
            layer: SendOnceLayer::new(engine, MailIdentify::default())
                .classify(MailClassifier)
                .namespace(NAMESPACE),
            transport: TransportService {
                transport: Arc::new(transport),
                timeout: Some(SEND_TIMEOUT),
            },
            require_key: None,
        }
    }
}

impl<T, St: Store, C> LettreSendOnce<T, St, C> {
    /// Reads the key from this header. Default: `Idempotency-Key`.
    pub fn key_header(self, name: impl Into<String>) -> Self {
        self.key_from(KeyFrom::Header(name.into().to_ascii_lowercase()))
    }

    /// Reads the key from the `Message-ID` header.
    ///
    /// lettre adds none: set a stable one with `MessageBuilder::message_id(Some(..))`. A
    /// message without one is refused, unless [`require_key(false)`](Self::require_key).
    pub fn key_from_message_id(self) -> Self {
        self.key_from(KeyFrom::MessageId)
    }

    fn key_from(mut self, from: KeyFrom) -> Self {
        let require = self
            .require_key
            .unwrap_or(matches!(from, KeyFrom::MessageId));
        self.layer = self
            .layer
            .identify(MailIdentify { from })
            .require_key(require);
        self
    }

    /// Bounds each send. A send past it has an unknown delivery.
    ///
    /// `Duration::MAX`: no bound but the transport's own. Default: 60 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.transport.timeout = (timeout != Duration::MAX).then_some(timeout);
        self
    }

    /// See [`SendOnceLayer::namespace`]. Default: `outbound/lettre`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.layer = self.layer.namespace(namespace);
        self
    }

    /// See [`SendOnceLayer::scope`].
    pub fn scope(mut self, scope: Scope) -> Self {
        self.layer = self.layer.scope(scope);
        self
    }

    /// See [`SendOnceLayer::hold`]. Default: 10 minutes.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.layer = self.layer.hold(hold);
        self
    }

    /// See [`SendOnceLayer::wait_in_flight`]. Default: zero.
    pub fn wait_in_flight(mut self, bound: Duration) -> Self {
        self.layer = self.layer.wait_in_flight(bound);
        self
    }

    /// Whether a message without a key is refused.
    ///
    /// On, it fails [`KeyMissing`](super::OutboundErrorKind::KeyMissing) and nothing is
    /// sent. Off, it is sent as it is and answered [`Delivery::Untracked`]. Default:
    /// on when the key is the `Message-ID`
    /// ([`key_from_message_id`](Self::key_from_message_id)), off otherwise.
    pub fn require_key(mut self, on: bool) -> Self {
        self.require_key = Some(on);
        self.layer = self.layer.require_key(on);
        self
    }

    /// Judges each send with `classify`. Default: [`MailClassifier`].
    ///
    /// See [`SendOnceLayer::classify`] for what each verdict does.
    pub fn classify<C2>(self, classify: C2) -> LettreSendOnce<T, St, C2> {
        LettreSendOnce {
            layer: self.layer.classify(classify),
            transport: self.transport,
            require_key: self.require_key,
        }
    }

    /// The wrapped transport.
    #[must_use]
    pub fn transport(&self) -> &T {
        &self.transport.transport
    }
}

impl<T, St, C> LettreSendOnce<T, St, C>
where
    T: AsyncTransport + Send + Sync + 'static,
    T::Ok: Send + 'static,
    T::Error: Send + 'static,
    Raw: Codec<T::Ok>,
    St: Store,
    C: Classify<Result<T::Ok, MailError<T::Error>>> + Clone,
{
    /// Sends `message` under `key`, given by the caller. The message's headers are not read
    /// for a key.
    ///
    /// # Errors
    /// See [`OutboundError`].
    pub async fn send_with_key(
        &self,
        key: &str,
        message: Message,
    ) -> Result<Delivery<T::Ok, MailError<T::Error>>, OutboundError<MailError<T::Error>>> {
        self.send_mail(Mail::new(&message).with_key(key)).await
    }

    /// Sends a [`Mail`].
    ///
    /// # Errors
    /// See [`OutboundError`].
    pub async fn send_mail(
        &self,
        mail: Mail,
    ) -> Result<Delivery<T::Ok, MailError<T::Error>>, OutboundError<MailError<T::Error>>> {
        let mut door = self.layer.layer(self.transport.clone());
        std::future::poll_fn(|cx| door.poll_ready(cx)).await?;
        door.call(mail).await
    }
}

#[async_trait::async_trait]
impl<T, St, C> AsyncTransport for LettreSendOnce<T, St, C>
where
    T: AsyncTransport + Send + Sync + 'static,
    T::Ok: Send + 'static,
    T::Error: Send + 'static,
    Raw: Codec<T::Ok>,
    St: Store,
    C: Classify<Result<T::Ok, MailError<T::Error>>> + Clone,
{
    type Ok = Delivery<T::Ok, MailError<T::Error>>;
    type Error = OutboundError<MailError<T::Error>>;

    async fn send(&self, message: Message) -> Result<Self::Ok, Self::Error> {
        self.send_mail(Mail::new(&message)).await
    }

    async fn send_raw(&self, envelope: &Envelope, email: &[u8]) -> Result<Self::Ok, Self::Error> {
        self.send_mail(Mail::raw(envelope.clone(), email.to_vec()))
            .await
    }

    async fn shutdown(&self) {
        self.transport.transport.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(subject: &str, attachment: &[u8]) -> Mail {
        use ::lettre::message::{Attachment, MultiPart, SinglePart, header::ContentType};
        let message = Message::builder()
            .from(
                "shop@example.com"
                    .parse()
                    .unwrap_or_else(|_| unreachable!()),
            )
            .to("ada@example.com".parse().unwrap_or_else(|_| unreachable!()))
            .subject(subject)
            .multipart(
                MultiPart::mixed()
                    .singlepart(SinglePart::plain(String::from("Your invoice.")))
                    .singlepart(Attachment::new(String::from("invoice.pdf")).body(
                        attachment.to_vec(),
                        ContentType::parse("application/pdf").unwrap_or(ContentType::TEXT_PLAIN),
                    )),
            )
            .unwrap_or_else(|_| unreachable!());
        Mail::new(&message).with_key("invoice-1")
    }

    fn fp(m: &Mail) -> Fingerprint {
        *MailIdentify::default()
            .identify(m)
            .ok()
            .flatten()
            .map(|i| i.fingerprint().to_owned())
            .as_ref()
            .unwrap_or(&Fingerprint::from_bytes([0; 32]))
    }

    #[test]
    fn two_builds_of_one_message_have_one_fingerprint() {
        // Each build has its own Date and MIME boundary.
        assert_eq!(
            fp(&mail("Invoice", b"%PDF-1")),
            fp(&mail("Invoice", b"%PDF-1"))
        );
    }

    #[test]
    fn attachment_bytes_do_not_count_but_the_subject_does() {
        assert_eq!(
            fp(&mail("Invoice", b"%PDF-1")),
            fp(&mail("Invoice", b"%PDF-2 other bytes"))
        );
        assert_ne!(
            fp(&mail("Invoice", b"%PDF-1")),
            fp(&mail("Invoice!", b"%PDF-1"))
        );
    }

    #[test]
    fn an_smtp_reply_round_trips_as_a_receipt() {
        use ::lettre::transport::smtp::response::Response;
        let reply = Response::from_str("250-queued as 1A2B\r\n250 OK\r\n")
            .unwrap_or_else(|_| unreachable!());
        let back: Response = Raw
            .decode(Raw.encode(&reply).unwrap_or_default())
            .unwrap_or_else(|_| unreachable!());
        assert_eq!(back, reply);
    }
}
